//! The checkers: from a recorded history to counts of what went wrong.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use super::worker::Step;
use super::{Fault, FaultWindow, Kind};

/// One worker's hold of the lock, as the worker believed it: from its acquire returning
/// to its release starting (or its death).
#[derive(Debug, Clone, Serialize)]
pub(super) struct Hold {
    pub(super) worker: usize,
    pub(super) start: u64,
    pub(super) end: u64,
    pub(super) fence: u64,
    /// Overlaps another worker's hold.
    pub(super) overlapping: bool,
}

/// A killed worker.
#[derive(Debug, Clone, Serialize)]
pub(super) struct Kill {
    pub(super) worker: usize,
    pub(super) t: u64,
    pub(super) was_holding: bool,
}

/// Final state of the protected resources.
#[derive(Debug, Clone, Default, Serialize)]
pub(super) struct Resources {
    pub(super) counter: i64,
    pub(super) fenced: i64,
    /// Fences of accepted fenced writes, in the order the resource accepted them.
    pub(super) fence_log: Vec<u64>,
    /// Lock keys still present on the server after ttl + ε.
    pub(super) orphans: usize,
}

/// What the checkers found for one lock kind.
#[derive(Debug, Clone, Serialize)]
pub(super) struct Findings {
    pub(super) kind: Kind,
    pub(super) faults: Vec<Fault>,
    pub(super) holds: usize,
    pub(super) errors: usize,
    /// A few distinct error messages workers reported.
    pub(super) error_samples: Vec<String>,
    pub(super) overlaps: usize,
    pub(super) unfenced_acknowledged: u64,
    pub(super) lost_increments: u64,
    pub(super) fenced_acknowledged: u64,
    pub(super) fenced_refused: u64,
    pub(super) fenced_lost: u64,
    pub(super) stale_accepted: u64,
    pub(super) fence_reuse: usize,
    pub(super) reacquire_ms: Vec<u64>,
    pub(super) liveness_violations: usize,
    pub(super) orphans: usize,
    pub(super) verdict_ok: bool,
    pub(super) verdict: String,
}

pub(super) struct Input<'a> {
    pub(super) kind: Kind,
    pub(super) faults: &'a [Fault],
    pub(super) history: &'a [(usize, Step)],
    pub(super) kills: &'a [Kill],
    pub(super) windows: &'a [FaultWindow],
    pub(super) resources: &'a Resources,
    pub(super) ttl_ns: u64,
    pub(super) end: u64,
}

/// Slack for liveness: a waiter's retry after the ttl.
const EPSILON_NS: u64 = 1_500_000_000;

