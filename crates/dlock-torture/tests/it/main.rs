//! The real `dlock-torture` binary (`dlock torture`, `dlock demo`) against real servers
//! from the test kit.

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use dlock_test::server::{RedisServer, free_port};

mod etcd_family;
mod memcached_family;
mod secrets;
mod supervised;

/// The harness binary.
fn harness() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_dlock-torture"));
    cmd.stdin(Stdio::null());
    cmd
}

/// The `dlock` command beside the harness (as `cargo build` and `cargo test --workspace`
/// leave it), which runs the harness for `dlock demo` and `dlock torture` as users type them.
fn dlock() -> Command {
    let path = PathBuf::from(env!("CARGO_BIN_EXE_dlock-torture")).with_file_name("dlock");
    assert!(
        path.is_file(),
        "{} is missing: build the dlock command too (cargo test --workspace)",
        path.display()
    );
    let mut cmd = Command::new(path);
    cmd.stdin(Stdio::null());
    cmd
}

fn output(cmd: &mut Command) -> Output {
    cmd.output().expect("run the harness")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "dlock-torture-test-{}-{name}-{}",
        std::process::id(),
        free_port().expect("port")
    ));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// Runs `dlock demo` against `url` and checks its table: the fenced row sold every unit
/// exactly once, the no-lock control oversold. Returns the demo's output.
fn demo_on(mut program: Command, url: &str) -> String {
    let out = output(program.env("DLOCK_URL", url).args(["demo", "--plain"]));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{text}{}", stderr(&out));
    assert!(text.contains("worker processes"), "{text}");
    let row = |label: &str| -> Vec<i64> {
        let line = text
            .lines()
            .find(|l| l.starts_with(label))
            .unwrap_or_else(|| panic!("no {label} row:\n{text}"));
        line[label.len()..]
            .split_whitespace()
            .filter_map(|w| w.parse().ok())
            .collect()
    };
    // orders, refused, final stock, oversold, lost updates
    let fenced = row("dlock + fenced stock");
    assert_eq!(
        (fenced[3], fenced[4]),
        (0, 0),
        "fenced run oversold:\n{text}"
    );
    assert_eq!(fenced[0], 24, "every unit sold exactly once:\n{text}");
    let none = row("no lock");
    assert!(none[3] > 0, "the no-lock control must oversell:\n{text}");
    text
}

#[test]
fn demo_shows_that_only_fencing_prevents_overselling() {
    let server = RedisServer::start().expect("redis-server");
    let text = demo_on(dlock(), &server.url());
    assert!(text.contains("Store: Redis at"), "{text}");
}

/// `dlock demo --url postgres://…`: the locks and the fenced stock both in PostgreSQL
/// (the stock table is the demo's; its rows are gone afterwards).
#[test]
fn demo_keeps_its_fenced_stock_in_postgres() {
    let pg = dlock_test::postgres::PostgresServer::start().expect("postgres");
    let text = demo_on(harness(), &pg.url());
    assert!(
        text.contains("Store: PostgreSQL at") && text.contains("dlock.demo_stock"),
        "{text}"
    );
    assert!(!text.contains(dlock_test::postgres::PASSWORD), "{text}");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let (rows, fence_column) = rt.block_on(async {
        let admin = pg.admin().await;
        let rows: i64 = admin
            .query_one("SELECT count(*) FROM dlock.demo_stock", &[])
            .await
            .expect("the demo's table")
            .get(0);
        let column: i64 = admin
            .query_one(
                "SELECT count(*) FROM information_schema.columns
                 WHERE table_schema = 'dlock' AND table_name = 'demo_stock'
                   AND column_name = 'dlock_fence'",
                &[],
            )
            .await
            .expect("columns")
            .get(0);
        (rows, column)
    });
    assert_eq!((rows, fence_column), (0, 1), "{text}");
}

