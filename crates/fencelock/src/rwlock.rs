//! A read-write lock: many readers or one writer, writers first.

use std::time::Duration;

use tokio::time::Instant;

use crate::engine::LeaseKind;
use crate::error::{Error, Result};
use crate::keys::LockKeys;
use crate::lock::{Lock, LockGuard, spawn_release};
use crate::options::{Options, builder_options, check_grace};
use crate::raw::{Acquire, LockState, RawFencing, RawLock, RawRwLock, ReleaseWatch};
use crate::token::Token;

/// Default key prefix of read-write locks.
pub const DEFAULT_RWLOCK_PREFIX: &str = "dlock-rw:";

/// Default time a waiting writer's claim outlives its next expected attempt: a crashed
/// waiting writer holds new readers back for at most the holders' remaining ttl plus this.
pub const DEFAULT_WRITER_GRACE: Duration = Duration::from_secs(2);

/// A backend seen through one side of a read-write lock (`WRITE` or read): it lets
/// readers and writers reuse the lock's guard, watchdog, `lost()` and waiting.
#[derive(Clone, Debug)]
pub struct RwSide<B, const WRITE: bool> {
    backend: B,
    grace: Duration,
}

impl<B: RawRwLock, const WRITE: bool> RawLock for RwSide<B, WRITE> {
    const QUEUES_WAITERS: bool = WRITE || B::READERS_QUEUE;
    const LEASE_KIND: LeaseKind = LeaseKind::ReadWrite;
    const PRIMITIVE: &'static str = if WRITE {
        crate::observe::primitive::RWLOCK_WRITE
    } else {
        crate::observe::primitive::RWLOCK_READ
    };

    async fn acquire(&self, keys: &LockKeys, token: &Token, ttl: Duration) -> Result<Acquire> {
        self.backend
            .acquire_rw(keys, token, WRITE, ttl, self.grace)
            .await
    }

    async fn release(&self, keys: &LockKeys, token: &Token) -> Result<bool> {
        self.backend.release_rw(keys, token).await
    }

    async fn extend(&self, keys: &LockKeys, token: &Token, ttl: Duration) -> Result<bool> {
        self.backend.extend_rw(keys, token, ttl).await
    }

    /// Readers and writers listen on channels of their own: a release wakes the side that
    /// can come in.
    async fn watch(&self, keys: &LockKeys) -> Result<ReleaseWatch> {
        self.backend
            .watch(&keys.side(if WRITE { "w" } else { "r" }))
            .await
    }

    /// A waiting writer listens for its own wake-up where the store wakes one writer per
    /// release; readers share one channel (a release lets them all in).
    async fn watch_for(&self, keys: &LockKeys, token: &Token) -> Result<ReleaseWatch> {
        self.backend.watch_rw(keys, token, WRITE).await
    }

    fn watch_ready(&self, keys: &LockKeys, token: &Token) -> Option<ReleaseWatch> {
        if WRITE {
            self.backend.watch_ready(&keys.side("w"), token)
        } else {
            None
        }
    }

    async fn abandon(&self, keys: &LockKeys, token: &Token, _ttl: Duration) -> Result<()> {
        self.backend.abandon_rw(keys, token).await
    }

    fn shares_grants(&self) -> bool {
        !WRITE
    }

    crate::raw::client_hooks!(backend);
}

/// Writers get fences like a plain lock's; readers have none (they exclude nobody but
/// writers, and a fence orders writers only).
impl<B: RawRwLock + RawFencing> RawFencing for RwSide<B, true> {}

/// A read hold: released by `release().await`, in the background when dropped, or by
/// itself when its lease runs out. No `fencing_token()`.
pub type ReadGuard<B> = LockGuard<RwSide<B, false>>;
/// The write hold, with a `fencing_token()` when the backend mints fences.
pub type WriteGuard<B> = LockGuard<RwSide<B, true>>;

