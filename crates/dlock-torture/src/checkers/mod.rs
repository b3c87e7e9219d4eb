//! The checkers: from a recorded history to counts of what went wrong, one property per
//! file — `holds` (the holds and their overlaps), `overlaps` (which a fault explains),
//! `client_clock` (whether a jump of the workers' wall clock reached them),
//! `resource` (lost increments, stale writes), `fences` (order and reuse), `reentry`,
//! `liveness` (reacquire after a crash, stalls), `supervised` (the command kinds' holds,
//! from their commands' writes) — and the `verdict` per kind.

mod client_clock;
mod fences;
mod holds;
mod liveness;
mod overlaps;
mod reentry;
mod resource;
mod supervised;
mod verdict;

use serde::Serialize;

use self::holds::{Side, collect, read_write_pairs};
pub(crate) use self::holds::{holds, step_time};
use self::overlaps::{excused, explanation};
use crate::model::{Fault, FaultWindow, Kind};
use crate::worker::Step;

/// One worker's hold of the lock, as the worker believed it: from its acquire returning
/// to its release starting (or its death). A write hold, or a read-write lock's read hold.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Hold {
    pub(crate) worker: usize,
    pub(crate) start: u64,
    pub(crate) end: u64,
    /// The grant's fence (0 for read holds and the controls).
    pub(crate) fence: u64,
    /// Overlaps another worker's hold (for a read hold: another worker's write hold).
    pub(crate) overlapping: bool,
}

/// Every hold of a run: exclusive holds (a read-write lock's write holds), and read holds.
pub(crate) struct Holds {
    pub(crate) writes: Vec<Hold>,
    pub(crate) reads: Vec<Hold>,
}

/// A killed worker.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Kill {
    pub(crate) worker: usize,
    pub(crate) t: u64,
    pub(crate) was_holding: bool,
}

/// Final state of the protected resources.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct Resources {
    pub(crate) counter: i64,
    pub(crate) fenced: i64,
    /// Fences of accepted fenced writes, in the order the resource accepted them.
    pub(crate) fence_log: Vec<u64>,
    /// Lock keys still present on the server after ttl + ε.
    pub(crate) orphans: usize,
    /// Workers (not killed by the nemesis) that exited with an error or had to be killed.
    pub(crate) worker_failures: usize,
}

/// What the checkers found for one lock kind.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Findings {
    pub(crate) kind: Kind,
    /// The faults that took effect (each as the form it took).
    pub(crate) faults: Vec<Fault>,
    /// Faults the nemesis was to inject that never took effect (see
    /// [`Fault::took_effect_as`]): the run did not test the kind under them.
    pub(crate) faults_missed: Vec<Fault>,
    /// Whether those fail the kind: the faults were named in `--faults`.
    pub(crate) faults_named: bool,
    pub(crate) holds: usize,
    pub(crate) errors: usize,
    /// A few distinct error messages workers reported.
    pub(crate) error_samples: Vec<String>,
    pub(crate) overlaps: usize,
    /// Overlaps no pause or restart window explains.
    pub(crate) unexcused_overlaps: usize,
    /// The first few of those, described (workers, holds, fences, the fault windows
    /// nearest to them), so that a failure can be read from the report alone.
    pub(crate) unexcused_samples: Vec<String>,
    /// Overlaps only a restart without persistence explains (no pause): for RedLock, the
    /// known hazard of a node that came back empty at once.
    pub(crate) restart_overlaps: usize,
    /// Overlaps only a failover before replication explains (a grant the replica never
    /// received died with the master): excused on Sentinel and Cluster without `WAIT`,
    /// a failure with it.
    pub(crate) failover_overlaps: usize,
    /// Overlaps only a jump or fast run of the lock server's wall clock explains:
    /// excused on the stores whose leases expire by it (Redis, PostgreSQL).
    pub(crate) clock_overlaps: usize,
    /// Overlaps no excusing fault explains that a jump of the workers' wall clock
    /// (`client-clock`) falls inside: none may be there for dlock, which reads only the
    /// monotonic clock; setnx-getset, which expires locks by that clock, is caught by them.
    pub(crate) client_clock_overlaps: usize,
    /// Under `client-clock`: the workers that reported their wall clock off by half a jump
    /// or more, of those running while it was moved. None means the fake clock never
    /// reached them (libfaketime not loaded), and fails the kind.
    pub(crate) client_clock_seen: usize,
    pub(crate) client_clock_workers: usize,
    /// Failovers that took effect.
    pub(crate) failovers: usize,
    /// The command kinds: writes a command (or the process it left in the background)
    /// made after the next holder's grant, in overlaps no fault excuses; of those, by
    /// background processes; and how long after that grant the latest came, in ms.
    pub(crate) late_writes: u64,
    pub(crate) late_writes_background: u64,
    pub(crate) latest_late_write_ms: u64,
    /// rwlock-fenced: read holds, those overlapping another worker's write hold, and those
    /// overlaps no pause or restart window explains.
    pub(crate) read_holds: usize,
    pub(crate) read_overlaps: usize,
    pub(crate) unexcused_read_overlaps: usize,
    /// reentrant-fenced: re-entries made inside a hold, those answered after the outer
    /// hold's lease had lapsed, and those that did not get the outer hold's fence (or were
    /// refused) while it was valid, no restart explaining it.
    pub(crate) reentries: usize,
    pub(crate) reentries_lapsed: usize,
    pub(crate) reentry_mismatches: usize,
    pub(crate) unfenced_acknowledged: u64,
    pub(crate) lost_increments: u64,
    pub(crate) fenced_acknowledged: u64,
    pub(crate) fenced_refused: u64,
    /// Of those, refused after the first restart (whose fences started over).
    pub(crate) refused_after_restart: u64,
    pub(crate) fenced_lost: u64,
    pub(crate) stale_accepted: u64,
    /// Of `fenced_lost` and `stale_accepted`, those no failover window explains on a kind
    /// where a failover before replication excuses them (see `resource`); on every other
    /// kind, all of them.
    pub(crate) unexcused_fenced_lost: u64,
    pub(crate) unexcused_stale_accepted: u64,
    pub(crate) fence_reuse: usize,
    /// Grants whose fence was not above every earlier grant's (since the last restart).
    pub(crate) fence_regressions: usize,
    pub(crate) reacquire_ms: Vec<u64>,
    pub(crate) liveness_violations: usize,
    /// Stretches without a grant to anyone (from one grant to the next, or to the
    /// workers' deadline) longer than the liveness bound that no fault or crash explains,
    /// in milliseconds: the lock stuck though every worker was asking for it.
    pub(crate) stall_ms: Vec<u64>,
    pub(crate) orphans: usize,
    pub(crate) worker_failures: usize,
    pub(crate) verdict_ok: bool,
    pub(crate) verdict: String,
}

pub(crate) struct Input<'a> {
    pub(crate) kind: Kind,
    pub(crate) history: &'a [(usize, Step)],
    pub(crate) kills: &'a [Kill],
    pub(crate) windows: &'a [FaultWindow],
    /// The faults the nemesis was to inject (each once or more): one of them that never
    /// took effect means the run did not test what it says it did.
    pub(crate) scheduled: &'a [Fault],
    /// Whether the faults were named in `--faults` (not `all`): then each scheduled one
    /// must take effect; otherwise one that never did is reported, not failed (a short
    /// run on a loaded machine may not fit them all, e.g. after a long failover window).
    pub(crate) faults_named: bool,
    pub(crate) resources: &'a Resources,
    pub(crate) ttl_ns: u64,
    /// What the kind may add to ttl + ε before the next holder after a crash.
    pub(crate) reacquire_slack_ns: u64,
    /// The workers' deadline: they stop asking for the lock here.
    pub(crate) until: u64,
    pub(crate) end: u64,
}

/// How many unexcused overlaps a report describes.
const UNEXCUSED_SAMPLES: usize = 5;

