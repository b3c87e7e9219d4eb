//! The simulator's omniscient view of the in-process store, and its restart (feature
//! `simulation`: for the test kit only).

use std::sync::Weak;

use tokio::time::Instant;

use super::Memory;

impl Memory {
    /// The live holders of the lock key `key` (a [`LockKeys::lock`]) across every
    /// primitive, as `(token, n)` sorted by token: a plain, fair or election lock's holder,
    /// each hold of a reentrant lock, a read-write lock's writer and each of its readers
    /// with `n = 1`; each semaphore holder with its permits. Expired entries are not
    /// listed. Nothing is announced and no expiry moves: a pure observation.
    ///
    /// [`LockKeys::lock`]: crate::keys::LockKeys::lock
    pub fn holders(&self, key: &str) -> Vec<(String, u32)> {
        let now = Instant::now();
        let mut state = self.state();
        let mut out = Vec::new();
        if let Some(held) = state.live(key, now) {
            out.push((held.token.as_str().to_owned(), 1));
        }
        if let Some(sem) = state.semaphores.get_mut(key) {
            let holders = sem.live(now).iter();
            out.extend(holders.map(|(token, (n, _))| (token.as_str().to_owned(), *n)));
        }
        if let Some(entry) = state.live_reentrant(key, now) {
            out.extend(entry.holds.iter().map(|t| (t.as_str().to_owned(), 1)));
        }
        if let Some(rw) = state.rw.get_mut(key) {
            rw.purge(now);
            out.extend(rw.writer.iter().map(|(t, _)| (t.as_str().to_owned(), 1)));
            out.extend(rw.readers.keys().map(|t| (t.as_str().to_owned(), 1)));
        }
        // The maps' order comes from a per-process random hash seed: sorted, one seed
        // gives one answer.
        out.sort();
        out
    }