/// Many readers or one writer across every process using the same name on the same store.
///
/// **Policy: writers first.** While a writer waits, new readers wait too (readers already
/// inside finish); when it has written, readers come in again. A stream of readers cannot
/// starve a writer; a stream of writers can starve readers. A waiting writer's claim lasts
/// until its next expected attempt plus a grace (default 2 s), renewed by every attempt
/// and withdrawn when it stops waiting, so a crashed waiting writer does not hold readers
/// back for longer than that. Every reader's lease expires on its own: a crashed reader
/// blocks writers for at most its ttl.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> fencelock::Result<()> {
/// use fencelock::{RwLock, backend::Memory};
///
/// let rw = RwLock::new(Memory::new(), "catalog")?;
/// let r1 = rw.read().await?;
/// let r2 = rw.try_read().await?.expect("readers share");
/// assert!(rw.try_write().await?.is_none()); // readers inside
/// r1.release().await?;
/// r2.release().await?;
/// let w = rw.write().await?;
/// assert!(rw.try_read().await?.is_none()); // the writer is alone
/// let r = rw.downgrade(w).await?;          // keep reading what we wrote
/// assert!(rw.try_read().await?.is_some());
/// r.release().await?;
/// # Ok(()) }
/// ```
///
/// # Correctness
///
/// While the store keeps its keys, a writer never overlaps another writer or a reader
/// whose lease is valid. The limits of every lease lock apply (a paused holder whose lease
/// ran out, failover, restart without persistence): writers should fence their writes.
#[derive(Clone, Debug)]
pub struct RwLock<B: RawRwLock> {
    read: Lock<RwSide<B, false>>,
    write: Lock<RwSide<B, true>>,
}

/// Options for an [`RwLock`]; made by [`RwLock::builder`].
#[must_use = "a builder does nothing until .build()"]
#[derive(Debug)]
pub struct RwLockBuilder<B: RawRwLock> {
    backend: B,
    grace: Duration,
    options: Options,
}

builder_options!(RwLockBuilder<B: RawRwLock>, DEFAULT_RWLOCK_PREFIX);

impl<B: RawRwLock> RwLockBuilder<B> {
    /// How long a waiting writer's claim outlives its next expected attempt (default
    /// [`DEFAULT_WRITER_GRACE`]).
    pub fn writer_grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// Checks the options and makes the lock.
    ///
    /// # Errors
    /// `InvalidArgument` for a bad name, prefix, ttl or retry, or a grace outside 10 ms to
    /// 60 s.
    pub fn build(self) -> Result<RwLock<B>> {
        let grace = check_grace(self.grace, "writer grace")?;
        let keys = self.options.keys()?;
        let read = Lock::from_options_on(
            RwSide {
                backend: self.backend.clone(),
                grace,
            },
            keys.clone(),
            &self.options,
        )?;
        let write = Lock::from_options_on(
            RwSide {
                backend: self.backend,
                grace,
            },
            keys,
            &self.options,
        )?;
        Ok(RwLock { read, write })
    }
}

impl<B: RawRwLock> RwLock<B> {
    /// A read-write lock named `name` with default options (30 s ttl, watchdog on, writer
    /// grace 2 s, prefix `dlock-rw:`).
    ///
    /// # Errors
    /// `InvalidArgument` for a bad name.
    pub fn new(backend: B, name: impl Into<String>) -> Result<RwLock<B>> {
        RwLock::builder(backend, name).build()
    }

    /// Options for a read-write lock named `name`.
    pub fn builder(backend: B, name: impl Into<String>) -> RwLockBuilder<B> {
        RwLockBuilder {
            backend,
            grace: DEFAULT_WRITER_GRACE,
            options: Options::new(name.into(), DEFAULT_RWLOCK_PREFIX),
        }
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        self.read.name()
    }

    /// Its keys in the store.
    pub fn keys(&self) -> &LockKeys {
        self.read.keys()
    }

    /// The read side as a [`Lock`] (for tools that handle every primitive alike).
    pub fn read_lock(&self) -> &Lock<RwSide<B, false>> {
        &self.read
    }

    /// The write side as a [`Lock`].
    pub fn write_lock(&self) -> &Lock<RwSide<B, true>> {
        &self.write
    }

    /// Waits for a read hold.
    ///
    /// # Errors
    /// Store failures.
    ///
    /// # Cancel safety
    /// Cancel-safe: a cancelled wait leaves no hold behind.
    pub async fn read(&self) -> Result<ReadGuard<B>> {
        self.read.lock().await
    }

    /// A read hold if no writer holds or waits now.
    ///
    /// # Errors
    /// Store failures.
    ///
    /// # Cancel safety
    /// As [`read`](RwLock::read).
    pub async fn try_read(&self) -> Result<Option<ReadGuard<B>>> {
        self.read.try_lock().await
    }

