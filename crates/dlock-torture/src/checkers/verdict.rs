//! The verdict: from the findings of every checker to pass or fail, per kind (dlock's
//! primitives must show no violation outside the windows their guarantees exclude; the
//! controls must be caught). A run that did not test what it was to test fails too: a
//! kind whose [required fault](Kind::required_faults) never took effect (a control not
//! exercised proves nothing; nor does a failover kind without a failover), any fault
//! named in `--faults` that never took effect (under `all`, such a fault is reported,
//! not failed), and a jump of the workers' wall clock that no worker saw.

use super::Findings;
use crate::model::{Fault, Kind};

pub(crate) fn verdict(f: &mut Findings) {
    let dead = f.liveness_violations > 0 || f.orphans > 0;
    let fail = |why: &str| (false, format!("FAIL: {why}"));
    let required = f.kind.required_faults();
    let (ok, text) = if f.holds == 0 {
        fail("no worker ever held the lock: the run tested nothing")
    } else if f.worker_failures > 0 {
        fail(
            "a worker failed: it exited with an error, or still ran past the run's hard stop (the harness printed which, with its exit status)",
        )
    } else if !required.is_empty()
        && !required
            .iter()
            .any(|r| f.faults.iter().any(|&w| r.took_effect_as(w)))
    {
        fail(&format!(
            "not exercised: no {} took effect, so the {} kind showed nothing",
            f.kind.required_words(),
            f.kind.id()
        ))
    } else if f.faults_named && !f.faults_missed.is_empty() {
        let missed: Vec<&str> = f.faults_missed.iter().map(|x| x.id()).collect();
        fail(&format!(
            "not exercised: the fault(s) {} were scheduled but never took effect",
            missed.join(", ")
        ))
    } else if f.faults.contains(&Fault::ClientClock) && f.client_clock_seen == 0 {
        fail(&format!(
            "not exercised: the workers' wall clock was moved (client-clock), but none of \
             the {} workers running then reported it off: the fake clock never reached them \
             (libfaketime not loaded into them?)",
            f.client_clock_workers
        ))
    } else {
        match f.kind {
            Kind::Dlock
            | Kind::DlockFenced
            | Kind::FairFenced
            | Kind::RwlockFenced
            | Kind::ReentrantFenced
            | Kind::ElectionFenced
            | Kind::Redlock
            | Kind::MemcachedFenced
            | Kind::MemcachedFamilyFenced
            | Kind::EtcdFenced
            | Kind::EtcdFamilyFenced
            | Kind::PostgresFenced
            | Kind::ZookeeperFenced
            | Kind::SentinelFenced
            | Kind::SentinelWaitFenced
            | Kind::ClusterFenced
            | Kind::RedlockDelayedRestart
            | Kind::RunSupervised
            | Kind::RunSupervisedZookeeper
            | Kind::Memory => {
                let fenced = f.kind.is_fenced();
                // Without WAIT, a failover before replication may take the fence
                // counter's last increments with the master: fences repeat, and the
                // resource may accept a second write under one (SAFETY.md) — inside the
                // failover's window only (`resource` attributes each to its window).
                let failover_excused = f.kind.failover_excuses() && f.failovers > 0;
                if fenced && (f.unexcused_stale_accepted > 0 || f.unexcused_fenced_lost > 0) {
                    fail(if failover_excused {
                        "the fenced resource lost or accepted a stale write outside any failover window"
                    } else {
                        "the fenced resource lost or accepted a stale write"
                    })
                } else if f.kind.runs_commands() && f.unexcused_overlaps > 0 {
                    fail(&format!(
                        "two holders at once: a command (or a process it left in the background) \
                         wrote after the next holder's grant ({} writes, {} of them in the \
                         background, the latest {} ms after that grant): dlock run let its \
                         command outlive its hold",
                        f.late_writes, f.late_writes_background, f.latest_late_write_ms
                    ))
                } else if f.client_clock_overlaps > 0 {
                    fail("holders overlapped while the workers' wall clock was moved (client-clock): dlock must read only the monotonic clock")
                } else if f.unexcused_overlaps > 0 {
                    fail("holders overlapped outside any window that excuses it (pause, restart without persistence, a clock step on a wall-clock store)")
                } else if f.unexcused_read_overlaps > 0 {
                    fail("a read hold overlapped a write hold outside any pause/restart window")
                } else if f.reentry_mismatches > 0 {
                    fail("a re-entry into a valid hold did not get that hold's fence")
                } else if dead {
                    fail("lock not free within ttl + ε after a crash, or orphan keys")
                } else if !f.stall_ms.is_empty() {
                    fail("nobody got the lock for longer than ttl + ε, no fault or crash explaining it")
                } else if (f.fence_reuse > 0 || f.fence_regressions > 0) && fenced {
                    fail("fences did not strictly increase in grant order")
                } else if failover_excused
                    && (f.failover_overlaps > 0
                        || f.stale_accepted > 0
                        || f.fenced_lost > 0
                        || f.fence_reuse > 0)
                {
                    (
                        true,
                        "ok: violations only in failover windows (a grant the replica never received died with the master), as SAFETY.md says of failover without WAIT"
                            .to_owned(),
                    )
                } else if f.overlaps > 0 || f.read_overlaps > 0 || f.lost_increments > 0 {
                    (
                        true,
                        if fenced {
                            "ok: fenced resource intact; overlaps only in pause/restart/clock windows"
                        } else {
                            "ok: violations only in pause/restart windows, which no unfenced lease lock survives"
                        }
                        .to_owned(),
                    )
                } else {
                    (true, "ok: no violation".to_owned())
                }
            }
            Kind::RedlockImmediateRestart if f.restart_overlaps > 0 => (
                true,
                "ok: control caught (the bridge node restarted empty within the ttl and the other half formed a second majority: RedLock's restart hazard)"
                    .to_owned(),
            ),
            Kind::RedlockImmediateRestart => fail(
                "control not caught: an immediate restart of the bridge node let no second majority form",
            ),
            Kind::RunUnsupervised if f.unexcused_overlaps > 0 => (
                true,
                format!(
                    "ok: control caught (a command under dlock acquire's lease, no supervisor, \
                     wrote after the next holder's grant: {} writes, {} of them in the \
                     background, the latest {} ms after it)",
                    f.late_writes, f.late_writes_background, f.latest_late_write_ms
                ),
            ),
            Kind::RunUnsupervised => fail(
                "control not caught: a command that outlives its lease wrote nothing after the \
                 next grant: the checker or the workload is broken",
            ),
            Kind::SetnxExpire if dead => (
                true,
                "ok: control caught (a crash between SETNX and EXPIRE left a lock with no expiry)"
                    .to_owned(),
            ),
            Kind::SetnxExpire => fail("control not caught under kill: the checker or nemesis is broken"),
            Kind::SetnxGetset if f.client_clock_overlaps > 0 => (
                true,
                "ok: control caught (holders overlapped while the workers' wall clock was moved: a worker whose clock jumped ahead took over a lock it thought expired)"
                    .to_owned(),
            ),
            Kind::SetnxGetset | Kind::GetDel | Kind::PlainDel if f.unexcused_overlaps > 0 => (
                true,
                "ok: control caught (holders overlapped outside any pause window: a stale release freed another's lock)"
                    .to_owned(),
            ),
            Kind::SetnxGetset | Kind::GetDel | Kind::PlainDel => fail(&format!(
                "control not caught under {}: the checker or nemesis is broken",
                f.kind.required_words()
            )),
        }
    };
    f.verdict_ok = ok;
    f.verdict = text;
}
