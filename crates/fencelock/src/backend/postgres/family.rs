//! The lock family on PostgreSQL: semaphore, reentrant, read-write and fair locks, each
//! operation one call of a function in `schema.sql`, waiting and waking as the plain
//! lock's (the waiters table, one `LISTEN` connection per client).

use std::time::Duration;

use tokio_postgres::Row;

use super::{Postgres, WAKE_GRACE, check_key, check_text, fence_of, granted, ttl_ms, waiter_grace};
use crate::engine::LeaseKind;
use crate::error::{Error, ErrorKind, Result};
use crate::keys::LockKeys;
use crate::raw::{Acquire, LockState, RawFair, RawLock, RawReentrant, RawRwLock, RawSemaphore};
use crate::token::Token;

/// A count from SQL as a `u32`, saturating.
fn count(row: &Row, i: usize) -> u32 {
    u32::try_from(row.get::<_, i64>(i).max(0)).unwrap_or(u32::MAX)
}

/// Milliseconds from SQL (null: none) as a duration.
fn millis(row: &Row, i: usize) -> Option<Duration> {
    row.get::<_, Option<i64>>(i)
        .and_then(|ms| u64::try_from(ms).ok())
        .map(Duration::from_millis)
}

/// The first column of the first row, as a boolean (false without a row).
fn first_bool(rows: &[Row]) -> bool {
    rows.first().is_some_and(|row| row.get::<_, bool>(0))
}

impl Postgres {
    async fn sem_release(&self, keys: &LockKeys, token: &str, mode: &str) -> Result<bool> {
        let rows = self
            .query(
                &self.inner.sql.sem_release,
                &[&keys.lock(), &token, &mode, &ttl_ms(WAKE_GRACE)?],
                "releasing permits",
            )
            .await?;
        Ok(first_bool(&rows))
    }

    async fn sem_resize(
        &self,
        keys: &LockKeys,
        target: Option<u32>,
        delta: i64,
        start: u32,
        max: u32,
    ) -> Result<Option<u32>> {
        let as_int = |n: u32| i32::try_from(n).unwrap_or(i32::MAX);
        let rows = self
            .query(
                &self.inner.sql.sem_resize,
                &[
                    &keys.lock(),
                    &target.map(as_int),
                    &delta,
                    &as_int(start),
                    &as_int(max),
                    &ttl_ms(WAKE_GRACE)?,
                ],
                "changing the permit count",
            )
            .await?;
        Ok(rows
            .first()
            .and_then(|row| row.get::<_, Option<i32>>(0))
            .and_then(|n| u32::try_from(n).ok()))
    }

    async fn re_release(
        &self,
        keys: &LockKeys,
        owner: &str,
        token: &str,
        mode: &str,
    ) -> Result<bool> {
        let rows = self
            .query(
                &self.inner.sql.re_release,
                &[&keys.lock(), &owner, &token, &mode, &ttl_ms(WAKE_GRACE)?],
                "releasing a reentrant lock",
            )
            .await?;
        Ok(first_bool(&rows))
    }

    async fn rw_release(
        &self,
        keys: &LockKeys,
        token: &str,
        mode: &str,
        ttl: Duration,
    ) -> Result<bool> {
        let rows = self
            .query(
                &self.inner.sql.rw_release,
                &[
                    &keys.lock(),
                    &token,
                    &mode,
                    &ttl_ms(ttl)?,
                    &ttl_ms(WAKE_GRACE)?,
                ],
                "releasing a read-write lock",
            )
            .await?;
        Ok(first_bool(&rows))
    }
}

/// The family's acquires as they run, to completion, inside [`Postgres::detached`].
impl Postgres {
    #[allow(clippy::too_many_arguments)]
    async fn acquire_permits_now(
        &self,
        keys: &LockKeys,
        token: &Token,
        n: u32,
        permits: u32,
        strict: bool,
        ttl: Duration,
        queue: bool,
    ) -> Result<Acquire> {
        let channel = if queue {
            self.wake_channel().await
        } else {
            None
        };
        let as_int = |n: u32| i32::try_from(n).unwrap_or(i32::MAX);
        let rows = self
            .query(
                &self.inner.sql.sem_acquire,
                &[
                    &keys.lock(),
                    &token.as_str(),
                    &as_int(n),
                    &as_int(permits),
                    &strict,
                    &ttl_ms(ttl)?,
                    &(queue && channel.is_some()),
                    &channel,
                    &ttl_ms(waiter_grace(ttl))?,
                    &ttl_ms(WAKE_GRACE)?,
                ],
                "acquiring permits",
            )
            .await?;
        if let Some(stored) = rows.first().and_then(|r| r.get::<_, Option<i32>>(3))
            && stored != as_int(permits)
        {
            let stored = u32::try_from(stored).unwrap_or(0);
            return Err(Error::permits_mismatch(keys.name(), stored, permits));
        }
        granted(&rows, "acquiring permits")
    }

