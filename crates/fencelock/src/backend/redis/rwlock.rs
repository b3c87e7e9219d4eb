//! Read-write locks on Redis: the writer at the lock key, readers and waiting writers in
//! two sorted sets scored by expiry (server clock), all under the lock's hash tag.

use std::time::Duration;

use redis::Value;

use super::decode::{self, typed};
use super::{Redis, map_err, not_replicated, parse_acquire, ttl_ms};
use crate::error::Result;
use crate::keys::LockKeys;
use crate::raw::{Acquire, LockState, RawRwLock};
use crate::token::Token;

pub(super) fn readers(keys: &LockKeys) -> String {
    keys.companion("readers")
}

pub(super) fn writers(keys: &LockKeys) -> String {
    keys.companion("writers")
}

impl RawRwLock for Redis {
    async fn acquire_rw(
        &self,
        keys: &LockKeys,
        token: &Token,
        write: bool,
        ttl: Duration,
        grace: Duration,
    ) -> Result<Acquire> {
        let (r, w) = (readers(keys), writers(keys));
        let (reply, replicated): (Vec<i64>, bool) = self
            .write(
                &self.inner.scripts.rw_acquire,
                &[keys.lock(), &r, &w, keys.fence(), &keys.legacy_fence()],
                &[
                    &if write { "w" } else { "r" },
                    &token.as_str(),
                    &ttl_ms(ttl),
                    &ttl_ms(grace),
                    &self.waiter_id(),
                ],
                "acquiring a read-write lock",
            )
            .await?;
        if !replicated && reply.first() == Some(&1) {
            let _ = self.release_rw(keys, token).await;
            return Err(not_replicated(keys, "the grant"));
        }
        parse_acquire(&reply, "read-write acquire")
    }

    async fn release_rw(&self, keys: &LockKeys, token: &Token) -> Result<bool> {
        let released: i64 = self
            .inner
            .scripts
            .rw_release
            .key(keys.lock())
            .key(readers(keys))
            .key(writers(keys))
            .arg(token.as_str())
            .arg(keys.channel())
            .arg(self.publish_cmd())
            .invoke_async(&mut self.conn())
            .await
            .map_err(|e| map_err(e, "releasing a read-write lock"))?;
        Ok(released == 1)
    }

    async fn extend_rw(&self, keys: &LockKeys, token: &Token, ttl: Duration) -> Result<bool> {
        let r = readers(keys);
        let (extended, replicated): (i64, bool) = self
            .write(
                &self.inner.scripts.rw_extend,
                &[keys.lock(), &r],
                &[&token.as_str(), &ttl_ms(ttl)],
                "renewing a read-write lock",
            )
            .await?;
        if extended == 1 && !replicated {
            return Err(not_replicated(keys, "the renewal"));
        }
        Ok(extended == 1)
    }

    async fn downgrade_rw(&self, keys: &LockKeys, token: &Token, ttl: Duration) -> Result<bool> {
        let done: i64 = self
            .inner
            .scripts
            .rw_downgrade
            .key(keys.lock())
            .key(readers(keys))
            .arg(token.as_str())
            .arg(ttl_ms(ttl))
            .arg(keys.channel())
            .arg(self.publish_cmd())
            .invoke_async(&mut self.conn())
            .await
            .map_err(|e| map_err(e, "downgrading a write lock"))?;
        Ok(done == 1)
    }

    async fn abandon_rw(&self, keys: &LockKeys, token: &Token) -> Result<()> {
        let _: i64 = self
            .inner
            .scripts
            .rw_abandon
            .key(keys.lock())
            .key(writers(keys))
            .key(readers(keys))
            .arg(token.as_str())
            .arg(keys.channel())
            .arg(self.waiter_id())
            .arg(self.publish_cmd())
            .invoke_async(&mut self.conn())
            .await
            .map_err(|e| map_err(e, "withdrawing a waiting writer"))?;
        Ok(())
    }
}

