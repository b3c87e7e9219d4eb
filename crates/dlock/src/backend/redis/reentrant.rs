//! Reentrant locks on Redis: seed 004's hash of owner -> hold count, plus the tenure's
//! fence and one field per live hold.

use std::time::Duration;

use super::{
    Redis, WAKE_GRACE, claims, map_err, not_replicated, parse_acquire, ttl_ms, waiter_grace,
    waiters,
};
use crate::error::{Error, ErrorKind, Result};
use crate::keys::LockKeys;
use crate::raw::{Acquire, LockState, RawInspect, RawReentrant};
use crate::token::Token;

impl RawReentrant for Redis {
    async fn acquire_reentrant(
        &self,
        keys: &LockKeys,
        owner: &str,
        token: &Token,
        ttl: Duration,
        limit: u32,
        queue: bool,
    ) -> Result<Acquire> {
        let (q, c) = (waiters(keys), claims(keys));
        let (reply, replicated): (Vec<i64>, bool) = self
            .write(
                &self.inner.scripts.re_acquire,
                &[keys.lock(), keys.fence(), &q, &c],
                &[
                    &owner,
                    &token.as_str(),
                    &ttl_ms(ttl),
                    &limit,
                    &if queue { "wait" } else { "try" },
                    &ttl_ms(waiter_grace(ttl)),
                    &self.waiter_id(),
                ],
                "acquiring a reentrant lock",
            )
            .await?;
        if !replicated && reply.first() == Some(&1) {
            let _ = self.release_reentrant(keys, owner, token).await;
            return Err(not_replicated(keys, "the grant"));
        }
        match reply.as_slice() {
            [2, count] => Err(Error::new(
                ErrorKind::LimitReached,
                format!(
                    "reentrant lock {:?}: {owner} already holds it {count} times, its \
                     reentrancy limit",
                    keys.name()
                ),
            )),
            [1, fence] if *fence < 1 => {
                let _ = self.release_reentrant(keys, owner, token).await;
                Err(Error::new(
                    ErrorKind::Backend,
                    format!(
                        "fence of reentrant lock {} is {fence}, not positive: it was tampered with",
                        keys.lock()
                    ),
                ))
            }
            other => parse_acquire(other, "reentrant acquire"),
        }
    }

    async fn release_reentrant(&self, keys: &LockKeys, owner: &str, token: &Token) -> Result<bool> {
        let released: i64 = self
            .inner
            .scripts
            .re_release
            .key(keys.lock())
            .key(waiters(keys))
            .key(claims(keys))
            .arg(owner)
            .arg(token.as_str())
            .arg(keys.channel())
            .arg(ttl_ms(WAKE_GRACE))
            .arg(self.publish_cmd())
            .invoke_async(&mut self.conn())
            .await
            .map_err(|e| map_err(e, "releasing a reentrant hold"))?;
        Ok(released == 1)
    }

    async fn extend_reentrant(
        &self,
        keys: &LockKeys,
        token: &Token,
        ttl: Duration,
    ) -> Result<bool> {
        let (extended, replicated): (i64, bool) = self
            .write(
                &self.inner.scripts.re_extend,
                &[keys.lock()],
                &[&token.as_str(), &ttl_ms(ttl)],
                "renewing a reentrant lock",
            )
            .await?;
        if extended == 1 && !replicated {
            return Err(not_replicated(keys, "the renewal"));
        }
        Ok(extended == 1)
    }

    async fn inspect_reentrant(&self, keys: &LockKeys) -> Result<LockState> {
        type Snapshot = (Vec<(String, String)>, i64, Option<u64>);
        let (fields, pttl, fence): Snapshot = redis::pipe()
            .atomic()
            .hgetall(keys.lock())
            .pttl(keys.lock())
            .get(keys.fence())
            .query_async(&mut self.conn())
            .await
            .map_err(|e| map_err(e, "inspecting a reentrant lock"))?;
        // The owner is the one field with a '/'; hold fields are 't:<hex token>'.
        let holder = fields
            .into_iter()
            .find(|(field, _)| field.contains('/'))
            .map(|(owner, count)| (owner, count.parse::<u32>().unwrap_or(0)));
        let remaining = u64::try_from(pttl).ok().map(Duration::from_millis);
        Ok(match holder {
            Some((owner, count)) => {
                LockState::new(Some(owner), remaining, fence).with_hold_count(count)
            }
            None => LockState::new(None, None, fence),
        })
    }

    async fn force_unlock_reentrant(&self, keys: &LockKeys) -> Result<bool> {
        self.force_unlock(keys).await
    }
}
