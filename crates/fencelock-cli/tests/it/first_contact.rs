//! What a new user meets first: `dlock leader --watch` reporting an empty seat, `--prefix`
//! defaults that are true and a `--prefix` used as given, a default store, and `dlock hold`
//! for shell scripts.

use std::io::{BufRead, BufReader, Read};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant, SystemTime};

use dlock_test::server::RedisServer;

use crate::{
    CONFLICT, LOST, UNAVAILABLE, dlock, output, scratch, stderr, wait_exit, wait_for_file,
};

/// The lines a child prints, read on a thread, so that waiting for one is bounded.
struct Lines(Receiver<String>);

impl Lines {
    fn of(child: &mut Child) -> Lines {
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Lines(rx)
    }

    /// The next line, within `within`.
    fn next(&self, within: Duration, what: &str) -> String {
        self.0
            .recv_timeout(within)
            .unwrap_or_else(|e| panic!("no line for {what} within {within:?}: {e}"))
    }
}

/// A child killed (SIGKILL) and reaped when dropped: a failed test leaves no process
/// behind.
struct Reaped(Child);

impl std::ops::Deref for Reaped {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for Reaped {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn signal(sig: &str, pid: u32) {
    let status = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
}

/// `dlock status --json` of `name` (with `extra` flags), parsed.
fn status(url: &str, name: &str, extra: &[&str]) -> serde_json::Value {
    let out = output(dlock(url).args(["status", "--json", name]).args(extra));
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_slice(&out.stdout).expect("status JSON")
}

/// Waits (bounded) until `name`'s plain lock is held or free, as `held` says.
fn until_held(url: &str, name: &str, held: bool, within: Duration) {
    let deadline = Instant::now() + within;
    while status(url, name, &[])["held"] != held {
        assert!(
            Instant::now() < deadline,
            "{name} not {} within {within:?}",
            if held { "held" } else { "released" }
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `--watch` says when the seat empties — at once when the leader resigns, with the term
/// that ended and since when — as a line of text, and as JSON.
#[test]
fn leader_watch_reports_the_empty_seat() {
    let server = RedisServer::start().expect("redis-server");
    let url = server.url();
    for json in [false, true] {
        let name = if json { "seat-json" } else { "seat-text" };
        let mut watch = Reaped(
            dlock(&url)
                .args(["leader", "--watch", name])
                .args(json.then_some("--json"))
                .stdout(Stdio::piped())
                .spawn()
                .expect("spawn watch"),
        );
        let lines = Lines::of(&mut watch);
        let quick = Duration::from_secs(10);
        let first = lines.next(quick, "the seat at the start");
        if json {
            assert_eq!(first, format!(r#"{{"name":"{name}","leader":false}}"#));
        } else {
            assert_eq!(first, "no leader");
        }
        // A leader whose command ends at once: it resigns (its lease is 30 s: only the
        // resignation's announcement can tell the watch in time).
        let before = SystemTime::now();
        let out = output(dlock(&url).args(["elect", "--value", "host-a:1", name, "--", "true"]));
        let after = SystemTime::now();
        assert!(out.status.success(), "{}", stderr(&out));
        let led = lines.next(quick, "the leader");
        let gone = lines.next(quick, "the resignation");
        let since = if json {
            assert_eq!(
                led,
                format!(r#"{{"name":"{name}","leader":true,"term":1,"value":"host-a:1"}}"#)
            );
            let gone: serde_json::Value = serde_json::from_str(&gone).expect("JSON");
            assert_eq!(gone["name"], name);
            assert_eq!(gone["leader"], false);
            assert_eq!(gone["last_term"], 1);
            let ms = gone["since_ms"].as_u64().expect("since_ms");
            let since = gone["since"].as_str().expect("since").to_owned();
            let at = humantime::parse_rfc3339(&since).expect("RFC 3339");
            let at_ms = at
                .duration_since(SystemTime::UNIX_EPOCH)
                .expect("after 1970")
                .as_millis();
            assert_eq!(u128::from(ms) / 1000, at_ms / 1000, "{gone}");
            since
        } else {
            assert_eq!(led, "term 1: host-a:1");
            let rest = gone
                .strip_prefix("no leader (last term 1, since ")
                .and_then(|r| r.strip_suffix(')'))
                .unwrap_or_else(|| panic!("{gone:?}"));
            rest.to_owned()
        };
        let at = humantime::parse_rfc3339(&since).expect("RFC 3339");
        let second = Duration::from_secs(1);
        assert!(
            at + second >= before && at <= after,
            "since {since}: resigned between {before:?} and {after:?}"
        );
        signal("-TERM", watch.id());
        assert_eq!(wait_exit(&mut watch, quick).code(), Some(128 + 15));
    }
}

/// `--help` states each command's true default prefix.
#[test]
fn help_states_each_commands_default_prefix() {
    let help = |args: &[&str]| {
        let out = output(Command::new(env!("CARGO_BIN_EXE_dlock")).args(args));
        assert!(out.status.success(), "{}", stderr(&out));
        // Wrapped lines joined again.
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    let election = format!(
        "--prefix <PREFIX> Key prefix of the election, used as given [default: {}]",
        fencelock::DEFAULT_ELECTION_PREFIX
    );
    for command in ["elect", "leader"] {
        let text = help(&[command, "--help"]);
        assert!(text.contains(&election), "{command}: {text}");
        assert!(!text.contains("[default: dlock:]"), "{command}: {text}");
    }
    let by_kind = format!(
        "--prefix <PREFIX> Key prefix of NAME, used as given [default: the --kind's own: {} \
         (lock), {} (semaphore), {} (reentrant), {} (rwlock), {} (fair)]",
        fencelock::keys::DEFAULT_PREFIX,
        fencelock::DEFAULT_SEMAPHORE_PREFIX,
        fencelock::DEFAULT_REENTRANT_PREFIX,
        fencelock::DEFAULT_RWLOCK_PREFIX,
        fencelock::DEFAULT_FAIR_PREFIX,
    );
    for command in ["status", "force-unlock"] {
        let text = help(&[command, "--help"]);
        assert!(text.contains(&by_kind), "{command}: {text}");
    }
    let text = help(&["run", "--help"]);
    assert!(
        text.contains(
            "--prefix <PREFIX> Key prefix of the lock, used as given [default: dlock:, or the \
             kind's own: dlock-sem: (--semaphore), dlock-rw: (--shared, --exclusive), \
             dlock-fair: (--fair)]"
        ),
        "{text}"
    );
    let text = help(&["set-permits", "--help"]);
    assert!(
        text.contains("Key prefix of the semaphore, used as given [default: dlock-sem:]"),
        "{text}"
    );
    for command in ["acquire", "hold", "release"] {
        let text = help(&[command, "--help"]);
        assert!(
            text.contains("Key prefix of the lock, used as given [default: dlock:]"),
            "{command}: {text}"
        );
    }
}

/// An explicit `--prefix dlock:` (the plain lock's default) is used as given by the
/// commands whose own default differs: `elect`/`leader`, `run --fair`, `status --kind`.
#[test]
fn an_explicit_prefix_is_used_as_given() {
    let server = RedisServer::start().expect("redis-server");
    let url = server.url();
    let dir = scratch("prefix");
    let seen = dir.join("seen");
    // While leading under dlock:, the election's lock is the key dlock:NAME (what a plain
    // lock's status reads), and `leader --prefix dlock:` sees the leader.
    let script = format!(
        "\"$0\" status --json chosen > {0}.status; \"$0\" leader --prefix dlock: chosen > \
         {0}.leader; \"$0\" leader chosen > {0}.default",
        seen.display()
    );
    let dlock_bin = env!("CARGO_BIN_EXE_dlock");
    let out = output(dlock(&url).args([
        "elect", "--prefix", "dlock:", "--value", "v", "chosen", "--", "sh", "-c", &script,
        dlock_bin,
    ]));
    assert!(out.status.success(), "{}", stderr(&out));
    let read = |ext: &str| {
        std::fs::read_to_string(dir.join(format!("seen.{ext}"))).expect("written by the command")
    };
    let status: serde_json::Value = serde_json::from_str(&read("status")).expect("JSON");
    assert_eq!(status["key"], "dlock:chosen");
    assert_eq!(status["held"], true, "{status}");
    assert_eq!(read("leader"), "term 1: v\n");
    assert_eq!(
        read("default"),
        "no leader\n",
        "the default prefix is another election"
    );

    // `run --fair --prefix dlock:` takes the fair lock at dlock:NAME; `status --kind fair
    // --prefix dlock:` reads it there.
    let script = format!(
        "\"$0\" status --json --kind fair --prefix dlock: fairly > {}",
        seen.display()
    );
    let out = output(dlock(&url).args([
        "run", "--fair", "--prefix", "dlock:", "fairly", "--", "sh", "-c", &script, dlock_bin,
    ]));
    assert!(out.status.success(), "{}", stderr(&out));
    let status: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&seen).expect("status")).expect("JSON");
    assert_eq!(status["key"], "dlock:fairly");
    assert_eq!(status["held"], true, "{status}");
    // And without --prefix, each kind's own default.
    let status = status_of_kind(&url, "fairly", "semaphore");
    assert_eq!(status["key"], "dlock-sem:fairly");
    let _ = std::fs::remove_dir_all(dir);
}

fn status_of_kind(url: &str, name: &str, kind: &str) -> serde_json::Value {
    status(url, name, &["--kind", kind])
}

/// The port of the default store, `redis://127.0.0.1:6379`.
const DEFAULT_PORT: u16 = 6379;

/// Without `--url` and `DLOCK_URL`, dlock uses a Redis server on this machine: the error
/// when none answers there names that default and how to name another store; with one
/// there, commands use it. `--help` says so.
#[test]
fn without_a_url_the_store_is_the_local_redis() {
    // Not skipped when the port is taken: a test that passes without testing anything
    // would hide a broken default. (.ci/run makes sure the port is free.)
    assert!(
        TcpStream::connect(("127.0.0.1", DEFAULT_PORT)).is_err(),
        "something listens on 127.0.0.1:{DEFAULT_PORT} (the default store's port): this test \
         needs it free, to see the error with nothing there, then to start a Redis server of \
         its own there; stop the server on that port (e.g. `systemctl stop redis-server`) and \
         run the test again"
    );
    let no_url = || {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_dlock"));
        cmd.env_remove("DLOCK_URL").stdin(Stdio::null());
        cmd
    };
    let out = output(no_url().args(["status", "local"]));
    assert_eq!(out.status.code(), Some(UNAVAILABLE), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.starts_with(
            "dlock: no store named (neither --url nor DLOCK_URL is set), and the default, \
             redis://127.0.0.1:6379, failed: "
        ),
        "{err}"
    );
    assert!(
        err.ends_with(
            "; start Redis there, or name the store with --url or DLOCK_URL (e.g. --url \
             redis://host:6379, etcd://host:2379)\n"
        ),
        "{err}"
    );
    // An empty DLOCK_URL (a variable that was meant to be set) is refused, not the default.
    let out = output(no_url().env("DLOCK_URL", "").args(["status", "local"]));
    assert_eq!(out.status.code(), Some(crate::USAGE), "{}", stderr(&out));
    assert_eq!(
        stderr(&out),
        "dlock: empty --url or DLOCK_URL: name a store, or leave both unset for the default, \
         redis://127.0.0.1:6379\n"
    );

    let help = output(no_url().args(["status", "--help"]));
    let help = String::from_utf8_lossy(&help.stdout)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    assert!(
        help.contains(
            "Without --url and DLOCK_URL: redis://127.0.0.1:6379, a Redis server on this \
             machine (an empty one is refused) [env: DLOCK_URL]"
        ),
        "{help}"
    );

    // A Redis server there: used.
    let mut local = Command::new("redis-server")
        .args(["--port", &DEFAULT_PORT.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-server");
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", DEFAULT_PORT)).is_err() {
        assert!(Instant::now() < deadline, "redis-server did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = output(no_url().args(["acquire", "--ttl", "1m", "local"]));
    let err = stderr(&out);
    let held = status(&format!("redis://127.0.0.1:{DEFAULT_PORT}"), "local", &[]);
    let _ = local.kill();
    let _ = local.wait();
    assert!(out.status.success(), "{err}");
    assert_eq!(held["held"], true, "{held}");
}

/// `dlock hold`: `TOKEN FENCE` once held, held (renewed) while it runs, released at
/// SIGTERM (exit 0); a second hold conflicts.
#[test]
fn hold_prints_token_and_fence_holds_and_releases_on_sigterm() {
    let server = RedisServer::start().expect("redis-server");
    let url = server.url();
    let mut hold = Reaped(
        dlock(&url)
            .args(["hold", "--ttl", "3s", "script-lock"])
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn hold"),
    );
    let lines = Lines::of(&mut hold);
    let line = lines.next(Duration::from_secs(10), "TOKEN FENCE");
    let (token, fence) = line.split_once(' ').expect("TOKEN FENCE");
    assert_eq!(fence, "1");
    let seen = status(&url, "script-lock", &[]);
    assert_eq!(seen["held"], true);
    assert_eq!(
        seen["holder_info"]["pid"],
        hold.id(),
        "the holder is dlock hold: kill it to release"
    );
    let shown = seen["holder"].as_str().expect("holder");
    assert!(
        token.starts_with(shown.trim_end_matches('…')),
        "{token} {shown}"
    );
    // Renewed: still held after more than a lease.
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(status(&url, "script-lock", &[])["held"], true);
    let other = output(dlock(&url).args(["hold", "--no-wait", "script-lock"]));
    assert_eq!(other.status.code(), Some(CONFLICT), "{}", stderr(&other));
    // Who holds it, as `dlock run` and `dlock acquire` say.
    let expected = format!(
        "dlock: script-lock is held by host {}, pid {}, since ",
        seen["holder_info"]["host"].as_str().expect("host"),
        hold.id()
    );
    let err = stderr(&other);
    assert!(err.contains(&expected), "{err}");
    assert!(
        err.ends_with(": not waiting (--no-wait); --wait D waits up to D for it\n"),
        "{err}"
    );
    signal("-TERM", hold.id());
    assert_eq!(
        wait_exit(&mut hold, Duration::from_secs(10)).code(),
        Some(0)
    );
    assert_eq!(
        status(&url, "script-lock", &[])["held"],
        false,
        "released on exit"
    );
    // --json: the same as `dlock acquire --json`.
    let mut hold = Reaped(
        dlock(&url)
            .args(["hold", "--json", "script-lock"])
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn hold"),
    );
    let lines = Lines::of(&mut hold);
    let line = lines.next(Duration::from_secs(10), "JSON");
    let held: serde_json::Value = serde_json::from_str(&line).expect("JSON");
    assert_eq!(held["key"], "dlock:script-lock");
    // Above the first hold's (a refused attempt in between may have taken a number: on
    // Redis a free lock's grant mints its fence in the same transaction as the SET, which
    // counts even when the SET finds the lock held).
    assert!(held["fence"].as_u64().is_some_and(|f| f > 1), "{held}");
    assert_eq!(held["ttl_ms"], 30_000);
    signal("-INT", hold.id());
    assert_eq!(
        wait_exit(&mut hold, Duration::from_secs(10)).code(),
        Some(0)
    );
}

/// `dlock hold` started by a script releases the lock when the script exits.
#[test]
fn hold_releases_when_its_parent_exits() {
    let server = RedisServer::start().expect("redis-server");
    let url = server.url();
    let dir = scratch("hold-parent");
    let (held, go) = (dir.join("held"), dir.join("go"));
    let script = format!(
        "\"$0\" hold parent-lock > {} & while [ ! -e {} ]; do sleep 0.05; done",
        held.display(),
        go.display()
    );
    // The script's loop ends once `go` exists (also when the test fails: dropped), and
    // then dlock hold's parent is gone.
    struct Go(std::path::PathBuf);
    impl Drop for Go {
        fn drop(&mut self) {
            let _ = std::fs::write(&self.0, "");
        }
    }
    let go_on_drop = Go(go.clone());
    let mut parent = Reaped(
        Command::new("sh")
            .env("DLOCK_URL", &url)
            .args(["-c", &script, env!("CARGO_BIN_EXE_dlock")])
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn the script"),
    );
    let line = wait_for_file(&held, Duration::from_secs(10));
    assert!(line.ends_with(" 1\n"), "{line:?}");
    assert_eq!(status(&url, "parent-lock", &[])["held"], true);
    drop(go_on_drop);
    assert!(wait_exit(&mut parent, Duration::from_secs(10)).success());
    until_held(&url, "parent-lock", false, Duration::from_secs(10));
    let _ = std::fs::remove_dir_all(dir);
}

/// A lock lost while `dlock hold` holds it (deleted behind its back): exit 76 at once,
/// saying so.
#[test]
fn hold_exits_with_the_lost_code_when_the_lock_is_lost() {
    let server = RedisServer::start().expect("redis-server");
    let url = server.url();
    let mut hold = Reaped(
        dlock(&url)
            .args(["hold", "--ttl", "3s", "lost-lock"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn hold"),
    );
    let lines = Lines::of(&mut hold);
    lines.next(Duration::from_secs(10), "TOKEN FENCE");
    let deleted = Command::new("redis-cli")
        .args(["-p", &server.port().to_string(), "DEL", "dlock:lost-lock"])
        .output()
        .expect("redis-cli");
    assert_eq!(String::from_utf8_lossy(&deleted.stdout).trim(), "1");
    let status = wait_exit(&mut hold, Duration::from_secs(10));
    assert_eq!(status.code(), Some(LOST));
    let mut err = String::new();
    hold.stderr
        .take()
        .expect("piped")
        .read_to_string(&mut err)
        .expect("stderr");
    assert!(
        err.ends_with(
            "dlock: lock \"lost-lock\" lost while held (deleted, force-unlocked, or not \
             renewed in time): another process may hold it now\n"
        ),
        "{err}"
    );
}