    /// The store restarts, as a store that keeps nothing in memory across a restart:
    /// every lock, semaphore holder, reentrant entry, read-write entry (writer, readers,
    /// waiting writers), fair queue and election record is forgotten.
    ///
    /// With `keep_fences` the store's counters survive, as on a store that writes them
    /// durably: every name's fence counter, so fences go on from where they were, and
    /// every semaphore's stored permit count (a key without expiry, like the counter).
    /// Without, they are lost too: fences start again at 1 (a fenced resource then
    /// refuses the new holders' writes, or accepts a stale holder's if it checks nothing
    /// else), and a semaphore's count is set again by its next acquire.
    ///
    /// Every client listening for a release is woken once (`notify_waiters`), as a
    /// networked client wakes its waiters when a restart drops its subscription; their
    /// next attempt finds the store empty. Holders are not told: each learns at its next
    /// renewal that its hold is gone.
    pub fn restart(&self, keep_fences: bool) {
        let mut state = self.state();
        state.locks.clear();
        state.reentrant.clear();
        state.rw.clear();
        state.fair.clear();
        state.records.clear();
        if keep_fences {
            state.semaphores.retain(|_, sem| {
                sem.holders.clear();
                sem.count.is_some()
            });
        } else {
            state.fences.clear();
            state.semaphores.clear();
        }
        state
            .watchers
            .retain(|_, watcher| watcher.strong_count() > 0);
        // In the channels' order, not the map's (which differs from process to process):
        // the order in which waiters wake is part of a simulated run's trace.
        let mut channels: Vec<_> = state.watchers.iter().collect();
        channels.sort_by(|a, b| a.0.cmp(b.0));
        for notify in channels.into_iter().filter_map(|(_, w)| Weak::upgrade(w)) {
            notify.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::time::sleep;

    use crate::backend::Memory;
    use crate::{Lock, Owner, ReentrantLock, RwLock, Semaphore};

    fn lock(store: &Memory, ttl: Duration) -> Lock<Memory> {
        Lock::builder(store.clone(), "restart")
            .ttl(ttl)
            .watchdog(false)
            .build()
            .expect("lock")
    }

    /// A held lock with a waiter: the restart frees the lock, wakes the waiter at once
    /// (long before its fallback, the holder's 10 s), and its grant's fence is 2 when the
    /// counter was kept, 1 when it was lost. The old holder learns at its next extend.
    async fn restart_with_a_waiter(keep_fences: bool) -> u64 {
        let store = Memory::new();
        let lock = lock(&store, Duration::from_secs(10));
        let held = lock.lock().await.expect("held");
        assert_eq!(held.fencing_token().get(), 1);
        let waiter = {
            let lock = lock.clone();
            tokio::spawn(async move { lock.lock().await })
        };
        sleep(Duration::from_millis(10)).await;
        assert!(!waiter.is_finished());
        store.restart(keep_fences);
        let granted = tokio::time::timeout(Duration::from_millis(100), waiter)
            .await
            .expect("woken by the restart")
            .expect("task")
            .expect("granted");
        assert_eq!(
            store.holders(lock.keys().lock()),
            vec![(granted.token().as_str().to_owned(), 1)]
        );
        let err = held
            .extend(Duration::from_secs(10))
            .await
            .expect_err("gone");
        assert!(err.is_lock_lost());
        let fence = granted.fencing_token().get();
        granted.release().await.expect("released");
        fence
    }

    #[tokio::test(start_paused = true)]
    async fn a_restart_forgets_holds_and_keeps_fences_only_if_asked() {
        assert_eq!(restart_with_a_waiter(true).await, 2);
        assert_eq!(restart_with_a_waiter(false).await, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn holders_lists_every_primitive_and_a_restart_forgets_them_all() {
        let store = Memory::new();
        let ttl = Duration::from_secs(10);
        let plain = lock(&store, ttl);
        let p = plain.lock().await.expect("plain");
        let sem = Semaphore::builder(store.clone(), "restart", 5)
            .watchdog(false)
            .build()
            .expect("semaphore");
        let s2 = sem.acquire_many(2).await.expect("2 permits");
        let s3 = sem.acquire_many(3).await.expect("3 permits");
        let re = ReentrantLock::builder(store.clone(), "restart")
            .watchdog(false)
            .build()
            .expect("reentrant");
        let owner = Owner::with_client("client", "a").expect("owner");
        let r1 = re.lock(&owner).await.expect("hold");
        let r2 = re.lock(&owner).await.expect("re-entry");
        let rw = RwLock::builder(store.clone(), "restart")
            .watchdog(false)
            .build()
            .expect("rwlock");
        let read1 = rw.read().await.expect("reader");
        let read2 = rw.read().await.expect("reader");

        let one = |t: &crate::Token| (t.as_str().to_owned(), 1);
        let mut want = vec![one(p.token())];
        want.sort();
        assert_eq!(store.holders(plain.keys().lock()), want);
        let mut want = vec![
            (s2.token().as_str().to_owned(), 2),
            (s3.token().as_str().to_owned(), 3),
        ];
        want.sort();
        assert_eq!(store.holders(sem.keys().lock()), want);
        let mut want = vec![one(r1.token()), one(r2.token())];
        want.sort();
        assert_eq!(store.holders(re.keys().lock()), want);
        let mut want = vec![one(read1.token()), one(read2.token())];
        want.sort();
        assert_eq!(store.holders(rw.keys().lock()), want);
        // Expired holds are not listed.
        assert_eq!(store.holders("no-such-key"), vec![]);

        store.restart(true);
        for key in [
            plain.keys().lock(),
            sem.keys().lock(),
            re.keys().lock(),
            rw.keys().lock(),
        ] {
            assert_eq!(store.holders(key), vec![], "{key}");
        }
        // The semaphore's stored count survives with the counters.
        assert_eq!(sem.stored_permits().await.expect("count"), Some(5));
        store.restart(false);
        assert_eq!(sem.stored_permits().await.expect("count"), None);
        drop((p, s2, s3, r1, r2, read1, read2));
    }
}
