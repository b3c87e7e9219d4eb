//! The blocking mutual-exclusion lock and the guard every blocking primitive hands out.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Client, Runtime, forward_options};
use crate::error::Result;
use crate::keys::LockKeys;
use crate::raw::{LockState, RawFencing, RawInspect, RawLock};
use crate::token::{FencingToken, Token};

/// A named lock in a store, for synchronous code: [`crate::Lock`] on a [`Client`]'s
/// runtime.
///
/// Cloning is cheap; clones name the same lock. Share it between threads freely.
#[derive(Clone)]
pub struct Lock<B: RawLock> {
    lock: crate::Lock<B>,
    runtime: Arc<Runtime>,
}

impl<B: RawLock> std::fmt::Debug for Lock<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.lock.fmt(f)
    }
}

/// Options for a blocking [`Lock`]; made by [`Lock::builder`].
#[must_use = "a builder does nothing until .build()"]
#[derive(Debug)]
pub struct LockBuilder<B: RawLock> {
    builder: crate::LockBuilder<B>,
    runtime: Arc<Runtime>,
}

forward_options!(LockBuilder<B: RawLock>, "LockBuilder");

impl<B: RawLock> LockBuilder<B> {
    /// Checks the options and makes the lock.
    ///
    /// # Errors
    /// As [`crate::LockBuilder::build`].
    pub fn build(self) -> Result<Lock<B>> {
        Ok(Lock::from_async(self.builder.build()?, self.runtime))
    }
}

impl<B: RawLock> Lock<B> {
    /// A lock named `name` on `client`'s store, with default options (30 s ttl, watchdog
    /// on, prefix `dlock:`).
    ///
    /// # Errors
    /// As [`crate::Lock::new`].
    pub fn new(client: &Client<B>, name: impl Into<String>) -> Result<Lock<B>> {
        Lock::builder(client, name).build()
    }

    /// Options for a lock named `name` on `client`'s store.
    pub fn builder(client: &Client<B>, name: impl Into<String>) -> LockBuilder<B> {
        LockBuilder {
            builder: crate::Lock::builder(client.backend.clone(), name),
            runtime: Arc::clone(&client.runtime),
        }
    }

    /// An async lock (of any adapter over the client's backend) made blocking on
    /// `client`'s runtime.
    pub fn with_client(client: &Client<impl RawLock>, lock: crate::Lock<B>) -> Lock<B> {
        Lock::from_async(lock, Arc::clone(&client.runtime))
    }

    pub(super) fn from_async(lock: crate::Lock<B>, runtime: Arc<Runtime>) -> Lock<B> {
        Lock { lock, runtime }
    }

    pub(super) fn guard(&self, guard: crate::LockGuard<B>) -> LockGuard<B> {
        LockGuard::new(guard, Arc::clone(&self.runtime))
    }

    /// The same lock for async code.
    pub fn as_async(&self) -> &crate::Lock<B> {
        &self.lock
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        self.lock.name()
    }

    /// The lock's keys in the store.
    pub fn keys(&self) -> &LockKeys {
        self.lock.keys()
    }

    /// The lease length.
    pub fn ttl(&self) -> Duration {
        self.lock.ttl()
    }

    /// Blocks until the lock is ours (as [`crate::Lock::lock`]).
    ///
    /// # Errors
    /// Store failures (`Unavailable`, `TimedOut`, `Backend`); `InvalidArgument` inside a
    /// runtime. Contention is waited out.
    pub fn lock(&self) -> Result<LockGuard<B>> {
        self.runtime
            .call(|| self.lock.lock())
            .map(|g| self.guard(g))
    }

    /// One attempt: `Ok(None)` if someone else holds the lock (as
    /// [`crate::Lock::try_lock`]).
    ///
    /// # Errors
    /// As [`crate::Lock::try_lock`]; `InvalidArgument` inside a runtime.
    pub fn try_lock(&self) -> Result<Option<LockGuard<B>>> {
        self.runtime
            .call(|| self.lock.try_lock())
            .map(|g| g.map(|g| self.guard(g)))
    }

    /// Blocks at most `timeout` for the lock: `Ok(None)` if it stayed held that long (as
    /// [`crate::Lock::try_lock_for`]).
    ///
    /// # Errors
    /// As [`crate::Lock::try_lock_for`]; `InvalidArgument` inside a runtime.
    pub fn try_lock_for(&self, timeout: Duration) -> Result<Option<LockGuard<B>>> {
        self.runtime
            .call(|| self.lock.try_lock_for(timeout))
            .map(|g| g.map(|g| self.guard(g)))
    }

    /// Blocks until `deadline` at most for the lock: `Ok(None)` if it stayed held.
    ///
    /// # Errors
    /// As [`crate::Lock::try_lock_until`]; `InvalidArgument` inside a runtime.
    pub fn try_lock_until(&self, deadline: Instant) -> Result<Option<LockGuard<B>>> {
        let deadline = tokio::time::Instant::from_std(deadline);
        self.runtime
            .call(|| self.lock.try_lock_until(deadline))
            .map(|g| g.map(|g| self.guard(g)))
    }

    /// Releases the lock held under `token` (a holder in another process that handed its
    /// token over).
    ///
    /// # Errors
    /// As [`crate::Lock::release_token`]; `InvalidArgument` inside a runtime.
    pub fn release_token(&self, token: &Token) -> Result<()> {
        self.runtime.call(|| self.lock.release_token(token))
    }

    /// Resets the lease of the lock held under `token` to `ttl` from now.
    ///
    /// # Errors
    /// As [`crate::Lock::extend_token`]; `InvalidArgument` inside a runtime.
    pub fn extend_token(&self, token: &Token, ttl: Duration) -> Result<()> {
        self.runtime.call(|| self.lock.extend_token(token, ttl))
    }
}

