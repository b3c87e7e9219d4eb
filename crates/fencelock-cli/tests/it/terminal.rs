//! `dlock run` started from an interactive terminal (a pseudo-terminal from util-linux
//! `script`, dlock in its foreground group): the command's process group is still its own
//! (it gets the terminal's foreground while it runs), so the lock is held until the whole
//! group is gone, the whole group is killed before the lease can end, and Ctrl-C reaches
//! the command while dlock still ends cleanly and releases.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use dlock_test::proxy::Fault;
use dlock_test::server::RedisServer;

use super::supervise::{
    next_holder, proxied_redis, stubborn_writer, wait_until_gone, writes_after_grant,
};
use super::{CONFLICT, LOST, dlock, output, scratch, stderr, wait_exit, wait_for_file};

/// A shell word for `s` (single quotes).
fn quoted(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Starts `dlock ARGS` with a pseudo-terminal on its stdin, stdout and stderr, as from an
/// interactive shell (`script -qec CMD /dev/null`): dlock is in the terminal's
/// foreground group. What is written to the returned child's stdin is typed on the
/// terminal; what the terminal shows goes to the returned file.
fn on_a_terminal(url: &str, args: &[&str], dir: &Path) -> (Child, PathBuf) {
    on_a_terminal_then(url, args, "", dir)
}

/// [`on_a_terminal`], dlock's stdout piped into the shell command `then` (if not empty).
fn on_a_terminal_then(url: &str, args: &[&str], then: &str, dir: &Path) -> (Child, PathBuf) {
    let words: Vec<String> = std::iter::once(env!("CARGO_BIN_EXE_dlock"))
        .chain(args.iter().copied())
        .map(quoted)
        .collect();
    let run = dir.join("on-a-terminal.sh");
    let line = if then.is_empty() {
        format!("exec {}\n", words.join(" "))
    } else {
        format!("{} | {then}\n", words.join(" "))
    };
    std::fs::write(&run, line).expect("script");
    let shown = dir.join("terminal");
    let child = Command::new("script")
        .args(["-qec", &format!("sh {}", run.display()), "/dev/null"])
        .env("DLOCK_URL", url)
        .stdin(Stdio::piped())
        .stdout(std::fs::File::create(&shown).expect("terminal file"))
        .stderr(Stdio::null())
        .spawn()
        .expect("util-linux script");
    (child, shown)
}

/// Waits (bounded) until `name` is held as a plain lock.
fn wait_held(url: &str, name: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = output(dlock(url).args(["status", "--json", name]));
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        if json["held"] == true {
            return;
        }
        assert!(Instant::now() < deadline, "{name} never held");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// On a terminal, a background child that closed the hold descriptor (so only its process
/// group ties it to the command) keeps the lock until it exits.
#[test]
fn on_a_terminal_the_lock_is_held_until_the_commands_group_has_exited() {
    let server = RedisServer::start().expect("redis-server");
    let url = server.url();
    let dir = scratch("tty-children");
    let (started, late) = (dir.join("started"), dir.join("late"));
    let script = format!(
        "echo started > {}; ( exec {{DLOCK_HOLD_FD}}>&-; sleep 2; echo late >> {} ) & exit 0",
        started.display(),
        late.display()
    );
    let (mut first, shown) = on_a_terminal(
        &url,
        &["run", "tty-children", "--", "bash", "-c", &script],
        &dir,
    );
    wait_for_file(&started, Duration::from_secs(10));
    std::thread::sleep(Duration::from_millis(500));
    assert!(!late.exists(), "the child already wrote");
    let out = output(dlock(&url).args(["run", "--no-wait", "tty-children", "--", "true"]));
    assert_eq!(
        out.status.code(),
        Some(CONFLICT),
        "the lock was released while the command's child still ran: {}",
        stderr(&out)
    );
    assert!(wait_exit(&mut first, Duration::from_secs(15)).success());
    assert_eq!(wait_for_file(&late, Duration::from_secs(1)).trim(), "late");
    let shown = std::fs::read_to_string(shown).expect("terminal");
    assert!(shown.contains("holding the lock"), "{shown}");
    let out = output(dlock(&url).args(["run", "--no-wait", "tty-children", "--", "true"]));
    assert!(out.status.success(), "not released: {}", stderr(&out));
    let _ = std::fs::remove_dir_all(dir);
}

/// On a terminal, a command that ignores SIGTERM and left a background child (ignoring
/// SIGTERM and SIGHUP too) writing: when renewals fail, the whole group is SIGKILLed
/// before the lease can end — nothing of it writes once the next holder is granted.
#[test]
fn on_a_terminal_the_whole_group_is_killed_before_the_next_holder_is_granted() {
    let (server, _runtime, proxy) = proxied_redis();
    let dir = scratch("tty-stubborn");
    let (log, pidfile, childfile) = (dir.join("log"), dir.join("pid"), dir.join("child"));
    let script = format!(
        "trap '' TERM HUP; \
         ( while :; do echo A >> {log}; sleep 0.05; done ) & echo $! > {child}; {writer}",
        log = log.display(),
        child = childfile.display(),
        writer = stubborn_writer(&log, &pidfile),
    );
    let (mut first, shown) = on_a_terminal(
        &format!("redis://{}/0", proxy.addr()),
        &[
            "run",
            "--ttl",
            "2s",
            "tty-stubborn",
            "--",
            "sh",
            "-c",
            &script,
        ],
        &dir,
    );
    let pid = wait_for_file(&pidfile, Duration::from_secs(10));
    let child = wait_for_file(&childfile, Duration::from_secs(10));
    wait_for_file(&log, Duration::from_secs(10));
    proxy.set_fault(Fault::Blackhole);
    let mut next = next_holder(&server.url(), "run", "tty-stubborn", &log);
    assert!(wait_exit(&mut next, Duration::from_secs(30)).success());
    assert_eq!(
        writes_after_grant(&log),
        0,
        "the first command's group wrote while the next holder held the lock"
    );
    assert!(
        wait_until_gone(&pid, Duration::from_secs(5)),
        "the command outlived its lease"
    );
    assert!(
        wait_until_gone(&child, Duration::from_secs(5)),
        "the command's background child outlived its lease"
    );
    // `script` ends with its command's status.
    assert_eq!(
        wait_exit(&mut first, Duration::from_secs(15)).code(),
        Some(LOST)
    );
    let shown = std::fs::read_to_string(shown).expect("terminal");
    assert!(shown.contains("terminating the command"), "{shown}");
    let _ = std::fs::remove_dir_all(dir);
}

/// On a terminal, Ctrl-C reaches the command's group (in the terminal's foreground); dlock
/// then gives the lock back and exits with the command's status (130: SIGINT).
#[test]
fn on_a_terminal_ctrl_c_ends_the_command_and_dlock_releases() {
    let server = RedisServer::start().expect("redis-server");
    let url = server.url();
    let dir = scratch("tty-interrupt");
    let pidfile = dir.join("pid");
    let script = format!("echo $$ > {}; exec sleep 60", pidfile.display());
    let (mut first, _) = on_a_terminal(
        &url,
        &["run", "tty-interrupt", "--", "sh", "-c", &script],
        &dir,
    );
    let pid = wait_for_file(&pidfile, Duration::from_secs(10));
    wait_held(&url, "tty-interrupt");
    let mut typed = first.stdin.take().expect("stdin");
    typed.write_all(b"\x03").expect("type Ctrl-C");
    typed.flush().expect("flush");
    assert!(
        wait_until_gone(&pid, Duration::from_secs(10)),
        "Ctrl-C did not reach the command"
    );
    assert_eq!(
        wait_exit(&mut first, Duration::from_secs(15)).code(),
        Some(130)
    );
    drop(typed);
    let out = output(dlock(&url).args(["run", "--no-wait", "tty-interrupt", "--", "true"]));
    assert!(out.status.success(), "not released: {}", stderr(&out));
    let _ = std::fs::remove_dir_all(dir);
}

/// On a terminal, Ctrl-Z stops the command's group (in the foreground); dlock follows it
/// as a shell's job (stops too, or, with no shell to continue it — `script`'s session —
/// continues the group at once): the command is never left stopped with nobody to
/// continue it, and the run ends with its status.
#[test]
fn on_a_terminal_a_stopped_command_is_not_left_stopped() {
    let server = RedisServer::start().expect("redis-server");
    let url = server.url();
    let dir = scratch("tty-stop");
    let (pidfile, done) = (dir.join("pid"), dir.join("done"));
    let script = format!(
        "echo $$ > {}; sleep 2; echo done > {}",
        pidfile.display(),
        done.display()
    );
    let (mut first, shown) =
        on_a_terminal(&url, &["run", "tty-stop", "--", "sh", "-c", &script], &dir);
    wait_for_file(&pidfile, Duration::from_secs(10));
    let mut typed = first.stdin.take().expect("stdin");
    typed.write_all(b"\x1a").expect("type Ctrl-Z");
    typed.flush().expect("flush");
    let status = wait_exit(&mut first, Duration::from_secs(20));
    let shown = std::fs::read_to_string(shown).expect("terminal");
    assert!(status.success(), "{status:?}: {shown}");
    assert_eq!(wait_for_file(&done, Duration::from_secs(1)).trim(), "done");
    drop(typed);
    let _ = std::fs::remove_dir_all(dir);
}

/// dlock blocks SIGTTOU for itself (to write while the command has the terminal); the
/// command does not inherit that block.
#[test]
fn the_command_does_not_inherit_dlocks_blocked_sigttou() {
    let server = RedisServer::start().expect("redis-server");
    let out = output(dlock(&server.url()).args([
        "run",
        "sigmask",
        "--",
        "grep",
        "SigBlk",
        "/proc/self/status",
    ]));
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    let mask = text
        .split_whitespace()
        .nth(1)
        .and_then(|hex| u64::from_str_radix(hex, 16).ok())
        .expect("SigBlk");
    assert_eq!(mask & (1 << (22 - 1)), 0, "SIGTTOU blocked: {text}");
}

/// On a terminal with dlock's output piped into a pager-like reader of the terminal (in
/// dlock's process group), the reader keeps the terminal: the command's group is not
/// given the foreground from the start.
#[test]
fn on_a_terminal_a_reader_piped_after_dlock_keeps_the_terminal() {
    let server = RedisServer::start().expect("redis-server");
    let url = server.url();
    let dir = scratch("tty-pager");
    let got = dir.join("got");
    let reader = format!("read x < /dev/tty; echo \"$x\" > {}", got.display());
    let (mut first, shown) = on_a_terminal_then(
        &url,
        &["run", "tty-pager", "--", "sh", "-c", "echo hi; sleep 1"],
        &format!("sh -c {}", quoted(&reader)),
        &dir,
    );
    std::thread::sleep(Duration::from_millis(300));
    let mut typed = first.stdin.take().expect("stdin");
    typed.write_all(b"typed\n").expect("type");
    typed.flush().expect("flush");
    let status = wait_exit(&mut first, Duration::from_secs(20));
    let shown = std::fs::read_to_string(shown).expect("terminal");
    assert!(status.success(), "{status:?}: {shown}");
    assert_eq!(wait_for_file(&got, Duration::from_secs(1)).trim(), "typed");
    drop(typed);
    let _ = std::fs::remove_dir_all(dir);
}

/// On a terminal with dlock's output piped elsewhere, a command that reads the terminal
/// gets it once it tries to (it is stopped for reading from the background, given the
/// foreground, and continued).
#[test]
fn on_a_terminal_a_command_that_reads_it_gets_it_when_output_is_piped() {
    let server = RedisServer::start().expect("redis-server");
    let url = server.url();
    let dir = scratch("tty-reads");
    let got = dir.join("got");
    let script = format!("read x; echo \"$x\" > {}", got.display());
    let (mut first, shown) = on_a_terminal_then(
        &url,
        &["run", "tty-reads", "--", "sh", "-c", &script],
        "cat > /dev/null",
        &dir,
    );
    std::thread::sleep(Duration::from_millis(300));
    let mut typed = first.stdin.take().expect("stdin");
    typed.write_all(b"typed\n").expect("type");
    typed.flush().expect("flush");
    let status = wait_exit(&mut first, Duration::from_secs(20));
    let shown = std::fs::read_to_string(shown).expect("terminal");
    assert!(status.success(), "{status:?}: {shown}");
    assert_eq!(wait_for_file(&got, Duration::from_secs(1)).trim(), "typed");
    drop(typed);
    let _ = std::fs::remove_dir_all(dir);
}
