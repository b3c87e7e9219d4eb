//! Fence order: grants' fences strictly increase in grant order and never repeat; a
//! restart without persistence (which forgets the counter) starts the sequence over, and
//! so does a failover before replication on the kinds where it may lose the counter's
//! last increments (Sentinel and Cluster without `WAIT`).

use std::collections::BTreeMap;

use super::Input;
use crate::model::Fault;
use crate::worker::Step;

/// (grants whose fence was not above every earlier grant's since the last restart,
/// fences granted more than once).
pub(crate) fn check(input: &Input<'_>) -> (usize, usize) {
    let mut grants: Vec<(u64, u64)> = input
        .history
        .iter()
        .filter_map(|(_, step)| match step {
            Step::Acquired { t, fence, .. } if *fence > 0 => Some((*t, *fence)),
            _ => None,
        })
        .collect();
    // The first grant after a restart began may still come from the old server (its
    // reply was on its way), so the sequence starts over at the first grant after the
    // restart that does not exceed the highest fence so far — or, failing that, at the
    // first grant after the restart was over, which the new server made.
    grants.sort_unstable();
    // Where a failover before replication is excused, two masters may grant at once
    // until the old one is demoted (its counter lost, or reset by its restart): grants
    // inside the window are not ordered, and the sequence starts over after it.
    if input.kind.failover_excuses() {
        grants.retain(|&(t, _)| {
            !input
                .windows
                .iter()
                .any(|w| w.fault == Fault::Failover && w.start <= t && t <= w.end)
        });
    }
    let mut restarts: Vec<(u64, u64)> = input
        .windows
        .iter()
        .filter(|w| {
            w.fault == Fault::Restart
                || (w.fault == Fault::Failover && input.kind.failover_excuses())
        })
        .map(|w| (w.start, w.end))
        .collect();
    restarts.sort_unstable();
    let mut fence_regressions = 0;
    let mut fence_reuse = 0;
    let mut seen: BTreeMap<u64, usize> = BTreeMap::new();
    let mut max_fence = (0u64, 0u64); // (fence, time)
    let mut next_restart = 0;
    // The end of the latest restart whose reset is still due.
    let mut reset_due: Option<u64> = None;
    for &(t, fence) in &grants {
        while restarts
            .get(next_restart)
            .is_some_and(|&(start, _)| start < t)
        {
            reset_due = Some(restarts[next_restart].1);
            next_restart += 1;
        }
        if let Some(restart_end) = reset_due
            && (fence <= max_fence.0 || t > restart_end)
        {
            reset_due = None;
            seen.clear();
            max_fence = (0, t);
        }
        if fence <= max_fence.0 {
            fence_regressions += 1;
        }
        let n = seen.entry(fence).or_default();
        *n += 1;
        if *n > 1 {
            fence_reuse += 1;
        }
        if fence > max_fence.0 {
            max_fence = (fence, t);
        }
    }
    (fence_regressions, fence_reuse)
}
