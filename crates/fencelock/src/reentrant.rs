//! A lock its holder may take again: hold counts per explicit owner.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::time::Instant;

use crate::engine::LeaseKind;
use crate::error::{Error, Result};
use crate::keys::LockKeys;
use crate::lock::{Lock, LockGuard};
use crate::options::{Options, builder_options};
use crate::raw::{Acquire, LockState, RawFencing, RawLock, RawReentrant, ReleaseWatch};
use crate::token::Token;

/// Default key prefix of reentrant locks (apart from plain locks: the value is a hash).
pub const DEFAULT_REENTRANT_PREFIX: &str = "dlock-re:";

/// Default reentrancy limit: how many holds one owner may stack.
pub const DEFAULT_MAX_HOLDS: u32 = 1024;

/// Longest owner string accepted, in bytes.
pub const MAX_OWNER_LEN: usize = 512;

/// Who holds a reentrant lock: a client id plus a part the caller chooses (or the current
/// tokio task's id).
///
/// Not a thread id: async tasks move between threads, and one thread runs many tasks, so
/// a thread-keyed reentrant lock lets unrelated tasks in and locks a task out of its own
/// lock. An `Owner` is a plain value — pass it along wherever the logical holder goes.
///
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Owner(Arc<str>);

impl Owner {
    /// This process's client id (random, drawn once per process) joined with `part`.
    ///
    /// # Errors
    /// `InvalidArgument` for an empty `part` or an owner over [`MAX_OWNER_LEN`] bytes.
    pub fn new(part: impl AsRef<str>) -> Result<Owner> {
        Owner::with_client(process_id()?, part)
    }

    /// `client` (any id stable for the holder, e.g. a host name and pid) joined with
    /// `part`. Two processes must never use the same client id.
    ///
    /// # Errors
    /// `InvalidArgument` for an empty `client` or `part`, or an owner over
    /// [`MAX_OWNER_LEN`] bytes.
    pub fn with_client(client: impl AsRef<str>, part: impl AsRef<str>) -> Result<Owner> {
        let (client, part) = (client.as_ref(), part.as_ref());
        if client.is_empty() || part.is_empty() {
            return Err(Error::invalid(
                "an owner needs a non-empty client id and part",
            ));
        }
        let owner = format!("{client}/{part}");
        if owner.len() > MAX_OWNER_LEN {
            return Err(Error::invalid(format!(
                "owner is {} bytes; the limit is {MAX_OWNER_LEN}",
                owner.len()
            )));
        }
        Ok(Owner(owner.into()))
    }

    /// The current tokio task as owner (`<process id>/task-<task id>`): it stays the same
    /// while the task moves between threads.
    ///
    /// # Errors
    /// `InvalidArgument` outside a tokio task.
    pub fn current_task() -> Result<Owner> {
        let id = tokio::task::try_id()
            .ok_or_else(|| Error::invalid("Owner::current_task() called outside a tokio task"))?;
        Owner::new(format!("task-{id}"))
    }

    /// The owner as stored in the lock.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Owner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Owner").field(&self.as_str()).finish()
    }
}

impl std::fmt::Display for Owner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

fn process_id() -> Result<&'static str> {
    static ID: OnceLock<String> = OnceLock::new();
    if let Some(id) = ID.get() {
        return Ok(id);
    }
    let random = Token::random()?;
    Ok(ID.get_or_init(|| random.as_str()[..16].to_owned()))
}

/// A backend seen through one owner of one reentrant lock: acquiring takes a hold for
/// that owner. It lets each hold reuse the lock's guard, watchdog, `lost()` and waiting.
#[derive(Clone, Debug)]
pub struct Holds<B> {
    backend: B,
    owner: Owner,
    limit: u32,
}

impl<B: RawReentrant> RawLock for Holds<B> {
    const LEASE_KIND: LeaseKind = LeaseKind::Reentrant;
    const PRIMITIVE: &'static str = crate::observe::primitive::REENTRANT;
    const QUEUES_WAITERS: bool = B::QUEUES_WAITERS;
    const QUEUES_ONLY_LISTENERS: bool = B::QUEUES_ONLY_LISTENERS;

    async fn acquire(&self, keys: &LockKeys, token: &Token, ttl: Duration) -> Result<Acquire> {
        self.backend
            .acquire_reentrant(keys, self.owner.as_str(), token, ttl, self.limit, false)
            .await
    }

    async fn acquire_or_queue(
        &self,
        keys: &LockKeys,
        token: &Token,
        ttl: Duration,
    ) -> Result<Acquire> {
        self.backend
            .acquire_reentrant(keys, self.owner.as_str(), token, ttl, self.limit, true)
            .await
    }

    /// A queued waiter listens for its own wake-up, where the store wakes one waiter per
    /// release.
    async fn watch_for(&self, keys: &LockKeys, token: &Token) -> Result<ReleaseWatch> {
        self.backend.watch_for(keys, token).await
    }