/// RwLock kind's inspection, for [`RawInspect`](crate::raw::RawInspect).
impl Redis {
    pub(crate) async fn inspect_rw(&self, keys: &LockKeys) -> Result<LockState> {
        let reply: Vec<Value> = redis::pipe()
            .atomic()
            .get(keys.lock())
            .pttl(keys.lock())
            .cmd("ZRANGE")
            .arg(readers(keys))
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .cmd("ZRANGE")
            .arg(writers(keys))
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .get(keys.fence())
            .cmd("TIME")
            .query_async(&mut self.conn())
            .await
            .map_err(|e| map_err(e, "inspecting a read-write lock"))?;
        rw_state(reply)
    }

    pub(crate) async fn force_unlock_rw(&self, keys: &LockKeys) -> Result<bool> {
        let reply: Vec<Value> = redis::pipe()
            .atomic()
            .del(&[keys.lock().to_owned(), readers(keys), writers(keys)])
            .cmd(self.publish_cmd())
            .arg(keys.side("w").channel())
            .arg(keys.lock())
            .ignore()
            .cmd(self.publish_cmd())
            .arg(keys.side("r").channel())
            .arg(keys.lock())
            .query_async(&mut self.conn())
            .await
            .map_err(|e| map_err(e, "force-unlocking a read-write lock"))?;
        forced(reply)
    }
}

/// A read-write lock's state from its inspection transaction: `GET` writer key, `PTTL`
/// writer key, `ZRANGE` readers `WITHSCORES`, `ZRANGE` waiting writers `WITHSCORES`,
/// `GET` fence counter, `TIME`.
fn rw_state(reply: Vec<Value>) -> Result<LockState> {
    const DOING: &str = "inspecting a read-write lock";
    let [writer, pttl, readers, writers, fence, time] = decode::replies(reply, DOING)?;
    let (secs, micros): (i64, i64) = typed(&time, DOING)?;
    Ok(rw_snapshot(
        typed(&writer, DOING)?,
        typed(&pttl, DOING)?,
        &typed::<Vec<(String, f64)>>(&readers, DOING)?,
        &typed::<Vec<(String, f64)>>(&writers, DOING)?,
        typed(&fence, DOING)?,
        super::server_ms(secs, micros),
    ))
}

/// A read-write lock's state from its writer (and the writer key's `PTTL`), its readers
/// and waiting writers (`member -> expiry ms` by the server's clock), its fence counter
/// and the server's time `now` (ms). Scores are whatever the sorted sets hold: any `f64`,
/// NaN and infinities included; conversions saturate.
fn rw_snapshot(
    writer: Option<String>,
    pttl: i64,
    readers: &[(String, f64)],
    writers: &[(String, f64)],
    fence: Option<u64>,
    now: i64,
) -> LockState {
    let now = now as f64;
    let live = |set: &[(String, f64)]| set.iter().filter(|(_, e)| *e > now).count();
    // `f64::max` skips NaN: the latest reader's expiry, NaN if there is none.
    let last_reader = readers.iter().map(|(_, e)| *e).fold(f64::NAN, f64::max);
    let remaining = match (&writer, u64::try_from(pttl)) {
        (Some(_), Ok(ms)) => Some(Duration::from_millis(ms)),
        // `as` saturates: an infinite expiry is u64::MAX ms.
        (None, _) if last_reader > now => Some(Duration::from_millis((last_reader - now) as u64)),
        _ => None,
    };
    LockState::new(writer, remaining, fence)
        .with_holders(u32::try_from(live(readers)).unwrap_or(u32::MAX))
        .with_queued(u32::try_from(live(writers)).unwrap_or(u32::MAX))
}

/// Whether a force-unlock deleted anything, from its transaction's replies (the `DEL`'s
/// count, then the second `PUBLISH`'s; the first is ignored).
fn forced(reply: Vec<Value>) -> Result<bool> {
    const DOING: &str = "force-unlocking a read-write lock";
    let [deleted, _published] = decode::replies(reply, DOING)?;
    Ok(typed::<i64>(&deleted, DOING)? > 0)
}

/// Hostile input: whatever a read-write lock's keys and the server's clock hold.
#[cfg(test)]
mod props {
    use std::time::Duration;

    use proptest::prelude::*;
    use redis::Value;

    use super::{forced, rw_snapshot, rw_state};
    use crate::backend::redis::decode::strategy::{get, time, transaction, value, zrange};

