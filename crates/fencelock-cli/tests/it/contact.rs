//! What a first-time user reads and copies: each command's own description in `--help`,
//! the README's `dlock hold` recipe run as written, and `dlock elect`'s conflict naming the
//! leader.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use dlock_test::server::RedisServer;

use crate::{CONFLICT, dlock, output, scratch, stderr, wait_exit};

/// `dlock ARGS` (no store needed) printed to stdout, its wrapped lines joined again.
fn help(args: &[&str]) -> String {
    let out = output(Command::new(env!("CARGO_BIN_EXE_dlock")).args(args));
    assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

const ACQUIRE: &str = "Acquire NAME and print `TOKEN FENCE`; the lease lasts --ttl (no renewal)";
const HOLD: &str = "Hold the lock NAME, renewed, until dlock is killed or its parent exits";

/// `dlock acquire` and `dlock hold` each describe themselves, in their own `--help` and in
/// `dlock --help`'s list of commands.
#[test]
fn acquire_and_hold_each_describe_themselves() {
    let text = help(&["acquire", "--help"]);
    assert!(text.starts_with(ACQUIRE), "{text}");
    assert!(!text.contains("Hold the lock"), "{text}");
    let text = help(&["hold", "--help"]);
    assert!(text.starts_with(HOLD), "{text}");
    assert!(!text.contains("Acquire NAME"), "{text}");
    let text = help(&["--help"]);
    assert!(text.contains(&format!("hold {HOLD}")), "{text}");
    assert!(text.contains(&format!("acquire {ACQUIRE}")), "{text}");
}

/// The README's `dlock hold` recipe: the line that starts it and the next one.
fn readme_recipe() -> (String, String) {
    let readme = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md");
    let readme = std::fs::read_to_string(&readme).expect("README.md");
    let mut lines = readme.lines().skip_while(|l| !l.starts_with("coproc HOLD"));
    let start = lines.next().expect("the README's `coproc HOLD` line");
    let rest = lines.next().expect("the line after it");
    assert!(
        rest.contains("kill \"$HOLD_PID\"; wait \"$HOLD_PID\""),
        "{rest}"
    );
    (start.to_owned(), rest.to_owned())
}

/// A directory with `dlock` (this build) and `migrate` (a stand-in for the README's
/// `./migrate`: it records its arguments and the lock's status), for a script run in it.
fn recipe_dir(name: &str) -> PathBuf {
    let dir = scratch(name);
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_dlock"), dir.join("dlock")).expect("symlink");
    std::fs::write(
        dir.join("migrate"),
        "#!/bin/sh\necho \"$@\" > migrate.args\ndlock status --json migrate > during.json\n",
    )
    .expect("write migrate");
    let made_executable = Command::new("chmod")
        .args(["+x", "migrate"])
        .current_dir(&dir)
        .status()
        .expect("chmod");
    assert!(made_executable.success());
    dir
}

/// What a script printed and how it exited.
struct Ran {
    status: std::process::ExitStatus,
    stdout: String,
    stderr: String,
}

/// Runs `script` under bash in `dir` with the store `url`, `dlock` found on PATH there.
/// Its output goes to files, not pipes: a process the script leaves behind (as a wrong
/// recipe does) would keep a pipe open, and reading it would not end.
fn bash(dir: &Path, url: &str, script: &str) -> Ran {
    let path = format!(
        "{}:{}",
        dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut child = Command::new("bash")
        .args(["-c", script])
        .current_dir(dir)
        .env("PATH", path)
        .env("DLOCK_URL", url)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(dir.join("script.out")).expect("script.out"))
        .stderr(std::fs::File::create(dir.join("script.err")).expect("script.err"))
        .spawn()
        .expect("bash");
    let status = wait_exit(&mut child, Duration::from_secs(30));
    let read = |file: &str| std::fs::read_to_string(dir.join(file)).expect("the script's output");
    Ran {
        status,
        stdout: read("script.out"),
        stderr: read("script.err"),
    }
}

/// `dlock status --json migrate` read from a file the script wrote.
fn json(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).expect("written by the script");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}: {text}", path.display()))
}

/// Kills, when dropped, the process whose pid the script wrote to a file (the coproc a
/// wrong recipe leaves behind): a failed test leaves no lock holder running.
struct KillRecorded(PathBuf);

impl Drop for KillRecorded {
    fn drop(&mut self) {
        if let Ok(pid) = std::fs::read_to_string(&self.0) {
            let _ = Command::new("kill").args(["-TERM", pid.trim()]).status();
        }
    }
}

