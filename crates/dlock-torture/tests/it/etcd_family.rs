//! The `etcd-family-fenced` kind: etcd's read-write lock under a holder's kill and a
//! leader's restart keeps the fenced resource intact and readers apart from writers.

#![cfg(feature = "etcd")]

use super::*;

#[test]
fn torture_holds_etcd_s_read_write_lock_to_its_fences_across_a_leader_restart() {
    let dir = scratch("torture-etcd-family");
    let out = output(harness().args([
        "torture",
        "--duration",
        "18s",
        "--workers",
        "3",
        "--kinds",
        "etcd-family-fenced",
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
    let f = &report["kinds"][0]["findings"];
    assert_eq!(f["kind"], "etcd-family-fenced");
    for some in ["fenced_acknowledged", "read_holds"] {
        assert!(f[some].as_u64().is_some_and(|n| n > 0), "{some}: {f}");
    }
    for zero in [
        "stale_accepted",
        "fenced_lost",
        "fence_regressions",
        "fence_reuse",
        "overlaps",
        "read_overlaps",
        "liveness_violations",
        "orphans",
        "worker_failures",
    ] {
        assert_eq!(f[zero], 0, "{zero}: {f}");
    }
    let _ = std::fs::remove_dir_all(dir);
}
