//! What the CLI tells its user, exactly: names shown so that they paste back into a shell,
//! the exit codes of a lock nobody holds and of a token that does not hold it, who holds a
//! lock on a conflict, the store client's errors with what dlock was doing and what to
//! check, and usage errors that say what to type instead. Each case is the real binary
//! against a real server of the test kit.

use std::process::Command;

use dlock_test::postgres::PostgresServer;
#[cfg(feature = "etcd")]
use dlock_test::server::EtcdCluster;
use dlock_test::server::{MemcachedServer, RedisServer, free_port};

use super::*;

/// `release` / `extend` under a token that does not hold the lock, another one does.
const NOT_OURS: i32 = 77;
/// Nobody holds the lock (`force-unlock`, `release`, `extend`).
const NOT_HELD: i32 = 79;

/// stderr without the warnings about the store's configuration (no AOF).
fn said(out: &Output) -> String {
    stderr(out)
        .lines()
        .filter(|l| !l.starts_with("dlock: warning: "))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Stops a `dlock run` as an operator would (SIGTERM: forwarded to its command, which
/// exits, then the lock is released) and waits for it.
fn stop(run: &mut std::process::Child) {
    let _ = Command::new("kill")
        .args(["-TERM", &run.id().to_string()])
        .status();
    wait_exit(run, Duration::from_secs(20));
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn status_json(url: &str, name: &str) -> serde_json::Value {
    let out = output(dlock(url).args(["status", "--json", "--", name]));
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_slice(&out.stdout).expect("json")
}

/// Takes `name` with `dlock acquire` and `extra` flags; returns its token.
fn acquire(url: &str, name: &str, extra: &[&str]) -> String {
    let out = output(
        dlock(url)
            .arg("acquire")
            .args(extra)
            .args(["--ttl", "1m", "--", name]),
    );
    assert!(out.status.success(), "acquire {name:?}: {}", stderr(&out));
    stdout(&out)
        .split_whitespace()
        .next()
        .expect("a token")
        .to_owned()
}

/// Who holds `name`, as `status --json` tells it: host and since.
fn holder(url: &str, name: &str) -> (String, String) {
    let s = status_json(url, name);
    let info = &s["holder_info"];
    (
        info["host"].as_str().expect("host").to_owned(),
        info["since"].as_str().expect("since").to_owned(),
    )
}

/// `list` shows each name as one shell word that bash reads back as the name itself, and
/// `force-unlock` of that word frees the real lock; `status` shows the name, its key and
/// nothing else with a control character; JSON has the names as they are.
#[test]
fn listed_names_paste_back_into_a_shell() {
    let server = RedisServer::start().expect("redis-server");
    let url = server.url();
    let names = ["it's", "my job", "new\nline", "plain-name", "a*b"];
    for name in names {
        acquire(&url, name, &[]);
    }
    let out = output(dlock(&url).args(["list"]));
    assert!(out.status.success(), "{}", stderr(&out));
    let table = stdout(&out);
    let shown: Vec<&str> = table
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().next().expect("a name"))
        .collect();
    assert_eq!(
        shown,
        [
            "'a*b'",
            "$'it\\'s'",
            "$'my\\x20job'",
            "$'new\\nline'",
            "plain-name"
        ],
        "{table}"
    );
    // Every row has its 9 columns: a name is one word.
    for line in table.lines().skip(1) {
        assert_eq!(line.split_whitespace().count(), 9, "{line}");
    }
    let out = output(dlock(&url).args(["list", "--json"]));
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let json: Vec<&str> = rows
        .as_array()
        .expect("rows")
        .iter()
        .map(|r| r["name"].as_str().expect("name"))
        .collect();
    assert_eq!(json, ["a*b", "it's", "my job", "new\nline", "plain-name"]);

    let out = output(dlock(&url).args(["status", "--", "new\nline"]));
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "name:            $'new\\nline'", "{text}");
    assert_eq!(lines[1], "key:             $'dlock:new\\nline'", "{text}");
    assert!(
        !text.chars().any(|c| c.is_control() && c != '\n'),
        "{text:?}"
    );
    assert_eq!(lines.len(), text.matches('\n').count());

    // Pasted into a shell as shown, each frees the real lock.
    let bin = env!("CARGO_BIN_EXE_dlock");
    for (word, name) in shown
        .iter()
        .zip(["a*b", "it's", "my job", "new\nline", "plain-name"])
    {
        let out = output(
            Command::new("bash")
                .args(["-c", &format!("{bin} force-unlock --yes -- {word}")])
                .env("DLOCK_URL", &url)
                .stdin(std::process::Stdio::null()),
        );
        assert!(out.status.success(), "{word}: {}", stderr(&out));
        assert_eq!(
            said(&out),
            format!("dlock: {word} force-unlocked"),
            "{word}"
        );
        assert_eq!(status_json(&url, name)["held"], false, "{word}");
    }
}

/// `force-unlock` and `release` of a lock nobody holds exit 79, saying so.
#[test]
fn a_lock_nobody_holds_is_exit_79() {
    let server = RedisServer::start().expect("redis-server");
    let url = server.url();
    let out = output(dlock(&url).args(["force-unlock", "--yes", "my_job"]));
    assert_eq!(out.status.code(), Some(NOT_HELD), "{}", stderr(&out));
    assert_eq!(
        said(&out),
        "dlock: my_job is not held: nothing to force-unlock (dlock list shows the held \
         locks, each name as it pastes back into a shell)"
    );
    let out = output(dlock(&url).args(["force-unlock", "--yes", "--kind", "semaphore", "slots"]));
    assert_eq!(out.status.code(), Some(NOT_HELD), "{}", stderr(&out));
    assert_eq!(
        said(&out),
        "dlock: slots is not held as a semaphore: nothing to force-unlock (dlock list shows \
         the held locks, each name as it pastes back into a shell)"
    );
    let token = acquire(&url, "done", &[]);
    let out = output(dlock(&url).args(["release", "done", "--token", &token]));
    assert!(out.status.success(), "{}", stderr(&out));
    let out = output(dlock(&url).args(["release", "done", "--token", &token]));
    assert_eq!(out.status.code(), Some(NOT_HELD), "{}", stderr(&out));
    assert_eq!(
        said(&out),
        "dlock: done is not held, under this token or any other: nothing to release; if this \
         token held it, its lease ran out or it was force-unlocked"
    );
    let out = output(dlock(&url).args(["extend", "done", "--token", &token, "--ttl", "5s"]));
    assert_eq!(out.status.code(), Some(NOT_HELD), "{}", stderr(&out));
    assert_eq!(
        said(&out),
        "dlock: done is not held, under this token or any other: nothing to extend; if this \
         token held it, its lease ran out or it was force-unlocked"
    );
}

/// `extend` / `release` under a token that does not hold the lock, which another one
/// does: exit 77, naming the holder; not "lock lost".
#[test]
fn a_token_that_does_not_hold_the_lock_is_exit_77() {
    let server = RedisServer::start().expect("redis-server");
    let url = server.url();
    acquire(&url, "busy", &["--info", "nightly report"]);
    let (host, since) = holder(&url, "busy");
    let pid = std::process::id();
    let by = format!("host {host}, pid {pid}, command \"nightly report\", since {since}");
    let out = output(dlock(&url).args(["extend", "busy", "--token", "WRONG", "--ttl", "10s"]));
    assert_eq!(out.status.code(), Some(NOT_OURS), "{}", stderr(&out));
    assert_eq!(
        said(&out),
        format!(
            "dlock: busy is held under another token, by {by}: not extended; if this token \
             held it, its lease ran out and another holder took the lock"
        )
    );
    let out = output(dlock(&url).args(["release", "busy", "--token", "WRONG"]));
    assert_eq!(out.status.code(), Some(NOT_OURS), "{}", stderr(&out));
    assert_eq!(
        said(&out),
        format!(
            "dlock: busy is held under another token, by {by}: not released; if this token \
             held it, its lease ran out and another holder took the lock"
        )
    );
    assert_eq!(status_json(&url, "busy")["held"], true);
}

/// A conflict (`--no-wait`, `--wait` ran out) says who holds the lock, as `status` knows
/// it, and what to do.
#[test]
fn a_conflict_says_who_holds_the_lock() {
    let server = RedisServer::start().expect("redis-server");
    let url = server.url();
    acquire(&url, "my job", &["--info", "nightly report"]);
    let (host, since) = holder(&url, "my job");
    let pid = std::process::id();
    let by = format!("host {host}, pid {pid}, command \"nightly report\", since {since}");
    let no_wait = format!(
        "dlock: $'my\\x20job' is held by {by}: not waiting (--no-wait); --wait D waits up to \
         D for it"
    );
    let out = output(dlock(&url).args(["run", "--no-wait", "my job", "--", "true"]));
    assert_eq!(out.status.code(), Some(CONFLICT), "{}", stderr(&out));
    assert_eq!(said(&out), no_wait);
    let out = output(dlock(&url).args(["acquire", "-n", "my job"]));
    assert_eq!(out.status.code(), Some(CONFLICT), "{}", stderr(&out));
    assert_eq!(said(&out), no_wait);
    let out = output(dlock(&url).args(["run", "--wait", "300ms", "my job", "--", "true"]));
    assert_eq!(out.status.code(), Some(CONFLICT), "{}", stderr(&out));
    assert_eq!(
        said(&out),
        format!(
            "dlock: $'my\\x20job' is still held after --wait 300ms, by {by}: a longer --wait \
             waits longer, and without --wait dlock waits until it is free"
        )
    );
    // A full semaphore: its holders.
    let mut slot = dlock(&url)
        .args(["run", "--semaphore", "1", "slots", "--", "sleep", "30"])
        .spawn()
        .expect("spawn dlock run");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = output(dlock(&url).args(["status", "--json", "--kind", "semaphore", "slots"]));
        let s: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        if s["held"] == true {
            break;
        }
        assert!(Instant::now() < deadline, "never held: {s}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = output(dlock(&url).args(["run", "--semaphore", "1", "-n", "slots", "--", "true"]));
    assert_eq!(out.status.code(), Some(CONFLICT), "{}", stderr(&out));
    assert_eq!(
        said(&out),
        "dlock: every permit of semaphore slots is taken by 1 holder: not waiting (--no-wait); \
         --wait D waits up to D for it"
    );
    stop(&mut slot);
    // A holder that told nothing: its abbreviated token.
    let token = acquire(&url, "quiet", &["--no-info"]);
    let out = output(dlock(&url).args(["run", "-n", "quiet", "--", "true"]));
    assert_eq!(out.status.code(), Some(CONFLICT), "{}", stderr(&out));
    assert_eq!(
        said(&out),
        format!(
            "dlock: quiet is held by token {}… (a holder that told nothing about itself): not \
             waiting (--no-wait); --wait D waits up to D for it",
            &token[..8]
        )
    );
}

/// A Redis URL at a server that is not Redis (memcached): what dlock was doing, what the
/// client said, and what to check.
#[test]
fn a_redis_url_at_another_server_says_so() {
    let mc = MemcachedServer::start().expect("memcached");
    let port = mc.port();
    let out = output(dlock(&format!("redis://127.0.0.1:{port}")).args(["status", "x"]));
    assert_eq!(out.status.code(), Some(UNAVAILABLE), "{}", stderr(&out));
    assert_eq!(
        said(&out),
        format!(
            "dlock: backend error: connecting to redis at 127.0.0.1:{port}: Incompatible type - \
             Parse error at 1 Unexpected `82` Unexpected `69`: the server there does not answer \
             as Redis does: check that the host and port are a Redis server's (not \
             memcached's, an HTTP server's or another service's)"
        )
    );
}

/// `rediss://` at a server without TLS says that rediss:// is TLS.
#[test]
fn rediss_at_a_plain_server_says_tls() {
    let server = RedisServer::start().expect("redis-server");
    let port = server.port();
    let out = output(dlock(&format!("rediss://127.0.0.1:{port}")).args(["status", "x"]));
    assert_eq!(out.status.code(), Some(UNAVAILABLE), "{}", stderr(&out));
    let text = said(&out);
    assert!(
        text.starts_with(&format!("dlock: connecting to rediss://127.0.0.1:{port}: ")),
        "{text}"
    );
    assert!(
        text.ends_with(
            ": rediss:// connects with TLS: check that the port is one where the server takes \
             TLS (Redis's tls-port); a server without TLS is redis://"
        ),
        "{text}"
    );
}

/// PostgreSQL: a refused connection and a wrong password each say why, and what to check.
#[test]
fn postgres_connect_failures_say_why() {
    let port = free_port().expect("port");
    let out = output(
        dlock(&format!("postgres://app:s3cret@127.0.0.1:{port}/postgres")).args(["status", "x"]),
    );
    assert_eq!(out.status.code(), Some(UNAVAILABLE), "{}", stderr(&out));
    assert_eq!(
        said(&out),
        format!(
            "dlock: backend unavailable: connecting to postgres://app:***@127.0.0.1:{port}/postgres: \
             preparing dlock's table: error connecting to server: Connection refused (os error \
             111): nothing listens there: is the server running, and are the host and port right?"
        )
    );
    let pg = PostgresServer::start().expect("postgres");
    let port = pg.port();
    let out = output(dlock(&pg.url_as("postgres", "wrong-password")).args(["status", "x"]));
    assert_eq!(out.status.code(), Some(UNAVAILABLE), "{}", stderr(&out));
    assert_eq!(
        said(&out),
        format!(
            "dlock: backend error: connecting to postgres://postgres:***@127.0.0.1:{port}/postgres: \
             preparing dlock's table: authentication failed: password authentication failed \
             for user \"postgres\": check the user name and password in the URL"
        )
    );
}

/// etcd without a majority of its members, and an etcd URL at a port that is not etcd's:
/// one line in words (no debug dump of the client's errors), and what to check.
#[cfg(feature = "etcd")]
#[test]
fn etcd_failures_are_words_and_a_hint() {
    let mut etcd = EtcdCluster::start(3).expect("etcd");
    let url = etcd.url();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !output(dlock(&url).args(["status", "ready"]))
        .status
        .success()
    {
        assert!(Instant::now() < deadline, "etcd never answered");
        std::thread::sleep(Duration::from_millis(200));
    }
    let first = etcd.members[0].addr();
    etcd.members[1].kill();
    etcd.members[2].kill();
    let out = output(dlock(&format!("etcd://{first}")).args(["status", "x"]));
    assert_eq!(out.status.code(), Some(UNAVAILABLE), "{}", stderr(&out));
    let text = said(&out);
    assert!(
        !text.contains("tonic") && !text.contains("source:"),
        "{text}"
    );
    assert_eq!(
        text,
        format!(
            "dlock: connecting to etcd://{first}: timed out: reaching etcd: etcd did not answer \
             in time: is it an etcd client port (2379 by default), and is a majority of the \
             cluster's members up? Without one, etcd answers nothing"
        )
    );
    let redis = RedisServer::start().expect("redis-server");
    let port = redis.port();
    let out = output(dlock(&format!("etcd://127.0.0.1:{port}")).args(["status", "x"]));
    assert_eq!(out.status.code(), Some(UNAVAILABLE), "{}", stderr(&out));
    // etcd's client sees Redis's reply as a broken HTTP/2 frame, or the connection closed
    // before that (Redis hangs up on what is not its protocol): either, and what to check.
    let hint = "the server there does not answer as etcd does: check that the port is an \
                etcd client port (2379 by default)";
    let saw = said(&out);
    assert!(
        [
            format!(
                "dlock: connecting to etcd://127.0.0.1:{port}: backend error: reaching etcd: \
                 Internal error: h2 protocol error: http2 error: connection error detected: \
                 frame with invalid size: {hint}"
            ),
            format!(
                "dlock: connecting to etcd://127.0.0.1:{port}: timed out: reaching etcd: The \
                 operation was cancelled: operation was canceled: connection closed: {hint}"
            ),
        ]
        .contains(&saw),
        "{saw}"
    );
}

/// Usage errors that say what to type instead: a --ttl over the longest lease (run and
/// elect renew; acquire's lease is extended by hand), --wait 0, a command without `--`.
#[test]
fn usage_errors_say_what_to_type() {
    let url = "redis://127.0.0.1:1";
    let cases: [(&[&str], String); 6] = [
        (
            &["hold", "--ttl", "48h", "x"],
            "dlock: invalid value '48h' for '--ttl <TTL>': at most 24h (the longest lease); the \
             lease is renewed every third of --ttl for as long as dlock hold runs, so the lock \
             is held however long that takes: --ttl is only how long the lock outlives a dlock \
             that crashed (default 30s) (see dlock --help)"
                .to_owned(),
        ),
        (
            &["run", "--ttl", "48h", "x", "--", "true"],
            "dlock: invalid value '48h' for '--ttl <TTL>': at most 24h (the longest lease); the \
             lease is renewed every third of --ttl for as long as the command runs, so the lock \
             is held however long that takes: --ttl is only how long the lock outlives a dlock \
             that crashed (default 30s) (see dlock --help)"
                .to_owned(),
        ),
        (
            &["acquire", "--ttl", "48h", "x"],
            "dlock: invalid value '48h' for '--ttl <TTL>': at most 24h (the longest lease); \
             nothing renews this lease: extend it before it ends (dlock extend NAME --token \
             TOKEN --ttl D), or hold the lock with dlock run, which renews it while its command \
             runs (see dlock --help)"
                .to_owned(),
        ),
        (
            &["run", "--wait", "0", "x", "--", "true"],
            "dlock: invalid value '0' for '--wait <WAIT>': 0 does not wait: use --no-wait (-n) \
             to give up at once when the lock is held (see dlock --help)"
                .to_owned(),
        ),
        (
            &["run", "x", "true"],
            "dlock: unexpected argument 'true' found: the command goes after --, as in: dlock \
             run [OPTIONS] <NAME> -- <COMMAND>... (see dlock run --help)"
                .to_owned(),
        ),
        (
            &["elect", "x", "./scheduler", "--flag"],
            "dlock: unexpected argument './scheduler' found: the command goes after --, as in: \
             dlock elect [OPTIONS] <NAME> -- <COMMAND>... (see dlock elect --help)"
                .to_owned(),
        ),
    ];
    for (args, expected) in cases {
        let out = output(dlock(url).args(args));
        assert_eq!(out.status.code(), Some(USAGE), "{args:?}: {}", stderr(&out));
        assert_eq!(said(&out), expected, "{args:?}");
    }
}

/// Advisory mode: `status` names the holder a PostgreSQL session and its pid the backend's
/// (a server process), not a process of the holder's; JSON has it as `backend_pid`.
#[test]
fn advisory_status_labels_the_backend_pid() {
    let pg = PostgresServer::start().expect("postgres");
    let advisory = format!("{}?mode=advisory", pg.url());
    let mut run = dlock(&advisory)
        .args(["run", "in-a-session", "--", "sleep", "30"])
        .spawn()
        .expect("spawn dlock run");
    let deadline = Instant::now() + Duration::from_secs(20);
    let s = loop {
        let s = status_json(&advisory, "in-a-session");
        if s["held"] == true {
            break s;
        }
        assert!(Instant::now() < deadline, "never held: {s}");
        std::thread::sleep(Duration::from_millis(50));
    };
    let backend = s["backend_pid"].as_u64().expect("backend_pid");
    assert_eq!(s["holder"], format!("pid {backend}"), "{s}");
    assert_ne!(u64::from(run.id()), backend, "dlock's own pid");
    let out = output(dlock(&advisory).args(["status", "in-a-session"]));
    let text = stdout(&out);
    let held = text
        .lines()
        .find(|l| l.starts_with("held:"))
        .unwrap_or_else(|| panic!("{text}"));
    assert_eq!(
        held,
        format!("held:            yes, by a PostgreSQL session, backend pid {backend}"),
        "{text}"
    );
    stop(&mut run);
}

/// A reader that closes the pipe early (`dlock list | head -1`) ends dlock quietly with
/// SIGPIPE's status, 141, as it ends a C tool — not with a panic message.
#[test]
fn a_closed_stdout_ends_dlock_quietly() {
    use std::process::Stdio;
    let server = RedisServer::start().expect("redis-server");
    let url = server.url();
    acquire(&url, "held", &[]);
    // clap_complete's write, and println! in `list`.
    for args in [&["completions", "bash"][..], &["list"][..]] {
        // A pipe whose reader is gone before dlock starts: its first write fails.
        let (reader, writer) = std::io::pipe().expect("a pipe");
        drop(reader);
        let out = dlock(&url)
            .args(args)
            .stdout(writer)
            .stderr(Stdio::piped())
            .output()
            .expect("dlock runs");
        assert_eq!(out.status.code(), Some(141), "{args:?}: {}", stderr(&out));
        assert_eq!(stderr(&out), "", "{args:?}: nothing on stderr");
    }
}
