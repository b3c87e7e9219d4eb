//! The protected resources: increments of the unfenced counter lost, and on the fenced
//! resource stale writes accepted, acknowledged writes lost, writes refused; and the
//! errors workers reported.
//!
//! On the kinds where a failover before replication may lose the fence counter's last
//! increments (`Kind::failover_excuses`: Sentinel and Cluster without `WAIT`), a stale
//! write accepted or an increment lost is excused only where a failover window explains
//! it, as `fences` excuses a repeated fence: a write accepted under a fence below one
//! granted before a failover ended, the lower one written after it began; or two writes
//! from one read whose holds a failover window touches. Anywhere else it fails the kind,
//! failovers or not.

use std::collections::BTreeMap;

use super::Input;
use crate::model::Fault;
use crate::worker::Step;

/// What the writes to the resources show.
pub(crate) struct Writes {
    pub(crate) unfenced_acknowledged: u64,
    pub(crate) lost_increments: u64,
    pub(crate) fenced_acknowledged: u64,
    pub(crate) fenced_refused: u64,
    /// Of those, refused after the first restart (whose fences started over).
    pub(crate) refused_after_restart: u64,
    pub(crate) fenced_lost: u64,
    pub(crate) stale_accepted: u64,
    /// Of those, the ones no failover window explains (all of them on a kind where a
    /// failover excuses nothing).
    pub(crate) unexcused_fenced_lost: u64,
    pub(crate) unexcused_stale_accepted: u64,
    pub(crate) errors: usize,
    /// A few distinct error messages workers reported.
    pub(crate) error_samples: Vec<String>,
}

