//! The rest of the family on the simulated store: semaphores, reentrant locks, read-write
//! locks, fair locks and elections, each call through the simulated network
//! (`SimStore::call`). The traits' default watches — a read-write lock's sides, a fair
//! lock's waiter's channel, an election's record — go through the simulated
//! [`RawLock::watch`](fencelock::raw::RawLock::watch), which keeps the in-process store's
//! own notifier for side channels. The in-process store sets none of the capability traits'
//! associated constants (no store-side waiter queue, readers never queue), so neither
//! does the simulated one.
//!
//! Checker 2 (fences strictly increase in grant order) sees the grants that mint a fence
//! of their own: a fair lock's, a read-write lock's writer's (readers have fence 0) and,
//! through the plain lock, an election's terms. A reentrant lock's re-entry returns its
//! tenure's first fence under a new request token, so its grants are recorded under the
//! owner instead (one owner may repeat its fence; another owner must get a greater one).
//! A semaphore's permits carry no fence (0): only their key is recorded, for the leak
//! check.

use std::time::Duration;

use fencelock::keys::LockKeys;
use fencelock::raw::{Acquire, RawElection, RawFair, RawReentrant, RawRwLock, RawSemaphore};
use fencelock::{Result, Token};

use crate::Plant;
use crate::store::SimStore;

fn acquired(r: &Result<Acquire>) -> String {
    match r {
        Ok(Acquire::Acquired { fence }) => format!("acquired fence {fence}"),
        Ok(Acquire::Held { remaining }) => format!("held ({remaining:?} left)"),
        Ok(other) => format!("{other:?}"),
        Err(e) => format!("error {e}"),
    }
}

fn yes<T: std::fmt::Debug>(r: &Result<T>) -> String {
    match r {
        Ok(v) => format!("{v:?}"),
        Err(e) => format!("error {e}"),
    }
}

fn ok<T>(r: &Result<T>) -> String {
    match r {
        Ok(_) => String::from("ok"),
        Err(e) => format!("error {e}"),
    }
}

impl SimStore {
    /// Whether the planted bug is in: a release deletes the key whoever holds it (as
    /// the plain lock's release does under the same plant).
    fn unchecked_release(&self) -> bool {
        self.world.lock().plant == Some(Plant::ReleaseWithoutOwnerCheck)
    }

    /// Remembers `key` for the leak check at the end of the run (grants without a fence
    /// are not recorded by checker 2).
    fn note_key(&self, key: &str) {
        let mut w = self.world.lock();
        if !w.keys.contains(key) {
            w.keys.insert(key.to_owned());
        }
    }
}

impl RawSemaphore for SimStore {
    async fn acquire_permits(
        &self,
        keys: &LockKeys,
        token: &Token,
        n: u32,
        permits: u32,
        strict: bool,
        ttl: Duration,
        queue: bool,
    ) -> Result<Acquire> {
        self.note_key(keys.lock());
        self.call(
            "acquire-permits",
            keys.lock(),
            Some(ttl),
            |t| {
                self.inner
                    .acquire_permits(keys, token, n, permits, strict, t, queue)
            },
            acquired,
        )
        .await
    }

    async fn release_permits(&self, keys: &LockKeys, token: &Token) -> Result<bool> {
        self.call(
            "release-permits",
            keys.lock(),
            None,
            |_| async move {
                if self.unchecked_release() {
                    return Ok(self.inner.force_delete(keys.lock()));
                }
                self.inner.release_permits(keys, token).await
            },
            yes,
        )
        .await
    }

    async fn extend_permits(&self, keys: &LockKeys, token: &Token, ttl: Duration) -> Result<bool> {
        self.call(
            "extend-permits",
            keys.lock(),
            Some(ttl),
            |t| self.inner.extend_permits(keys, token, t),
            yes,
        )
        .await
    }

    async fn permits_in_use(&self, keys: &LockKeys, permits: u32) -> Result<(u32, u32)> {
        self.call(
            "permits-in-use",
            keys.lock(),
            None,
            |_| self.inner.permits_in_use(keys, permits),
            yes,
        )
        .await
    }

    async fn set_permits(&self, keys: &LockKeys, permits: u32) -> Result<()> {
        self.call(
            "set-permits",
            keys.lock(),
            None,
            |_| self.inner.set_permits(keys, permits),
            yes,
        )
        .await
    }

    async fn add_permits(
        &self,
        keys: &LockKeys,
        delta: i64,
        permits: u32,
        max: u32,
    ) -> Result<Option<u32>> {
        self.call(
            "add-permits",
            keys.lock(),
            None,
            |_| self.inner.add_permits(keys, delta, permits, max),
            yes,
        )
        .await
    }
}