/// One overlap in words: both holds (ms from the run's first hold), their fences, what
/// the first explains (if anything the kind does not excuse), and the fault windows
/// within a ttl of the pair.
fn describe_overlap(a: &Hold, b: &Hold, explained: Option<Fault>, input: &Input<'_>) -> String {
    let origin = input
        .history
        .iter()
        .map(|(_, s)| holds::step_time(s))
        .min()
        .unwrap_or(0);
    let ms = |t: u64| t.saturating_sub(origin) as f64 / 1e6;
    let (lo, hi) = (
        a.start.min(b.start).saturating_sub(input.ttl_ns),
        a.end.max(b.end).saturating_add(input.ttl_ns),
    );
    let near: Vec<String> = input
        .windows
        .iter()
        .filter(|w| w.start <= hi && w.end >= lo)
        .map(|w| {
            let who = w
                .worker
                .map_or_else(String::new, |n| format!(" worker {n}"));
            format!("{}{who} {:.1}–{:.1}", w.fault.id(), ms(w.start), ms(w.end))
        })
        .collect();
    // The hold's own steps, from its grant to how its release went.
    let steps = |h: &Hold| {
        let mut words = Vec::new();
        // A command kind's writes, summed up: (count, last) of its own, of its background
        // process's.
        let mut appended = [(0usize, 0u64); 2];
        for (_, step) in input
            .history
            .iter()
            .filter(|(w, s)| *w == h.worker && holds::step_time(s) >= h.start)
        {
            if !words.is_empty() && matches!(step, Step::Acquired { .. }) {
                break;
            }
            if let Step::Appended { t, late } = step {
                let a = &mut appended[usize::from(*late)];
                *a = (a.0 + 1, a.1.max(*t));
                continue;
            }
            words.push(step_word(step, ms));
            if matches!(step, Step::Released { .. }) {
                break;
            }
        }
        for (&(n, last), whose) in appended.iter().zip(["", " in the background"]) {
            if n > 0 {
                words.push(format!("{n} writes{whose}, the last at {:.1}", ms(last)));
            }
        }
        words.join(", ")
    };
    format!(
        "worker {} {:.1}–{:.1} ms (fence {}; {}) and worker {} {:.1}–{:.1} ms (fence {}; {}); explained by {}; windows near: {}",
        a.worker,
        ms(a.start),
        ms(a.end),
        a.fence,
        steps(a),
        b.worker,
        ms(b.start),
        ms(b.end),
        b.fence,
        steps(b),
        explained.map_or("nothing", Fault::id),
        if near.is_empty() {
            "none".to_owned()
        } else {
            near.join(", ")
        }
    )
}

/// A step in a few words, for [`describe_overlap`].
fn step_word(step: &Step, ms: impl Fn(u64) -> f64) -> String {
    let t = ms(holds::step_time(step));
    match step {
        Step::Acquired { fence, .. } => format!("acquired {fence} at {t:.1}"),
        Step::Reentered { fence, lapsed, .. } => {
            format!("re-entered {fence:?} (lapsed {lapsed}) at {t:.1}")
        }
        Step::Fenced { ok, .. } => format!("fenced write (accepted {ok}) at {t:.1}"),
        Step::Wrote { .. } => format!("wrote at {t:.1}"),
        Step::Read { .. } => format!("read at {t:.1}"),
        Step::Releasing { .. } => format!("releasing at {t:.1}"),
        Step::Released { ok, .. } => format!("released {ok:?} at {t:.1}"),
        Step::ReadAcquired { .. } => format!("read-acquired at {t:.1}"),
        Step::ReadReleasing { .. } => format!("read-releasing at {t:.1}"),
        Step::Error { message, .. } => {
            let short: String = message.chars().take(80).collect();
            format!("error {short:?} at {t:.1}")
        }
        Step::Clock { offset_ms, .. } => format!("wall clock {offset_ms:+} ms off at {t:.1}"),
        Step::Appended { late: false, .. } => format!("wrote at {t:.1}"),
        Step::Appended { late: true, .. } => format!("wrote in the background at {t:.1}"),
    }
}

