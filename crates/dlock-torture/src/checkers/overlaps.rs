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
/// (raft keeps the lock through it). A pause is named first when both apply.
pub(crate) fn explanation(a: &Hold, b: &Hold, windows: &[FaultWindow]) -> Option<Fault> {
    let paused = windows.iter().any(|w| {
        w.fault == Fault::Pause
            && [a, b]
                .iter()
                .any(|h| w.worker == Some(h.worker) && w.start <= h.end && w.end >= h.start)
    });
    let restarted = windows.iter().any(|w| {
        let (lo, hi) = (a.start.min(b.start), a.end.max(b.end));
        w.fault == Fault::Restart && w.start >= lo && w.start <= hi
    });
    if paused {
        Some(Fault::Pause)
    } else if restarted {
        Some(Fault::Restart)
    } else {
        None
    }
}

pub(crate) fn excused(a: &Hold, b: &Hold, windows: &[FaultWindow]) -> bool {
    explanation(a, b, windows).is_some()
}