    fn watch_ready(&self, keys: &LockKeys, token: &Token) -> Option<ReleaseWatch> {
        self.backend.watch_ready(keys, token)
    }

    async fn abandon(&self, keys: &LockKeys, token: &Token, ttl: Duration) -> Result<()> {
        self.backend.abandon(keys, token, ttl).await
    }

    async fn release(&self, keys: &LockKeys, token: &Token) -> Result<bool> {
        self.backend
            .release_reentrant(keys, self.owner.as_str(), token)
            .await
    }

    async fn extend(&self, keys: &LockKeys, token: &Token, ttl: Duration) -> Result<bool> {
        self.backend.extend_reentrant(keys, token, ttl).await
    }

    crate::raw::client_hooks!(backend);
}

/// A re-entry returns the first grant's fence: fences still strictly increase from one
/// owner's tenure to the next.
impl<B: RawReentrant + RawFencing> RawFencing for Holds<B> {}

/// One hold of a reentrant lock. Every hold is released on its own (`release().await`, or
/// in the background when dropped); the lock is free once the owner's last hold is gone.
/// Re-entrant holds carry the first hold's `fencing_token()`.
pub type ReentrantGuard<B> = LockGuard<Holds<B>>;

/// A lock that its owner may take again while holding it (N acquires need N releases),
/// for code that calls itself or other lock-taking code under the lock.
///
/// The owner is an explicit [`Owner`], not a thread: pass it down the call chain. Each
/// hold is a guard with its own lease (renewed by the watchdog); the store keeps the
/// owner's hold count, the first grant's fence and the expiry in one hash (Redisson's
/// layout), so every hold of the owner renews the same key.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> fencelock::Result<()> {
/// use fencelock::{Owner, ReentrantLock, backend::Memory};
///
/// let lock = ReentrantLock::new(Memory::new(), "ledger")?;
/// let me = Owner::new("worker-1")?;
/// let outer = lock.lock(&me).await?;
/// let inner = lock.lock(&me).await?; // the same owner enters again
/// assert_eq!(inner.fencing_token(), outer.fencing_token());
/// assert_eq!(lock.hold_count(&me).await?, 2);
/// let other = Owner::new("worker-2")?;
/// assert!(lock.try_lock(&other).await?.is_none());
/// inner.release().await?;
/// outer.release().await?;
/// assert!(lock.try_lock(&other).await?.is_some());
/// # Ok(()) }
/// ```
///
/// # Correctness
///
/// As [`Lock`](crate::Lock): at most one owner holds the lock at a time while the store
/// keeps its keys, with the same limits (a paused holder whose lease ran out, failover,
/// restart without persistence; fence your writes). Hold counts are exact under repeated
/// calls whose replies were lost: each hold is recorded under its own request token, so a
/// repeat is recognised. A reentrant acquire never waits on its own owner.
#[derive(Clone, Debug)]
pub struct ReentrantLock<B: RawReentrant> {
    backend: B,
    keys: LockKeys,
    limit: u32,
    options: Options,
}

/// Options for a [`ReentrantLock`]; made by [`ReentrantLock::builder`].
#[must_use = "a builder does nothing until .build()"]
#[derive(Debug)]
pub struct ReentrantLockBuilder<B: RawReentrant> {
    backend: B,
    limit: u32,
    options: Options,
}

builder_options!(ReentrantLockBuilder<B: RawReentrant>, DEFAULT_REENTRANT_PREFIX);

impl<B: RawReentrant> ReentrantLockBuilder<B> {
    /// Reentrancy limit: the most holds one owner may stack (default
    /// [`DEFAULT_MAX_HOLDS`]); one more fails with
    /// [`ErrorKind::LimitReached`](crate::ErrorKind::LimitReached).
    pub fn max_holds(mut self, limit: u32) -> Self {
        self.limit = limit;
        self
    }

    /// Checks the options and makes the lock.
    ///
    /// # Errors
    /// `InvalidArgument` for a bad name, prefix, ttl or retry, or a limit of 0.
    pub fn build(self) -> Result<ReentrantLock<B>> {
        if self.limit == 0 {
            return Err(Error::invalid("a reentrancy limit must be at least 1"));
        }
        let lock = ReentrantLock {
            keys: self.options.keys()?,
            backend: self.backend,
            limit: self.limit,
            options: self.options,
        };
        // Checks the ttl and retry once, as every hold's lock will.
        lock.holds_of(&Owner(Arc::from("-")))?;
        Ok(lock)
    }
}

impl<B: RawReentrant> ReentrantLock<B> {
    /// A reentrant lock named `name` with default options (30 s ttl, watchdog on, limit
    /// [`DEFAULT_MAX_HOLDS`], prefix `dlock-re:`).
    ///
    /// # Errors
    /// `InvalidArgument` for a bad name.
    pub fn new(backend: B, name: impl Into<String>) -> Result<ReentrantLock<B>> {
        ReentrantLock::builder(backend, name).build()
    }

