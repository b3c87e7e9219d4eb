//! The command kinds (issue 25, "the harness must see the edges"): `dlock run` processes,
//! the shipped binary, whose command ignores SIGTERM, writes for longer than a lease and
//! leaves a writer in the background — and the control that runs the same command under
//! `dlock acquire`'s lease, unsupervised. The resource sees every write of every process
//! a command started, unfenced; a write after the next holder's grant is two holders at
//! once.

use super::{dlock, output, scratch, stderr};

/// `dlock torture --kinds <kind>` for `duration` under `faults`, 3 workers: its stdout,
/// and the kind's entry of report.json.
fn torture(kind: &str, duration: &str, faults: &str) -> (String, serde_json::Value) {
    let dir = scratch(kind);
    let out = output(dlock().args([
        "torture",
        "--duration",
        duration,
        "--workers",
        "3",
        "--kinds",
        kind,
        "--faults",
        faults,
        "--out",
        dir.to_str().expect("utf-8 path"),
    ]));
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), stderr(&out));
    let report: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("report.json"))
            .unwrap_or_else(|e| panic!("no report.json ({e}):\n{text}")),
    )
    .expect("json");
    let entry = report["kinds"][0].clone();
    assert_eq!(entry["findings"]["kind"], kind, "{text}");
    let _ = std::fs::remove_dir_all(dir);
    assert!(
        out.status.success(),
        "{kind}: exit {:?}\n{text}",
        out.status.code()
    );
    (text, entry)
}

/// The supervised kind on `kind`'s store, under a pause of a holder's `dlock` process and a
/// partition of its links to the store, each at a grant: no write of any command, nor of
/// any process it left behind, after the next holder's grant — a paused `dlock` included
/// (its reaper process kills the command on time).
fn supervised(kind: &str) {
    // Room for both faults (and a third): they start three ttls (9 s) apart, and one
    // waits for the last one's window (a pause's lasts up to 3.5 ttls) and for a grant.
    let (text, entry) = torture(kind, "40s", "pause,blackhole");
    let f = &entry["findings"];
    assert_eq!(f["verdict_ok"], true, "{text}");
    for zero in [
        "late_writes",
        "unexcused_overlaps",
        "worker_failures",
        "orphans",
        "liveness_violations",
    ] {
        assert_eq!(f[zero], 0, "{zero}: {f}\n{text}");
    }
    assert!(f["holds"].as_u64().is_some_and(|n| n >= 3), "{f}");
    let faults = f["faults"].as_array().expect("faults");
    for fault in ["pause", "blackhole"] {
        assert!(faults.iter().any(|x| x == fault), "{fault}: {f}");
    }
    // Each fault hit a holder at its grant: its worker holds from the window's start.
    let holds = entry["holds"].as_array().expect("holds");
    for window in entry["fault_windows"].as_array().expect("windows") {
        let hit = holds.iter().any(|h| {
            h["worker"] == window["worker"]
                && h["start"].as_u64() <= window["start"].as_u64()
                && h["end"].as_u64() >= window["start"].as_u64()
        });
        assert!(hit, "{window} hit no holder: {holds:?}");
    }
}

/// Redis, `dlock run --ttl 3s` with the default `--kill-grace` (10 s): the lease is the
/// ttl. Fails until `dlock run` kills the command's whole process group before its lease
/// can end and holds the lock until every process of the group has exited.
#[test]
fn torture_finds_no_write_of_a_dlock_run_command_or_its_children_outside_its_hold() {
    supervised("run-supervised");
}

/// ZooKeeper, session timeout 3 s: the lease is 2/3 of it (2 s), shorter than the ttl,
/// and a third of the default `--kill-grace`.
#[test]
fn torture_finds_no_write_of_a_dlock_run_command_outside_its_hold_on_zookeeper() {
    supervised("run-supervised-zookeeper");
}

/// The control: the same command under a lease nobody supervises (`dlock acquire --ttl
/// 3s`, the command, `dlock release`) writes after the next holder's grant, and the
/// checker says so — its own writes and its background writer's.
#[test]
fn torture_catches_a_command_that_outlives_an_unsupervised_lease() {
    let (text, entry) = torture("run-unsupervised", "12s", "blackhole");
    let f = &entry["findings"];
    assert_eq!(f["verdict_ok"], true, "{text}");
    assert!(
        f["verdict"]
            .as_str()
            .is_some_and(|v| v.contains("control caught")),
        "{f}"
    );
    assert!(
        f["unexcused_overlaps"].as_u64().is_some_and(|n| n > 0),
        "{f}"
    );
    assert!(f["late_writes"].as_u64().is_some_and(|n| n > 0), "{f}");
    assert!(
        f["late_writes_background"].as_u64().is_some_and(|n| n > 0),
        "{f}"
    );
    assert_eq!(f["worker_failures"], 0, "{f}\n{text}");
}
