//! A lock granted in arrival order.

use std::time::Duration;

use crate::engine::LeaseKind;
use crate::error::Result;
use crate::keys::LockKeys;
use crate::lock::{Lock, LockGuard};
use crate::options::{Options, builder_options, check_grace};
use crate::raw::{Acquire, LockState, RawFair, RawFencing, RawLock, ReleaseWatch};
use crate::token::Token;

/// Default key prefix of fair locks.
pub const DEFAULT_FAIR_PREFIX: &str = "dlock-fair:";

/// Default time a waiter's place outlives its next expected attempt: a crashed waiter
/// leaves the queue within the holder's remaining ttl plus this.
pub const DEFAULT_WAITER_GRACE: Duration = Duration::from_secs(5);

/// A backend seen through a fair lock: acquiring queues, releasing wakes the head.
#[derive(Clone, Debug)]
pub struct Queued<B> {
    backend: B,
    grace: Duration,
}

impl<B: RawFair> RawLock for Queued<B> {
    const QUEUES_WAITERS: bool = true;
    const LEASE_KIND: LeaseKind = LeaseKind::Lock;
    const PRIMITIVE: &'static str = crate::observe::primitive::FAIR;

    async fn acquire(&self, keys: &LockKeys, token: &Token, ttl: Duration) -> Result<Acquire> {
        self.backend
            .acquire_fair(keys, token, ttl, self.grace)
            .await
    }

    async fn release(&self, keys: &LockKeys, token: &Token) -> Result<bool> {
        self.backend.release_fair(keys, token).await
    }

    async fn extend(&self, keys: &LockKeys, token: &Token, ttl: Duration) -> Result<bool> {
        self.backend.extend(keys, token, ttl).await
    }

    /// Each waiter listens on a channel of its own: a release wakes exactly the next in
    /// line, not every waiter.
    async fn watch_for(&self, keys: &LockKeys, token: &Token) -> Result<ReleaseWatch> {
        self.backend.watch_fair(keys, token).await
    }

    async fn abandon(&self, keys: &LockKeys, token: &Token, _ttl: Duration) -> Result<()> {
        self.backend.abandon_fair(keys, token).await
    }

    crate::raw::client_hooks!(backend);
}

/// Fences are minted with each grant, as for a plain lock.
impl<B: RawFair + RawFencing> RawFencing for Queued<B> {}

/// The hold of a fair lock (with `fencing_token()` when the backend mints fences).
pub type FairGuard<B> = LockGuard<Queued<B>>;

/// A lock granted first come, first served across processes: waiters get it in the order
/// of their first attempt, and a release wakes exactly the next waiter (no herd).
///
/// A waiter keeps its place while it waits; its place lapses when it has not tried again
/// for the holder's remaining ttl plus a grace (default [`DEFAULT_WAITER_GRACE`]), so a
/// crashed waiter delays the queue by at most that. A cancelled or timed-out waiter
/// leaves the queue at once. `try_lock` does not jump the queue: with waiters queued, it
/// fails even when the lock is momentarily free.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> fencelock::Result<()> {
/// use fencelock::{FairLock, backend::Memory};
///
/// let fair = FairLock::new(Memory::new(), "printer")?;
/// let g = fair.lock().await?;
/// assert!(fair.try_lock().await?.is_none());
/// g.release().await?;
/// # Ok(()) }
/// ```
///
/// # Correctness
///
/// Mutual exclusion as [`Lock`] (with its limits: fence your writes). Order: waiters that
/// keep waiting are granted in the order the store first saw them; a waiter whose place
/// lapsed (it could not reach the store for longer than its grace) queues again at the
/// back.
#[derive(Clone, Debug)]
pub struct FairLock<B: RawFair> {
    lock: Lock<Queued<B>>,
}

/// Options for a [`FairLock`]; made by [`FairLock::builder`].
#[must_use = "a builder does nothing until .build()"]
#[derive(Debug)]
pub struct FairLockBuilder<B: RawFair> {
    backend: B,
    grace: Duration,
    options: Options,
}

builder_options!(FairLockBuilder<B: RawFair>, DEFAULT_FAIR_PREFIX);