    /// A read hold, waiting at most `timeout`.
    ///
    /// # Errors
    /// Store failures.
    ///
    /// # Cancel safety
    /// As [`read`](RwLock::read).
    pub async fn try_read_for(&self, timeout: Duration) -> Result<Option<ReadGuard<B>>> {
        self.read.try_lock_for(timeout).await
    }

    /// Waits for the write hold; from its first attempt on, new readers wait behind it.
    ///
    /// # Errors
    /// Store failures.
    ///
    /// # Cancel safety
    /// Cancel-safe: a cancelled wait leaves no hold behind and withdraws its claim (in the
    /// background; it lapses by itself after the grace if that fails).
    pub async fn write(&self) -> Result<WriteGuard<B>> {
        self.write.lock().await
    }

    /// The write hold if the lock is free now (its claim is withdrawn if not).
    ///
    /// # Errors
    /// Store failures.
    ///
    /// # Cancel safety
    /// As [`write`](RwLock::write).
    pub async fn try_write(&self) -> Result<Option<WriteGuard<B>>> {
        self.write.try_lock().await
    }

    /// The write hold, waiting at most `timeout`.
    ///
    /// # Errors
    /// Store failures.
    ///
    /// # Cancel safety
    /// As [`write`](RwLock::write).
    pub async fn try_write_for(&self, timeout: Duration) -> Result<Option<WriteGuard<B>>> {
        self.write.try_lock_for(timeout).await
    }

    /// Turns a write hold into a read hold atomically: no other writer gets in between,
    /// and waiting readers may join once no writer waits.
    ///
    /// # Errors
    /// `LockLost` if the write hold was no longer live; store failures (the hold is then
    /// given back in the background).
    ///
    /// # Cancel safety
    /// Not cancel-safe: cancelled mid-call, the hold (write or read) lapses at its ttl.
    pub async fn downgrade(&self, guard: WriteGuard<B>) -> Result<ReadGuard<B>> {
        let lapsed = guard.is_lost();
        let (backend, token) = guard.into_held();
        if lapsed {
            spawn_release(&backend, self.keys(), &token);
            return Err(Error::lost(format!(
                "rwlock {:?}: the write hold had lapsed before the downgrade",
                self.name()
            )));
        }
        let sent = Instant::now();
        let downgraded = crate::observe::observed!(
            self.read.obs(),
            self.read.name(),
            crate::observe::span::DOWNGRADE,
            crate::observe::op::DOWNGRADE,
            backend
                .backend
                .downgrade_rw(self.keys(), &token, self.read.ttl())
        );
        match downgraded {
            Ok(true) => self.read.guard(token, sent, 0),
            Ok(false) => Err(Error::lost(format!(
                "rwlock {:?} was no longer ours when downgrading",
                self.name()
            ))),
            Err(err) => {
                spawn_release(&backend, self.keys(), &token);
                Err(err)
            }
        }
    }

    /// Writer token, number of live readers, waiting writers, remaining ttl, last fence.
    ///
    /// # Errors
    /// Store failures.
    pub async fn state(&self) -> Result<LockState> {
        crate::observe::observed!(
            self.read.obs(),
            self.read.name(),
            crate::observe::span::INSPECT,
            crate::observe::op::INSPECT,
            self.read
                .backend()
                .backend
                .inspect(crate::raw::Kind::RwLock, self.keys())
        )
    }

    /// Whether a writer or any reader holds the lock now.
    ///
    /// # Errors
    /// Store failures.
    pub async fn is_locked(&self) -> Result<bool> {
        let s = self.state().await?;
        Ok(s.holder.is_some() || s.holders.unwrap_or(0) > 0)
    }

    /// Deletes every hold and claim, whoever holds them. **Dangerous**, as
    /// [`Lock::force_unlock`](crate::Lock::force_unlock).
    ///
    /// # Errors
    /// Store failures.
    pub async fn force_unlock(&self) -> Result<bool> {
        crate::observe::observed!(
            self.read.obs(),
            self.read.name(),
            crate::observe::span::FORCE_UNLOCK,
            crate::observe::op::FORCE_UNLOCK,
            self.read
                .backend()
                .backend
                .force_unlock(crate::raw::Kind::RwLock, self.keys())
        )
    }
}
