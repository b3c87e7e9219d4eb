//! The same name under two kinds with a `--prefix` of the user's: every kind of the name
//! then has the same lock key, so `dlock run`'s check of the other kinds looks under that
//! prefix, does not take the run's own hold there for another kind's, and still sees a
//! read-write lock's readers (kept beside the key), which a plain run does not exclude.

use super::*;

fn status_json(url: &str, prefix: &str, kind: &str, name: &str) -> serde_json::Value {
    let out =
        output(dlock(url).args(["status", "--json", "--prefix", prefix, "--kind", kind, name]));
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_slice(&out.stdout).expect("json")
}

fn other_kinds_are_checked_under_the_given_prefix(url: &str) {
    let (prefix, name) = ("app:", "report");
    // Alone: its own hold is not another kind's.
    let out = output(dlock(url).args(["run", "--prefix", prefix, name, "--", "true"]));
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        !stderr(&out).contains("also held") && !stderr(&out).contains("not checked"),
        "{}",
        stderr(&out)
    );
    // A reader holds the read-write lock of the name under the same prefix.
    let mut reader = dlock(url)
        .args([
            "run", "--prefix", prefix, "--shared", name, "--", "sleep", "30",
        ])
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the reader");
    let deadline = Instant::now() + Duration::from_secs(20);
    while status_json(url, prefix, "rwlock", name)["held"] != true {
        assert!(Instant::now() < deadline, "the reader never held {name}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = output(dlock(url).args(["run", "--prefix", prefix, name, "--", "true"]));
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(&format!("{name:?} is also held as a read-write lock")),
        "no warning: {}",
        stderr(&out)
    );
    let out = output(dlock(url).args([
        "run",
        "--prefix",
        prefix,
        "--refuse-other-kinds",
        name,
        "--",
        "true",
    ]));
    assert_eq!(out.status.code(), Some(CONFLICT), "{}", stderr(&out));
    let _ = Command::new("kill")
        .args(["-TERM", &reader.id().to_string()])
        .status();
    wait_exit(&mut reader, Duration::from_secs(20));
}

#[test]
fn redis_checks_the_other_kinds_under_a_given_prefix() {
    let server = RedisServer::start().expect("redis-server");
    other_kinds_are_checked_under_the_given_prefix(&server.url());
}

#[test]
fn postgres_checks_the_other_kinds_under_a_given_prefix() {
    let pg = dlock_test::postgres::PostgresServer::start().expect("postgres");
    other_kinds_are_checked_under_the_given_prefix(&pg.url());
}

/// On zk:// the check is not made under a `--prefix` (a reader there shows as a plain
/// lock's holder): a one-line note says so, and the command runs.
#[test]
fn zookeeper_says_the_other_kinds_are_not_checked_under_a_given_prefix() {
    let zk = dlock_test::zookeeper::ZooKeeper::shared();
    let url = zk.url("/dlock-cli-kinds-prefix", "");
    let out = output(dlock(&url).args(["run", "--prefix", "app:", "report", "--", "true"]));
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("another kind of lock was not checked: under --prefix"),
        "{}",
        stderr(&out)
    );
}