impl<B: RawFair> FairLockBuilder<B> {
    /// How long a waiter's place outlives its next expected attempt (default
    /// [`DEFAULT_WAITER_GRACE`]).
    pub fn waiter_grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// Checks the options and makes the lock.
    ///
    /// # Errors
    /// `InvalidArgument` for a bad name, prefix, ttl or retry, or a grace outside 10 ms to
    /// 60 s.
    pub fn build(self) -> Result<FairLock<B>> {
        let queued = Queued {
            backend: self.backend,
            grace: check_grace(self.grace, "waiter grace")?,
        };
        Ok(FairLock {
            lock: Lock::from_options(queued, &self.options)?,
        })
    }
}

impl<B: RawFair> FairLock<B> {
    /// A fair lock named `name` with default options (30 s ttl, watchdog on, waiter grace
    /// 5 s, prefix `dlock-fair:`).
    ///
    /// # Errors
    /// `InvalidArgument` for a bad name.
    pub fn new(backend: B, name: impl Into<String>) -> Result<FairLock<B>> {
        FairLock::builder(backend, name).build()
    }

    /// Options for a fair lock named `name`.
    pub fn builder(backend: B, name: impl Into<String>) -> FairLockBuilder<B> {
        FairLockBuilder {
            backend,
            grace: DEFAULT_WAITER_GRACE,
            options: Options::new(name.into(), DEFAULT_FAIR_PREFIX),
        }
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        self.lock.name()
    }

    /// Its keys in the store.
    pub fn keys(&self) -> &LockKeys {
        self.lock.keys()
    }

    /// The fair lock as a [`Lock`] (for tools that handle every primitive alike).
    pub fn as_lock(&self) -> &Lock<Queued<B>> {
        &self.lock
    }

    /// Queues and waits for the lock.
    ///
    /// # Errors
    /// Store failures.
    ///
    /// # Cancel safety
    /// Cancel-safe: a cancelled wait leaves no hold and, once the background withdrawal
    /// lands (or its place lapses), no queue entry.
    pub async fn lock(&self) -> Result<FairGuard<B>> {
        self.lock.lock().await
    }

    /// The lock if it is free and nobody is queued before us.
    ///
    /// # Errors
    /// Store failures.
    ///
    /// # Cancel safety
    /// As [`lock`](FairLock::lock).
    pub async fn try_lock(&self) -> Result<Option<FairGuard<B>>> {
        self.lock.try_lock().await
    }

    /// Queues and waits at most `timeout` (leaving the queue if it runs out).
    ///
    /// # Errors
    /// Store failures.
    ///
    /// # Cancel safety
    /// As [`lock`](FairLock::lock).
    pub async fn try_lock_for(&self, timeout: Duration) -> Result<Option<FairGuard<B>>> {
        self.lock.try_lock_for(timeout).await
    }

    /// Holder token, remaining ttl, last fence and queued waiters.
    ///
    /// # Errors
    /// Store failures.
    pub async fn state(&self) -> Result<LockState> {
        crate::observe::observed!(
            self.lock.obs(),
            self.lock.name(),
            crate::observe::span::INSPECT,
            crate::observe::op::INSPECT,
            self.lock
                .backend()
                .backend
                .inspect(crate::raw::Kind::Fair, self.keys())
        )
    }

    /// Whether anyone holds the lock now.
    ///
    /// # Errors
    /// Store failures.
    pub async fn is_locked(&self) -> Result<bool> {
        Ok(self.state().await?.holder.is_some())
    }

    /// Deletes the holder whoever it is and wakes the next in line (the queue stays).
    /// **Dangerous**, as [`Lock::force_unlock`](crate::Lock::force_unlock).
    ///
    /// # Errors
    /// Store failures.
    pub async fn force_unlock(&self) -> Result<bool> {
        crate::observe::observed!(
            self.lock.obs(),
            self.lock.name(),
            crate::observe::span::FORCE_UNLOCK,
            crate::observe::op::FORCE_UNLOCK,
            self.lock
                .backend()
                .backend
                .force_unlock(crate::raw::Kind::Fair, self.keys())
        )
    }
}
