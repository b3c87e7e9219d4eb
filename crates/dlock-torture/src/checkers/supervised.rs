//! The command kinds (`crate::command`): a holder is one `dlock` process's grant, and its
//! hold lasts from the grant (its command's first write) to the last write of anything
//! the command started — its background process's too, which no fence stops. So two
//! holds overlap exactly when a command, or a process it left behind, wrote after the
//! next holder was granted: two holders at once, as the resource saw them.

use std::collections::BTreeMap;

use super::Hold;
use super::holds::pairs;
use crate::worker::Step;

/// The holds of a command kind's history, by start, and every pair of overlapping holds.
pub(crate) fn holds(history: &[(usize, Step)]) -> (Vec<Hold>, Vec<(usize, usize)>) {
    let mut by_worker: BTreeMap<usize, Hold> = BTreeMap::new();
    for (w, step) in history {
        if let Step::Acquired { t, fence, .. } = step {
            by_worker.entry(*w).or_insert(Hold {
                worker: *w,
                start: *t,
                end: *t,
                fence: *fence,
                overlapping: false,
            });
        }
    }
    for (w, step) in history {
        if let (Step::Appended { t, .. }, Some(hold)) = (step, by_worker.get_mut(w)) {
            hold.end = hold.end.max(*t);
        }
    }
    let mut holds: Vec<Hold> = by_worker.into_values().collect();
    holds.sort_by_key(|h| h.start);
    let pairs = pairs(&mut holds);
    (holds, pairs)
}

/// Writes made after a later holder's grant.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LateWrites {
    pub(crate) writes: u64,
    /// Of those, by the process a command left in the background.
    pub(crate) background: u64,
    /// The latest, in milliseconds after the grant it followed.
    pub(crate) latest_ms: u64,
}

/// The writes each holder made after the earliest grant of a later holder it overlaps,
/// counting only the `pairs` (indexes into `holds`) that `counts` keeps (those no fault
/// excuses).
pub(crate) fn late_writes(
    history: &[(usize, Step)],
    holds: &[Hold],
    pairs: &[(usize, usize)],
    counts: impl Fn(usize) -> bool,
) -> LateWrites {
    // Each earlier holder (by worker) → the first grant of a later one it overlaps.
    let mut next_grant: BTreeMap<usize, u64> = BTreeMap::new();
    for (k, &(i, j)) in pairs.iter().enumerate() {
        if !counts(k) {
            continue;
        }
        let (earlier, later) = if holds[i].start <= holds[j].start {
            (&holds[i], &holds[j])
        } else {
            (&holds[j], &holds[i])
        };
        let grant = next_grant.entry(earlier.worker).or_insert(later.start);
        *grant = (*grant).min(later.start);
    }
    let mut late = LateWrites::default();
    for (w, step) in history {
        if let (
            Step::Appended {
                t,
                late: background,
            },
            Some(&grant),
        ) = (step, next_grant.get(w))
            && *t > grant
        {
            late.writes += 1;
            late.background += u64::from(*background);
            late.latest_ms = late.latest_ms.max((t - grant) / 1_000_000);
        }
    }
    late
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acq(t: u64) -> Step {
        Step::Acquired {
            t,
            token: String::new(),
            fence: 0,
        }
    }

    fn wrote(t: u64, late: bool) -> Step {
        Step::Appended { t, late }
    }

    const MS: u64 = 1_000_000;

    #[test]
    fn a_background_write_after_the_next_grant_is_an_overlap_and_one_before_it_is_not() {
        // Worker 0's command writes until 40 ms, its background process at 60 ms; worker 1
        // is granted at 50 ms.
        let history = vec![
            (0, acq(0)),
            (0, wrote(10 * MS, false)),
            (0, wrote(40 * MS, false)),
            (1, acq(50 * MS)),
            (0, wrote(60 * MS, true)),
            (1, wrote(70 * MS, false)),
        ];
        let (holds, pairs) = holds(&history);
        assert_eq!(holds.len(), 2);
        assert_eq!((holds[0].start, holds[0].end), (0, 60 * MS));
        assert_eq!(pairs, vec![(0, 1)]);
        let late = late_writes(&history, &holds, &pairs, |_| true);
        assert_eq!(
            late,
            LateWrites {
                writes: 1,
                background: 1,
                latest_ms: 10
            }
        );
        // Excused (a pause): not counted.
        assert_eq!(
            late_writes(&history, &holds, &pairs, |_| false),
            LateWrites::default()
        );
        // The background write before the next grant: no overlap.
        let mut history = history;
        history[4] = (0, wrote(45 * MS, true));
        let (_, pairs) = super::holds(&history);
        assert!(pairs.is_empty());
    }
}
