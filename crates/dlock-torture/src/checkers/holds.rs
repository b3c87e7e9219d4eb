//! From a history to holds: each worker's hold of the lock from its acquire to its release
//! starting (or its death), on the write side and a read-write lock's read side, and the
//! pairs of holds of different workers that overlap.

use std::collections::HashMap;

use super::{Hold, Kill};
use crate::worker::Step;

/// Which holds to collect from a history.
#[derive(Clone, Copy)]
pub(crate) enum Side {
    /// `Acquired` … `Releasing`: the lock's exclusive holds.
    Write,
    /// `ReadAcquired` … `ReadReleasing`: a read-write lock's read holds.
    Read,
}

/// The holds of one side, by start: each from its acquire to its release starting, or to
/// its holder's death, or to the holder's last step if the run cut it off.
pub(crate) fn collect(
    history: &[(usize, Step)],
    kills: &[Kill],
    end: u64,
    side: Side,
) -> Vec<Hold> {
    let mut open: HashMap<usize, (u64, u64)> = HashMap::new();
    let mut holds = Vec::new();
    let mut last_seen: HashMap<usize, u64> = HashMap::new();
    for (w, step) in history {
        match (side, step) {
            (Side::Write, Step::Acquired { t, fence, .. }) => {
                open.insert(*w, (*t, *fence));
            }
            (Side::Read, Step::ReadAcquired { t }) => {
                open.insert(*w, (*t, 0));
            }
            (Side::Write, Step::Releasing { t }) | (Side::Read, Step::ReadReleasing { t }) => {
                if let Some((start, fence)) = open.remove(w) {
                    holds.push(Hold {
                        worker: *w,
                        start,
                        end: *t,
                        fence,
                        overlapping: false,
                    });
                }
            }
            // Reported by a thread of its own, whatever the worker's loop is doing.
            (_, Step::Clock { .. }) => continue,
            _ => {}
        }
        let t = step_time(step);
        last_seen.insert(*w, t);
    }
    for (w, (start, fence)) in open {
        // A holder that never started releasing: killed (its hold ends at its death) or
        // cut off by the end of the run.
        let stop = kills.iter().find(|k| k.worker == w).map_or_else(
            || last_seen.get(&w).copied().unwrap_or(end).max(start),
            |k| k.t,
        );
        holds.push(Hold {
            worker: w,
            start,
            end: stop,
            fence,
            overlapping: false,
        });
    }
    holds.sort_by_key(|h| h.start);
    holds
}

/// The holds, and every pair (by index) of overlapping holds of different workers.
pub(crate) fn holds(
    history: &[(usize, Step)],
    kills: &[Kill],
    end: u64,
) -> (Vec<Hold>, Vec<(usize, usize)>) {
    let mut holds = collect(history, kills, end, Side::Write);
    let pairs = pairs(&mut holds);
    (holds, pairs)
}

/// Every pair (by index) of overlapping holds of different workers in `holds` (sorted by
/// start); both are marked.
pub(crate) fn pairs(holds: &mut [Hold]) -> Vec<(usize, usize)> {
    // Sweep: a hold overlaps any other worker's hold that started before it ended.
    let mut pairs = Vec::new();
    for i in 0..holds.len() {
        for j in i + 1..holds.len() {
            if holds[j].start >= holds[i].end {
                break;
            }
            if holds[j].worker != holds[i].worker {
                holds[i].overlapping = true;
                holds[j].overlapping = true;
                pairs.push((i, j));
            }
        }
    }
    pairs
}

/// Every pair (read index, write index) of a read hold and another worker's write hold
/// that overlap; both are marked. `writes` is sorted by start.
pub(crate) fn read_write_pairs(reads: &mut [Hold], writes: &mut [Hold]) -> Vec<(usize, usize)> {
    // A write hold that overlaps a read hold started at most the longest write hold's
    // length before the read hold did: only those are compared.
    let longest = writes
        .iter()
        .map(|w| w.end.saturating_sub(w.start))
        .max()
        .unwrap_or(0);
    let mut pairs = Vec::new();
    for (i, r) in reads.iter_mut().enumerate() {
        let from = writes.partition_point(|w| w.start < r.start.saturating_sub(longest));
        let to = writes.partition_point(|w| w.start < r.end);
        for (j, w) in writes.iter_mut().enumerate().take(to).skip(from) {
            if w.end > r.start && w.worker != r.worker {
                r.overlapping = true;
                w.overlapping = true;
                pairs.push((i, j));
            }
        }
    }
    pairs
}

pub(crate) fn step_time(step: &Step) -> u64 {
    match step {
        Step::Acquired { t, .. }
        | Step::Read { t }
        | Step::Wrote { t, .. }
        | Step::Fenced { t, .. }
        | Step::Releasing { t }
        | Step::Released { t, .. }
        | Step::ReadAcquired { t }
        | Step::ReadReleasing { t }
        | Step::Reentered { t, .. }
        | Step::Error { t, .. }
        | Step::Clock { t, .. }
        | Step::Appended { t, .. } => *t,
    }
}
