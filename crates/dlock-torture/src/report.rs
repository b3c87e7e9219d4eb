//! What a run reports: `report.json` (every kind's findings, fault windows, kills and
//! holds) and the summary table on stdout.

use std::path::Path;

use serde::Serialize;

use crate::checkers::{Findings, Hold, Kill};
use crate::exit::{self, Failure};
use crate::model::{Fault, FaultWindow, Kind};

#[derive(Serialize)]
pub(crate) struct Report<'a> {
    pub(crate) seed: u64,
    pub(crate) ttl_ms: u64,
    pub(crate) workers: usize,
    pub(crate) duration_ms: u64,
    pub(crate) lock_server: &'a str,
    pub(crate) kinds: &'a [KindReport],
}

#[derive(Serialize)]
pub(crate) struct KindReport {
    pub(crate) findings: Findings,
    pub(crate) fault_windows: Vec<FaultWindow>,
    pub(crate) kills: Vec<Kill>,
    /// Exclusive holds (a read-write lock's write holds).
    pub(crate) holds: Vec<Hold>,
    /// A read-write lock's read holds.
    pub(crate) read_holds: Vec<Hold>,
}

pub(crate) fn write(path: &Path, text: &str) -> Result<(), Failure> {
    std::fs::write(path, text).map_err(|e| {
        Failure::new(
            exit::UNAVAILABLE,
            format!("writing {}: {e}", path.display()),
        )
    })
}