impl<B: RawInspect> Lock<B> {
    /// What the store says about this lock now: holder token, remaining ttl, last fence.
    ///
    /// # Errors
    /// Store failures; `InvalidArgument` inside a runtime.
    pub fn state(&self) -> Result<LockState> {
        self.runtime.call(|| self.lock.state())
    }

    /// Whether anyone holds the lock now (a snapshot).
    ///
    /// # Errors
    /// Store failures; `InvalidArgument` inside a runtime.
    pub fn is_locked(&self) -> Result<bool> {
        self.runtime.call(|| self.lock.is_locked())
    }

    /// Deletes the lock whoever holds it and wakes a waiter. **Dangerous**: see
    /// [`crate::Lock::force_unlock`].
    ///
    /// # Errors
    /// Store failures; `InvalidArgument` inside a runtime.
    pub fn force_unlock(&self) -> Result<bool> {
        self.runtime.call(|| self.lock.force_unlock())
    }
}

/// Proof that this process holds a lock (or permits, a hold, a read or write side): the
/// blocking twin of [`crate::LockGuard`], renewed by the client's watchdog while it lives.
///
/// Released by [`release`](LockGuard::release), or when dropped: `drop` waits for the
/// store's answer at most [`DROP_RELEASE_WAIT`](super::DROP_RELEASE_WAIT) (2 s), then
/// leaves the release to the background (see the [module docs](super#drop-never-blocks-for-long)).
#[must_use = "the lock is released as soon as the guard is dropped"]
pub struct LockGuard<B: RawLock> {
    /// `None` only once consumed (released, forgotten, handed on).
    guard: Option<crate::LockGuard<B>>,
    runtime: Arc<Runtime>,
}

impl<B: RawLock> std::fmt::Debug for LockGuard<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.held().fmt(f)
    }
}

impl<B: RawFencing> LockGuard<B> {
    /// The fence minted with this grant: strictly greater than every earlier grant's of the
    /// same name (see [`crate::LockGuard::fencing_token`]).
    pub fn fencing_token(&self) -> FencingToken {
        self.held().fencing_token()
    }
}

impl<B: RawLock> LockGuard<B> {
    pub(super) fn new(guard: crate::LockGuard<B>, runtime: Arc<Runtime>) -> LockGuard<B> {
        LockGuard {
            guard: Some(guard),
            runtime,
        }
    }

    fn held(&self) -> &crate::LockGuard<B> {
        self.guard
            .as_ref()
            .expect("a guard holds its lease until it is consumed")
    }

    /// The async guard inside, with the runtime it must be used on; the caller has
    /// checked that it is outside a runtime.
    pub(super) fn into_parts(mut self) -> (crate::LockGuard<B>, Arc<Runtime>) {
        let guard = self
            .guard
            .take()
            .expect("a guard holds its lease until it is consumed");
        (guard, Arc::clone(&self.runtime))
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        self.held().name()
    }

    /// The owner token stored at the lock key.
    pub fn token(&self) -> &Token {
        self.held().token()
    }

    /// Whether the lease can no longer be guaranteed: the store reported it gone, or its
    /// validity ran out without a successful renewal. Cheap: check it between steps of
    /// long work and stop when it turns true.
    pub fn is_lost(&self) -> bool {
        self.held().is_lost()
    }

    /// The lease each renewal buys (see [`crate::LockGuard::lease`]).
    pub fn lease(&self) -> Duration {
        self.held().lease()
    }

    /// How much validity is left (zero once lost).
    pub fn remaining(&self) -> Duration {
        self.held().remaining()
    }

    /// Blocks until the lease can no longer be guaranteed (see
    /// [`is_lost`](LockGuard::is_lost)) or `timeout` passes: `Ok(true)` if it was lost,
    /// `Ok(false)` if it is still held. A thread that supervises work done elsewhere can
    /// loop on it; `Duration::MAX` waits for as long as the lease lives.
    ///
    /// # Errors
    /// `InvalidArgument` inside a runtime.
    pub fn wait_lost(&self, timeout: Duration) -> Result<bool> {
        self.runtime.run(|| {
            let lost = self.held().lost();
            async move { tokio::time::timeout(timeout, lost).await.is_ok() }
        })
    }

    /// Resets the lease to expire `ttl` from now (as [`crate::LockGuard::extend`]).
    ///
    /// # Errors
    /// As [`crate::LockGuard::extend`]; `InvalidArgument` inside a runtime.
    pub fn extend(&self, ttl: Duration) -> Result<()> {
        self.runtime.call(|| self.held().extend(ttl))
    }

    /// Releases the lock and reports whether it was still ours all along (as
    /// [`crate::LockGuard::release`]).
    ///
    /// # Errors
    /// [`ErrorKind::LockLost`](crate::ErrorKind::LockLost) if the lock was no longer ours
    /// — never silent success; store failures otherwise (the lease then expires by
    /// itself). `InvalidArgument` inside a runtime: the guard is then dropped (released
    /// in the background).
    pub fn release(mut self) -> Result<()> {
        let runtime = Arc::clone(&self.runtime);
        runtime.call(|| {
            self.guard
                .take()
                .expect("a guard holds its lease until it is consumed")
                .release()
        })
    }

    /// Stops renewing and keeps the lock until its ttl runs out, without releasing it.
    pub fn forget(mut self) {
        if let Some(guard) = self.guard.take() {
            guard.forget();
        }
    }
}

impl<B: RawLock> Drop for LockGuard<B> {
    fn drop(&mut self) {
        if let Some(guard) = self.guard.take() {
            self.runtime.settle(async move {
                // Errors were the caller's to see through `release()`; the lease expires.
                let _ = guard.release().await;
            });
        }
    }
}