#[test]
fn torture_catches_a_control_and_keeps_the_fenced_resource_intact() {
    let dir = scratch("torture");
    let out = output(harness().args([
        "torture",
        // Long enough, with enough workers, that the control's stale release lands
        // outside a pause window at least once (6 s with 3 workers missed it once in CI).
        "--duration",
        "10s",
        "--workers",
        "4",
        "--kinds",
        "dlock-fenced,plain-del",
        "--faults",
        "pause,kill",
        "--out",
        dir.to_str().expect("utf-8 path"),
    ]));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{text}{}", stderr(&out));
    let report: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("report.json")).expect("report.json"),
    )
    .expect("json");
    let kinds = report["kinds"].as_array().expect("kinds");
    let fenced = &kinds[0]["findings"];
    assert_eq!(fenced["kind"], "dlock-fenced");
    assert_eq!(fenced["stale_accepted"], 0);
    assert_eq!(fenced["fenced_lost"], 0);
    let control = &kinds[1]["findings"];
    assert_eq!(control["kind"], "plain-del");
    assert!(
        control["overlaps"].as_u64().is_some_and(|n| n > 0),
        "the control must be caught: {control}"
    );
    let svg = std::fs::read_to_string(dir.join("timeline-plain-del.svg")).expect("timeline");
    assert!(svg.starts_with("<svg") && svg.contains("overlapping hold"));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn torture_keeps_the_rwlock_s_fenced_resource_intact_and_readers_apart_from_writers() {
    let dir = scratch("torture-rwlock");
    let out = output(harness().args([
        "torture",
        "--duration",
        "6s",
        "--workers",
        "3",
        "--kinds",
        "rwlock-fenced",
        "--faults",
        "pause,kill",
        "--out",
        dir.to_str().expect("utf-8 path"),
    ]));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{text}{}", stderr(&out));
    let report: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("report.json")).expect("report.json"),
    )
    .expect("json");
    let rw = &report["kinds"][0]["findings"];
    assert_eq!(rw["kind"], "rwlock-fenced");
    assert_eq!(rw["stale_accepted"], 0);
    assert_eq!(rw["fenced_lost"], 0);
    assert!(
        rw["fenced_acknowledged"].as_u64().is_some_and(|n| n > 0),
        "writers wrote: {rw}"
    );
    assert!(
        rw["read_holds"].as_u64().is_some_and(|n| n > 0),
        "readers read: {rw}"
    );
    assert_eq!(rw["unexcused_read_overlaps"], 0);
    assert_eq!(rw["orphans"], 0);
    assert!(text.contains("read holds"), "{text}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn torture_holds_redlock_and_memcached_to_their_promises() {
    let dir = scratch("torture-redlock-memcached");
    let out = output(harness().args([
        "torture",
        "--duration",
        "9s",
        "--workers",
        "3",
        "--kinds",
        "redlock,memcached-fenced",
        "--faults",
        "pause,kill,restart",
        "--out",
        dir.to_str().expect("utf-8 path"),
    ]));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{text}{}", stderr(&out));
    let report: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("report.json")).expect("report.json"),
    )
    .expect("json");
    let kinds = report["kinds"].as_array().expect("kinds");
    let redlock = &kinds[0];
    let f = &redlock["findings"];
    assert_eq!(f["kind"], "redlock");
    assert!(
        f["unfenced_acknowledged"].as_u64().is_some_and(|n| n > 0),
        "holders wrote: {f}"
    );
    assert!(f["faults"].as_array().is_some_and(|a| !a.is_empty()), "{f}");
    assert_eq!(f["unexcused_overlaps"], 0, "{f}");
    assert_eq!(f["liveness_violations"], 0, "{f}");
    assert_eq!(f["orphans"], 0, "{f}");
    let holds = redlock["holds"].as_array().expect("holds");
    assert!(
        holds.iter().all(|h| h["fence"] == 0),
        "a quorum grants no fence"
    );
    for w in redlock["fault_windows"].as_array().expect("windows") {
        if let Some(nodes) = w["nodes"].as_array() {
            assert!((1..=2).contains(&nodes.len()), "a minority of 5: {w}");
        }
    }
    assert!(text.contains("node restarts:"), "{text}");
    let f = &kinds[1]["findings"];
    assert_eq!(f["kind"], "memcached-fenced");
    assert_eq!(f["stale_accepted"], 0, "{f}");
    assert_eq!(f["fenced_lost"], 0, "{f}");
    assert_eq!(f["fence_regressions"], 0, "{f}");
    assert_eq!(f["unexcused_overlaps"], 0, "{f}");
    assert_eq!(f["orphans"], 0, "{f}");
    assert!(
        f["fenced_acknowledged"].as_u64().is_some_and(|n| n > 0),
        "holders wrote: {f}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[cfg(feature = "etcd")]
#[test]
fn torture_holds_etcd_to_its_fences_and_its_lock_across_a_leader_restart() {
    let dir = scratch("torture-etcd");
    let out = output(harness().args([
        "torture",
        "--duration",
        "18s",
        "--workers",
        "3",
        "--kinds",
        "etcd-fenced",
        "--faults",
        "kill,restart",
        "--out",
        dir.to_str().expect("utf-8 path"),
    ]));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{text}{}", stderr(&out));
    let report: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("report.json")).expect("report.json"),
    )
    .expect("json");
    let etcd = &report["kinds"][0];
    let f = &etcd["findings"];
    assert_eq!(f["kind"], "etcd-fenced");
    assert!(
        f["fenced_acknowledged"].as_u64().is_some_and(|n| n > 0),
        "holders wrote: {f}"
    );
    for zero in [
        "stale_accepted",
        "fenced_lost",
        "fence_regressions",
        "fence_reuse",
        // No pause here, and a leader's restart excuses no overlap: raft keeps the lock.
        "overlaps",
        "liveness_violations",
        "orphans",
        "worker_failures",
    ] {
        assert_eq!(f[zero], 0, "{zero}: {f}");
    }
    // A holder was killed; that the lock came free within the kind's bound after it is the
    // checker's `liveness_violations` (0 above), not a time asserted here.
    let reacquire = f["reacquire_ms"].as_array().expect("reacquire_ms");
    assert!(!reacquire.is_empty(), "a holder was killed: {f}");
    // The first restart kills the leader; grants after it carry higher fences than every
    // grant before it (a revision never repeats, whoever leads).
    let windows = etcd["fault_windows"].as_array().expect("windows");
    let killed = windows
        .iter()
        .find(|w| w["fault"] == "leader-restart")
        .unwrap_or_else(|| panic!("no leader restart: {windows:?}"))["start"]
        .as_u64()
        .expect("start");
    let holds = etcd["holds"].as_array().expect("holds");
    let fences = |after: bool| {
        holds
            .iter()
            .filter(|h| h["start"].as_u64().is_some_and(|t| (t > killed) == after))
            .filter_map(|h| h["fence"].as_u64())
            .collect::<Vec<_>>()
    };
    let (before, after) = (fences(false), fences(true));
    assert!(!before.is_empty() && !after.is_empty(), "{holds:?}");
    assert!(
        after.iter().min() > before.iter().max(),
        "{before:?} then {after:?}"
    );
    assert!(text.contains("member restarts: 1 of the leader"), "{text}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn torture_holds_zookeeper_to_its_fences_and_its_lock_across_a_leader_restart() {
    let dir = scratch("torture-zookeeper");
    let out = output(harness().args([
        "torture",
        "--duration",
        "18s",
        "--workers",
        "3",
        "--kinds",
        "zookeeper-fenced",
        // 18 s at ZooKeeper's 2 s ttl has room for two faults, three ttls apart: the two
        // this test is about (more would leave some of them unscheduled).
        "--faults",
        "kill,restart",
        "--out",
        dir.to_str().expect("utf-8 path"),
    ]));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{text}{}", stderr(&out));
    let report: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("report.json")).expect("report.json"),
    )
    .expect("json");
    let zk = &report["kinds"][0];
    let f = &zk["findings"];
    assert_eq!(f["kind"], "zookeeper-fenced");
    assert!(
        f["fenced_acknowledged"].as_u64().is_some_and(|n| n > 0),
        "holders wrote: {f}"
    );
    for zero in [
        "stale_accepted",
        "fenced_lost",
        "fence_regressions",
        "fence_reuse",
        // No pause here, and a leader's restart excuses no overlap: the quorum keeps the
        // lock's nodes.
        "overlaps",
        "liveness_violations",
        "orphans",
        "worker_failures",
    ] {
        assert_eq!(f[zero], 0, "{zero}: {f}");
    }
    // A holder was killed; that the lock came free within the kind's bound after it is the
    // checker's `liveness_violations` (0 above), not a time asserted here.
    let reacquire = f["reacquire_ms"].as_array().expect("reacquire_ms");
    assert!(!reacquire.is_empty(), "a holder was killed: {f}");
    // The first restart kills the leader. Grants after it carry higher fences than every
    // grant before it (a zxid never repeats), and those made once the restart was over
    // carry a new leader's epoch (a zxid's high 32 bits).
    let windows = zk["fault_windows"].as_array().expect("windows");
    let restart = windows
        .iter()
        .find(|w| w["fault"] == "leader-restart")
        .unwrap_or_else(|| panic!("no leader restart: {windows:?}"));
    let killed = restart["start"].as_u64().expect("start");
    let revived = restart["end"].as_u64().expect("end");
    let holds = zk["holds"].as_array().expect("holds");
    let fences = |from: u64, to: u64| {
        holds
            .iter()
            .filter(|h| h["start"].as_u64().is_some_and(|t| t > from && t <= to))
            .filter_map(|h| h["fence"].as_u64())
            .collect::<Vec<_>>()
    };
    let (before, after, later) = (
        fences(0, killed),
        fences(killed, u64::MAX),
        fences(revived, u64::MAX),
    );
    assert!(
        !before.is_empty() && !later.is_empty(),
        "grants before and after the restart: {holds:?}"
    );
    assert!(
        after.iter().min() > before.iter().max(),
        "{before:?} then {after:?}"
    );
    let epoch = |fence: &u64| fence >> 32;
    assert!(
        later.iter().map(epoch).min() > before.iter().map(epoch).max(),
        "a new leader, a new epoch: {before:?} then {later:?}"
    );
    assert!(text.contains("member restarts: 1 of the leader"), "{text}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn torture_holds_elections_to_their_terms() {
    let dir = scratch("torture-election");
    let out = output(harness().args([
        "torture",
        "--kinds",
        "election-fenced",
        "--quick",
        "--out",
        dir.to_str().expect("utf-8 path"),
    ]));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(0), "{text}{}", stderr(&out));
    let report: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("report.json")).expect("report.json"),
    )
    .expect("json");
    let kinds = report["kinds"].as_array().expect("kinds");
    assert_eq!(kinds.len(), 1, "{kinds:?}");
    let f = &kinds[0]["findings"];
    assert_eq!(f["kind"], "election-fenced");
    assert!(f["verdict_ok"].as_bool().unwrap_or(false), "{f}");
    // Leaders were elected, and wrote under their terms.
    assert!(
        f["holds"].as_u64().is_some_and(|n| n > 0),
        "leaderships: {f}"
    );
    assert!(
        f["fenced_acknowledged"].as_u64().is_some_and(|n| n > 0),
        "leaders wrote: {f}"
    );
    assert!(f["faults"].as_array().is_some_and(|a| !a.is_empty()), "{f}");
    for zero in [
        "stale_accepted",
        "fenced_lost",
        "fence_reuse",
        "fence_regressions",
        "liveness_violations",
        "orphans",
        "worker_failures",
    ] {
        assert_eq!(f[zero], 0, "{zero}: {f}");
    }
    assert!(text.contains("leaderships"), "{text}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn torture_soak_holds_every_lease_of_one_client_through_the_rounds() {
    let dir = scratch("torture-soak");
    let out = output(harness().args([
        "torture",
        "--soak",
        "20s",
        "--quick",
        "--kinds",
        "dlock-fenced",
        "--soak-leases",
        "200",
        "--out",
        dir.to_str().expect("utf-8 path"),
    ]));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(0), "{text}{}", stderr(&out));
    let report: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("report.json")).expect("report.json"),
    )
    .expect("json");
    // The kind ran (a quick dlock-fenced run outlasts the 20 s soak: one round).
    let kinds = report["kinds"].as_array().expect("kinds");
    assert!(!kinds.is_empty(), "{report}");
    assert_eq!(kinds[0]["round"], 1);
    assert_eq!(kinds[0]["findings"]["kind"], "dlock-fenced");
    assert_eq!(kinds[0]["findings"]["stale_accepted"], 0);
    let soak = &report["soak"];
    assert_eq!(soak["verdict_ok"], true, "{soak}");
    assert_eq!(soak["leases"], 200);
    assert_eq!(soak["lost"], 0, "{soak}");
    assert_eq!(soak["holder"]["acquired"], 200, "{soak}");
    assert_eq!(soak["holder"]["released"], 200, "{soak}");
    assert_eq!(soak["holder"]["keys_left"], 0, "{soak}");
    assert_eq!(soak["rounds"][0]["kinds"][0], "dlock-fenced");
    let samples = soak["samples"].as_array().expect("samples");
    let holding: Vec<&serde_json::Value> =
        samples.iter().filter(|s| s["phase"] == "holding").collect();
    assert!(holding.len() >= 2, "{samples:?}");
    for s in &holding {
        assert_eq!(s["held"], 200, "{s}");
        assert_eq!(s["lost"], 0, "{s}");
        assert!(s["rss_kb"].as_u64().is_some_and(|kb| kb > 0), "{s}");
        assert!(s["fds"].as_u64().is_some_and(|n| n > 0), "{s}");
        assert!(
            s["orchestrator_rss_kb"].as_u64().is_some_and(|kb| kb > 0),
            "{s}"
        );
    }
    assert!(soak["rss_slope_kib_per_min"].is_number(), "{soak}");
    assert!(text.contains("client RSS"), "{text}");
    let svg = std::fs::read_to_string(dir.join("soak.svg")).expect("soak.svg");
    assert!(svg.starts_with("<svg") && svg.contains("polyline"));
    assert!(dir.join("round-1/timeline-dlock-fenced.svg").is_file());
    let _ = std::fs::remove_dir_all(dir);
}

