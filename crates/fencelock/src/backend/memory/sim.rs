//! The simulator's view of and faults on the in-process store (feature `simulation`).

use tokio::time::Instant;

use super::Memory;

impl Memory {
    /// Every live holder of `key` across primitives, sorted: `(token, n)` where `n` is a
    /// semaphore holder's permits and 1 otherwise (a plain, fair or election lock's
    /// holder, a reentrant lock's holds, a read-write lock's writer and readers).
    pub fn holders(&self, key: &str) -> Vec<(String, u32)> {
        let now = Instant::now();
        let mut state = self.state();
        let mut out = Vec::new();
        if let Some(h) = state.live(key, now) {
            out.push((h.token.as_str().to_owned(), 1));
        }
        if let Some(sem) = state.semaphores.get_mut(key) {
            out.extend(
                sem.live(now)
                    .iter()
                    .map(|(t, (n, _))| (t.as_str().to_owned(), *n)),
            );
        }
        if let Some(e) = state.live_reentrant(key, now) {
            out.extend(e.holds.iter().map(|t| (t.as_str().to_owned(), 1)));
        }
        if let Some(rw) = state.rw.get_mut(key) {
            rw.purge(now);
            out.extend(rw.writer.iter().map(|(t, _)| (t.as_str().to_owned(), 1)));
            out.extend(rw.readers.keys().map(|t| (t.as_str().to_owned(), 1)));
        }
        out.sort();
        out
    }

    /// The store restarts: every hold, queue place and election record is forgotten;
    /// the fence counters survive if `keep_fences` (a store whose counter is durable),
    /// else they start again at 1. Every watcher is woken (a restart drops
    /// subscriptions).
    pub fn restart(&self, keep_fences: bool) {
        let mut state = self.state();
        state.locks.clear();
        state.semaphores.clear();
        state.reentrant.clear();
        state.rw.clear();
        state.fair.clear();
        state.records.clear();
        if !keep_fences {
            state.fences.clear();
        }
        for w in state.watchers.values().filter_map(std::sync::Weak::upgrade) {
            w.notify_waiters();
        }
    }
}
