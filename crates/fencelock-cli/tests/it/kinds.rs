//! Issue 25, parts 4 and 7: a semaphore's size is never silently ignored, and the same
//! name under two kinds of lock (separate locks) is shown and warned about. On Redis,
//! PostgreSQL and ZooKeeper.

use super::*;

/// A store's URL, and what it is called in messages.
struct Store {
    label: &'static str,
    url: String,
}

fn json_of(out: &Output) -> serde_json::Value {
    assert!(out.status.success(), "{}", stderr(out));
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

fn status_of(url: &str, kind: &str, name: &str) -> serde_json::Value {
    json_of(&output(
        dlock(url).args(["status", "--json", "--kind", kind, name]),
    ))
}

/// `dlock run <flags> NAME -- sleep 30` in the background, once the store shows it held
/// as `kind`.
fn hold(url: &str, kind: &str, flags: &[&str], name: &str) -> Child {
    let mut child = dlock(url)
        .arg("run")
        .args(flags)
        .args([name, "--", "sleep", "30"])
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn dlock run");
    let deadline = Instant::now() + Duration::from_secs(20);
    while status_of(url, kind, name)["held"] != true {
        if let Some(status) = child.try_wait().expect("try_wait") {
            panic!("the holder exited ({status}): {}", piped_stderr(&mut child));
        }
        assert!(Instant::now() < deadline, "{name} never held as {kind}");
        std::thread::sleep(Duration::from_millis(50));
    }
    child
}

/// Ends a background `dlock run` (SIGTERM, forwarded to its command).
fn stop(mut child: Child) {
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    wait_exit(&mut child, Duration::from_secs(20));
}

/// `dlock run --semaphore N` whose N differs from the stored count is a usage error that
/// names the stored count and how to change it; `--set-permits` and `dlock set-permits`
/// change it; `status --kind semaphore` shows it.
fn semaphore_count_is_never_ignored(store: &Store) {
    let (url, label) = (store.url.as_str(), store.label);
    let name = format!("exports-{label}");
    let dir = scratch(&format!("permits-{label}"));
    // The stored count is 5 (held, so that ZooKeeper keeps the semaphore's directory).
    let holder = hold(url, "semaphore", &["--semaphore", "5"], &name);
    let s = status_of(url, "semaphore", &name);
    assert_eq!(s["permits"], 5, "{label}: the stored count: {s}");
    let text = String::from_utf8_lossy(
        &output(dlock(url).args(["status", "--kind", "semaphore", &name])).stdout,
    )
    .into_owned();
    assert!(
        text.lines()
            .any(|l| l.starts_with("permits:") && l.ends_with(" 5")),
        "{label}: {text}"
    );

    // The repro: three runs of 1 at once; none of them runs.
    let ran = dir.join("ran");
    let script = format!("echo x >> {}; sleep 2", ran.display());
    let mut runs: Vec<Child> = (0..3)
        .map(|_| {
            dlock(url)
                .args(["run", "--semaphore", "1", "--no-wait", &name, "--"])
                .args(["sh", "-c", &script])
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn")
        })
        .collect();
    for run in &mut runs {
        let code = wait_exit(run, Duration::from_secs(30)).code();
        let err = piped_stderr(run);
        assert_eq!(code, Some(USAGE), "{label}: {err}");
        assert!(
            err.contains('5') && err.contains("dlock set-permits") && err.contains("--set-permits"),
            "{label}: names the stored count and how to change it: {err}"
        );
    }
    assert!(!ran.exists(), "{label}: a run of 1 ran under the stored 5");

    // --set-permits sets the count instead: 1, held by the holder of 5, so a conflict.
    let out = output(dlock(url).args([
        "run",
        "--semaphore",
        "1",
        "--set-permits",
        "--no-wait",
        &name,
        "--",
        "true",
    ]));
    assert_eq!(
        out.status.code(),
        Some(CONFLICT),
        "{label}: {}",
        stderr(&out)
    );
    assert_eq!(status_of(url, "semaphore", &name)["permits"], 1, "{label}");

    // dlock set-permits: 3; a run of 3 now takes a permit, a run of 5 is refused.
    let out = output(dlock(url).args(["set-permits", &name, "3"]));
    assert!(out.status.success(), "{label}: {}", stderr(&out));
    assert_eq!(status_of(url, "semaphore", &name)["permits"], 3, "{label}");
    let out =
        output(dlock(url).args(["run", "--semaphore", "3", "--no-wait", &name, "--", "true"]));
    assert!(out.status.success(), "{label}: {}", stderr(&out));
    let out =
        output(dlock(url).args(["run", "--semaphore", "5", "--no-wait", &name, "--", "true"]));
    assert_eq!(out.status.code(), Some(USAGE), "{label}: {}", stderr(&out));
    for bad in ["0", "1000001", "x"] {
        let out = output(dlock(url).args(["set-permits", &name, bad]));
        assert_eq!(
            out.status.code(),
            Some(USAGE),
            "{label}: {bad}: {}",
            stderr(&out)
        );
    }
    stop(holder);
    let _ = std::fs::remove_dir_all(dir);
}

/// The kinds of lock `dlock run` takes on one name, as `(status --kind, run flags)`.
const KINDS: &[(&str, &[&str])] = &[
    ("lock", &[]),
    ("fair", &["--fair"]),
    ("semaphore", &["--semaphore", "2"]),
    ("rwlock", &["--exclusive"]),
];

/// One name held as a plain lock: every other kind warns that it is a separate lock (or,
/// with --refuse-other-kinds, refuses: the conflict code, the command not run); `list`
/// shows every kind held, with a KIND column.
fn kinds_are_shown_and_warned_about(store: &Store) {
    let (url, label) = (store.url.as_str(), store.label);
    let name = format!("x-{label}");
    let dir = scratch(&format!("kinds-{label}"));
    let plain = hold(url, "lock", &[], &name);
    for &(kind, flags) in &KINDS[1..] {
        let out =
            output(
                dlock(url)
                    .arg("run")
                    .args(flags)
                    .args(["--no-wait", &name, "--", "true"]),
            );
        let err = stderr(&out);
        assert!(out.status.success(), "{label} {kind}: {err}");
        assert!(
            err.contains("warning") && err.contains("also held as a lock"),
            "{label} {kind}: warns: {err}"
        );
        let ran = dir.join(kind);
        let out = output(
            dlock(url)
                .arg("run")
                .args(flags)
                .args(["--no-wait", "--refuse-other-kinds", &name, "--"])
                .args(["touch", &ran.display().to_string()]),
        );
        assert_eq!(
            out.status.code(),
            Some(CONFLICT),
            "{label} {kind}: {} (the plain lock: {})",
            stderr(&out),
            status_of(url, "lock", &name)
        );
        assert!(
            !ran.exists(),
            "{label} {kind}: refused, yet the command ran"
        );
    }
    // Alone under its kind: no warning of another kind (the store's configuration may
    // have one: a Redis without AOF).
    let other = format!("alone-{label}");
    let out = output(dlock(url).args(["run", "--fair", "--no-wait", &other, "--", "true"]));
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        !stderr(&out).contains("also held as"),
        "{label}: {}",
        stderr(&out)
    );

    // Held as a semaphore too: list shows both, each with its kind.
    let sem = hold(url, "semaphore", &["--semaphore", "2"], &name);
    let out = output(dlock(url).args(["run", "--no-wait", &name, "--", "true"]));
    assert!(!out.status.success(), "{label}: the plain lock is held");
    let rows = json_of(&output(dlock(url).args(["list", "--json", "x-*"])));
    let mut kinds: Vec<&str> = rows
        .as_array()
        .expect("rows")
        .iter()
        .filter(|r| r["name"] == name.as_str())
        .map(|r| {
            r["kind"]
                .as_str()
                .unwrap_or_else(|| panic!("{label}: a kind in {r}"))
        })
        .collect();
    kinds.sort_unstable();
    assert_eq!(kinds, ["lock", "semaphore"], "{label}: {rows}");
    let out = output(dlock(url).args(["list", "x-*"]));
    assert!(out.status.success(), "{}", stderr(&out));
    let table = String::from_utf8_lossy(&out.stdout).into_owned();
    let header: Vec<&str> = table
        .lines()
        .next()
        .expect("a header")
        .split_whitespace()
        .collect();
    let at = header
        .iter()
        .position(|h| *h == "KIND")
        .unwrap_or_else(|| panic!("{label}: a KIND column: {table}"));
    let mut shown: Vec<&str> = table
        .lines()
        .skip(1)
        .filter(|l| l.split_whitespace().next() == Some(name.as_str()))
        .map(|l| l.split_whitespace().nth(at).expect("a kind cell"))
        .collect();
    shown.sort_unstable();
    assert_eq!(shown, ["lock", "semaphore"], "{label}: {table}");
    stop(sem);
    stop(plain);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn redis_semaphore_count_and_kinds() {
    let server = RedisServer::start().expect("redis-server");
    let store = Store {
        label: "redis",
        url: server.url(),
    };
    semaphore_count_is_never_ignored(&store);
    kinds_are_shown_and_warned_about(&store);
}

#[test]
fn postgres_semaphore_count_and_kinds() {
    let pg = dlock_test::postgres::PostgresServer::start().expect("postgres");
    let store = Store {
        label: "postgres",
        url: pg.url(),
    };
    semaphore_count_is_never_ignored(&store);
    kinds_are_shown_and_warned_about(&store);
}

#[test]
fn zookeeper_semaphore_count_and_kinds() {
    let zk = dlock_test::zookeeper::ZooKeeper::shared();
    let store = Store {
        label: "zk",
        url: zk.url("/dlock-cli-kinds", ""),
    };
    semaphore_count_is_never_ignored(&store);
    kinds_are_shown_and_warned_about(&store);
}

/// Each kind's `--help` text says that the kinds are separate locks.
#[test]
fn each_kind_says_it_is_a_separate_lock() {
    let out = output(dlock("redis://127.0.0.1:1").args(["run", "--help"]));
    assert!(out.status.success(), "{}", stderr(&out));
    let help = String::from_utf8_lossy(&out.stdout).into_owned();
    // One paragraph per flag, from its name to the next flag.
    for flag in [
        "--semaphore",
        "--shared",
        "--exclusive",
        "--fair",
        "--refuse-other-kinds",
    ] {
        let at = help
            .find(&format!("      {flag}"))
            .unwrap_or_else(|| panic!("{flag} in {help}"));
        let rest = &help[at + flag.len() + 6..];
        let end = rest.find("\n  -").unwrap_or(rest.len());
        let text = rest[..end].split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(text.contains("separate lock"), "{flag}: {text}");
    }
    let about = help.split("Usage:").next().unwrap_or_default();
    assert!(about.contains("separate lock"), "the plain lock: {about}");
}
