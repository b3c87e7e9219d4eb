//! Mutual exclusion: which overlapping holds a fault explains (a holder paused while
//! holding, or a restart without persistence inside the pair), and which are the lock's
//! fault.

use super::Hold;
use crate::model::{Fault, FaultWindow};

/// The fault window that explains an overlap between holds `a` and `b`, if any: one of
/// them is a worker paused (stalled) while holding, or a restart without persistence fell
/// inside the pair (the server, or RedLock nodes started empty at once, forgot the lock).
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
    let began_inside = |fault: Fault| {
        windows
            .iter()
            .any(|w| w.fault == fault && w.start >= lo && w.start <= hi)
    };
    if paused {
        Some(Fault::Pause)
    } else if began_inside(Fault::Restart) {
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
        None
    }
}

pub(crate) fn excused(a: &Hold, b: &Hold, windows: &[FaultWindow], failover: bool) -> bool {
    match explanation(a, b, windows) {
        Some(Fault::Failover) => failover,
        other => other.is_some(),
    }
}