pub(crate) fn print_summary(reports: &[KindReport]) {
    println!(
        "\n{:<16} {:>6} {:>8} {:>10} {:>8} {:>8} {:>8} {:>10} {:>7}  verdict",
        "kind",
        "holds",
        "overlaps",
        "lost incr",
        "stale ok",
        "refused",
        "f. lost",
        "reacquire",
        "orphans"
    );
    for r in reports {
        let f = &r.findings;
        let reacquire = f
            .reacquire_ms
            .iter()
            .max()
            .map_or_else(|| "-".to_owned(), |ms| format!("{ms} ms"));
        let fenced = f.kind.is_fenced();
        let dash = |fenced_metric: bool, v: u64| {
            if fenced_metric == fenced {
                v.to_string()
            } else {
                "-".to_owned()
            }
        };
        println!(
            "{:<16} {:>6} {:>8} {:>10} {:>8} {:>8} {:>8} {:>10} {:>7}  {}",
            f.kind.id(),
            f.holds,
            f.overlaps,
            dash(false, f.lost_increments),
            dash(true, f.stale_accepted),
            dash(true, f.fenced_refused),
            dash(true, f.fenced_lost),
            reacquire,
            f.orphans,
            f.verdict
        );
        if !f.stall_ms.is_empty() && !f.kind.is_control() {
            println!(
                "{:<16} STALLED {} time(s): nobody got the lock for {:?} ms, no fault or crash explaining it",
                "",
                f.stall_ms.len(),
                f.stall_ms
            );
        }
        // Where an overlap failed the kind (a control's are its point: not printed).
        for sample in f.unexcused_samples.iter().filter(|_| !f.verdict_ok) {
            println!("{:<16} UNEXCUSED overlap: {sample}", "");
        }
        // The checks of one primitive only, on a line of their own.
        if f.kind == Kind::RwlockFenced {
            println!(
                "{:<16} read holds {}, overlapping a write hold {} ({} outside pause/restart windows)",
                "", f.read_holds, f.read_overlaps, f.unexcused_read_overlaps
            );
        }
        if f.kind == Kind::ReentrantFenced {
            println!(
                "{:<16} re-entries {}, fence mismatches {} (re-entries after the outer hold lapsed: {})",
                "", f.reentries, f.reentry_mismatches, f.reentries_lapsed
            );
        }
        let windows = |fault: Fault| r.fault_windows.iter().filter(|w| w.fault == fault).count();
        if f.kind == Kind::ElectionFenced {
            println!(
                "{:<16} leaderships {} (each a campaign won, a term-fenced write, a resignation); terms {} out of grant order, {} reused",
                "", f.holds, f.fence_regressions, f.fence_reuse
            );
        }
        if f.kind == Kind::Redlock {
            println!(
                "{:<16} node restarts: {} empty at once (overlaps only they explain: {}), {} empty after 2 × ttl; no fences",
                "",
                windows(Fault::Restart),
                f.restart_overlaps,
                windows(Fault::DelayedRestart)
            );
        }
        if !f.faults_missed.is_empty() {
            let missed: Vec<&str> = f.faults_missed.iter().map(|x| x.id()).collect();
            println!(
                "{:<16} scheduled but never took effect: {} (the run did not test the kind under them; name them in --faults to require them)",
                "",
                missed.join(", ")
            );
        }
        let clock_windows = [
            Fault::ClockJump,
            Fault::ClockBack,
            Fault::ClockFast,
            Fault::ClientClock,
        ]
        .map(windows);
        if clock_windows.iter().any(|&n| n > 0) {
            println!(
                "{:<16} clock faults: the store's wall clock {} × forward, {} × back, {} × fast; the workers' {} × an hour; overlaps only a store clock fault explains {} ({})",
                "",
                clock_windows[0],
                clock_windows[1],
                clock_windows[2],
                clock_windows[3],
                f.clock_overlaps,
                if f.kind.clock_excuses() {
                    "excused: leases expire by this store's wall clock"
                } else {
                    "none excused: this store's expiry does not follow its wall clock"
                }
            );
        }
        if clock_windows[3] > 0 {
            println!(
                "{:<16} workers saw a wall-clock step of ±{}: {} of {}; overlaps while it was moved {} ({})",
                "",
                humantime::format_duration(crate::model::CLIENT_JUMP),
                f.client_clock_seen,
                f.client_clock_workers,
                f.client_clock_overlaps,
                if f.kind == Kind::SetnxGetset {
                    "this control expires locks by the client's wall clock: they catch it"
                } else {
                    "none may be: dlock reads only the monotonic clock"
                }
            );
        }
        if matches!(
            f.kind,
            Kind::RedlockImmediateRestart | Kind::RedlockDelayedRestart
        ) {
            println!(
                "{:<16} bridge restarts: {} at once (overlaps only they explain: {}), {} after 2 × ttl; the halves apart all run",
                "",
                windows(Fault::Restart),
                f.restart_overlaps,
                windows(Fault::DelayedRestart)
            );
        }
        if matches!(
            f.kind,
            Kind::SentinelFenced | Kind::SentinelWaitFenced | Kind::ClusterFenced
        ) {
            println!(
                "{:<16} failovers before replication: {}; overlaps only a failover explains {}, fences repeated {}, out of grant order {}, stale writes accepted {} ({} outside failover windows), fenced increments lost {} ({} outside failover windows)",
                "",
                f.failovers,
                f.failover_overlaps,
                f.fence_reuse,
                f.fence_regressions,
                f.stale_accepted,
                f.unexcused_stale_accepted,
                f.fenced_lost,
                f.unexcused_fenced_lost
            );
        }
        if f.kind.runs_commands() {
            println!(
                "{:<16} commands' writes after the next holder's grant: {} ({} by the writers they left in the background), the latest {} ms after it",
                "", f.late_writes, f.late_writes_background, f.latest_late_write_ms,
            );
        }
        if matches!(f.kind, Kind::MemcachedFenced | Kind::MemcachedFamilyFenced) {
            println!(
                "{:<16} restarts {} (fences start over at 1), fenced writes refused after one {}, overlaps only a restart explains {}",
                "",
                windows(Fault::Restart),
                f.refused_after_restart,
                f.restart_overlaps
            );
        }
        if matches!(
            f.kind,
            Kind::EtcdFenced | Kind::EtcdFamilyFenced | Kind::ZookeeperFenced
        ) {
            println!(
                "{:<16} member restarts: {} of the leader, {} of a follower (down 2 × ttl, data kept); fences never start over: {} out of grant order, {} reused",
                "",
                windows(Fault::LeaderRestart),
                windows(Fault::MemberRestart),
                f.fence_regressions,
                f.fence_reuse
            );
        }
        if f.kind == Kind::ZookeeperFenced {
            // A zxid's high 32 bits are the epoch of the leader that made it.
            let mut epochs: Vec<u64> = r.holds.iter().map(|h| h.fence >> 32).collect();
            epochs.sort_unstable();
            epochs.dedup();
            println!(
                "{:<16} grants under {} leader epoch(s) (a fence is its node's creation zxid: epoch << 32 | counter)",
                "",
                epochs.len()
            );
        }
    }
}