    async fn acquire_reentrant_now(
        &self,
        keys: &LockKeys,
        owner: &str,
        token: &Token,
        ttl: Duration,
        limit: u32,
        queue: bool,
    ) -> Result<Acquire> {
        let channel = if queue {
            self.wake_channel().await
        } else {
            None
        };
        let rows = self
            .query(
                &self.inner.sql.re_acquire,
                &[
                    &keys.lock(),
                    &owner,
                    &token.as_str(),
                    &ttl_ms(ttl)?,
                    &i32::try_from(limit).unwrap_or(i32::MAX),
                    &(queue && channel.is_some()),
                    &channel,
                    &ttl_ms(waiter_grace(ttl))?,
                ],
                "acquiring a reentrant lock",
            )
            .await?;
        let row = rows.first().ok_or_else(|| {
            Error::new(
                ErrorKind::Backend,
                "acquiring a reentrant lock: no reply row",
            )
        })?;
        match row.get::<_, i32>(0) {
            2 => Err(Error::new(
                ErrorKind::LimitReached,
                format!(
                    "reentrant lock {:?}: {owner} already holds it {} times, its reentrancy limit",
                    keys.name(),
                    row.get::<_, i64>(1)
                ),
            )),
            1 => Ok(Acquire::Acquired {
                fence: fence_of(row.get(1)),
            }),
            _ => Ok(Acquire::Held {
                remaining: millis(row, 2),
            }),
        }
    }

    async fn acquire_rw_now(
        &self,
        keys: &LockKeys,
        token: &Token,
        write: bool,
        ttl: Duration,
        grace: Duration,
    ) -> Result<Acquire> {
        let channel = self.wake_channel().await;
        // What blocked readers of this lock wait for (`RwSide` watches the "r" side).
        let readers = keys.side("r");
        let rows = self
            .query(
                &self.inner.sql.rw_acquire,
                &[
                    &keys.lock(),
                    &token.as_str(),
                    &write,
                    &ttl_ms(ttl)?,
                    &ttl_ms(grace)?,
                    &channel,
                    &readers.lock(),
                ],
                "acquiring a read-write lock",
            )
            .await?;
        granted(&rows, "acquiring a read-write lock")
    }
}

/// Permits are leases of their own (`leases`, role `p`), the count on the name's row; a
/// grant takes the queue's head only, and a grant that leaves permits free wakes the next.
impl RawSemaphore for Postgres {
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
        check_key(keys)?;
        self.detached(
            keys,
            token,
            move |pg, k, t, _| async move {
                pg.acquire_permits_now(&k, &t, n, permits, strict, ttl, queue)
                    .await
            },
            move |pg, gk, gt| async move {
                let _ = pg.sem_release(&gk, gt.as_str(), "own").await;
            },
        )
        .await
    }

    async fn abandon_permits(
        &self,
        keys: &LockKeys,
        token: &Token,
        _n: u32,
        _ttl: Duration,
    ) -> Result<()> {
        check_key(keys)?;
        self.settled(token).await;
        self.sem_release(keys, token.as_str(), "leave")
            .await
            .map(|_| ())
    }

    async fn release_permits(&self, keys: &LockKeys, token: &Token) -> Result<bool> {
        check_key(keys)?;
        self.settled(token).await;
        self.sem_release(keys, token.as_str(), "own").await
    }

    async fn extend_permits(&self, keys: &LockKeys, token: &Token, ttl: Duration) -> Result<bool> {
        check_key(keys)?;
        self.extend_kind(LeaseKind::Permits, keys, token, ttl).await
    }

    async fn permits_in_use(&self, keys: &LockKeys, permits: u32) -> Result<(u32, u32)> {
        check_key(keys)?;
        let rows = self
            .query(
                &self.inner.sql.sem_inspect,
                &[&keys.lock()],
                "counting permits",
            )
            .await?;
        let row = rows
            .first()
            .ok_or_else(|| Error::new(ErrorKind::Backend, "counting permits: no reply row"))?;
        let stored = row
            .get::<_, Option<i32>>(3)
            .and_then(|n| u32::try_from(n).ok())
            .unwrap_or(permits);
        Ok((count(row, 0), stored))
    }

    async fn set_permits(&self, keys: &LockKeys, permits: u32) -> Result<()> {
        check_key(keys)?;
        self.sem_resize(keys, Some(permits), 0, permits, permits)
            .await
            .map(|_| ())
    }

    async fn add_permits(
        &self,
        keys: &LockKeys,
        delta: i64,
        permits: u32,
        max: u32,
    ) -> Result<Option<u32>> {
        check_key(keys)?;
        self.sem_resize(keys, None, delta, permits, max).await
    }
}