/// A lock server given with a password: the password appears in nothing the harness
/// prints or writes (stdout, stderr, report.json), whether it is right or wrong.
#[test]
fn torture_never_prints_or_reports_the_lock_server_s_password() {
    const SECRET: &str = "s3cr3t-torture-pw";
    let server = RedisServer::start().expect("redis-server");
    let mut admin = server.client().get_connection().expect("admin connection");
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg(SECRET)
        .query(&mut admin)
        .expect("CONFIG SET requirepass");
    let dir = scratch("torture-secret");
    let run = |password: &str| {
        output(harness().args([
            "torture",
            "--url",
            &format!("redis://:{password}@127.0.0.1:{}/", server.port()),
            "--kinds",
            "dlock-fenced",
            "--faults",
            "pause,kill",
            "--duration",
            "4s",
            "--out",
            dir.to_str().expect("utf-8 path"),
        ]))
    };
    let out = run(SECRET);
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), stderr(&out));
    assert!(out.status.success(), "{text}");
    assert!(text.contains("***"), "the URL is shown redacted: {text}");
    let report = std::fs::read_to_string(dir.join("report.json")).expect("report.json");
    for (what, body) in [("output", &text), ("report.json", &report)] {
        assert!(!body.contains(SECRET), "the password is in the {what}");
    }
    // A wrong password: a clear failure, and still no password (neither of them).
    let wrong = "wr0ng-torture-pw";
    let out = run(wrong);
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), stderr(&out));
    assert!(!out.status.success(), "{text}");
    assert!(!text.contains(wrong) && !text.contains(SECRET), "{text}");
    let _ = std::fs::remove_dir_all(dir);
}