    /// Options for a reentrant lock named `name`.
    pub fn builder(backend: B, name: impl Into<String>) -> ReentrantLockBuilder<B> {
        ReentrantLockBuilder {
            backend,
            limit: DEFAULT_MAX_HOLDS,
            options: Options::new(name.into(), DEFAULT_REENTRANT_PREFIX),
        }
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        self.keys.name()
    }

    /// Its keys in the store.
    pub fn keys(&self) -> &LockKeys {
        &self.keys
    }

    /// The lock as seen by `owner`: what [`lock`](ReentrantLock::lock) and friends wait on
    /// (for tools that handle every primitive as a [`Lock`]).
    ///
    /// # Errors
    /// `InvalidArgument` for a ttl out of range.
    pub fn holds_of(&self, owner: &Owner) -> Result<Lock<Holds<B>>> {
        let holds = Holds {
            backend: self.backend.clone(),
            owner: owner.clone(),
            limit: self.limit,
        };
        Lock::from_options_on(holds, self.keys.clone(), &self.options)
    }

    /// Waits until `owner` holds the lock (at once if it already does: one more hold).
    ///
    /// # Errors
    /// `LimitReached` at the reentrancy limit; store failures.
    ///
    /// # Cancel safety
    /// Cancel-safe: a cancelled call leaves no hold behind (a grant whose reply was never
    /// seen is given back in the background, and only that hold).
    pub async fn lock(&self, owner: &Owner) -> Result<ReentrantGuard<B>> {
        self.holds_of(owner)?.lock().await
    }

    /// One hold for `owner` if the lock is free or already `owner`'s; `Ok(None)` if
    /// another owner holds it.
    ///
    /// # Errors
    /// As [`lock`](ReentrantLock::lock).
    ///
    /// # Cancel safety
    /// As [`lock`](ReentrantLock::lock).
    pub async fn try_lock(&self, owner: &Owner) -> Result<Option<ReentrantGuard<B>>> {
        self.holds_of(owner)?.try_lock().await
    }

    /// As [`lock`](ReentrantLock::lock), waiting at most `timeout`.
    ///
    /// # Errors
    /// As [`lock`](ReentrantLock::lock).
    ///
    /// # Cancel safety
    /// As [`lock`](ReentrantLock::lock).
    pub async fn try_lock_for(
        &self,
        owner: &Owner,
        timeout: Duration,
    ) -> Result<Option<ReentrantGuard<B>>> {
        self.holds_of(owner)?.try_lock_for(timeout).await
    }

    /// How many holds `owner` has now (0 if it does not hold the lock).
    ///
    /// # Errors
    /// Store failures.
    pub async fn hold_count(&self, owner: &Owner) -> Result<u32> {
        let state = self.state().await?;
        Ok(match state.holder {
            Some(h) if h == owner.as_str() => state.hold_count.unwrap_or(0),
            _ => 0,
        })
    }

    /// The holder (owner string), its hold count, remaining ttl and last fence.
    ///
    /// # Errors
    /// Store failures.
    pub async fn state(&self) -> Result<LockState> {
        crate::observe::observed!(
            self.obs(),
            self.keys.name(),
            crate::observe::span::INSPECT,
            crate::observe::op::INSPECT,
            self.backend
                .inspect(crate::raw::Kind::Reentrant, &self.keys)
        )
    }

    /// Its spans' labels (operator calls only: made on demand).
    fn obs(&self) -> crate::observe::Obs {
        crate::observe::Obs::new(
            RawLock::store_label(&self.backend),
            crate::observe::primitive::REENTRANT,
            self.keys.name(),
            self.options.name_label,
        )
    }

    /// Whether any owner holds the lock now.
    ///
    /// # Errors
    /// Store failures.
    pub async fn is_locked(&self) -> Result<bool> {
        Ok(self.state().await?.holder.is_some())
    }

    /// Deletes the lock with all its holds, whoever holds it. **Dangerous**, as
    /// [`Lock::force_unlock`](crate::Lock::force_unlock).
    ///
    /// # Errors
    /// Store failures.
    pub async fn force_unlock(&self) -> Result<bool> {
        crate::observe::observed!(
            self.obs(),
            self.keys.name(),
            crate::observe::span::FORCE_UNLOCK,
            crate::observe::op::FORCE_UNLOCK,
            self.backend
                .force_unlock(crate::raw::Kind::Reentrant, &self.keys)
        )
    }
}

/// The store side of the memory backend's reentrant locks.
#[derive(Debug)]
pub(crate) struct ReentrantEntry {
    pub(crate) owner: String,
    pub(crate) count: u32,
    pub(crate) fence: u64,
    /// The request token of every live hold.
    pub(crate) holds: std::collections::HashSet<Token>,
    pub(crate) expires: Instant,
}
