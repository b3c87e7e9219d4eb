//! The lock family on the stores that gained it by read-modify-write recipes (memcached:
//! CAS on index items; etcd: revision-ordered keys), one test walked per store:
//! `dlock run --semaphore N` lets at most N commands run at once, `--shared`,
//! `--exclusive` and `--fair` run, `status` and `set-permits` take the semaphore, a run
//! asking for the old count is refused, a run sees a name held as another kind, and
//! `force-unlock` takes every `--kind`. Where the store can iterate keys (etcd), `list`
//! and `top` show the held semaphore; on memcached they stay refused (no key iteration,
//! checked in `stores`).

use super::*;

#[cfg(feature = "etcd")]
use dlock_test::server::EtcdCluster;
use dlock_test::server::MemcachedServer;

/// A store the family runs on, as the CLI reaches it.
struct FamilyStore {
    label: &'static str,
    url: String,
    /// Whether `list` and `top` work (the store can iterate keys).
    lists: bool,
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

/// The store answers (an etcd member may still be electing itself).
fn wait_ready(url: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = output(dlock(url).args(["status", "ready-probe"]));
        if out.status.success() {
            return;
        }
        assert!(Instant::now() < deadline, "never ready: {}", stderr(&out));
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn runs_every_kind(store: &FamilyStore) {
    let (label, url) = (store.label, store.url.as_str());
    wait_ready(url);

    // --semaphore 2: at most two of five commands at once.
    let dir = scratch(&format!("{label}-family"));
    let log = dir.join("log");
    let script = format!(
        "echo \"begin ${{DLOCK_FENCE:-none}}\" >> {0}; sleep 0.5; echo end >> {0}",
        log.display()
    );
    let text = run_concurrently(
        url,
        5,
        &[
            "run",
            "--semaphore",
            "2",
            "slots",
            "--",
            "sh",
            "-c",
            &script,
        ],
        &log,
    );
    let (mut inside, mut most) = (0, 0);
    for line in text.lines() {
        if line.starts_with("begin") {
            assert_eq!(line, "begin none", "{label}: permits carry no fence");
            inside += 1;
            most = most.max(inside);
        } else {
            inside -= 1;
        }
    }
    assert_eq!(
        text.lines().count(),
        10,
        "{label}: every command ran: {text}"
    );
    assert!(
        (1..=2).contains(&most),
        "{label}: at most 2 commands at once:\n{text}"
    );
    println!("{label}: at most {most} commands ran at once");

    // The other kinds run.
    for flags in [&["--shared"][..], &["--exclusive"], &["--fair"]] {
        let out =
            output(
                dlock(url)
                    .arg("run")
                    .args(flags)
                    .args(["--no-wait", "kinds", "--", "true"]),
            );
        assert!(out.status.success(), "{label} {flags:?}: {}", stderr(&out));
    }

    // A held semaphore: status shows it as one (and list and top, where the store lists).
    let mut holder = dlock(url)
        .args(["run", "--semaphore", "2", "held-sem", "--", "sleep", "30"])
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn dlock run");
    let deadline = Instant::now() + Duration::from_secs(20);
    while status_of(url, "semaphore", "held-sem")["held"] != true {
        if let Some(status) = holder.try_wait().expect("try_wait") {
            panic!(
                "{label}: the holder exited ({status}): {}",
                piped_stderr(&mut holder)
            );
        }
        assert!(
            Instant::now() < deadline,
            "{label}: the semaphore was never held"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let s = status_of(url, "semaphore", "held-sem");
    assert_eq!(s["permits"], 2, "{label}: {s}");
    if store.lists {
        let rows = json_of(&output(dlock(url).args([
            "list",
            "--json",
            "--kind",
            "semaphore",
        ])));
        let listed: Vec<(&str, &str)> = rows
            .as_array()
            .expect("rows")
            .iter()
            .map(|r| {
                (
                    r["name"].as_str().expect("a name"),
                    r["kind"].as_str().expect("a kind"),
                )
            })
            .collect();
        assert_eq!(listed, [("held-sem", "semaphore")], "{label}: {rows}");
        let out =
            output(dlock(url).args(["top", "--json", "--iterations", "1", "--kind", "semaphore"]));
        assert!(out.status.success(), "{label}: {}", stderr(&out));
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("held-sem"),
            "{label}: {}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
    // set-permits changes the stored count; a run with the old count is refused.
    let out = output(dlock(url).args(["set-permits", "held-sem", "3"]));
    assert!(out.status.success(), "{label}: {}", stderr(&out));
    assert_eq!(
        status_of(url, "semaphore", "held-sem")["permits"],
        3,
        "{label}"
    );
    let out = output(dlock(url).args([
        "run",
        "--semaphore",
        "2",
        "--no-wait",
        "held-sem",
        "--",
        "true",
    ]));
    assert_eq!(out.status.code(), Some(USAGE), "{label}: {}", stderr(&out));
    // Held as a semaphore, the name is another kind's lock for a plain run: a warning,
    // or with --refuse-other-kinds the conflict code and the command not run.
    let out = output(dlock(url).args(["run", "--no-wait", "held-sem", "--", "true"]));
    assert!(out.status.success(), "{label}: {}", stderr(&out));
    assert!(
        stderr(&out).contains("also held as a semaphore"),
        "{label}: {}",
        stderr(&out)
    );
    let ran = dir.join("ran");
    let out = output(
        dlock(url)
            .args(["run", "--no-wait", "--refuse-other-kinds", "held-sem", "--"])
            .args(["touch", &ran.display().to_string()]),
    );
    assert_eq!(
        out.status.code(),
        Some(CONFLICT),
        "{label}: {}",
        stderr(&out)
    );
    assert!(!ran.exists(), "{label}: refused, yet the command ran");
    // force-unlock takes the semaphore's permits back, and takes every --kind.
    let out = output(dlock(url).args(["force-unlock", "--yes", "--kind", "semaphore", "held-sem"]));
    assert!(out.status.success(), "{label}: {}", stderr(&out));
    assert_eq!(
        status_of(url, "semaphore", "held-sem")["held"],
        false,
        "{label}"
    );
    let out = output(dlock(url).args(["force-unlock", "--yes", "--kind", "rwlock", "x"]));
    assert!(
        out.status.code() != Some(USAGE),
        "{label}: {}",
        stderr(&out)
    );
    let _ = Command::new("kill")
        .args(["-TERM", &holder.id().to_string()])
        .status();
    wait_exit(&mut holder, Duration::from_secs(40));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn memcached_runs_every_kind() {
    let server = MemcachedServer::start().expect("memcached");
    runs_every_kind(&FamilyStore {
        label: "memcached",
        url: server.url(),
        lists: false,
    });
}

#[cfg(feature = "etcd")]
#[test]
fn etcd_runs_every_kind_and_lists_it() {
    let cluster = EtcdCluster::start(1).expect("etcd");
    runs_every_kind(&FamilyStore {
        label: "etcd",
        url: cluster.url(),
        lists: true,
    });
}
