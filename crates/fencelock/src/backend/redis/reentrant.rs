//! Reentrant locks on Redis: Redisson's hash of owner -> hold count, plus the tenure's
//! fence and one field per live hold.

use std::time::Duration;

use redis::Value;

use super::decode::{self, typed};
use super::{
    Attempt, Redis, WAKE_GRACE, claims, map_err, not_replicated, parse_acquire, tampered_fence,
    ttl_ms, waiter_grace, waiters,
};
use crate::error::{Error, ErrorKind, Result};
use crate::keys::LockKeys;
use crate::raw::{Acquire, LockState, RawReentrant};
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
                &[keys.lock(), keys.fence(), &q, &c, &keys.legacy_fence()],
                &[
                    &owner,
                    &token.as_str(),
                    &ttl_ms(ttl),
                    &limit,
                    &Attempt::queue(queue).as_arg(),
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
        if let Some(count) = limit_reached(&reply) {
            return Err(Error::new(
                ErrorKind::LimitReached,
                format!(
                    "reentrant lock {:?}: {owner} already holds it {count} times, its \
                     reentrancy limit",
                    keys.name()
                ),
            ));
        }
        if let Some(fence) = tampered_fence(&reply) {
            let _ = self.release_reentrant(keys, owner, token).await;
            return Err(Error::new(
                ErrorKind::Backend,
                format!(
                    "fence of reentrant lock {} is {fence}, not positive: it was tampered with",
                    keys.lock()
                ),
            ));
        }
        parse_acquire(&reply, "reentrant acquire")
    }

    async fn release_reentrant(&self, keys: &LockKeys, owner: &str, token: &Token) -> Result<bool> {
        let released: i64 = self
            .inner
            .scripts
            .re_release
            .key(keys.lock())
            .key(waiters(keys))
            .key(claims(keys))
            .key(keys.legacy_fence().as_ref())
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
}

/// Reentrant kind's inspection, for [`RawInspect`](crate::raw::RawInspect).
impl Redis {
    pub(crate) async fn inspect_reentrant(&self, keys: &LockKeys) -> Result<LockState> {
        let reply: Vec<Value> = redis::pipe()
            .atomic()
            .hgetall(keys.lock())
            .pttl(keys.lock())
            .get(keys.fence())
            .query_async(&mut self.conn())
            .await
            .map_err(|e| map_err(e, "inspecting a reentrant lock"))?;
        reentrant_state(reply)
    }

    pub(crate) async fn force_unlock_reentrant(&self, keys: &LockKeys) -> Result<bool> {
        self.force_unlock_plain(keys).await
    }
}

/// The owner's hold count in a reentrant acquire's `{2, count}`: the owner is at its
/// reentrancy limit.
fn limit_reached(reply: &[i64]) -> Option<i64> {
    match reply {
        [2, count] => Some(*count),
        _ => None,
    }
}

const INSPECTING: &str = "inspecting a reentrant lock";

/// A reentrant lock's state from its inspection transaction: `HGETALL` of the lock hash,
/// its `PTTL`, `GET` of the fence counter.
fn reentrant_state(reply: Vec<Value>) -> Result<LockState> {
    let [fields, pttl, fence] = decode::replies(reply, INSPECTING)?;
    let fields: Vec<(String, String)> = typed(&fields, INSPECTING)?;
    holds(
        &fields,
        typed(&pttl, INSPECTING)?,
        typed(&fence, INSPECTING)?,
    )
}

/// A reentrant lock's state from its hash (see `lua/re_acquire.lua`: the owner -> its hold
/// count, `:fence` -> the tenure's fence, `t:<token>` -> 1 per live hold), the hash's
/// `PTTL` and the fence counter. The owner is the field with a '/' (every owner has one);
/// a hold field has one only if its request token does (one given to
/// `Token::from_string`), so a field with a '/' outside `t:` is the owner, whatever the
/// order `HGETALL` lists them in. An owner's count that is no `u32` is a `Backend` error.
fn holds(fields: &[(String, String)], pttl: i64, fence: Option<u64>) -> Result<LockState> {
    let owners = || fields.iter().filter(|(field, _)| field.contains('/'));
    let owner = owners()
        .find(|(field, _)| !field.starts_with("t:"))
        .or_else(|| owners().next());
    let Some((owner, count)) = owner else {
        return Ok(LockState::new(None, None, fence));
    };
    let count = count.parse::<u32>().map_err(|_| {
        decode::malformed(
            INSPECTING,
            format!("the hold count of {owner:?} is {count:?}, not a count"),
        )
    })?;
    let remaining = u64::try_from(pttl).ok().map(Duration::from_millis);
    Ok(LockState::new(Some(owner.clone()), remaining, fence).with_hold_count(count))
}

/// Hostile input: whatever a reentrant lock's hash holds, and any acquire reply.
#[cfg(test)]
mod props {
    use std::time::Duration;

    use proptest::prelude::*;
    use redis::Value;

