//! Fair locks on Redis: the holder at the lock key, the queue in a sorted set by arrival
//! (server time), each waiter's claim expiry in another, all under the lock's hash tag.

use std::time::Duration;

use redis::Value;

use super::decode::typed;
use super::{Ending, Redis, map_err, not_replicated, parse_acquire, ttl_ms};
use crate::error::Result;
use crate::keys::LockKeys;
use crate::raw::{Acquire, LockState, RawFair};
use crate::token::Token;

pub(super) fn queue(keys: &LockKeys) -> String {
    keys.companion("queue")
}

pub(super) fn claims(keys: &LockKeys) -> String {
    keys.companion("claims")
}

impl Redis {
    async fn fair_release(&self, keys: &LockKeys, token: &str, mode: Ending) -> Result<bool> {
        let done: i64 = self
            .inner
            .scripts
            .fair_release
            .key(keys.lock())
            .key(queue(keys))
            .key(claims(keys))
            .arg(token)
            .arg(keys.channel())
            .arg(mode.as_arg())
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
                &[keys.lock(), &q, &c, keys.fence(), &keys.legacy_fence()],
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
        self.fair_release(keys, token.as_str(), Ending::Own).await
    }

    async fn abandon_fair(&self, keys: &LockKeys, token: &Token) -> Result<()> {
        self.fair_release(keys, token.as_str(), Ending::Leave)
            .await
            .map(|_| ())
    }
}

/// Fair kind's inspection, for [`RawInspect`](crate::raw::RawInspect).
impl Redis {
    pub(crate) async fn inspect_fair(&self, keys: &LockKeys) -> Result<LockState> {
        let base = self.inspect_plain(keys).await?;
        // Waiters whose place lapsed but was not purged yet are counted too.
        let queued: Value = redis::cmd("ZCARD")
            .arg(queue(keys))
            .query_async(&mut self.conn())
            .await
            .map_err(|e| map_err(e, "inspecting a fair lock"))?;
        fair_state(base, &queued)
    }

    pub(crate) async fn force_unlock_fair(&self, keys: &LockKeys) -> Result<bool> {
        self.fair_release(keys, "", Ending::Force).await
    }
}

/// A fair lock's state: the plain lock's (`base`) with the queue's length from `ZCARD`
/// (saturating at `u32::MAX`; a count that is no `u64` is a `Backend` error).
fn fair_state(base: LockState, queued: &Value) -> Result<LockState> {
    let queued: u64 = typed(queued, "inspecting a fair lock")?;
    Ok(base.with_queued(u32::try_from(queued).unwrap_or(u32::MAX)))
}

/// Hostile input: whatever `ZCARD` of the queue answers.
#[cfg(test)]
mod props {
    use proptest::prelude::*;
    use redis::Value;

    use super::fair_state;
    use crate::backend::redis::decode::strategy::value;
    use crate::raw::LockState;

    proptest! {
        #![proptest_config(crate::backend::hostile::cases(256))]

        #[test]
        fn any_queue_length_decodes_or_is_a_backend_error(reply in value()) {
            if let Err(e) = fair_state(LockState::new(None, None, None), &reply) {
                prop_assert_eq!(e.kind(), crate::ErrorKind::Backend, "{}", e);
            }
        }

        #[test]
        fn queue_lengths_round_trip(queued in prop_oneof![0..1_000i64, 0..i64::MAX], fence in any::<u64>()) {
            let base = LockState::new(Some("t".into()), None, Some(fence));
            let state = fair_state(base.clone(), &Value::Int(queued))
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            let expected = u32::try_from(queued).unwrap_or(u32::MAX);
            prop_assert_eq!(state, base.with_queued(expected));
        }
    }
}
