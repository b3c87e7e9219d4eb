//! Text another process put in the store reaches an operator's terminal only as plain
//! text: `dlock leader` (once and `--watch`) shows a candidate's `--value` with its control
//! characters made harmless.

use std::sync::mpsc;

use super::*;

/// A value that, printed raw, would clear the screen, retitle the window, go back to the
/// start of the line and fake a line of its own.
const HOSTILE: &str = "evil\x1b[2J\x1b]0;owned\x07\rterm 99: fake\nno leader\x1b[31m\u{9b}2J";

/// Whether `text` (one line of output, without its newline) could move the cursor,
/// restyle or retitle a terminal.
fn has_control(text: &str) -> bool {
    text.chars().any(char::is_control)
}

/// `dlock leader` prints the leader's value on one line, without a control character;
/// `--json` keeps the value exact.
#[test]
fn leader_shows_a_hostile_value_as_plain_text() {
    let server = RedisServer::start().expect("redis-server");
    let url = server.url();
    let dir = scratch("leader-text");
    let ready = dir.join("ready");
    let hold = format!("echo up > {}; sleep 30", ready.display());
    let mut elector = dlock(&url)
        .args([
            "elect", "--ttl", "5s", "--value", HOSTILE, "shown", "--", "sh", "-c", &hold,
        ])
        .spawn()
        .expect("spawn dlock elect");
    wait_for_file(&ready, Duration::from_secs(10));

    let out = output(dlock(&url).args(["leader", "shown"]));
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8(out.stdout).expect("utf-8");
    let line = text.strip_suffix('\n').expect("one line, ended");
    assert!(!has_control(line), "raw control characters: {line:?}");
    assert!(line.starts_with("term "), "{line:?}");
    assert!(line.contains("evil") && line.contains("fake"), "{line:?}");

    let out = output(dlock(&url).args(["leader", "--json", "shown"]));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(json["value"], HOSTILE, "JSON keeps the value exact");

    // --watch: the same value, as the first change it prints.
    let mut watch = dlock(&url)
        .args(["leader", "--watch", "shown"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn dlock leader --watch");
    let stdout = watch.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut out = BufReader::new(stdout);
        let mut line = Vec::new();
        // One line, bytes as written (a raw value would end it early at its `\n`).
        let _ = out.read_until(b'\n', &mut line);
        let _ = tx.send(line);
    });
    let line = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("--watch printed the leader");
    signal_term(watch.id());
    assert_eq!(
        wait_exit(&mut watch, Duration::from_secs(10)).code(),
        Some(128 + 15)
    );
    reader.join().expect("reader");
    let line = String::from_utf8(line).expect("utf-8");
    let line = line.strip_suffix('\n').expect("a whole line");
    assert!(!has_control(line), "raw control characters: {line:?}");
    assert!(
        line.starts_with("term ") && line.contains("evil"),
        "{line:?}"
    );

    signal_term(elector.id());
    wait_exit(&mut elector, Duration::from_secs(10));
    let _ = std::fs::remove_dir_all(dir);
}

fn signal_term(pid: u32) {
    let status = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
}

/// On `zk://`, `--ttl` is what bounds a crashed dlock: it is dlock's session timeout, so a
/// SIGKILLed `dlock run --ttl 3s` (no release, no renewal: its node lives as long as its
/// session) is replaced within the ttl plus a margin — not the 10 s default session. A
/// URL whose `?session_timeout=` is longer than `--ttl` is refused, saying why.
#[test]
fn on_zookeeper_ttl_bounds_a_sigkilled_holder() {
    let zk = dlock_test::zookeeper::ZooKeeper::shared();
    let url = zk.url("/dlock-cli-ttl", "");
    let dir = scratch("zk-ttl");
    let (started, child, next) = (dir.join("started"), dir.join("child"), dir.join("next"));
    let hold = format!(
        "echo $$ > {}; echo up > {}; exec sleep 60",
        child.display(),
        started.display()
    );
    let mut holder = dlock(&url)
        .args(["run", "--ttl", "3s", "crashy", "--", "sh", "-c", &hold])
        .spawn()
        .expect("spawn the holder");
    wait_for_file(&started, Duration::from_secs(20));
    let take = format!("echo got > {}", next.display());
    let mut waiter = dlock(&url)
        .args(["run", "--ttl", "3s", "crashy", "--", "sh", "-c", &take])
        .spawn()
        .expect("spawn the waiter");
    // The waiter queues behind the holder (its node is listed) before the holder dies.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = output(dlock(&url).args(["status", "--json", "crashy"]));
        let status: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        if status["waiting_clients"].as_u64().is_some_and(|n| n >= 1)
            || status["queued"].as_u64().is_some_and(|n| n >= 1)
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the waiter never queued: {status}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    holder.kill().expect("SIGKILL the holder's dlock");
    let killed = Instant::now();
    let _ = holder.wait();
    wait_for_file(&next, Duration::from_secs(30));
    let waited = killed.elapsed();
    assert!(wait_exit(&mut waiter, Duration::from_secs(10)).success());
    let orphan = std::fs::read_to_string(&child).expect("child pid");
    let _ = Command::new("kill").args(["-9", orphan.trim()]).status();
    // A liveness bound (the ttl, plus a margin for a busy machine), not a speed: the 10 s
    // default session it replaces is well outside it.
    assert!(
        waited < Duration::from_secs(3 + 4),
        "a SIGKILLed --ttl 3s holder was replaced only after {waited:?}"
    );

    let longer = zk.url("/dlock-cli-ttl", "?session_timeout=10s");
    let out = output(dlock(&longer).args(["run", "--ttl", "3s", "refused", "--", "true"]));
    assert_eq!(out.status.code(), Some(USAGE), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("session") && stderr(&out).contains("--ttl"),
        "{}",
        stderr(&out)
    );
    let out = output(dlock(&longer).args(["elect", "--ttl", "3s", "refused", "--", "true"]));
    assert_eq!(out.status.code(), Some(USAGE), "{}", stderr(&out));
    // As long as --ttl, or shorter: accepted.
    let out = output(dlock(&longer).args(["run", "--ttl", "10s", "fine", "--", "true"]));
    assert!(out.status.success(), "{}", stderr(&out));
    let _ = std::fs::remove_dir_all(dir);
}