/// Runs every checker over one kind's run.
pub(crate) fn check(input: &Input<'_>) -> (Findings, Holds) {
    let (mut holds, pairs) = if input.kind.runs_commands() {
        supervised::holds(input.history)
    } else {
        holds(input.history, input.kills, input.end)
    };
    let explained: Vec<Option<Fault>> = pairs
        .iter()
        .map(|&(i, j)| explanation(&holds[i], &holds[j], input.windows))
        .collect();
    let kind = input.kind;
    let unexcused_overlaps = explained
        .iter()
        .filter(|e| !e.is_some_and(|f| kind.excuses(f)))
        .count();
    let unexcused_samples = pairs
        .iter()
        .zip(&explained)
        .filter(|(_, e)| !e.is_some_and(|f| kind.excuses(f)))
        .take(UNEXCUSED_SAMPLES)
        .map(|(&(i, j), e)| describe_overlap(&holds[i], &holds[j], *e, input))
        .collect();
    let late = supervised::late_writes(input.history, &holds, &pairs, |k| {
        !explained[k].is_some_and(|f| kind.excuses(f))
    });
    let clock_overlaps = explained
        .iter()
        .filter(|e| e.is_some_and(Fault::moves_store_clock))
        .count();
    let client_clock_overlaps = pairs
        .iter()
        .zip(&explained)
        .filter(|(_, e)| !e.is_some_and(|f| kind.excuses(f)))
        .filter(|&(&(i, j), _)| client_clock::touches(&holds[i], &holds[j], input.windows))
        .count();
    let (client_clock_seen, client_clock_workers) = client_clock::seen(input);
    let failover_overlaps = explained
        .iter()
        .filter(|e| **e == Some(Fault::Failover))
        .count();
    let restart_overlaps = explained
        .iter()
        .filter(|e| **e == Some(Fault::Restart))
        .count();
    // Read holds against write holds, excused as writers against writers.
    let mut read_holds = collect(input.history, input.kills, input.end, Side::Read);
    let read_pairs = read_write_pairs(&mut read_holds, &mut holds);
    let unexcused_read_overlaps = read_pairs
        .iter()
        .filter(|&&(i, j)| !excused(&read_holds[i], &holds[j], input.windows, kind))
        .count();
    let writes = resource::check(input);
    let (fence_regressions, fence_reuse) = fences::check(input);
    let (reentries, reentries_lapsed, reentry_mismatches) =
        reentry::reentry(input.history, input.windows);
    let (reacquire_ms, liveness_violations) = liveness::reacquire(input);
    // Twice the reacquire bound: a loaded machine's hiccup is not a stuck lock.
    let stall_ms = liveness::stalls(input, 2 * liveness::allowed(input));
    // The faults that actually took effect.
    let mut faults: Vec<Fault> = Vec::new();
    for w in input.windows {
        if !faults.contains(&w.fault) {
            faults.push(w.fault);
        }
    }
    let faults_missed = input
        .scheduled
        .iter()
        .copied()
        .filter(|&planned| !faults.iter().any(|&f| planned.took_effect_as(f)))
        .collect();
    let mut f = Findings {
        kind: input.kind,
        faults,
        faults_missed,
        faults_named: input.faults_named,
        holds: holds.len(),
        errors: writes.errors,
        error_samples: writes.error_samples,
        overlaps: pairs.len(),
        unexcused_overlaps,
        unexcused_samples,
        restart_overlaps,
        failover_overlaps,
        clock_overlaps,
        client_clock_overlaps,
        client_clock_seen,
        client_clock_workers,
        failovers: input
            .windows
            .iter()
            .filter(|w| w.fault == Fault::Failover)
            .count(),
        late_writes: late.writes,
        late_writes_background: late.background,
        latest_late_write_ms: late.latest_ms,
        read_holds: read_holds.len(),
        read_overlaps: read_pairs.len(),
        unexcused_read_overlaps,
        reentries,
        reentries_lapsed,
        reentry_mismatches,
        unfenced_acknowledged: writes.unfenced_acknowledged,
        lost_increments: writes.lost_increments,
        fenced_acknowledged: writes.fenced_acknowledged,
        fenced_refused: writes.fenced_refused,
        refused_after_restart: writes.refused_after_restart,
        fenced_lost: writes.fenced_lost,
        stale_accepted: writes.stale_accepted,
        unexcused_fenced_lost: writes.unexcused_fenced_lost,
        unexcused_stale_accepted: writes.unexcused_stale_accepted,
        fence_reuse,
        fence_regressions,
        reacquire_ms,
        liveness_violations,
        stall_ms,
        orphans: input.resources.orphans,
        worker_failures: input.resources.worker_failures,
        verdict_ok: true,
        verdict: String::new(),
    };
    verdict::verdict(&mut f);
    (
        f,
        Holds {
            writes: holds,
            reads: read_holds,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::holds::step_time;
    use super::*;

    fn acq(t: u64, fence: u64) -> Step {
        Step::Acquired {
            t,
            token: String::new(),
            fence,
        }
    }

    fn window(fault: Fault, worker: Option<usize>, start: u64, end: u64) -> FaultWindow {
        FaultWindow {
            fault,
            start,
            end,
            worker,
            nodes: Vec::new(),
        }
    }

    fn run(
        kind: Kind,
        history: &[(usize, Step)],
        windows: &[FaultWindow],
        kills: &[Kill],
        resources: &Resources,
    ) -> Findings {
        check(&Input {
            kind,
            history,
            kills,
            windows,
            scheduled: &[],
            faults_named: false,
            resources,
            ttl_ns: 1_000_000_000,
            reacquire_slack_ns: 0,
            // No stall check: these histories are a few grants each, far apart.
            until: 0,
            end: 10_000_000_000,
        })
        .0
    }

    /// Worker 1 holds 21..30; worker 2 acquires at 25, inside it.
    fn overlapping() -> Vec<(usize, Step)> {
        vec![
            (0, acq(10, 1)),
            (0, Step::Releasing { t: 20 }),
            (1, acq(21, 2)),
            (1, Step::Releasing { t: 30 }),
            (2, acq(25, 3)),
            (2, Step::Releasing { t: 40 }),
        ]
    }

    #[test]
    fn overlapping_holds_are_found_and_handoffs_are_not() {
        let (h, pairs) = holds(&overlapping(), &[], 100);
        assert_eq!(pairs, vec![(1, 2)]);
        assert_eq!(h.len(), 3);
        assert!(!h[0].overlapping);
        assert!(h[1].overlapping && h[2].overlapping);
    }

    #[test]
    fn an_overlap_fails_dlock_unless_a_pause_of_one_holder_explains_it() {
        let resources = Resources {
            counter: 3,
            ..Resources::default()
        };
        let f = run(
            Kind::Dlock,
            &overlapping(),
            &[window(Fault::Kill, Some(0), 5, 5)],
            &[],
            &resources,
        );
        assert_eq!((f.overlaps, f.unexcused_overlaps), (1, 1));
        assert!(!f.verdict_ok, "{}", f.verdict);
        // The report describes it: both workers, their steps, what explains it.
        let [sample] = f.unexcused_samples.as_slice() else {
            panic!("one sample: {:?}", f.unexcused_samples)
        };
        assert!(
            sample.starts_with("worker 1 ") && sample.contains("and worker 2 "),
            "{sample}"
        );
        assert!(
            sample.contains("acquired ") && sample.contains("explained by nothing"),
            "{sample}"
        );
        let paused = [window(Fault::Pause, Some(1), 22, 28)];
        let f = run(Kind::Dlock, &overlapping(), &paused, &[], &resources);
        assert_eq!(f.unexcused_overlaps, 0);
        assert!(f.verdict_ok, "{}", f.verdict);
        // A pause of an uninvolved worker explains nothing.
        let elsewhere = [window(Fault::Pause, Some(0), 22, 28)];
        assert!(!run(Kind::Dlock, &overlapping(), &elsewhere, &[], &resources).verdict_ok);
    }

    #[test]
    fn a_killed_holder_s_hold_ends_at_its_death_and_liveness_is_measured() {
        let history = vec![(0, acq(10, 1)), (1, acq(2_000_000_000, 2))];
        let kills = [Kill {
            worker: 0,
            t: 500_000_000,
            was_holding: true,
        }];
        let f = run(
            Kind::Dlock,
            &history,
            &[window(Fault::Kill, Some(0), 500_000_000, 500_000_000)],
            &kills,
            &Resources::default(),
        );
        assert_eq!(f.overlaps, 0);
        assert_eq!(f.reacquire_ms, vec![1500]);
        assert_eq!(f.liveness_violations, 0);
        assert!(f.verdict_ok, "{}", f.verdict);
        // Nobody got it for 9.5 s: a liveness violation.
        let stuck = vec![(0, acq(10, 1))];
        let f = run(Kind::Dlock, &stuck, &[], &kills, &Resources::default());
        assert_eq!(f.liveness_violations, 1);
        assert!(!f.verdict_ok);
    }

    #[test]
    fn stale_fences_lost_increments_and_fence_order_fail_fenced_kinds() {
        let history = vec![
            (0, acq(1, 5)),
            (
                0,
                Step::Fenced {
                    t: 2,
                    ok: true,
                    value: 1,
                },
            ),
            (0, Step::Releasing { t: 3 }),
            (1, acq(4, 4)), // a fence below an earlier grant's
            (
                1,
                Step::Fenced {
                    t: 5,
                    ok: true,
                    value: 2,
                },
            ),
            (1, Step::Releasing { t: 6 }),
        ];
        let resources = Resources {
            fenced: 1,
            fence_log: vec![5, 4],
            ..Resources::default()
        };
        let f = run(Kind::DlockFenced, &history, &[], &[], &resources);
        assert_eq!(
            (f.stale_accepted, f.fenced_lost, f.fence_regressions),
            (1, 1, 1)
        );
        assert!(!f.verdict_ok);
        // After a restart, fences may start over.
        let restart = [window(Fault::Restart, None, 3, 3)];
        let ok = Resources {
            fenced: 2,
            fence_log: vec![5],
            ..Resources::default()
        };
        let f = run(Kind::DlockFenced, &history, &restart, &[], &ok);
        assert_eq!(f.fence_regressions, 0);
    }

    #[test]
    fn two_writes_from_one_read_are_a_lost_increment() {
        let history = vec![
            (0, acq(1, 1)),
            (0, Step::Wrote { t: 2, read: 7 }),
            (0, Step::Releasing { t: 3 }),
            (1, acq(4, 2)),
            (1, Step::Wrote { t: 5, read: 7 }),
            (1, Step::Releasing { t: 6 }),
        ];
        // An unacknowledged write raised the counter to 9: the count alone would hide it.
        let f = run(
            Kind::Dlock,
            &history,
            &[],
            &[],
            &Resources {
                counter: 9,
                ..Resources::default()
            },
        );
        assert_eq!(f.lost_increments, 1);
    }

    #[test]
    fn a_control_is_caught_only_by_overlaps_no_pause_explains() {
        let resources = Resources {
            counter: 3,
            ..Resources::default()
        };
        let explained = [window(Fault::Pause, Some(1), 22, 28)];
        let f = run(Kind::PlainDel, &overlapping(), &explained, &[], &resources);
        assert!(
            !f.verdict_ok,
            "a pause-explained overlap is not the control's own bug: {}",
            f.verdict
        );
        let unexplained = [window(Fault::Pause, Some(0), 11, 12)];
        let f = run(
            Kind::PlainDel,
            &overlapping(),
            &unexplained,
            &[],
            &resources,
        );
        assert!(f.verdict_ok, "{}", f.verdict);
    }

    #[test]
    fn a_read_hold_overlapping_a_writer_fails_rwlock_unless_a_pause_explains_it() {
        let mut history = vec![
            (0, acq(10, 1)),
            (0, Step::Releasing { t: 20 }),
            // Worker 1 reads 15..25, inside worker 0's write hold; worker 2 reads after it.
            (1, Step::ReadAcquired { t: 15 }),
            (1, Step::ReadReleasing { t: 25 }),
            (2, Step::ReadAcquired { t: 21 }),
            (2, Step::ReadReleasing { t: 30 }),
        ];
        history.sort_by_key(|(_, s)| step_time(s));
        let none = Resources::default();
        let (f, holds) = check(&Input {
            kind: Kind::RwlockFenced,
            history: &history,
            kills: &[],
            windows: &[],
            scheduled: &[],
            faults_named: false,
            resources: &none,
            ttl_ns: 1_000_000_000,
            reacquire_slack_ns: 0,
            until: 100,
            end: 100,
        });
        assert_eq!((f.read_holds, f.read_overlaps), (2, 1));
        assert_eq!(f.unexcused_read_overlaps, 1);
        assert!(!f.verdict_ok, "{}", f.verdict);
        assert!(holds.writes[0].overlapping && holds.reads[0].overlapping);
        assert!(
            !holds.reads[1].overlapping,
            "readers share, and 21 is past 20"
        );
        // The writer was paused while holding: excused, as for writers.
        let paused = [window(Fault::Pause, Some(0), 12, 18)];
        let f = run(Kind::RwlockFenced, &history, &paused, &[], &none);
        assert_eq!((f.read_overlaps, f.unexcused_read_overlaps), (1, 0));
        assert!(f.verdict_ok, "{}", f.verdict);
    }

    #[test]
    fn the_family_kinds_fail_on_a_planted_overlap_that_no_fault_of_theirs_excuses() {
        // A reader inside a writer's hold, and a second writer inside it.
        let mut history = vec![
            (0, acq(10, 1)),
            (0, Step::Releasing { t: 20 }),
            (1, Step::ReadAcquired { t: 15 }),
            (1, Step::ReadReleasing { t: 25 }),
            (2, acq(18, 2)),
            (2, Step::Releasing { t: 30 }),
        ];
        history.sort_by_key(|(_, s)| step_time(s));
        let none = Resources::default();
        let at = |fault| [window(fault, None, 12, 16)];
        for kind in [Kind::MemcachedFamilyFenced, Kind::EtcdFamilyFenced] {
            let f = run(kind, &history, &[], &[], &none);
            assert_eq!((f.overlaps, f.unexcused_overlaps), (1, 1), "{kind:?}");
            // The reader overlaps both writers.
            assert_eq!(
                (f.read_overlaps, f.unexcused_read_overlaps),
                (2, 2),
                "{kind:?}"
            );
            assert!(!f.verdict_ok, "{kind:?}: {}", f.verdict);
            // memcached's expiry follows its monotonic clock: a jump excuses nothing.
            let f = run(kind, &history, &at(Fault::ClockJump), &[], &none);
            assert_eq!(f.unexcused_read_overlaps, 2, "{kind:?}");
            assert!(!f.verdict_ok, "{kind:?}: {}", f.verdict);
        }
        // A memcached restart forgets every item: the overlaps it explains are excused.
        let f = run(
            Kind::MemcachedFamilyFenced,
            &history,
            &at(Fault::Restart),
            &[],
            &none,
        );
        assert_eq!((f.unexcused_overlaps, f.unexcused_read_overlaps), (0, 0));
        assert!(f.verdict_ok, "{}", f.verdict);
    }

    #[test]
    fn a_reentry_under_another_fence_fails_unless_the_hold_lapsed_or_a_restart_explains_it() {
        let reentered = |fence: Option<u64>, lapsed: bool| {
            vec![
                (0, acq(10, 7)),
                (
                    0,
                    Step::Reentered {
                        t: 12,
                        fence,
                        lapsed,
                    },
                ),
                (0, Step::Releasing { t: 20 }),
            ]
        };
        let none = Resources::default();
        let f = run(
            Kind::ReentrantFenced,
            &reentered(Some(7), false),
            &[],
            &[],
            &none,
        );
        assert_eq!((f.reentries, f.reentry_mismatches), (1, 0));
        assert!(f.verdict_ok, "{}", f.verdict);
        for inner in [Some(8), None] {
            let f = run(
                Kind::ReentrantFenced,
                &reentered(inner, false),
                &[],
                &[],
                &none,
            );
            assert_eq!(f.reentry_mismatches, 1, "{inner:?}");
            assert!(!f.verdict_ok);
        }
        let f = run(
            Kind::ReentrantFenced,
            &reentered(Some(1), true),
            &[],
            &[],
            &none,
        );
        assert_eq!((f.reentries_lapsed, f.reentry_mismatches), (1, 0));
        // A restart inside the hold, or one under way when its grant arrived.
        for (start, end) in [(11, 11), (9, 10)] {
            let restart = [window(Fault::Restart, None, start, end)];
            let f = run(
                Kind::ReentrantFenced,
                &reentered(Some(1), false),
                &restart,
                &[],
                &none,
            );
            assert_eq!(f.reentry_mismatches, 0, "{start}..{end}");
        }
        let earlier = [window(Fault::Restart, None, 5, 8)];
        let f = run(
            Kind::ReentrantFenced,
            &reentered(Some(1), false),
            &earlier,
            &[],
            &none,
        );
        assert_eq!(f.reentry_mismatches, 1);
    }

    #[test]
    fn a_restart_under_way_when_a_grant_was_reported_explains_the_overlap() {
        // Worker 0's grant came from the server just before it died (reported at 22, the
        // restart's window 20..24); worker 1's from the server started empty.
        let history = vec![
            (0, acq(22, 206)),
            (1, acq(30, 1)),
            (1, Step::Releasing { t: 31 }),
            (0, Step::Releasing { t: 40 }),
        ];
        let none = Resources::default();
        let restart = [window(Fault::Restart, None, 20, 24)];
        let f = run(Kind::DlockFenced, &history, &restart, &[], &none);
        assert_eq!((f.overlaps, f.unexcused_overlaps), (1, 0));
        // Over before either grant was reported: it explains nothing.
        let before = [window(Fault::Restart, None, 10, 21)];
        let f = run(Kind::DlockFenced, &history, &before, &[], &none);
        assert_eq!((f.overlaps, f.unexcused_overlaps), (1, 1));
    }

    #[test]
    fn a_reacquire_slack_widens_the_liveness_bound() {
        // The next holder came 2.9 s after the crash: past ttl + ε, within + 0.5 s.
        let history = vec![(0, acq(10, 1)), (1, acq(3_400_000_000, 2))];
        let kills = [Kill {
            worker: 0,
            t: 500_000_000,
            was_holding: true,
        }];
        let none = Resources::default();
        let check_with = |slack: u64| {
            check(&Input {
                kind: Kind::FairFenced,
                history: &history,
                kills: &kills,
                windows: &[],
                scheduled: &[],
                faults_named: false,
                resources: &none,
                ttl_ns: 1_000_000_000,
                reacquire_slack_ns: slack,
                until: 0,
                end: 10_000_000_000,
            })
            .0
        };
        assert_eq!(check_with(0).liveness_violations, 1);
        assert_eq!(check_with(500_000_000).liveness_violations, 0);
    }

    #[test]
    fn restart_overlaps_are_counted_apart_and_a_delayed_restart_excuses_nothing() {
        let resources = Resources {
            counter: 3,
            ..Resources::default()
        };
        // Nodes that came back empty at once, inside the pair 21..30 / 25..40.
        let at_once = [window(Fault::Restart, None, 26, 26)];
        let f = run(Kind::Redlock, &overlapping(), &at_once, &[], &resources);
        assert_eq!(
            (f.overlaps, f.unexcused_overlaps, f.restart_overlaps),
            (1, 0, 1)
        );
        assert!(f.verdict_ok, "{}", f.verdict);
        // Nodes kept down until their leases ran out: an overlap is the lock's fault.
        let delayed = [window(Fault::DelayedRestart, None, 26, 29)];
        let f = run(Kind::Redlock, &overlapping(), &delayed, &[], &resources);
        assert_eq!((f.unexcused_overlaps, f.restart_overlaps), (1, 0));
        assert!(!f.verdict_ok, "{}", f.verdict);
        // A pause of one of the holders explains it first.
        let both = [
            window(Fault::Pause, Some(1), 22, 28),
            window(Fault::Restart, None, 26, 26),
        ];
        let f = run(Kind::Redlock, &overlapping(), &both, &[], &resources);
        assert_eq!((f.unexcused_overlaps, f.restart_overlaps), (0, 0));
    }

    #[test]
    fn the_redlock_restart_control_is_caught_only_by_an_overlap_an_immediate_restart_explains() {
        let resources = Resources {
            counter: 3,
            ..Resources::default()
        };
        // The bridge restarted empty inside the pair: the control is caught.
        let at_once = [window(Fault::Restart, None, 26, 26)];
        let f = run(
            Kind::RedlockImmediateRestart,
            &overlapping(),
            &at_once,
            &[],
            &resources,
        );
        assert!(
            f.verdict_ok && f.verdict.contains("caught"),
            "{}",
            f.verdict
        );
        // A restart but no overlap: the control was not caught, and the run fails.
        let apart = vec![
            (0, acq(10, 0)),
            (0, Step::Releasing { t: 20 }),
            (1, acq(21, 0)),
            (1, Step::Releasing { t: 30 }),
        ];
        let f = run(
            Kind::RedlockImmediateRestart,
            &apart,
            &at_once,
            &[],
            &resources,
        );
        assert!(!f.verdict_ok, "{}", f.verdict);
        // The delayed configuration excuses nothing: an overlap there fails.
        let delayed = [window(Fault::DelayedRestart, None, 26, 29)];
        let f = run(
            Kind::RedlockDelayedRestart,
            &overlapping(),
            &delayed,
            &[],
            &resources,
        );
        assert!(!f.verdict_ok, "{}", f.verdict);
    }

    #[test]
    fn a_store_clock_step_excuses_overlaps_only_where_leases_expire_by_the_wall_clock() {
        let resources = Resources {
            fenced: 2,
            fence_log: vec![1, 2],
            ..Resources::default()
        };
        let fenced = vec![
            (0, acq(21, 1)),
            (1, acq(25, 2)),
            (1, Step::Releasing { t: 30 }),
            (0, Step::Releasing { t: 40 }),
        ];
        // The server's clock stepped forward inside the pair.
        let jump = [window(Fault::ClockJump, None, 24, 26)];
        let f = run(Kind::DlockFenced, &fenced, &jump, &[], &resources);
        assert_eq!((f.clock_overlaps, f.unexcused_overlaps), (1, 0));
        assert!(f.verdict_ok, "{}", f.verdict);
        // memcached's expiry follows its monotonic clock: the same overlap is its fault.
        let f = run(Kind::MemcachedFenced, &fenced, &jump, &[], &resources);
        assert_eq!(f.unexcused_overlaps, 1);
        assert!(!f.verdict_ok, "{}", f.verdict);
        // The step forward that ends `clock-back` (at the window's end) counts too.
        let back = [window(Fault::ClockBack, None, 5, 22)];
        let f = run(Kind::PostgresFenced, &fenced, &back, &[], &resources);
        assert_eq!(f.unexcused_overlaps, 0);
        // The workers' clock explains nothing: dlock reads only the monotonic clock.
        let client = [window(Fault::ClientClock, None, 20, 45)];
        let f = run(Kind::DlockFenced, &fenced, &client, &[], &resources);
        assert_eq!(f.unexcused_overlaps, 1);
        assert!(!f.verdict_ok, "{}", f.verdict);
    }

    #[test]
    fn a_failover_excuses_overlaps_and_repeated_fences_only_without_wait() {
        // Worker 0 holds 10..40 under fence 7 (granted on the master that died); worker 1
        // is granted fence 7 again by the promoted replica at 25; the failover window
        // (kill → the old master back as a replica) spans both.
        let history = vec![
            (0, acq(10, 7)),
            (1, acq(25, 7)),
            (1, Step::Releasing { t: 30 }),
            (0, Step::Releasing { t: 40 }),
        ];
        let failover = [window(Fault::Failover, None, 15, 35)];
        let resources = Resources {
            fenced: 2,
            fence_log: vec![7, 7],
            ..Resources::default()
        };
        let f = run(Kind::SentinelFenced, &history, &failover, &[], &resources);
        assert_eq!((f.failover_overlaps, f.unexcused_overlaps), (1, 0));
        assert!(f.verdict_ok, "{}", f.verdict);
        // With WAIT, the same history is a failure: no grant may die with the master.
        let f = run(
            Kind::SentinelWaitFenced,
            &history,
            &failover,
            &[],
            &resources,
        );
        assert_eq!(f.unexcused_overlaps, 1);
        assert!(!f.verdict_ok, "{}", f.verdict);
        // And without any failover it fails on Sentinel too.
        let f = run(Kind::SentinelFenced, &history, &[], &[], &resources);
        assert!(!f.verdict_ok, "{}", f.verdict);
    }

    #[test]
    fn fences_start_over_after_a_restart_even_when_an_old_grant_is_reported_late() {
        let refused = |t| Step::Fenced {
            t,
            ok: false,
            value: 0,
        };
        let mut history = vec![
            (0, acq(50, 7)),
            (0, refused(55)),
            (0, Step::Releasing { t: 60 }),
            // Granted by the old server, reported after the restart began.
            (1, acq(120, 8)),
            (1, Step::Releasing { t: 130 }),
            // The new server's counter starts over.
            (2, acq(250, 1)),
            (2, refused(255)),
            (2, Step::Releasing { t: 260 }),
            (0, acq(300, 2)),
            (0, refused(305)),
            (0, Step::Releasing { t: 310 }),
        ];
        let restart = [window(Fault::Restart, None, 100, 200)];
        let none = Resources::default();
        let f = run(Kind::MemcachedFenced, &history, &restart, &[], &none);
        assert_eq!((f.fence_regressions, f.fence_reuse), (0, 0));
        assert_eq!((f.fenced_refused, f.refused_after_restart), (3, 2));
        assert!(f.verdict_ok, "{}", f.verdict);
        // Without the restart, the same grants go backwards.
        let f = run(Kind::MemcachedFenced, &history, &[], &[], &none);
        assert_eq!(f.fence_regressions, 2);
        assert_eq!(f.refused_after_restart, 0);
        // After the sequence started over, a repeated fence still counts.
        history.push((1, acq(400, 2)));
        let f = run(Kind::MemcachedFenced, &history, &restart, &[], &none);
        assert_eq!((f.fence_regressions, f.fence_reuse), (1, 1));
        assert!(!f.verdict_ok);
    }

    #[test]
    fn a_postgres_crash_restart_resets_no_fence() {
        // The same history as above, whose fences start over after the restart: on
        // PostgreSQL a crash keeps the counter, so going back is a failure.
        let history = vec![
            (0, acq(50, 7)),
            (0, Step::Releasing { t: 60 }),
            (1, acq(250, 1)),
            (1, Step::Releasing { t: 260 }),
            (0, acq(300, 2)),
            (0, Step::Releasing { t: 310 }),
        ];
        let crash = [window(Fault::CrashRestart, None, 100, 200)];
        let none = Resources::default();
        let f = run(Kind::PostgresFenced, &history, &crash, &[], &none);
        assert_eq!(f.fence_regressions, 2);
        assert!(!f.verdict_ok, "{}", f.verdict);
        // Fences that keep rising through the crash pass.
        let rising = vec![
            (0, acq(50, 7)),
            (0, Step::Releasing { t: 60 }),
            (1, acq(250, 8)),
            (1, Step::Releasing { t: 260 }),
        ];
        let f = run(Kind::PostgresFenced, &rising, &crash, &[], &none);
        assert_eq!((f.fence_regressions, f.fence_reuse), (0, 0));
        assert!(f.verdict_ok, "{}", f.verdict);
    }

    #[test]
    fn an_etcd_member_s_restart_excuses_no_overlap_and_resets_no_fence() {
        let resources = Resources {
            fenced: 3,
            fence_log: vec![11, 12, 13],
            ..Resources::default()
        };
        let fenced = |t, value| Step::Fenced { t, ok: true, value };
        let mut history = vec![
            (0, acq(10, 11)),
            (0, fenced(12, 1)),
            (0, Step::Releasing { t: 20 }),
            (1, acq(21, 12)),
            (1, fenced(22, 2)),
            (1, Step::Releasing { t: 30 }),
            (2, acq(25, 13)),
            (2, fenced(27, 3)),
            (2, Step::Releasing { t: 40 }),
        ];
        history.sort_by_key(|(_, s)| step_time(s));
        for fault in [Fault::LeaderRestart, Fault::MemberRestart] {
            let restart = [window(fault, None, 24, 26)];
            let f = run(Kind::EtcdFenced, &history, &restart, &[], &resources);
            assert_eq!((f.overlaps, f.unexcused_overlaps), (1, 1), "{}", fault.id());
            assert!(!f.verdict_ok, "{}", f.verdict);
        }
        // Fences after a leader change must still climb: one below the last grant's fails.
        let later = vec![
            (0, acq(10, 11)),
            (0, Step::Releasing { t: 20 }),
            (1, acq(50, 9)),
            (1, Step::Releasing { t: 60 }),
        ];
        let restart = [window(Fault::LeaderRestart, None, 30, 40)];
        let f = run(
            Kind::EtcdFenced,
            &later,
            &restart,
            &[],
            &Resources::default(),
        );
        assert_eq!(f.fence_regressions, 1);
        assert!(!f.verdict_ok, "{}", f.verdict);
    }

    #[test]
    fn a_zookeeper_leader_s_restart_excuses_no_overlap_and_its_new_epoch_keeps_fences_rising() {
        // Fences are creation zxids: the leader's epoch in the high 32 bits, a counter that
        // starts over with each epoch below.
        let zxid = |epoch: u64, counter: u64| (epoch << 32) | counter;
        let fenced = |t, value| Step::Fenced { t, ok: true, value };
        let mut overlapping = vec![
            (0, acq(10, zxid(1, 11))),
            (0, fenced(12, 1)),
            (0, Step::Releasing { t: 20 }),
            (1, acq(21, zxid(1, 12))),
            (1, fenced(22, 2)),
            (1, Step::Releasing { t: 30 }),
            (2, acq(25, zxid(2, 1))),
            (2, fenced(27, 3)),
            (2, Step::Releasing { t: 40 }),
        ];
        overlapping.sort_by_key(|(_, s)| step_time(s));
        let resources = Resources {
            fenced: 3,
            fence_log: vec![zxid(1, 11), zxid(1, 12), zxid(2, 1)],
            ..Resources::default()
        };
        // The quorum keeps the nodes through a server's or the leader's restart.
        for fault in [Fault::LeaderRestart, Fault::MemberRestart] {
            let restart = [window(fault, None, 24, 26)];
            let f = run(
                Kind::ZookeeperFenced,
                &overlapping,
                &restart,
                &[],
                &resources,
            );
            assert_eq!((f.overlaps, f.unexcused_overlaps), (1, 1), "{}", fault.id());
            assert_eq!(
                f.fence_regressions, 0,
                "a new epoch's counter restarts below"
            );
            assert!(!f.verdict_ok, "{}", f.verdict);
        }
        // A new leader's epoch lifts every later fence over the old epoch's; a grant under
        // the old epoch after one under the new is a regression, restart or not.
        let rising = vec![
            (0, acq(10, zxid(1, 900))),
            (0, Step::Releasing { t: 20 }),
            (1, acq(50, zxid(2, 3))),
            (1, Step::Releasing { t: 60 }),
        ];
        let restart = [window(Fault::LeaderRestart, None, 30, 40)];
        let none = Resources::default();
        let f = run(Kind::ZookeeperFenced, &rising, &restart, &[], &none);
        assert_eq!((f.fence_regressions, f.fence_reuse), (0, 0));
        assert!(f.verdict_ok, "{}", f.verdict);
        let mut stale = rising.clone();
        stale.extend([
            (0, acq(70, zxid(1, 901))),
            (0, Step::Releasing { t: 80 }),
            (1, acq(90, zxid(2, 3))),
            (1, Step::Releasing { t: 95 }),
        ]);
        let f = run(Kind::ZookeeperFenced, &stale, &restart, &[], &none);
        assert_eq!((f.fence_regressions, f.fence_reuse), (2, 1));
        assert!(!f.verdict_ok, "{}", f.verdict);
    }

    #[test]
    fn a_crashed_zookeeper_holder_s_node_must_go_within_a_session_timeout_and_epsilon() {
        // ttl = session timeout = 1 s here; the holder dies at 0.5 s, its session expires
        // about 1 s after its last ping, and the next waiter's watch fires.
        let kills = [Kill {
            worker: 0,
            t: 500_000_000,
            was_holding: true,
        }];
        let next_at = |t: u64| vec![(0, acq(10, 1)), (1, acq(t, 2))];
        let none = Resources::default();
        let f = run(
            Kind::ZookeeperFenced,
            &next_at(1_700_000_000),
            &[],
            &kills,
            &none,
        );
        assert_eq!(
            (f.reacquire_ms.clone(), f.liveness_violations),
            (vec![1200], 0)
        );
        // 2.6 s after the crash: past 1 s + 1.5 s.
        let f = run(
            Kind::ZookeeperFenced,
            &next_at(3_100_000_000),
            &[],
            &kills,
            &none,
        );
        assert_eq!(f.liveness_violations, 1);
        assert!(!f.verdict_ok, "{}", f.verdict);
        // Unless a restart held everyone up: a new leader gives every session (the dead
        // holder's too) a whole timeout again.
        let restart = [window(
            Fault::LeaderRestart,
            None,
            1_000_000_000,
            2_000_000_000,
        )];
        let f = run(
            Kind::ZookeeperFenced,
            &next_at(3_100_000_000),
            &restart,
            &kills,
            &none,
        );
        assert_eq!(f.liveness_violations, 0);
    }

    #[test]
    fn a_lock_nobody_gets_long_after_every_fault_ended_is_a_stall() {
        const S: u64 = 1_000_000_000;
        let grants = |times: &[u64]| -> Vec<(usize, Step)> {
            times
                .iter()
                .enumerate()
                .flat_map(|(i, &t)| {
                    [
                        (i % 3, acq(t, i as u64 + 1)),
                        (i % 3, Step::Releasing { t: t + 1 }),
                    ]
                })
                .collect()
        };
        let none = Resources::default();
        // ttl 1 s + ε 1.5 s, twice: after a grant at 0.1 s the next is due by 5.1 s.
        let check_with = |history: &[(usize, Step)], windows: &[FaultWindow], until: u64| {
            check(&Input {
                kind: Kind::ZookeeperFenced,
                history,
                kills: &[],
                windows,
                scheduled: &[],
                faults_named: false,
                resources: &none,
                ttl_ns: S,
                reacquire_slack_ns: 0,
                until,
                end: until + S,
            })
            .0
        };
        let stuck = grants(&[0, S / 10, 10 * S]);
        let f = check_with(&stuck, &[], 12 * S);
        assert_eq!(f.stall_ms, vec![9_900]);
        assert!(!f.verdict_ok, "{}", f.verdict);
        // A fault that ended 5 s or more before the next grant does not explain it (the
        // first seed-7 run of zookeeper-fenced: stuck for 47 s after a delay's 4 s).
        let delay = [window(Fault::Delay, Some(0), S / 5, 4 * S / 5)];
        assert_eq!(check_with(&stuck, &delay, 12 * S).stall_ms, vec![9_900]);
        // Faults that keep the whole gap covered do, one after another too.
        let long = [window(Fault::Blackhole, Some(0), S / 5, 8 * S)];
        let f = check_with(&stuck, &long, 12 * S);
        assert!(f.stall_ms.is_empty() && f.verdict_ok, "{}", f.verdict);
        let chained = [
            window(Fault::Delay, Some(0), S / 5, 4 * S),
            window(Fault::LeaderRestart, None, 6 * S, 8 * S),
        ];
        assert!(check_with(&stuck, &chained, 12 * S).stall_ms.is_empty());
        // A kill excuses twice ttl + ε after it.
        let kills = [Kill {
            worker: 0,
            t: 8 * S,
            was_holding: false,
        }];
        let f = check(&Input {
            kind: Kind::ZookeeperFenced,
            history: &stuck,
            kills: &kills,
            windows: &delay,
            scheduled: &[],
            faults_named: false,
            resources: &none,
            ttl_ns: S,
            reacquire_slack_ns: 0,
            until: 12 * S,
            end: 13 * S,
        })
        .0;
        assert_eq!(
            f.stall_ms,
            vec![9_900],
            "5.8 s to 8 s is covered by nothing"
        );
        // From the last grant to the workers' deadline counts too; past it, nothing.
        assert_eq!(check_with(&stuck, &[], 16 * S).stall_ms, vec![9_900, 6_000]);
        let f = check_with(&grants(&[0, S, 2 * S, 3 * S]), &[], 5 * S);
        assert!(f.stall_ms.is_empty() && f.verdict_ok, "{}", f.verdict);
    }

    /// Two clean holds, far apart: nothing for a checker to find.
    fn two_clean_holds() -> Vec<(usize, Step)> {
        vec![
            (0, acq(10, 1)),
            (0, Step::Releasing { t: 20 }),
            (1, acq(30, 2)),
            (1, Step::Releasing { t: 40 }),
        ]
    }

    #[test]
    fn a_control_or_failover_kind_whose_fault_never_took_effect_fails_as_not_exercised() {
        let none = Resources::default();
        for (kind, fault, took) in [
            (Kind::SetnxExpire, "kill", Fault::Kill),
            (Kind::SetnxGetset, "pause or client-clock", Fault::Pause),
            (
                Kind::SetnxGetset,
                "pause or client-clock",
                Fault::ClientClock,
            ),
            (Kind::GetDel, "pause", Fault::Pause),
            (Kind::PlainDel, "pause", Fault::Pause),
            (Kind::RedlockImmediateRestart, "restart", Fault::Restart),
            (
                Kind::RedlockDelayedRestart,
                "restart",
                Fault::DelayedRestart,
            ),
            (Kind::SentinelFenced, "failover", Fault::Failover),
            (Kind::SentinelWaitFenced, "failover", Fault::Failover),
            (Kind::ClusterFenced, "failover", Fault::Failover),
        ] {
            let f = run(kind, &two_clean_holds(), &[], &[], &none);
            assert!(!f.verdict_ok, "{}: {}", kind.id(), f.verdict);
            assert!(
                f.verdict
                    .starts_with(&format!("FAIL: not exercised: no {fault} took effect")),
                "{}: {}",
                kind.id(),
                f.verdict
            );
            // Once it took effect, the verdict is the kind's own (for a failover kind
            // with nothing wrong: a pass; for a control: whether it was caught). A jump of
            // the workers' clock has taken effect once a worker saw it.
            let mut history = two_clean_holds();
            if took == Fault::ClientClock {
                history.push((0, clock(55, 3_600_000)));
            }
            let f = run(kind, &history, &[window(took, None, 50, 60)], &[], &none);
            assert!(
                !f.verdict.contains("not exercised"),
                "{}: {}",
                kind.id(),
                f.verdict
            );
            if kind.is_fenced() || kind == Kind::RedlockDelayedRestart {
                assert!(f.verdict_ok, "{}: {}", kind.id(), f.verdict);
            }
        }
        // The restart control exercised and caught: an overlap only the bridge node's
        // restart (at once) explains.
        let f = run(
            Kind::RedlockImmediateRestart,
            &overlapping(),
            &[window(Fault::Restart, None, 24, 26)],
            &[],
            &none,
        );
        assert_eq!(f.restart_overlaps, 1);
        assert!(
            f.verdict_ok && f.verdict.contains("control caught"),
            "{}",
            f.verdict
        );
        // A delayed restart explains no overlap: the same history does not catch it.
        let delayed = [window(Fault::DelayedRestart, None, 24, 26)];
        let f = run(
            Kind::RedlockImmediateRestart,
            &overlapping(),
            &delayed,
            &[],
            &none,
        );
        assert!(!f.verdict_ok, "{}", f.verdict);
    }

    fn clock(t: u64, offset_ms: i64) -> Step {
        Step::Clock { t, offset_ms }
    }

    #[test]
    fn a_jump_of_the_workers_clock_that_no_worker_saw_fails_the_kind() {
        const S: u64 = 1_000_000_000;
        let none = Resources::default();
        // Workers 0 and 1 from the start, 2 killed before the jump, 3 started after it.
        let mut history = vec![
            (0, clock(1, 0)),
            (1, clock(2, 0)),
            (2, clock(3, 0)),
            (0, acq(10, 1)),
            (0, Step::Releasing { t: 20 }),
            (1, acq(30, 2)),
            (1, Step::Releasing { t: 40 }),
            (3, clock(9 * S, 0)),
        ];
        let kills = [Kill {
            worker: 2,
            t: S,
            was_holding: false,
        }];
        let jump = [window(Fault::ClientClock, None, 2 * S, 4 * S)];
        let check_with = |history: &[(usize, Step)]| {
            check(&Input {
                kind: Kind::DlockFenced,
                history,
                kills: &kills,
                windows: &jump,
                scheduled: &[Fault::ClientClock],
                faults_named: false,
                resources: &none,
                ttl_ns: S,
                reacquire_slack_ns: 0,
                until: 0,
                end: 10 * S,
            })
            .0
        };
        // libfaketime never loaded: the jump "took effect" in the harness only.
        let f = check_with(&history);
        assert_eq!((f.client_clock_seen, f.client_clock_workers), (0, 2));
        assert!(!f.verdict_ok, "{}", f.verdict);
        assert!(
            f.verdict.contains("not exercised") && f.verdict.contains("client-clock"),
            "{}",
            f.verdict
        );
        // A step of a second is no jump of an hour.
        history.push((0, clock(2 * S + 1, 1_000)));
        assert!(!check_with(&history).verdict_ok);
        // Seen by one worker (either way), the kind's verdict is its own.
        for offset in [3_600_000, -3_600_000] {
            let mut seen = history.clone();
            seen.push((1, clock(2 * S + 2, offset)));
            let f = check_with(&seen);
            assert_eq!((f.client_clock_seen, f.client_clock_workers), (1, 2));
            assert!(f.verdict_ok, "{}", f.verdict);
        }
        // Without the fault, nobody need see anything.
        let f = run(Kind::DlockFenced, &history, &[], &kills, &none);
        assert_eq!((f.client_clock_seen, f.client_clock_workers), (0, 0));
        assert!(f.verdict_ok, "{}", f.verdict);
    }

    #[test]
    fn an_overlap_while_the_workers_clock_jumped_catches_setnx_getset_and_fails_dlock() {
        const S: u64 = 1_000_000_000;
        // Worker 0 holds from 1 s to 1.5 s; the workers' clock steps an hour ahead at
        // 1.2 s, and worker 1 takes the lock it thinks expired at 1.21 s.
        let history = vec![
            (0, clock(1, 0)),
            (1, clock(2, 0)),
            (0, acq(S, 0)),
            (0, clock(S + S / 5, 3_600_000)),
            (1, clock(S + S / 5, 3_600_000)),
            (1, acq(S + S / 5 + S / 100, 0)),
            (0, Step::Releasing { t: S + S / 2 }),
            (1, Step::Releasing { t: 2 * S }),
        ];
        let resources = Resources {
            counter: 2,
            ..Resources::default()
        };
        let jump = [window(Fault::ClientClock, None, S + S / 5, 3 * S)];
        let f = run(Kind::SetnxGetset, &history, &jump, &[], &resources);
        assert_eq!(
            (f.unexcused_overlaps, f.client_clock_overlaps),
            (1, 1),
            "{f:?}"
        );
        assert!(
            f.verdict_ok
                && f.verdict.contains("control caught")
                && f.verdict.contains("wall clock"),
            "{}",
            f.verdict
        );
        let f = run(Kind::Dlock, &history, &jump, &[], &resources);
        assert!(!f.verdict_ok, "{}", f.verdict);
        assert!(f.verdict.contains("client-clock"), "{}", f.verdict);
        // Not excused: a pause window elsewhere in the run changes nothing.
        let windows = [jump[0].clone(), window(Fault::Pause, Some(1), 5 * S, 6 * S)];
        let f = run(Kind::Dlock, &history, &windows, &[], &resources);
        assert_eq!(f.client_clock_overlaps, 1);
        assert!(!f.verdict_ok, "{}", f.verdict);
        // The same overlap far from any jump is no client-clock overlap (setnx-getset is
        // still caught: a stale release outside any pause window).
        let later = [window(Fault::ClientClock, None, 5 * S, 6 * S)];
        let f = run(Kind::SetnxGetset, &history, &later, &[], &resources);
        assert_eq!(
            (f.unexcused_overlaps, f.client_clock_overlaps),
            (1, 0),
            "{f:?}"
        );
        assert!(
            f.verdict_ok && f.verdict.contains("stale release"),
            "{}",
            f.verdict
        );
    }

    #[test]
    fn a_scheduled_fault_that_never_took_effect_fails_the_kind() {
        let none = Resources::default();
        let check_with = |kind: Kind, windows: &[FaultWindow], scheduled: &[Fault]| {
            check(&Input {
                kind,
                history: &two_clean_holds(),
                kills: &[],
                windows,
                scheduled,
                faults_named: true,
                resources: &none,
                ttl_ns: 1_000_000_000,
                reacquire_slack_ns: 0,
                until: 0,
                end: 10_000_000_000,
            })
            .0
        };
        let paused = [window(Fault::Pause, Some(0), 12, 18)];
        let f = check_with(Kind::DlockFenced, &paused, &[Fault::Pause, Fault::Freeze]);
        assert_eq!(f.faults_missed, vec![Fault::Freeze]);
        assert!(!f.verdict_ok, "{}", f.verdict);
        assert!(
            f.verdict.contains("not exercised") && f.verdict.contains("freeze"),
            "{}",
            f.verdict
        );
        let f = check_with(Kind::DlockFenced, &paused, &[Fault::Pause]);
        assert!(f.faults_missed.is_empty() && f.verdict_ok, "{}", f.verdict);
        // Under `--faults all`, a fault that found no room is reported, not failed.
        let f = check(&Input {
            kind: Kind::DlockFenced,
            history: &two_clean_holds(),
            kills: &[],
            windows: &paused,
            scheduled: &[Fault::Pause, Fault::Freeze],
            faults_named: false,
            resources: &none,
            ttl_ns: 1_000_000_000,
            reacquire_slack_ns: 0,
            until: 0,
            end: 10_000_000_000,
        })
        .0;
        assert_eq!(f.faults_missed, vec![Fault::Freeze]);
        assert!(f.verdict_ok, "{}", f.verdict);
        // A restart takes effect in the form the store gives it.
        let crash = [window(Fault::CrashRestart, None, 12, 18)];
        let f = check_with(Kind::PostgresFenced, &crash, &[Fault::Restart]);
        assert!(f.faults_missed.is_empty() && f.verdict_ok, "{}", f.verdict);
    }

    /// Worker 0 granted fence 8 by the master that dies (t 10), writes at 12; worker 1
    /// granted 7 by the promoted replica (t 30), writes at 32: the resource's log says
    /// 8 then 7. Both read the same value: one increment lost.
    fn across_a_failover() -> (Vec<(usize, Step)>, Resources) {
        let history = vec![
            (0, acq(10, 8)),
            (
                0,
                Step::Fenced {
                    t: 12,
                    ok: true,
                    value: 5,
                },
            ),
            (0, Step::Releasing { t: 13 }),
            (1, acq(30, 7)),
            (
                1,
                Step::Fenced {
                    t: 32,
                    ok: true,
                    value: 5,
                },
            ),
            (1, Step::Releasing { t: 33 }),
        ];
        let resources = Resources {
            fenced: 5,
            fence_log: vec![8, 7],
            ..Resources::default()
        };
        (history, resources)
    }

    #[test]
    fn stale_writes_on_a_failover_kind_are_excused_only_in_a_failover_window() {
        let (history, resources) = across_a_failover();
        // The failover between the two grants explains both.
        let between = [window(Fault::Failover, None, 15, 25)];
        let f = run(Kind::SentinelFenced, &history, &between, &[], &resources);
        assert_eq!((f.stale_accepted, f.fenced_lost), (1, 1));
        assert_eq!(
            (f.unexcused_stale_accepted, f.unexcused_fenced_lost),
            (0, 0)
        );
        assert!(f.verdict_ok, "{}", f.verdict);
        assert!(f.verdict.contains("failover windows"), "{}", f.verdict);
        // A failover that happened, but long after both writes, explains neither.
        let later = [window(Fault::Failover, None, 500, 600)];
        let f = run(Kind::SentinelFenced, &history, &later, &[], &resources);
        assert_eq!(f.failovers, 1);
        assert_eq!(
            (f.unexcused_stale_accepted, f.unexcused_fenced_lost),
            (1, 1)
        );
        assert!(!f.verdict_ok, "{}", f.verdict);
        assert!(
            f.verdict.contains("outside any failover window"),
            "{}",
            f.verdict
        );
        let f = run(Kind::ClusterFenced, &history, &later, &[], &resources);
        assert!(!f.verdict_ok, "{}", f.verdict);
        // A failover before the higher fence was granted does not explain a lower one
        // written after it.
        let before = [window(Fault::Failover, None, 2, 5)];
        let f = run(Kind::SentinelFenced, &history, &before, &[], &resources);
        assert_eq!(f.unexcused_stale_accepted, 1);
        assert!(!f.verdict_ok, "{}", f.verdict);
        // With WAIT (min_replicas), a failover excuses nothing.
        let f = run(
            Kind::SentinelWaitFenced,
            &history,
            &between,
            &[],
            &resources,
        );
        assert_eq!(
            (f.unexcused_stale_accepted, f.unexcused_fenced_lost),
            (1, 1)
        );
        assert!(!f.verdict_ok, "{}", f.verdict);
    }

    /// The resource took a stale write whose worker was killed before it reported it (no
    /// write in the history for that log entry): it is placed before the next reported
    /// write, so a failover between the higher grant and that write still explains it.
    #[test]
    fn a_stale_write_its_worker_never_reported_is_placed_by_the_next_one() {
        let (mut history, mut resources) = across_a_failover();
        // Worker 2, granted fence 7 too by the promoted replica, wrote it and was killed:
        // the log has its 7 before worker 1's; the history has no write of it.
        history.insert(3, (2, acq(28, 7)));
        resources.fence_log = vec![8, 7, 7];
        let between = [window(Fault::Failover, None, 15, 25)];
        let f = run(Kind::SentinelFenced, &history, &between, &[], &resources);
        assert_eq!(f.stale_accepted, 2);
        assert_eq!(f.unexcused_stale_accepted, 0, "{}", f.verdict);
        // After every reported write, a failover explains the reported one's stale write
        // not (the unreported one, last in the log, may have been written until the end).
        let later = [window(Fault::Failover, None, 500, 600)];
        let f = run(Kind::SentinelFenced, &history, &later, &[], &resources);
        assert_eq!(f.unexcused_stale_accepted, 1);
        assert!(!f.verdict_ok, "{}", f.verdict);
        // Before the higher fence's grant, a failover explains neither.
        let before = [window(Fault::Failover, None, 2, 5)];
        let f = run(Kind::SentinelFenced, &history, &before, &[], &resources);
        assert_eq!(f.unexcused_stale_accepted, 2);
    }

    #[test]
    fn two_accepted_writes_of_one_read_are_a_lost_fenced_increment_even_if_the_count_hides_it() {
        let (history, _) = across_a_failover();
        // An unacknowledged write raised the final value: acknowledged − final is 0.
        let resources = Resources {
            fenced: 6,
            fence_log: vec![7, 8],
            ..Resources::default()
        };
        let f = run(Kind::DlockFenced, &history, &[], &[], &resources);
        assert_eq!((f.fenced_lost, f.unexcused_fenced_lost), (1, 1));
        assert!(!f.verdict_ok, "{}", f.verdict);
    }

    #[test]
    fn a_run_with_no_holds_fails() {
        let f = run(Kind::DlockFenced, &[], &[], &[], &Resources::default());
        assert!(!f.verdict_ok);
    }
}