pub(super) fn holds(history: &[(usize, Step)], kills: &[Kill], end: u64) -> Vec<Hold> {
    let mut open: HashMap<usize, (u64, u64)> = HashMap::new();
    let mut holds = Vec::new();
    let mut last_seen: HashMap<usize, u64> = HashMap::new();
    for (w, step) in history {
        match step {
            Step::Acquired { t, fence, .. } => {
                open.insert(*w, (*t, *fence));
            }
            Step::Releasing { t } => {
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
    // Sweep: a hold overlaps any other worker's hold that started before it ended.
    for i in 0..holds.len() {
        for j in i + 1..holds.len() {
            if holds[j].start >= holds[i].end {
                break;
            }
            if holds[j].worker != holds[i].worker {
                holds[i].overlapping = true;
                holds[j].overlapping = true;
            }
        }
    }
    holds
}

pub(super) fn step_time(step: &Step) -> u64 {
    match step {
        Step::Acquired { t, .. }
        | Step::Read { t }
        | Step::Wrote { t, .. }
        | Step::Fenced { t, .. }
        | Step::Releasing { t }
        | Step::Released { t, .. }
        | Step::Error { t, .. } => *t,
    }
}

pub(super) fn check(input: &Input<'_>) -> (Findings, Vec<Hold>) {
    let holds = holds(input.history, input.kills, input.end);
    let overlaps = {
        let mut n = 0;
        for i in 0..holds.len() {
            for j in i + 1..holds.len() {
                if holds[j].start >= holds[i].end {
                    break;
                }
                if holds[j].worker != holds[i].worker {
                    n += 1;
                }
            }
        }
        n
    };
    let mut unfenced_acknowledged = 0u64;
    let mut fenced_acknowledged = 0u64;
    let mut fenced_refused = 0u64;
    let mut errors = 0;
    let mut error_samples: Vec<String> = Vec::new();
    let mut fences: BTreeMap<u64, usize> = BTreeMap::new();
    for (_, step) in input.history {
        match step {
            Step::Wrote { .. } => unfenced_acknowledged += 1,
            Step::Fenced { ok: true, .. } => fenced_acknowledged += 1,
            Step::Fenced { ok: false, .. } => fenced_refused += 1,
            Step::Error { message, .. } => {
                errors += 1;
                if error_samples.len() < 5 && !error_samples.contains(message) {
                    error_samples.push(message.clone());
                }
            }
            Step::Acquired { fence, .. } if *fence > 0 => *fences.entry(*fence).or_default() += 1,
            _ => {}
        }
    }
    let r = input.resources;
    let lost_increments =
        unfenced_acknowledged.saturating_sub(u64::try_from(r.counter).unwrap_or(0));
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
    let fence_reuse = fences.values().filter(|&&n| n > 1).count();

    // Liveness: after a holder was killed, someone else must get the lock within
    // ttl + ε (unless the run ended first).
    let mut reacquire_ms = Vec::new();
    let mut liveness_violations = 0;
    for kill in input.kills.iter().filter(|k| k.was_holding) {
        let next = input
            .history
            .iter()
            .filter(|(w, s)| {
                *w != kill.worker && matches!(s, Step::Acquired { .. }) && step_time(s) > kill.t
            })
            .map(|(_, s)| step_time(s))
            .min();
        match next {
            Some(t) => {
                let delay = t - kill.t;
                reacquire_ms.push(delay / 1_000_000);
                if delay > input.ttl_ns + EPSILON_NS {
                    liveness_violations += 1;
                }
            }
            None if input.end.saturating_sub(kill.t) > input.ttl_ns + EPSILON_NS => {
                liveness_violations += 1;
            }
            None => {}
        }
    }

    let mut f = Findings {
        kind: input.kind,
        faults: input.faults.to_vec(),
        holds: holds.len(),
        errors,
        error_samples,
        overlaps,
        unfenced_acknowledged,
        lost_increments,
        fenced_acknowledged,
        fenced_refused,
        fenced_lost,
        stale_accepted,
        fence_reuse,
        reacquire_ms,
        liveness_violations,
        orphans: r.orphans,
        verdict_ok: true,
        verdict: String::new(),
    };
    let _ = input.windows;
    verdict(&mut f);
    (f, holds)
}

fn verdict(f: &mut Findings) {
    let has = |fault: Fault| f.faults.contains(&fault);
    let unsafe_counter = f.overlaps > 0 || f.lost_increments > 0;
    let unsafe_fenced = f.stale_accepted > 0 || f.fenced_lost > 0;
    let dead = f.liveness_violations > 0 || f.orphans > 0;
    let (ok, text) = match f.kind {
        Kind::DlockFenced | Kind::Memory => {
            if unsafe_fenced {
                (
                    false,
                    "FAIL: the fenced resource lost or accepted a stale write".to_owned(),
                )
            } else if dead {
                (
                    false,
                    "FAIL: lock not free within ttl + ε after a crash, or orphan keys".to_owned(),
                )
            } else if f.fence_reuse > 0 && !has(Fault::Restart) {
                (false, "FAIL: two grants shared a fence".to_owned())
            } else {
                (
                    true,
                    "ok: fenced resource intact under every fault".to_owned(),
                )
            }
        }
        Kind::Dlock => {
            let excusing = has(Fault::Pause) || has(Fault::Restart);
            if dead {
                (
                    false,
                    "FAIL: lock not free within ttl + ε after a crash, or orphan keys".to_owned(),
                )
            } else if unsafe_counter && !excusing {
                (
                    false,
                    "FAIL: overlapping holders without a fault no lease lock survives".to_owned(),
                )
            } else if unsafe_counter {
                (true, "ok: violations only under pause/restart, which no lease lock survives unfenced".to_owned())
            } else {
                (true, "ok: no violation".to_owned())
            }
        }
        Kind::SetnxExpire => {
            if !has(Fault::Kill) {
                (true, "not exercised (needs the kill fault)".to_owned())
            } else if dead {
                (true, "ok: control caught (a crash between SETNX and EXPIRE left a lock with no expiry)".to_owned())
            } else {
                (
                    false,
                    "FAIL: control not caught under kill: the checker or nemesis is broken"
                        .to_owned(),
                )
            }
        }
        Kind::SetnxGetset | Kind::GetDel | Kind::PlainDel => {
            if !has(Fault::Pause) {
                (true, "not exercised (needs the pause fault)".to_owned())
            } else if unsafe_counter {
                (
                    true,
                    "ok: control caught (overlapping holders / lost increments)".to_owned(),
                )
            } else {
                (
                    false,
                    "FAIL: control not caught under pause: the checker or nemesis is broken"
                        .to_owned(),
                )
            }
        }
    };
    f.verdict_ok = ok;
    f.verdict = text;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acq(t: u64, fence: u64) -> Step {
        Step::Acquired {
            t,
            token: String::new(),
            fence,
        }
    }

    #[test]
    fn overlapping_holds_are_found_and_handoffs_are_not() {
        let history = vec![
            (0, acq(10, 1)),
            (0, Step::Releasing { t: 20 }),
            (1, acq(21, 2)),
            (1, Step::Releasing { t: 30 }),
            (2, acq(25, 3)), // inside worker 1's hold
            (2, Step::Releasing { t: 40 }),
        ];
        let h = holds(&history, &[], 100);
        assert_eq!(h.len(), 3);
        assert!(!h[0].overlapping);
        assert!(h[1].overlapping && h[2].overlapping);
    }

    #[test]
    fn a_killed_holder_s_hold_ends_at_its_death_and_liveness_is_measured() {
        let history = vec![(0, acq(10, 1)), (1, acq(2_000_000_000, 2))];
        let kills = [Kill {
            worker: 0,
            t: 500_000_000,
            was_holding: true,
        }];
        let resources = Resources::default();
        let (f, h) = check(&Input {
            kind: Kind::Dlock,
            faults: &[Fault::Kill],
            history: &history,
            kills: &kills,
            windows: &[],
            resources: &resources,
            ttl_ns: 1_000_000_000,
            end: 3_000_000_000,
        });
        assert_eq!(h[0].end, 500_000_000);
        assert_eq!(f.overlaps, 0);
        assert_eq!(f.reacquire_ms, vec![1500]);
        assert_eq!(f.liveness_violations, 0);
        assert!(f.verdict_ok);
    }

    #[test]
    fn stale_fences_in_the_resource_log_and_lost_increments_fail_fenced_kinds() {
        let history = vec![
            (
                0,
                Step::Fenced {
                    t: 1,
                    ok: true,
                    value: 1,
                },
            ),
            (
                1,
                Step::Fenced {
                    t: 2,
                    ok: true,
                    value: 2,
                },
            ),
        ];
        let resources = Resources {
            fenced: 1,
            fence_log: vec![2, 1],
            ..Resources::default()
        };
        let (f, _) = check(&Input {
            kind: Kind::DlockFenced,
            faults: &[Fault::Pause],
            history: &history,
            kills: &[],
            windows: &[],
            resources: &resources,
            ttl_ns: 1,
            end: 10,
        });
        assert_eq!((f.stale_accepted, f.fenced_lost), (1, 1));
        assert!(!f.verdict_ok);
    }

    #[test]
    fn an_uncaught_control_fails_the_run() {
        let (f, _) = check(&Input {
            kind: Kind::PlainDel,
            faults: &[Fault::Pause],
            history: &[],
            kills: &[],
            windows: &[],
            resources: &Resources::default(),
            ttl_ns: 1,
            end: 10,
        });
        assert!(!f.verdict_ok, "{}", f.verdict);
    }
}