    use super::{holds, limit_reached, reentrant_state};
    use crate::backend::redis::decode::strategy::{get, hgetall, transaction};
    use crate::backend::redis::{parse_acquire, tampered_fence};

    fn fail(e: impl std::fmt::Display) -> TestCaseError {
        TestCaseError::fail(e.to_string())
    }

    proptest! {
        #![proptest_config(crate::backend::hostile::cases(256))]

        #[test]
        fn any_inspection_decodes_or_is_a_backend_error(
            reply in transaction(vec![
                hgetall(&[("c/p".into(), "1".into()), (":fence".into(), "4".into())], false),
                Value::Int(100),
                get(Some(4)),
            ]),
        ) {
            if let Err(e) = reentrant_state(reply) {
                prop_assert_eq!(e.kind(), crate::ErrorKind::Backend, "{}", e);
            }
        }

        #[test]
        fn any_hash_content_decodes_or_is_a_backend_error(
            fields in prop::collection::vec((prop_oneof!["[a-z]{1,3}/[a-z]{1,3}", "t:[a-z/]{1,4}", ":fence", any::<String>()], prop_oneof!["[0-9]{1,11}", "-[0-9]{1,3}", any::<String>()]), 0..6),
            pttl in any::<i64>(),
            fence in proptest::option::of(any::<u64>()),
        ) {
            match holds(&fields, pttl, fence) {
                Ok(state) => {
                    prop_assert_eq!(state.last_fence, fence);
                    let owner = state.holder.clone();
                    prop_assert_eq!(owner.is_some(), fields.iter().any(|(f, _)| f.contains('/')));
                    if let Some(owner) = owner {
                        let count = fields.iter().find(|(f, _)| *f == owner).map(|(_, c)| c.parse::<u32>().ok());
                        prop_assert_eq!(count, Some(state.hold_count));
                    }
                }
                Err(e) => prop_assert_eq!(e.kind(), crate::ErrorKind::Backend, "{}", e),
            }
        }

        /// The hash as `re_acquire.lua` writes it, its fields in any order (a hash past its
        /// listpack size lists them in no particular order).
        #[test]
        fn inspections_round_trip(
            owner in "(t:)?[a-z0-9]{1,8}/[a-z0-9]{1,8}",
            count in any::<u32>(),
            holds in prop::collection::vec(prop_oneof!["[0-9a-f]{32}", "[0-9a-f]{4}/[a-z]{1,3}"], 0..4),
            tenure in 1..u64::MAX,
            pttl in prop_oneof![Just(-2i64), Just(-1), 0..100_000i64],
            counter in proptest::option::of(any::<u64>()),
            order in any::<prop::sample::Index>(),
            resp3 in any::<bool>(),
        ) {
            // An owner starting with "t:" beside a token with a '/' is the one layout that
            // cannot be told apart: such an owner's holds have plain tokens here.
            let ambiguous = |t: &String| owner.starts_with("t:") && t.contains('/');
            let holds: Vec<String> = holds.into_iter().filter(|t| !ambiguous(t)).collect();
            let mut fields = vec![(owner.clone(), count.to_string()), (":fence".to_owned(), tenure.to_string())];
            fields.extend(holds.iter().map(|t| (format!("t:{t}"), "1".to_owned())));
            let at = order.index(fields.len());
            fields.rotate_left(at);
            let reply = vec![hgetall(&fields, resp3), Value::Int(pttl), get(counter)];
            let state = reentrant_state(reply).map_err(fail)?;
            prop_assert_eq!(state.holder, Some(owner));
            prop_assert_eq!(state.hold_count, Some(count));
            prop_assert_eq!(state.last_fence, counter);
            prop_assert_eq!(state.remaining, u64::try_from(pttl).ok().map(Duration::from_millis));
        }

        #[test]
        fn released_hashes_have_no_holder(counter in proptest::option::of(any::<u64>()), pttl in any::<i64>()) {
            let state = reentrant_state(vec![Value::Array(vec![]), Value::Int(pttl), get(counter)]).map_err(fail)?;
            prop_assert_eq!((state.holder, state.remaining, state.last_fence), (None, None, counter));
        }

        /// A reentrant acquire's reply: the limit, a tampered fence, or `parse_acquire`'s.
        #[test]
        fn acquire_replies_are_told_apart(reply in prop::collection::vec(prop_oneof![-2..3i64, any::<i64>()], 0..4)) {
            let limit = limit_reached(&reply);
            let tampered = tampered_fence(&reply);
            prop_assert_eq!(limit.is_some(), reply.len() == 2 && reply[0] == 2);
            prop_assert_eq!(tampered.is_some(), reply.len() == 2 && reply[0] == 1 && reply[1] < 1);
            if limit.is_none() && tampered.is_none() {
                match parse_acquire(&reply, "t") {
                    Ok(_) => prop_assert!(matches!(reply.as_slice(), [1, f] if *f >= 1) || reply.first() == Some(&0)),
                    Err(e) => prop_assert_eq!(e.kind(), crate::ErrorKind::Backend),
                }
            }
        }
    }
}
