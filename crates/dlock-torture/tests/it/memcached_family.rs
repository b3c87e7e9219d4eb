//! The `memcached-family-fenced` kind: memcached's read-write lock under a holder's pause
//! and kill, memcached's restart and a jump of its clock keeps the fenced resource intact
//! and readers apart from writers.

use super::*;

#[test]
fn torture_holds_memcached_s_read_write_lock_to_its_fences_across_restarts_and_clock_jumps() {
    let dir = scratch("torture-memcached-family");
    let out = output(harness().args([
        "torture",
        "--duration",
        "18s",
        "--workers",
        "3",
        "--kinds",
        "memcached-family-fenced",
        "--faults",
        "pause,kill,restart,clock-jump",
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
    assert_eq!(f["kind"], "memcached-family-fenced");
    for some in ["fenced_acknowledged", "read_holds"] {
        assert!(f[some].as_u64().is_some_and(|n| n > 0), "{some}: {f}");
    }
    assert!(f["faults"].as_array().is_some_and(|a| !a.is_empty()), "{f}");
    for zero in [
        "stale_accepted",
        "fenced_lost",
        "fence_regressions",
        "unexcused_overlaps",
        "unexcused_read_overlaps",
        "liveness_violations",
        "orphans",
        "worker_failures",
    ] {
        assert_eq!(f[zero], 0, "{zero}: {f}");
    }
    assert!(text.contains("fences start over at 1"), "{text}");
    let _ = std::fs::remove_dir_all(dir);
}
