//! Fair locks on Redis: the holder at the lock key, the queue in a sorted set by arrival
//! (server time), each waiter's claim expiry in another, all under the lock's hash tag.

use std::time::Duration;

use super::{Redis, map_err, not_replicated, parse_acquire, ttl_ms};
use crate::error::Result;
use crate::keys::LockKeys;
use crate::raw::{Acquire, LockState, RawFair, RawInspect};
use crate::token::Token;

pub(super) fn queue(keys: &LockKeys) -> String {
    keys.companion("queue")
}

pub(super) fn claims(keys: &LockKeys) -> String {
    keys.companion("claims")
}

impl Redis {
    async fn fair_release(&self, keys: &LockKeys, token: &str, mode: &str) -> Result<bool> {
        let done: i64 = self
            .inner
            .scripts
            .fair_release
            .key(keys.lock())
            .key(queue(keys))
            .key(claims(keys))
            .arg(token)
            .arg(keys.channel())
            .arg(mode)
            .arg(self.publish_cmd())
            .invoke_async(&mut self.conn())
            .await
            .map_err(|e| map_err(e, "releasing a fair lock"))?;
        Ok(done == 1)
    }
}

impl RawFair for Redis {
    async fn acquire_fair(
        &self,
        keys: &LockKeys,
        token: &Token,
        ttl: Duration,
        grace: Duration,
    ) -> Result<Acquire> {
        let (q, c) = (queue(keys), claims(keys));
        let (reply, replicated): (Vec<i64>, bool) = self
            .write(
                &self.inner.scripts.fair_acquire,
                &[keys.lock(), &q, &c, keys.fence()],
                &[&token.as_str(), &ttl_ms(ttl), &ttl_ms(grace)],
                "acquiring a fair lock",
            )
            .await?;
        if !replicated && reply.first() == Some(&1) {
            let _ = self.release_fair(keys, token).await;
            return Err(not_replicated(keys, "the grant"));
        }
        parse_acquire(&reply, "fair acquire")
    }

    async fn release_fair(&self, keys: &LockKeys, token: &Token) -> Result<bool> {
        self.fair_release(keys, token.as_str(), "own").await
    }

    async fn abandon_fair(&self, keys: &LockKeys, token: &Token) -> Result<()> {
        self.fair_release(keys, token.as_str(), "leave")
            .await
            .map(|_| ())
    }

    async fn inspect_fair(&self, keys: &LockKeys) -> Result<LockState> {
        let base = self.inspect(keys).await?;
        // Waiters whose place lapsed but was not purged yet are counted too.
        let queued: i64 = redis::cmd("ZCARD")
            .arg(queue(keys))
            .query_async(&mut self.conn())
            .await
            .map_err(|e| map_err(e, "inspecting a fair lock"))?;
        Ok(base.with_queued(u32::try_from(queued).unwrap_or(0)))
    }

    async fn force_unlock_fair(&self, keys: &LockKeys) -> Result<bool> {
        self.fair_release(keys, "", "force").await
    }
}