/// Semaphore kind's inspection, for [`RawInspect`](crate::raw::RawInspect).
impl Postgres {
    pub(crate) async fn inspect_permits(&self, keys: &LockKeys) -> Result<LockState> {
        check_key(keys)?;
        let rows = self
            .query(
                &self.inner.sql.sem_inspect,
                &[&keys.lock()],
                "inspecting a semaphore",
            )
            .await?;
        let row = rows.first().ok_or_else(|| {
            Error::new(ErrorKind::Backend, "inspecting a semaphore: no reply row")
        })?;
        Ok(LockState::new(None, millis(row, 2), None)
            .with_hold_count(count(row, 0))
            .with_holders(count(row, 1))
            .with_queued(count(row, 4)))
    }

    pub(crate) async fn force_unlock_permits(&self, keys: &LockKeys) -> Result<bool> {
        check_key(keys)?;
        self.sem_release(keys, "", "force").await
    }
}

/// The owner and the tenure's expiry and fence on the name's row; one `leases` row (role
/// `h`) per hold's request token.
impl RawReentrant for Postgres {
    async fn acquire_reentrant(
        &self,
        keys: &LockKeys,
        owner: &str,
        token: &Token,
        ttl: Duration,
        limit: u32,
        queue: bool,
    ) -> Result<Acquire> {
        check_key(keys)?;
        check_text(owner, "reentrant lock's owner")?;
        let (o, go) = (owner.to_owned(), owner.to_owned());
        self.detached(
            keys,
            token,
            move |pg, k, t, _| async move {
                pg.acquire_reentrant_now(&k, &o, &t, ttl, limit, queue)
                    .await
            },
            move |pg, gk, gt| async move {
                let _ = pg.re_release(&gk, &go, gt.as_str(), "own").await;
            },
        )
        .await
    }

    async fn release_reentrant(&self, keys: &LockKeys, owner: &str, token: &Token) -> Result<bool> {
        check_key(keys)?;
        check_text(owner, "reentrant lock's owner")?;
        self.settled(token).await;
        self.re_release(keys, owner, token.as_str(), "own").await
    }

    async fn extend_reentrant(
        &self,
        keys: &LockKeys,
        token: &Token,
        ttl: Duration,
    ) -> Result<bool> {
        check_key(keys)?;
        self.extend_kind(LeaseKind::Reentrant, keys, token, ttl)
            .await
    }
}

/// Reentrant kind's inspection, for [`RawInspect`](crate::raw::RawInspect).
impl Postgres {
    pub(crate) async fn inspect_reentrant(&self, keys: &LockKeys) -> Result<LockState> {
        check_key(keys)?;
        let rows = self
            .query(
                &self.inner.sql.re_inspect,
                &[&keys.lock()],
                "inspecting a reentrant lock",
            )
            .await?;
        Ok(match rows.first() {
            Some(row) => {
                let fence = fence_of(row.get(2));
                let fence = (fence > 0).then_some(fence);
                match row.get::<_, Option<String>>(0) {
                    Some(owner) => LockState::new(Some(owner), millis(row, 1), fence)
                        .with_hold_count(count(row, 3)),
                    None => LockState::new(None, None, fence),
                }
                .with_queued(count(row, 4))
            }
            None => LockState::new(None, None, None),
        })
    }

    pub(crate) async fn force_unlock_reentrant(&self, keys: &LockKeys) -> Result<bool> {
        check_key(keys)?;
        self.re_release(keys, "", "", "force").await
    }
}