pub(crate) fn check(input: &Input<'_>) -> Writes {
    let first_restart = input
        .windows
        .iter()
        .filter(|w| w.fault == Fault::Restart)
        .map(|w| w.start)
        .min();
    let mut unfenced_acknowledged = 0u64;
    let mut fenced_acknowledged = 0u64;
    let mut fenced_refused = 0u64;
    let mut refused_after_restart = 0u64;
    let mut errors = 0;
    let mut error_samples: Vec<String> = Vec::new();
    let mut reads: BTreeMap<i64, u64> = BTreeMap::new();
    for (_, step) in input.history {
        match step {
            Step::Wrote { read, .. } => {
                unfenced_acknowledged += 1;
                *reads.entry(*read).or_default() += 1;
            }
            Step::Fenced { ok: true, .. } => fenced_acknowledged += 1,
            Step::Fenced { ok: false, t, .. } => {
                fenced_refused += 1;
                if first_restart.is_some_and(|r| *t >= r) {
                    refused_after_restart += 1;
                }
            }
            Step::Error { message, .. } => {
                errors += 1;
                if error_samples.len() < 5 && !error_samples.contains(message) {
                    error_samples.push(message.clone());
                }
            }
            _ => {}
        }
    }
    let r = input.resources;
    // Two acknowledged writes from the same read value lost one of them, even where an
    // unacknowledged write raised the final value.
    let duplicate_reads: u64 = reads.values().map(|n| n - 1).sum();
    let lost_increments = unfenced_acknowledged
        .saturating_sub(u64::try_from(r.counter).unwrap_or(0))
        .max(duplicate_reads);
    let accepted = accepted_writes(input);
    let excusing = input.kind.failover_excuses();
    let failover = |lo: u64, hi: u64| {
        excusing
            && input
                .windows
                .iter()
                .any(|w| w.fault == Fault::Failover && w.start <= hi && w.end >= lo)
    };
    // Two accepted writes of one value (from one read) lost one of them, even where an
    // unacknowledged write raised the final value.
    let mut by_value: BTreeMap<i64, Vec<&Accepted>> = BTreeMap::new();
    for w in &accepted {
        by_value.entry(w.value).or_default().push(w);
    }
    let (mut duplicates, mut excused_duplicates) = (0u64, 0u64);
    for writes in by_value.values().filter(|w| w.len() > 1) {
        let extra = writes.len() as u64 - 1;
        duplicates += extra;
        let lo = writes.iter().map(|w| w.granted).min().unwrap_or(0);
        let hi = writes.iter().map(|w| w.t).max().unwrap_or(u64::MAX);
        if failover(lo, hi) {
            excused_duplicates += extra;
        }
    }
    let short = fenced_acknowledged.saturating_sub(u64::try_from(r.fenced).unwrap_or(0));
    let fenced_lost = short.max(duplicates);
    // What the duplicates do not account for, no window can explain.
    let unexcused_fenced_lost =
        (duplicates - excused_duplicates) + short.saturating_sub(duplicates);
    // The resource's own log: an accepted fence below an earlier accepted one is a stale
    // write that got through. The k-th entry of a fence in the log is the k-th accepted
    // write under that fence in the history, in time order.
    // (A log entry with no such write — its worker was killed after the resource took it,
    // before it reported — is placed before the next entry that has one, or the run's end.)
    let mut by_fence: BTreeMap<u64, Vec<&Accepted>> = BTreeMap::new();
    for w in &accepted {
        by_fence.entry(w.fence).or_default().push(w);
    }
    let mut nth: BTreeMap<u64, usize> = BTreeMap::new();
    let writes: Vec<Option<&Accepted>> = r
        .fence_log
        .iter()
        .map(|f| {
            let k = nth.entry(*f).or_default();
            *k += 1;
            by_fence.get(f).and_then(|ws| ws.get(*k - 1)).copied()
        })
        .collect();
    // Entries after the last reported write were written by the run's end.
    let mut written_by = vec![input.end; writes.len()];
    let mut next = input.end;
    for (i, w) in writes.iter().enumerate().rev() {
        next = w.map_or(next, |w| w.t);
        written_by[i] = next;
    }
    let mut highest: Option<(u64, Option<&Accepted>)> = None;
    let mut stale_accepted = 0;
    let mut unexcused_stale_accepted = 0;
    for (i, &f) in r.fence_log.iter().enumerate() {
        let write = writes[i];
        match highest {
            Some((h, above)) if f < h => {
                stale_accepted += 1;
                // The higher fence granted before a failover ended, this one written
                // after it began: the counter's increments died with the old master.
                let explained = above.is_some_and(|a| failover(a.granted, written_by[i]));
                if !explained {
                    unexcused_stale_accepted += 1;
                }
            }
            Some((h, _)) if f == h => {}
            _ => highest = Some((f, write)),
        }
    }
    Writes {
        unfenced_acknowledged,
        lost_increments,
        fenced_acknowledged,
        fenced_refused,
        refused_after_restart,
        fenced_lost,
        stale_accepted,
        unexcused_fenced_lost,
        unexcused_stale_accepted,
        errors,
        error_samples,
    }
}

/// A write the fenced resource accepted, as the history shows it: its hold's grant and
/// fence, its time and the value it wrote.
struct Accepted {
    granted: u64,
    fence: u64,
    t: u64,
    value: i64,
}

/// Every accepted fenced write of the history, in time order.
fn accepted_writes(input: &Input<'_>) -> Vec<Accepted> {
    let mut hold: BTreeMap<usize, (u64, u64)> = BTreeMap::new(); // worker → (grant, fence)
    let mut accepted = Vec::new();
    for (worker, step) in input.history {
        match step {
            Step::Acquired { t, fence, .. } => {
                hold.insert(*worker, (*t, *fence));
            }
            Step::Fenced {
                ok: true, t, value, ..
            } => {
                let (granted, fence) = hold.get(worker).copied().unwrap_or((*t, 0));
                accepted.push(Accepted {
                    granted,
                    fence,
                    t: *t,
                    value: *value,
                });
            }
            _ => {}
        }
    }
    accepted.sort_by_key(|w| w.t);
    accepted
}
