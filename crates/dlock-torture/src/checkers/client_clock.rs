//! The workers' wall clock: whether a jump of it (`client-clock`) reached the workers at
//! all (each reports its clock's offset from the real one), and which overlaps a jump's
//! window touches. dlock reads only the monotonic clock, so for its kinds there may be
//! none; setnx-getset expires locks by the client's wall clock, and they are how it is
//! caught.

use std::collections::{BTreeMap, BTreeSet};

use super::holds::step_time;
use super::{Hold, Input};
use crate::model::{CLIENT_JUMP, Fault, FaultWindow};
use crate::worker::Step;

/// How long after a client-clock window an overlap may still come of the step that ends
/// it (the clock set right): a grant made just before the step may be reported after it.
const STEP_SLACK_NS: u64 = 250_000_000;

/// Of the workers running while the workers' wall clock was moved (their first report
/// before a client-clock window ended, not killed before it began), how many reported
/// their wall clock off by half a jump or more: `(saw it, running)`. `(0, 0)` without a
/// client-clock window.
pub(crate) fn seen(input: &Input<'_>) -> (usize, usize) {
    let windows: Vec<&FaultWindow> = input
        .windows
        .iter()
        .filter(|w| w.fault == Fault::ClientClock)
        .collect();
    if windows.is_empty() {
        return (0, 0);
    }
    let half_ms = i64::try_from(CLIENT_JUMP.as_millis() / 2).unwrap_or(i64::MAX);
    let mut first: BTreeMap<usize, u64> = BTreeMap::new();
    let mut saw: BTreeSet<usize> = BTreeSet::new();
    for (w, step) in input.history {
        let t = step_time(step);
        first
            .entry(*w)
            .and_modify(|f| *f = (*f).min(t))
            .or_insert(t);
        if let Step::Clock { offset_ms, .. } = step
            && offset_ms.unsigned_abs() >= half_ms.unsigned_abs()
        {
            saw.insert(*w);
        }
    }
    let running: BTreeSet<usize> = first
        .iter()
        .filter(|&(&w, &start)| {
            windows.iter().any(|win| {
                start <= win.end && !input.kills.iter().any(|k| k.worker == w && k.t < win.start)
            })
        })
        .map(|(&w, _)| w)
        .collect();
    (saw.intersection(&running).count(), running.len())
}

/// Whether a client-clock window (or the step that ended it) falls inside the pair of
/// holds `a` and `b`.
pub(crate) fn touches(a: &Hold, b: &Hold, windows: &[FaultWindow]) -> bool {
    let (lo, hi) = (a.start.min(b.start), a.end.max(b.end));
    windows.iter().any(|w| {
        w.fault == Fault::ClientClock && w.start <= hi && w.end.saturating_add(STEP_SLACK_NS) >= lo
    })
}