impl RawReentrant for SimStore {
    async fn acquire_reentrant(
        &self,
        keys: &LockKeys,
        owner: &str,
        token: &Token,
        ttl: Duration,
        limit: u32,
        queue: bool,
    ) -> Result<Acquire> {
        self.call(
            "acquire-reentrant",
            keys.lock(),
            Some(ttl),
            |t| async move {
                let r = self
                    .inner
                    .acquire_reentrant(keys, owner, token, t, limit, queue)
                    .await;
                // Checker 2 by owner: a re-entry (or a repeat) returns the tenure's
                // fence; the next owner's first grant must carry a greater one.
                if let Ok(Acquire::Acquired { fence }) = &r {
                    self.world.granted(keys.lock(), owner, *fence);
                }
                r
            },
            acquired,
        )
        .await
    }

    async fn release_reentrant(&self, keys: &LockKeys, owner: &str, token: &Token) -> Result<bool> {
        self.call(
            "release-reentrant",
            keys.lock(),
            None,
            |_| async move {
                if self.unchecked_release() {
                    return Ok(self.inner.force_delete(keys.lock()));
                }
                self.inner.release_reentrant(keys, owner, token).await
            },
            yes,
        )
        .await
    }

    async fn extend_reentrant(
        &self,
        keys: &LockKeys,
        token: &Token,
        ttl: Duration,
    ) -> Result<bool> {
        self.call(
            "extend-reentrant",
            keys.lock(),
            Some(ttl),
            |t| self.inner.extend_reentrant(keys, token, t),
            yes,
        )
        .await
    }
}

impl RawRwLock for SimStore {
    async fn acquire_rw(
        &self,
        keys: &LockKeys,
        token: &Token,
        write: bool,
        ttl: Duration,
        grace: Duration,
    ) -> Result<Acquire> {
        self.note_key(keys.lock());
        self.call(
            if write {
                "acquire-write"
            } else {
                "acquire-read"
            },
            keys.lock(),
            Some(ttl),
            |t| async move {
                let r = self.inner.acquire_rw(keys, token, write, t, grace).await;
                // Writers mint fences (readers get 0 and order nobody).
                if write {
                    self.note_grant(keys.lock(), token, &r);
                }
                r
            },
            acquired,
        )
        .await
    }

    async fn release_rw(&self, keys: &LockKeys, token: &Token) -> Result<bool> {
        self.call(
            "release-rw",
            keys.lock(),
            None,
            |_| async move {
                if self.unchecked_release() {
                    return Ok(self.inner.force_delete(keys.lock()));
                }
                self.inner.release_rw(keys, token).await
            },
            yes,
        )
        .await
    }

    async fn extend_rw(&self, keys: &LockKeys, token: &Token, ttl: Duration) -> Result<bool> {
        self.call(
            "extend-rw",
            keys.lock(),
            Some(ttl),
            |t| self.inner.extend_rw(keys, token, t),
            yes,
        )
        .await
    }

    async fn downgrade_rw(&self, keys: &LockKeys, token: &Token, ttl: Duration) -> Result<bool> {
        self.call(
            "downgrade",
            keys.lock(),
            Some(ttl),
            |t| self.inner.downgrade_rw(keys, token, t),
            yes,
        )
        .await
    }

    async fn abandon_rw(&self, keys: &LockKeys, token: &Token) -> Result<()> {
        self.call(
            "abandon-rw",
            keys.lock(),
            None,
            |_| self.inner.abandon_rw(keys, token),
            ok,
        )
        .await
    }
}

impl RawFair for SimStore {
    async fn acquire_fair(
        &self,
        keys: &LockKeys,
        token: &Token,
        ttl: Duration,
        grace: Duration,
    ) -> Result<Acquire> {
        self.call(
            "acquire-fair",
            keys.lock(),
            Some(ttl),
            |t| async move {
                let r = self.inner.acquire_fair(keys, token, t, grace).await;
                self.note_grant(keys.lock(), token, &r);
                r
            },
            acquired,
        )
        .await
    }

    async fn release_fair(&self, keys: &LockKeys, token: &Token) -> Result<bool> {
        self.call(
            "release-fair",
            keys.lock(),
            None,
            |_| async move {
                if self.unchecked_release() {
                    return Ok(self.inner.force_delete(keys.lock()));
                }
                self.inner.release_fair(keys, token).await
            },
            yes,
        )
        .await
    }

    async fn abandon_fair(&self, keys: &LockKeys, token: &Token) -> Result<()> {
        self.call(
            "abandon-fair",
            keys.lock(),
            None,
            |_| self.inner.abandon_fair(keys, token),
            ok,
        )
        .await
    }
}

impl RawElection for SimStore {
    async fn publish(&self, keys: &LockKeys, token: &Token, term: u64, data: &str) -> Result<bool> {
        self.call(
            "publish",
            keys.lock(),
            None,
            |_| self.inner.publish(keys, token, term, data),
            yes,
        )
        .await
    }

    async fn record(&self, keys: &LockKeys) -> Result<Option<(u64, String)>> {
        self.call(
            "record",
            keys.lock(),
            None,
            |_| self.inner.record(keys),
            |r: &Result<Option<(u64, String)>>| match r {
                Ok(Some((term, _))) => format!("term {term}"),
                Ok(None) => String::from("none"),
                Err(e) => format!("error {e}"),
            },
        )
        .await
    }
}
