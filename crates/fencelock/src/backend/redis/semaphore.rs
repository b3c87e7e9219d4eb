//! Semaphores on Redis: the holders' leases in a sorted set at the lock key (token ->
//! expiry by the server's clock), their permits in a hash, the permit count beside them;
//! waiters queue as the plain lock's do, and a release hands freed permits to the head.
//!
//! The permits held are kept as a running total beside the holders
//! ([`permits_used`]): every script that adds or removes a holder — a grant, a hand-over,
//! a release, a lease that ran out and is cleaned up, a force-unlock — changes the total
//! in the same atomic step, so an acquire reads one number instead of summing the
//! holders. A lease that ran out leaves the total as its entry leaves the holders (the
//! cleanup subtracts its permits before dropping it). The total's key runs out no later
//! than the latest lease as it stood when the total was written, so it never outlives the
//! holders it counts; a missing total (it ran out before a renewed lease, or the semaphore
//! was written by a version that kept none) is summed again from the holders once and
//! kept from then on.

use std::time::Duration;

use super::{
    Attempt, Ending, Redis, WAKE_GRACE, claims, decode, map_err, not_replicated, parse_acquire,
    ttl_ms, waiter_grace, waiters,
};
use crate::error::{Error, Result};
use crate::keys::LockKeys;
use crate::raw::{Acquire, LockState, RawSemaphore};
use crate::token::Token;

/// How the permit script changes a semaphore's count (its `mode` argument).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CountChange {
    /// Adds a delta.
    Add,
    /// Sets it.
    Set,
}

impl CountChange {
    /// The script's word for it.
    fn as_arg(self) -> &'static str {
        match self {
            CountChange::Add => "add",
            CountChange::Set => "set",
        }
    }
}

/// A semaphore's holders' permits (token -> permits held; the lock key is the zset of
/// their leases).
pub(super) fn holders(keys: &LockKeys) -> String {
    keys.companion("holders")
}

/// A semaphore's permit count.
pub(super) fn permit_count(keys: &LockKeys) -> String {
    keys.companion("permits")
}

/// The permits a semaphore's holders hold now: the running total of [`holders`]' counts.
pub(super) fn permits_used(keys: &LockKeys) -> String {
    keys.companion("used")
}

impl RawSemaphore for Redis {
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
        let (holders, count, used) = (holders(keys), permit_count(keys), permits_used(keys));
        let (q, c) = (waiters(keys), claims(keys));
        let (reply, replicated): (Vec<i64>, bool) = self
            .write(
                &self.inner.scripts.sem_acquire,
                &[
                    keys.lock(),
                    &holders,
                    &count,
                    &q,
                    &c,
                    &used,
                    keys.fence(),
                    &keys.legacy_fence(),
                ],
                &[
                    &token.as_str(),
                    &n,
                    &permits,
                    &ttl_ms(ttl),
                    &Attempt::queue(queue).as_arg(),
                    &ttl_ms(waiter_grace(ttl)),
                    &keys.channel(),
                    &ttl_ms(WAKE_GRACE),
                    &self.waiter_id(),
                    &self.hand_over(),
                    &if strict { "1" } else { "0" },
                    &self.publish_cmd(),
                ],
                "acquiring permits",
            )
            .await?;
        if let [-2, stored] = reply.as_slice() {
            // A count that is not a permit count (set by hand) is reported as it reads.
            let stored = u32::try_from(*stored).unwrap_or(0);
            return Err(Error::permits_mismatch(keys.name(), stored, permits));
        }
        if queue && let [0, _, counter] = reply.as_slice() {
            self.raise_floor(keys, token, *counter);
        }
        if !replicated && reply.first() == Some(&1) {
            let _ = self.release_permits(keys, token).await;
            return Err(not_replicated(keys, "the permit grant"));
        }
        parse_acquire(&reply, "permit")
    }

    async fn release_permits(&self, keys: &LockKeys, token: &Token) -> Result<bool> {
        self.sem_release(keys, token.as_str(), Ending::Own, (0, Duration::ZERO))
            .await
    }

    async fn abandon_permits(
        &self,
        keys: &LockKeys,
        token: &Token,
        n: u32,
        ttl: Duration,
    ) -> Result<()> {
        self.sem_release(keys, token.as_str(), Ending::Leave, (n, ttl))
            .await
            .map(|_| ())
    }

    async fn extend_permits(&self, keys: &LockKeys, token: &Token, ttl: Duration) -> Result<bool> {
        let holders = holders(keys);
        let (extended, replicated): (i64, bool) = self
            .write(
                &self.inner.scripts.sem_extend,
                &[keys.lock(), &holders],
                &[&token.as_str(), &ttl_ms(ttl)],
                "renewing permits",
            )
            .await?;
        if extended == 1 && !replicated {
            return Err(not_replicated(keys, "the permit renewal"));
        }
        Ok(extended == 1)
    }

    async fn permits_in_use(&self, keys: &LockKeys, permits: u32) -> Result<(u32, u32)> {
        // Live leases only: those whose expiry is still ahead by the server's clock.
        let reply: redis::Value = self
            .inner
            .scripts
            .sem_count
            .key(keys.lock())
            .key(holders(keys))
            .key(permit_count(keys))
            .invoke_async(&mut self.conn())
            .await
            .map_err(|e| map_err(e, "counting permits"))?;
        decode::permit_count(&reply, permits)
    }

    async fn add_permits(
        &self,
        keys: &LockKeys,
        delta: i64,
        permits: u32,
        max: u32,
    ) -> Result<Option<u32>> {
        let count = self
            .sem_count(keys, delta, permits, max, CountChange::Add)
            .await?;
        Ok(u32::try_from(count).ok())
    }

    async fn set_permits(&self, keys: &LockKeys, permits: u32) -> Result<()> {
        let count = self
            .sem_count(
                keys,
                i64::from(permits),
                permits,
                u32::MAX,
                CountChange::Set,
            )
            .await?;
        if count < 0 {
            return Err(Error::invalid(format!(
                "a semaphore's permit count must be at least 1, not {permits}"
            )));
        }
        Ok(())
    }
}

