//! Read-write locks on Redis: the writer at the lock key, readers and waiting writers in
//! two sorted sets scored by expiry (server clock), all under the lock's hash tag.

use std::time::Duration;

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
                &[keys.lock(), &r, &w, keys.fence()],
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

    async fn inspect_rw(&self, keys: &LockKeys) -> Result<LockState> {
        type Snapshot = (
            Option<String>,
            i64,
            Vec<(String, f64)>,
            Vec<(String, f64)>,
            Option<u64>,
            (i64, i64),
        );
        let (writer, pttl, readers, writers, fence, (secs, micros)): Snapshot = redis::pipe()
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
        let now = super::server_ms(secs, micros) as f64;
        let live = |set: &[(String, f64)]| set.iter().filter(|(_, e)| *e > now).count();
        let last_reader = readers.iter().map(|(_, e)| *e).fold(f64::NAN, f64::max);
        let remaining = match (&writer, u64::try_from(pttl)) {
            (Some(_), Ok(ms)) => Some(Duration::from_millis(ms)),
            (None, _) if last_reader > now => {
                Some(Duration::from_millis((last_reader - now) as u64))
            }
            _ => None,
        };
        Ok(LockState::new(writer, remaining, fence)
            .with_holders(u32::try_from(live(&readers)).unwrap_or(u32::MAX))
            .with_queued(u32::try_from(live(&writers)).unwrap_or(u32::MAX)))
    }

    async fn force_unlock_rw(&self, keys: &LockKeys) -> Result<bool> {
        let (deleted, _): (i64, i64) = redis::pipe()
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
        Ok(deleted > 0)
    }
}
