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
    assert!(line.starts_with("term ") && line.contains("evil"), "{line:?}");

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
