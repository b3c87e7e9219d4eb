//! The real `dlock-torture` binary (`dlock torture`, `dlock demo`) against real servers
//! from the test kit.

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use dlock_test::server::{RedisServer, free_port};

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
        "--faults",
        "kill,restart,delay,blackhole",
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
