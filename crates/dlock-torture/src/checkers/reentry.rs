//! Re-entry: a reentrant lock's inner hold gets its outer hold's fence.

use std::collections::HashMap;

use crate::model::{Fault, FaultWindow};
use crate::worker::Step;

/// Re-entries: (made, answered after the outer hold lapsed, mismatched). A re-entry made
/// while the outer hold was valid must get the outer grant's fence; a refusal or another
/// fence is a mismatch unless a restart without persistence (which forgets the lock) was
/// under way between the outer grant and the re-entry. (A window, not its start: the old
/// server's grant may reach its worker just after the restart began.)
pub(crate) fn reentry(history: &[(usize, Step)], windows: &[FaultWindow]) -> (usize, usize, usize) {
    let mut outer: HashMap<usize, (u64, u64)> = HashMap::new(); // worker -> (start, fence)
    let (mut made, mut lapsed_count, mut mismatches) = (0, 0, 0);
    for (w, step) in history {
        match step {
            Step::Acquired { t, fence, .. } => {
                outer.insert(*w, (*t, *fence));
            }
            Step::Releasing { .. } => {
                outer.remove(w);
            }
            Step::Reentered { t, fence, lapsed } => {
                made += 1;
                if *lapsed {
                    lapsed_count += 1;
                    continue;
                }
                let Some(&(start, granted)) = outer.get(w) else {
                    mismatches += 1; // a re-entry outside any hold: the worker is broken
                    continue;
                };
                let restarted = windows
                    .iter()
                    .any(|w| w.fault == Fault::Restart && w.end >= start && w.start <= *t);
                if *fence != Some(granted) && !restarted {
                    mismatches += 1;
                }
            }
            _ => {}
        }
    }
    (made, lapsed_count, mismatches)
}