    fn fail(e: impl std::fmt::Display) -> TestCaseError {
        TestCaseError::fail(e.to_string())
    }

    fn backend_error<T>(decoded: &crate::Result<T>) -> Result<(), TestCaseError> {
        if let Err(e) = decoded {
            prop_assert_eq!(e.kind(), crate::ErrorKind::Backend, "{}", e);
        }
        Ok(())
    }

    /// Members with expiries relative to the server's time (ms).
    fn members() -> impl Strategy<Value = Vec<(String, i64)>> {
        prop::collection::btree_map("[0-9a-f]{1,8}", -10_000..10_000i64, 0..6)
            .prop_map(|m| m.into_iter().collect())
    }

    proptest! {
        #![proptest_config(crate::backend::hostile::cases(256))]

        #[test]
        fn any_inspection_decodes_or_is_a_backend_error(
            reply in transaction(vec![
                get(Some("w")),
                Value::Int(100),
                zrange(&[("r".into(), 2_000)], false),
                zrange(&[], false),
                get(Some(3)),
                time(1_000),
            ]),
        ) {
            backend_error(&rw_state(reply))?;
        }

        #[test]
        fn inspections_round_trip(
            writer in proptest::option::of("[0-9a-f]{32}"),
            pttl in prop_oneof![Just(-2i64), Just(-1), 0..100_000i64],
            readers in members(),
            writers in members(),
            fence in proptest::option::of(any::<u64>()),
            now in 0..4_000_000_000_000i64,
            resp3 in any::<bool>(),
        ) {
            let at = |set: &[(String, i64)]| -> Vec<(String, i64)> {
                set.iter().map(|(m, dt)| (m.clone(), now + dt)).collect()
            };
            let reply = vec![
                get(writer.as_ref()),
                Value::Int(pttl),
                zrange(&at(&readers), resp3),
                zrange(&at(&writers), resp3),
                get(fence),
                time(now),
            ];
            let state = rw_state(reply).map_err(fail)?;
            let live = |set: &[(String, i64)]| set.iter().filter(|(_, dt)| *dt > 0).count() as u32;
            // The writer's ttl; without a writer, the last live reader's.
            let remaining = match (&writer, u64::try_from(pttl)) {
                (Some(_), Ok(ms)) => Some(ms),
                (Some(_), Err(_)) => None,
                (None, _) => readers.iter().map(|(_, dt)| *dt).filter(|dt| *dt > 0).max().map(|dt| dt as u64),
            };
            prop_assert_eq!(state.holder, writer);
            prop_assert_eq!(state.remaining, remaining.map(Duration::from_millis));
            prop_assert_eq!(state.last_fence, fence);
            prop_assert_eq!(state.holders, Some(live(&readers)));
            prop_assert_eq!(state.queued, Some(live(&writers)));
        }

        #[test]
        fn any_scores_and_clock_give_a_state(
            pttl in any::<i64>(),
            readers in prop::collection::vec(("[a-c]", any::<f64>()), 0..6),
            writers in prop::collection::vec(("[a-c]", prop_oneof![any::<f64>(), Just(f64::NAN), Just(f64::INFINITY), Just(f64::NEG_INFINITY)]), 0..6),
            now in any::<i64>(),
        ) {
            let state = rw_snapshot(None, pttl, &readers, &writers, None, now);
            let live = |set: &[(String, f64)]| set.iter().filter(|(_, e)| *e > now as f64).count() as u32;
            prop_assert_eq!(state.holders, Some(live(&readers)));
            prop_assert_eq!(state.queued, Some(live(&writers)));
            prop_assert_eq!(state.remaining.is_some(), live(&readers) > 0);
        }

        #[test]
        fn any_force_unlock_reply_decodes_or_is_a_backend_error(reply in prop::collection::vec(value(), 0..4)) {
            backend_error(&forced(reply))?;
        }

        #[test]
        fn force_unlock_replies_round_trip(deleted in 0..4i64, listeners in 0..3i64) {
            prop_assert_eq!(forced(vec![Value::Int(deleted), Value::Int(listeners)]).map_err(fail)?, deleted > 0);
        }
    }
}