/// `dlock torture --url postgres://…`: the postgres-fenced kind runs on that server (not on
/// a PostgreSQL of its own), its locks under the kind's keys there, audited and removed
/// afterwards; the faults that need to own the server are skipped with a note, and the
/// password is in nothing the harness prints or writes.
#[test]
fn torture_runs_postgres_fenced_on_the_postgres_server_its_url_names() {
    let pg = dlock_test::postgres::PostgresServer::start().expect("postgres");
    let dir = scratch("torture-given-postgres");
    let url = pg.url();
    let stdout = std::fs::File::create(dir.join("stdout")).expect("stdout file");
    let stderr_file = std::fs::File::create(dir.join("stderr")).expect("stderr file");
    let mut child = harness()
        .env_remove("CI")
        .args([
            "torture",
            "--url",
            &url,
            "--kinds",
            "postgres-fenced",
            "--faults",
            "pause,kill,restart,blackhole",
            // Room for each named fault to land on a loaded machine: a named fault that
            // never took effect fails the run.
            "--duration",
            "20s",
            "--workers",
            "3",
            "--out",
            dir.to_str().expect("utf-8 path"),
        ])
        .stdout(stdout)
        .stderr(stderr_file)
        .spawn()
        .expect("run the harness");
    // While it runs, the server's own lock table shows the holds being made there.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let (seen, left) = rt.block_on(async {
        let admin = pg.admin().await;
        let mut seen: Vec<(String, i64)> = Vec::new();
        loop {
            // The table appears with the first worker's connection.
            if let Ok(rows) = admin
                .query("SELECT key, fence FROM dlock.locks WHERE fence > 0", &[])
                .await
            {
                seen.extend(rows.iter().map(|r| (r.get(0), r.get(1))));
            }
            if child.try_wait().expect("try_wait").is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let left: i64 = admin
            .query_one(
                "SELECT (SELECT count(*) FROM dlock.locks) + (SELECT count(*) FROM dlock.leases)
                      + (SELECT count(*) FROM dlock.waiters)",
                &[],
            )
            .await
            .expect("count what is left")
            .get(0);
        (seen, left)
    });
    let status = child.wait().expect("wait");
    let text = format!(
        "{}{}",
        std::fs::read_to_string(dir.join("stdout")).expect("stdout"),
        std::fs::read_to_string(dir.join("stderr")).expect("stderr")
    );
    assert!(status.success(), "{text}");
    let redacted = format!("postgres://dlock:***@127.0.0.1:{}/postgres", pg.port());
    assert!(
        text.contains(&format!("lock server {redacted}")),
        "the run names the server it tortures: {text}"
    );
    assert!(
        text.contains("skipped for postgres://dlock:***@"),
        "restart needs a server dlock owns: {text}"
    );
    let report_text = std::fs::read_to_string(dir.join("report.json")).expect("report.json");
    for (what, body) in [("output", &text), ("report.json", &report_text)] {
        assert!(
            !body.contains(dlock_test::postgres::PASSWORD),
            "the password is in the {what}"
        );
    }
    let report: serde_json::Value = serde_json::from_str(&report_text).expect("json");
    assert_eq!(report["lock_server"], redacted.as_str());
    let kinds = report["kinds"].as_array().expect("kinds");
    assert_eq!(kinds.len(), 1, "{kinds:?}");
    let f = &kinds[0]["findings"];
    assert_eq!(f["kind"], "postgres-fenced");
    assert_eq!(f["verdict_ok"], true, "{f}");
    assert!(f["holds"].as_u64().is_some_and(|n| n > 0), "{f}");
    assert!(
        f["fenced_acknowledged"].as_u64().is_some_and(|n| n > 0),
        "holders wrote: {f}"
    );
    for zero in [
        "stale_accepted",
        "fenced_lost",
        "fence_regressions",
        "fence_reuse",
        "unexcused_overlaps",
        "orphans",
        "worker_failures",
    ] {
        assert_eq!(f[zero], 0, "{zero}: {f}");
    }
    let faults: Vec<&str> = f["faults"]
        .as_array()
        .expect("faults")
        .iter()
        .filter_map(|x| x.as_str())
        .collect();
    for fault in ["pause", "kill", "blackhole"] {
        assert!(faults.contains(&fault), "{fault} took effect: {faults:?}");
    }
    assert!(
        !faults.iter().any(|x| x.contains("restart")),
        "not restarted: {faults:?}"
    );
    // The holds were made on this server, under the kind's lock key, with fences.
    assert!(!seen.is_empty(), "no hold seen on the server given");
    for (key, fence) in &seen {
        assert!(
            key.starts_with("torture:") && key.ends_with(":postgres-fenced:lock"),
            "{key}"
        );
        assert!(*fence > 0, "{key}: {fence}");
    }
    let fences: Vec<i64> = kinds[0]["holds"]
        .as_array()
        .expect("holds")
        .iter()
        .filter_map(|h| h["fence"].as_i64())
        .collect();
    // The grants the report holds are the server's: fences seen there are reported
    // ones (not every one: a grant whose reply a blackhole or a kill swallowed is not).
    let reported = seen.iter().filter(|s| fences.contains(&s.1)).count();
    assert!(
        reported > 0,
        "no fence seen on the server is a reported grant's: {seen:?} vs {fences:?}"
    );
    // And nothing of the run is left there.
    assert_eq!(left, 0, "rows left on the user's server");
    let _ = std::fs::remove_dir_all(dir);
}