/// The README's `dlock hold` recipe, run by bash as written: a script that ends without
/// killing dlock hold frees the lock; the lock is held while the script works, and `kill
/// "$HOLD_PID"; wait "$HOLD_PID"` releases it (dlock hold exits 0 once it has).
#[test]
fn the_readmes_hold_recipe_holds_and_releases() {
    let server = RedisServer::start().expect("redis-server");
    let url = server.url();
    let (start, rest) = readme_recipe();

    // The script ends without `kill`: the lock is freed too (dlock hold's parent exited).
    let dir = recipe_dir("recipe-exit");
    let _cleanup = KillRecorded(dir.join("hold.pid"));
    let read = rest.split(';').next().expect("the `read` of the recipe");
    let script = format!("{start}\necho \"$HOLD_PID\" > hold.pid\n{read}\necho \"$fence\"\n");
    let out = bash(&dir, &url, &script);
    assert!(out.status.success(), "{}", out.stderr);
    assert_eq!(out.stdout, "1\n");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = output(dlock(&url).args(["status", "--json", "migrate"]));
        let status: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
        if status["held"] == false {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still held 10 s after the script ended: {status}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = std::fs::remove_dir_all(dir);

    // As written, then the lock's status right after `wait`.
    let dir = recipe_dir("recipe-kill");
    let _cleanup = KillRecorded(dir.join("hold.pid"));
    let script = format!(
        "{start}\necho \"$HOLD_PID\" > hold.pid\n{rest}\necho \"$?\" > waited\n\
         dlock status --json migrate > after.json\n"
    );
    let out = bash(&dir, &url, &script);
    assert!(out.status.success(), "{}", out.stderr);
    assert_eq!(
        std::fs::read_to_string(dir.join("migrate.args")).expect("migrate ran"),
        "--fence 2\n"
    );
    let during = json(&dir.join("during.json"));
    assert_eq!(during["held"], true, "{during}");
    let hold_pid = std::fs::read_to_string(dir.join("hold.pid")).expect("pid");
    assert_eq!(
        during["holder_info"]["pid"].to_string(),
        hold_pid.trim(),
        "$HOLD_PID is dlock hold itself: {during}"
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("waited"))
            .expect("waited")
            .trim(),
        "0",
        "`wait \"$HOLD_PID\"` is dlock hold's own exit: released, exit 0"
    );
    let after = json(&dir.join("after.json"));
    assert_eq!(
        after["held"], false,
        "released once `wait` returns: {after}"
    );
    let _ = std::fs::remove_dir_all(dir);

    // The same recipe in docs/cli.md and in `dlock hold --help`.
    let cli = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/cli.md");
    let cli = std::fs::read_to_string(cli).expect("docs/cli.md");
    let recipe = "coproc HOLD { exec dlock hold --wait 5m migrate; }";
    assert!(cli.contains(recipe), "docs/cli.md");
    assert!(help(&["hold", "--help"]).contains(recipe));
    assert!(
        start.starts_with("coproc HOLD { exec dlock hold "),
        "{start}"
    );
}

/// `dlock elect` while another candidate leads: who leads (term, value as `dlock leader`
/// shows it: on one line) and what to do next.
#[test]
fn an_elect_conflict_names_the_leader() {
    let server = RedisServer::start().expect("redis-server");
    let url = server.url();
    let mut leading = Stopped(
        dlock(&url)
            .args(["elect", "--value", "host-a:1\nfake line", "my seat", "--"])
            .args(["sleep", "30"])
            .spawn()
            .expect("spawn dlock elect"),
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = output(dlock(&url).args(["leader", "--json", "my seat"]));
        let leader: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
        if leader["leader"] == true && leader["value"].is_string() {
            break;
        }
        assert!(Instant::now() < deadline, "never led: {leader}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let said = |out: &std::process::Output| {
        stderr(out)
            .lines()
            .filter(|l| !l.starts_with("dlock: warning: "))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let out = output(dlock(&url).args(["elect", "-n", "my seat", "--", "true"]));
    assert_eq!(out.status.code(), Some(CONFLICT), "{}", stderr(&out));
    assert_eq!(
        said(&out),
        "dlock: another candidate leads $'my\\x20seat' (term 1, value \"host-a:1 fake line\"): \
         not waiting (--no-wait); --wait D waits up to D to lead"
    );
    let out = output(dlock(&url).args(["elect", "--wait", "300ms", "my seat", "--", "true"]));
    assert_eq!(out.status.code(), Some(CONFLICT), "{}", stderr(&out));
    assert_eq!(
        said(&out),
        "dlock: another candidate still leads $'my\\x20seat' after --wait 300ms (term 1, value \
         \"host-a:1 fake line\"): a longer --wait waits longer, and without --wait dlock waits \
         until it leads"
    );
    let _ = Command::new("kill")
        .args(["-TERM", &leading.0.id().to_string()])
        .status();
    wait_exit(&mut leading.0, Duration::from_secs(20));
}

/// A child killed (SIGKILL) and reaped when dropped: a failed test leaves no process
/// behind.
struct Stopped(std::process::Child);

impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