/// The writer on the name's row (a fence per grant), each reader a lease (role `r`),
/// waiting writers in the waiters table with claims; blocked readers leave a row there
/// (role `r`) that tells a release whom to wake.
impl RawRwLock for Postgres {
    async fn acquire_rw(
        &self,
        keys: &LockKeys,
        token: &Token,
        write: bool,
        ttl: Duration,
        grace: Duration,
    ) -> Result<Acquire> {
        check_key(keys)?;
        self.detached(
            keys,
            token,
            move |pg, k, t, _| async move { pg.acquire_rw_now(&k, &t, write, ttl, grace).await },
            move |pg, gk, gt| async move {
                let _ = pg.rw_release(&gk, gt.as_str(), "own", WAKE_GRACE).await;
            },
        )
        .await
    }

    async fn release_rw(&self, keys: &LockKeys, token: &Token) -> Result<bool> {
        check_key(keys)?;
        self.settled(token).await;
        self.rw_release(keys, token.as_str(), "own", WAKE_GRACE)
            .await
    }

    async fn extend_rw(&self, keys: &LockKeys, token: &Token, ttl: Duration) -> Result<bool> {
        check_key(keys)?;
        self.extend_kind(LeaseKind::ReadWrite, keys, token, ttl)
            .await
    }

    async fn downgrade_rw(&self, keys: &LockKeys, token: &Token, ttl: Duration) -> Result<bool> {
        check_key(keys)?;
        self.rw_release(keys, token.as_str(), "downgrade", ttl)
            .await
    }

    async fn abandon_rw(&self, keys: &LockKeys, token: &Token) -> Result<()> {
        check_key(keys)?;
        self.settled(token).await;
        self.rw_release(keys, token.as_str(), "leave", WAKE_GRACE)
            .await
            .map(|_| ())
    }
}

/// RwLock kind's inspection, for [`RawInspect`](crate::raw::RawInspect).
impl Postgres {
    pub(crate) async fn inspect_rw(&self, keys: &LockKeys) -> Result<LockState> {
        check_key(keys)?;
        let rows = self
            .query(
                &self.inner.sql.rw_inspect,
                &[&keys.lock()],
                "inspecting a read-write lock",
            )
            .await?;
        Ok(match rows.first() {
            Some(row) => {
                let fence = fence_of(row.get(2));
                let writer = row.get::<_, Option<String>>(0);
                let remaining = if writer.is_some() {
                    millis(row, 1)
                } else {
                    millis(row, 4)
                };
                LockState::new(writer, remaining, (fence > 0).then_some(fence))
                    .with_holders(count(row, 3))
                    .with_queued(count(row, 5))
            }
            None => LockState::new(None, None, None),
        })
    }

    pub(crate) async fn force_unlock_rw(&self, keys: &LockKeys) -> Result<bool> {
        check_key(keys)?;
        self.rw_release(keys, "", "force", WAKE_GRACE).await
    }
}

/// The plain lock's queue is first come, first served already; a fair lock's waiter
/// queues from its first attempt and is woken on its own side name.
impl RawFair for Postgres {
    async fn acquire_fair(
        &self,
        keys: &LockKeys,
        token: &Token,
        ttl: Duration,
        grace: Duration,
    ) -> Result<Acquire> {
        check_key(keys)?;
        self.detached(
            keys,
            token,
            move |pg, k, t, _| async move {
                let side = k.side(t.as_str());
                pg.attempt(&k, &t, ttl, grace, true, Some(side.lock()))
                    .await
            },
            move |pg, gk, gt| async move {
                let _ = pg.release_lock(&gk, gt.as_str(), "own").await;
            },
        )
        .await
    }

    async fn release_fair(&self, keys: &LockKeys, token: &Token) -> Result<bool> {
        check_key(keys)?;
        self.release(keys, token).await
    }

    async fn abandon_fair(&self, keys: &LockKeys, token: &Token) -> Result<()> {
        check_key(keys)?;
        self.abandon(keys, token, Duration::ZERO).await
    }
}

/// Fair kind's inspection, for [`RawInspect`](crate::raw::RawInspect).
impl Postgres {
    pub(crate) async fn inspect_fair(&self, keys: &LockKeys) -> Result<LockState> {
        check_key(keys)?;
        self.inspect_plain(keys).await
    }

    pub(crate) async fn force_unlock_fair(&self, keys: &LockKeys) -> Result<bool> {
        check_key(keys)?;
        self.force_unlock_plain(keys).await
    }
}