/// Semaphore kind's inspection, for [`RawInspect`](crate::raw::RawInspect).
impl Redis {
    pub(crate) async fn inspect_permits(&self, keys: &LockKeys) -> Result<LockState> {
        let reply: Vec<redis::Value> = redis::pipe()
            .atomic()
            .cmd("TIME")
            .cmd("ZRANGE")
            .arg(keys.lock())
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .hgetall(holders(keys))
            .query_async(&mut self.conn())
            .await
            .map_err(|e| map_err(e, "inspecting a semaphore"))?;
        decode::permit_snapshot(reply)
    }

    pub(crate) async fn force_unlock_permits(&self, keys: &LockKeys) -> Result<bool> {
        self.sem_release(keys, "", Ending::Force, (0, Duration::ZERO))
            .await
    }
}

impl Redis {
    /// The semaphore's release script ending `mode` (`wanted` is the leaving waiter's
    /// permits and ttl).
    async fn sem_release(
        &self,
        keys: &LockKeys,
        token: &str,
        mode: Ending,
        wanted: (u32, Duration),
    ) -> Result<bool> {
        let done: i64 = self
            .inner
            .scripts
            .sem_release
            .key(keys.lock())
            .key(holders(keys))
            .key(waiters(keys))
            .key(claims(keys))
            .key(permit_count(keys))
            .key(permits_used(keys))
            .key(keys.fence())
            .key(keys.legacy_fence().as_ref())
            .arg(token)
            .arg(keys.channel())
            .arg(mode.as_arg())
            .arg(ttl_ms(WAKE_GRACE))
            .arg(self.waiter_id())
            .arg(ttl_ms(wanted.1))
            .arg(wanted.0)
            .arg(self.publish_cmd())
            .invoke_async(&mut self.conn())
            .await
            .map_err(|e| map_err(e, "releasing permits"))?;
        Ok(done == 1)
    }

    /// Changes the permit count (adds `value` to it, or sets it to `value`), handing added
    /// permits over to waiters.
    async fn sem_count(
        &self,
        keys: &LockKeys,
        value: i64,
        permits: u32,
        max: u32,
        change: CountChange,
    ) -> Result<i64> {
        self.inner
            .scripts
            .sem_add
            .key(permit_count(keys))
            .key(waiters(keys))
            .key(claims(keys))
            .key(keys.lock())
            .key(holders(keys))
            .key(permits_used(keys))
            .key(keys.fence())
            .key(keys.legacy_fence().as_ref())
            .arg(value)
            .arg(permits)
            .arg(max)
            .arg(keys.channel())
            .arg(change.as_arg())
            .arg(ttl_ms(WAKE_GRACE))
            .arg(self.publish_cmd())
            .invoke_async(&mut self.conn())
            .await
            .map_err(|e| map_err(e, "changing the permit count"))
    }
}