/// A clock fault that cannot run here (no libfaketime) fails the run at once where it was
/// asked for — named in --faults, or in the CI profile (--quick with the kinds named) —
/// and is skipped with a note otherwise.
#[test]
fn a_clock_fault_that_cannot_run_fails_the_run_only_where_it_was_asked_for() {
    let dir = scratch("torture-no-faketime");
    let torture = |args: &[&str]| {
        output(
            harness()
                .env("DLOCK_LIBFAKETIME", dir.join("no-libfaketime.so"))
                .env_remove("CI")
                .arg("torture")
                .args(args)
                .args(["--out", dir.to_str().expect("utf-8 path")]),
        )
    };
    for args in [
        &[
            "--kinds",
            "postgres-fenced",
            "--faults",
            "pause,client-clock",
        ][..],
        &["--kinds", "postgres-fenced", "--faults", "clock-jump"],
        &["--kinds", "postgres-fenced", "--quick"],
    ] {
        let out = torture(args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(69), "{args:?}: {err}");
        assert!(
            err.contains("cannot be injected here") && err.contains("DLOCK_LIBFAKETIME"),
            "{args:?}: {err}"
        );
        assert!(!dir.join("report.json").exists(), "{args:?}: nothing ran");
    }
    // Not asked for by name, outside the CI profile: skipped, said, and the run goes on.
    let out = torture(&[
        "--kinds",
        "postgres-fenced",
        "--duration",
        "4s",
        "--workers",
        "2",
    ]);
    let err = stderr(&out);
    assert!(
        out.status.success(),
        "{err}{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(
        err.contains("clock-jump") && err.contains("are skipped"),
        "{err}"
    );
    let report: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("report.json")).expect("report.json"),
    )
    .expect("json");
    let f = &report["kinds"][0]["findings"];
    assert!(
        f["faults"].as_array().is_some_and(|a| !a
            .iter()
            .any(|x| x.as_str().is_some_and(|x| x.contains("clock")))),
        "{f}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// The proof that `client-clock` reaches the workers. Positive control: setnx-getset
/// expires locks by the client's wall clock, so under the workers' clock jump alone (no
/// pause) a worker whose clock stepped an hour ahead takes over a held lock: it must be
/// caught, by overlaps inside the jump's windows, and the workers must report the step.
/// And the audit's case, a preload that silently failed (`DLOCK_LIBFAKETIME=/dev/null`:
/// ld.so ignores it with a warning and the workers run on the real clock): a dlock kind
/// that would otherwise pass fails as not exercised. (faketime is installed in CI: the
/// harness finds Debian's libfaketimeMT.so.1 beside libfaketime.so.1, and fails the run
/// at once, exit 69, if it cannot.)
#[test]
fn a_jump_of_the_workers_clock_catches_setnx_getset_and_must_reach_the_workers() {
    let caught_dir = scratch("torture-client-clock");
    let missed_dir = scratch("torture-client-clock-missed");
    let torture = |dir: &PathBuf, kind: &str, duration: &str| {
        let mut cmd = harness();
        cmd.env_remove("DLOCK_LIBFAKETIME")
            .args([
                "torture",
                // Room for two jumps (forward, then back; three ttls apart): a jump ahead
                // while a worker holds the lock catches it, and so does setting the clock
                // right after the jump back.
                "--duration",
                duration,
                "--workers",
                "4",
                "--kinds",
                kind,
                "--faults",
                "client-clock",
                "--out",
                dir.to_str().expect("utf-8 path"),
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd
    };
    // Both at once: they spend their time waiting.
    let caught = torture(&caught_dir, "setnx-getset", "10s")
        .spawn()
        .expect("run the harness");
    let missed = torture(&missed_dir, "dlock-fenced", "6s")
        .env("DLOCK_LIBFAKETIME", "/dev/null")
        .spawn()
        .expect("run the harness");
    let (caught, missed) = (
        caught.wait_with_output().expect("harness"),
        missed.wait_with_output().expect("harness"),
    );
    let report = |dir: &PathBuf| -> serde_json::Value {
        serde_json::from_str(
            &std::fs::read_to_string(dir.join("report.json")).expect("report.json"),
        )
        .expect("json")
    };

    let text = String::from_utf8_lossy(&caught.stdout).into_owned();
    assert!(caught.status.success(), "{text}{}", stderr(&caught));
    let run = &report(&caught_dir)["kinds"][0];
    let f = &run["findings"];
    assert_eq!(f["kind"], "setnx-getset");
    assert_eq!(f["faults"], serde_json::json!(["client-clock"]), "{f}");
    let jumps = run["fault_windows"].as_array().expect("windows");
    assert!(
        !jumps.is_empty() && jumps.iter().all(|w| w["fault"] == "client-clock"),
        "{jumps:?}"
    );
    // The workers saw it: at least one of those running reported the step.
    let (seen, running) = (
        f["client_clock_seen"].as_u64().expect("seen"),
        f["client_clock_workers"].as_u64().expect("running"),
    );
    assert!(seen > 0 && seen <= running, "{f}");
    assert!(
        text.contains(&format!(
            "workers saw a wall-clock step of ±1h: {seen} of {running}"
        )),
        "{text}"
    );
    // Caught, by overlaps while the clock was moved (no pause to excuse any).
    assert!(
        f["client_clock_overlaps"].as_u64().is_some_and(|n| n > 0),
        "{f}"
    );
    assert!(
        f["verdict_ok"] == true
            && f["verdict"]
                .as_str()
                .is_some_and(|v| v.starts_with("ok: control caught") && v.contains("wall clock")),
        "{f}"
    );

    let text = String::from_utf8_lossy(&missed.stdout).into_owned();
    let err = stderr(&missed);
    assert_eq!(missed.status.code(), Some(1), "{text}{err}");
    assert!(err.contains("LD_PRELOAD cannot be preloaded"), "{err}");
    let f = &report(&missed_dir)["kinds"][0]["findings"];
    assert_eq!(f["kind"], "dlock-fenced");
    assert_eq!(f["faults"], serde_json::json!(["client-clock"]), "{f}");
    assert_eq!(f["client_clock_seen"], 0, "{f}");
    assert!(
        f["client_clock_workers"].as_u64().is_some_and(|n| n > 0),
        "{f}"
    );
    // Nothing else wrong: only the clock that never reached the workers fails it.
    assert_eq!(f["overlaps"], 0, "{f}");
    assert_eq!(f["stale_accepted"], 0, "{f}");
    assert!(
        f["verdict_ok"] == false
            && f["verdict"].as_str().is_some_and(|v| {
                v.starts_with("FAIL: not exercised") && v.contains("never reached them")
            }),
        "{f}"
    );
    let _ = std::fs::remove_dir_all(caught_dir);
    let _ = std::fs::remove_dir_all(missed_dir);
}

/// A kind that exists for one fault, named without it: a usage error, before anything
/// runs (it would prove nothing).
#[test]
fn a_kind_named_without_the_fault_it_exists_for_is_a_usage_error() {
    let dir = scratch("torture-required");
    for (kind, faults, fault) in [
        ("plain-del", "kill", "pause"),
        ("setnx-expire", "pause", "kill"),
        ("sentinel-fenced", "pause,kill", "failover"),
        ("redlock-immediate-restart", "pause", "restart"),
    ] {
        let out = output(harness().args([
            "torture",
            "--kinds",
            kind,
            "--faults",
            faults,
            "--out",
            dir.to_str().expect("utf-8 path"),
        ]));
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(64), "{kind}: {err}");
        assert!(
            err.contains(kind) && err.contains(&format!("the {fault} fault")),
            "{kind}: {err}"
        );
    }
    // The Redis kinds need a Redis server, which a PostgreSQL URL is not.
    let out = output(harness().args([
        "torture",
        "--url",
        "postgres://app:pw@127.0.0.1:1/db",
        "--kinds",
        "dlock-fenced",
        "--out",
        dir.to_str().expect("utf-8 path"),
    ]));
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(64), "{err}");
    assert!(
        err.contains("needs a Redis lock server") && !err.contains(":pw@"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// A harness built without the `etcd` feature refuses `--kinds etcd-fenced` before it
/// starts anything, saying how to get it (with the feature, the kind runs: above).
#[cfg(not(feature = "etcd"))]
#[test]
fn etcd_fenced_is_refused_by_a_harness_built_without_etcd_support() {
    let dir = scratch("torture-no-etcd");
    let out = output(harness().args([
        "torture",
        "--kinds",
        "memory,etcd-fenced",
        "--out",
        dir.to_str().expect("utf-8 path"),
    ]));
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(64), "{err}");
    assert!(
        err.contains("etcd-fenced") && err.contains("--features etcd") && err.contains("protoc"),
        "{err}"
    );
    assert!(
        out.stdout.is_empty(),
        "nothing ran: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// `sslmode=require`/`verify-full` URLs work in `dlock demo` and `dlock torture` as they do
/// in the library (the harness builds dlock with `postgres-tls` itself): the demo keeps
/// its fenced stock over TLS, the torture runs postgres-fenced over it (straight to the
/// server: dlock verifies its name, which no proxy's address is, so the network faults
/// are skipped, with a note). A certificate the platform does not trust is refused.
#[test]
fn demo_and_torture_take_a_postgres_url_with_tls() {
    let pg = dlock_test::postgres::PostgresServer::start_tls().expect("postgres with TLS");
    let url = format!(
        "{}?sslmode=verify-full&sslrootcert={}",
        pg.url(),
        pg.certificate().display()
    );
    let text = demo_on(harness(), &url);
    assert!(text.contains("Store: PostgreSQL at"), "{text}");
    // Without the CA, the self-signed certificate does not verify: TLS was asked for.
    let untrusted = format!("{}?sslmode=require", pg.url());
    let out = output(harness().args(["demo", "--plain", "--url", &untrusted]));
    assert_eq!(out.status.code(), Some(69), "{}", stderr(&out));
    assert!(stderr(&out).contains("TLS"), "{}", stderr(&out));
    let dir = scratch("torture-postgres-tls");
    let out = output(harness().env_remove("CI").args([
        "torture",
        "--url",
        &url,
        "--kinds",
        "postgres-fenced",
        "--faults",
        "pause,kill,blackhole",
        "--duration",
        "6s",
        "--workers",
        "2",
        "--out",
        dir.to_str().expect("utf-8 path"),
    ]));
    let err = stderr(&out);
    assert!(
        out.status.success(),
        "{err}{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(err.contains("blackhole and close skipped"), "{err}");
    let report: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("report.json")).expect("report.json"),
    )
    .expect("json");
    let f = &report["kinds"][0]["findings"];
    assert_eq!(f["kind"], "postgres-fenced");
    assert_eq!(f["verdict_ok"], true, "{f}");
    assert!(
        f["fenced_acknowledged"].as_u64().is_some_and(|n| n > 0),
        "holders wrote: {f}"
    );
    let _ = std::fs::remove_dir_all(dir);
}
