//! Mutual exclusion: which overlapping holds a fault explains (a holder paused while
//! holding, or a restart without persistence inside the pair), and which are the lock's
//! fault.

use super::Hold;
use crate::model::{Fault, FaultWindow, Kind};

/// How long after a clock fault's window a grant reported may still have been made under
/// the clock before the window's last step.
const CLOCK_STEP_SLACK_NS: u64 = 250_000_000;

/// The fault window that explains an overlap between holds `a` and `b`, if any: one of
/// them is a worker paused (stalled) while holding, or a restart without persistence fell
/// inside the pair or was under way when the earlier grant was reported (the server, or
/// RedLock nodes started empty at once, forgot the lock).
/// No lease lock survives those unfenced; every other overlap is the lock's fault — a
/// delayed restart of RedLock nodes included, and an etcd member's or leader's restart
/// (raft keeps the lock through it). A pause is named first when both apply; a failover
/// before replication (a grant that died with the master) is named last.
pub(crate) fn explanation(a: &Hold, b: &Hold, windows: &[FaultWindow]) -> Option<Fault> {
    let paused = windows.iter().any(|w| {
        w.fault == Fault::Pause
            && [a, b]
                .iter()
                .any(|h| w.worker == Some(h.worker) && w.start <= h.end && w.end >= h.start)
    });
    let (lo, hi) = (a.start.min(b.start), a.end.max(b.end));
    // A restart under way when the earlier grant was reported counts too: the server may
    // have granted it just before it died (the window opens before the kill), and the
    // later grant then came from the server started empty.
    let restart = windows
        .iter()
        .any(|w| w.fault == Fault::Restart && w.start <= hi && w.end >= lo);
    if paused {
        Some(Fault::Pause)
    } else if restart {
        Some(Fault::Restart)
    } else if windows
        .iter()
        .any(|w| w.fault == Fault::Failover && w.start <= hi && w.end >= lo)
    {
        // A failover's hazard lasts its whole window (a grant lost with the master, then
        // the old master back empty, serving clients until the sentinels demote it), so
        // any pair the window touches. Whether that excuses it depends on the kind (see
        // `Kind::failover_excuses`).
        Some(Fault::Failover)
    } else {
        // A forward step or a fast run of the lock server's wall clock ends leases early
        // while its window lasts, and so does the step forward that sets a clock right
        // after `clock-back` (at the window's end: a grant the server made just before the
        // step may be reported just after it, hence the slack); whether that excuses the
        // overlap depends on the store (see `Kind::clock_excuses`).
        windows
            .iter()
            .find(|w| {
                w.fault.moves_store_clock()
                    && w.start <= hi
                    && w.end.saturating_add(CLOCK_STEP_SLACK_NS) >= lo
            })
            .map(|w| w.fault)
    }
}

/// Whether a fault the kind's guarantees exclude explains the overlap of `a` and `b`.
pub(crate) fn excused(a: &Hold, b: &Hold, windows: &[FaultWindow], kind: Kind) -> bool {
    explanation(a, b, windows).is_some_and(|f| kind.excuses(f))
}
