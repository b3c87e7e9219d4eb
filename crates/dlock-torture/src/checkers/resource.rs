//! The protected resources: increments of the unfenced counter lost, and on the fenced
//! resource stale writes accepted, acknowledged writes lost, writes refused; and the
//! errors workers reported.

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
    let fenced_lost = fenced_acknowledged.saturating_sub(u64::try_from(r.fenced).unwrap_or(0));
    // The resource's own log: an accepted fence below an earlier accepted one is a stale
    // write that got through.
    let mut highest = 0;
    let mut stale_accepted = 0;
    for &f in &r.fence_log {
        if f < highest {
            stale_accepted += 1;
        }
        highest = highest.max(f);
    }
    Writes {
        unfenced_acknowledged,
        lost_increments,
        fenced_acknowledged,
        fenced_refused,
        refused_after_restart,
        fenced_lost,
        stale_accepted,
        errors,
        error_samples,
    }
}
