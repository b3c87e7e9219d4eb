//! The blocking lock family: semaphore, reentrant, read-write and fair locks. Each is its
//! async twin run on a [`Client`]'s runtime, and hands out the one blocking [`LockGuard`].

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::{Client, Lock, LockGuard, Runtime, forward_options};
use crate::error::Result;
use crate::fair::Queued;
use crate::keys::LockKeys;
use crate::raw::{LockState, RawFair, RawReentrant, RawRwLock, RawSemaphore};
use crate::reentrant::{Holds, Owner};
use crate::rwlock::RwSide;
use crate::semaphore::Permits;

/// Held permits of a blocking [`Semaphore`] (no `fencing_token()`: holders of a semaphore
/// do not exclude each other).
pub type SemaphorePermit<B> = LockGuard<Permits<B>>;
/// One hold of a blocking [`ReentrantLock`]; re-entrant holds carry the first hold's fence.
pub type ReentrantGuard<B> = LockGuard<Holds<B>>;
/// A read hold of a blocking [`RwLock`].
pub type ReadGuard<B> = LockGuard<RwSide<B, false>>;
/// The write hold of a blocking [`RwLock`].
pub type WriteGuard<B> = LockGuard<RwSide<B, true>>;
/// The hold of a blocking [`FairLock`].
pub type FairGuard<B> = LockGuard<Queued<B>>;

/// Wraps what an acquire returned in the blocking guard.
fn held<B: crate::raw::RawLock>(
    runtime: &Arc<Runtime>,
    guard: Option<crate::LockGuard<B>>,
) -> Option<LockGuard<B>> {
    guard.map(|g| LockGuard::new(g, Arc::clone(runtime)))
}

/// At most `permits` holders across every process: [`crate::Semaphore`] for synchronous
/// code.
///
/// ```
/// use fencelock::backend::Memory;
/// use fencelock::blocking::{Client, Semaphore};
///
/// let client = Client::from_backend(Memory::new())?;
/// let sem = Semaphore::new(&client, "exports", 2)?;
/// let a = sem.acquire()?;
/// let b = sem.try_acquire()?.expect("a second permit");
/// assert!(sem.try_acquire()?.is_none()); // both taken
/// a.release()?;
/// assert_eq!(sem.available_permits()?, 1);
/// # drop(b);
/// # Ok::<(), fencelock::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct Semaphore<B: RawSemaphore> {
    semaphore: crate::Semaphore<B>,
    runtime: Arc<Runtime>,
}

/// Options for a blocking [`Semaphore`]; made by [`Semaphore::builder`].
#[must_use = "a builder does nothing until .build()"]
#[derive(Debug)]
pub struct SemaphoreBuilder<B: RawSemaphore> {
    builder: crate::SemaphoreBuilder<B>,
    runtime: Arc<Runtime>,
}

forward_options!(SemaphoreBuilder<B: RawSemaphore>, "SemaphoreBuilder");

impl<B: RawSemaphore> SemaphoreBuilder<B> {
    /// Checks the options and makes the semaphore.
    ///
    /// # Errors
    /// As [`crate::SemaphoreBuilder::build`].
    pub fn build(self) -> Result<Semaphore<B>> {
        Ok(Semaphore {
            semaphore: self.builder.build()?,
            runtime: self.runtime,
        })
    }
}

impl<B: RawSemaphore> Semaphore<B> {
    /// A semaphore named `name` with `permits` permits and default options.
    ///
    /// # Errors
    /// As [`crate::Semaphore::new`].
    pub fn new(client: &Client<B>, name: impl Into<String>, permits: u32) -> Result<Semaphore<B>> {
        Semaphore::builder(client, name, permits).build()
    }

    /// Options for a semaphore named `name` with `permits` permits.
    pub fn builder(
        client: &Client<B>,
        name: impl Into<String>,
        permits: u32,
    ) -> SemaphoreBuilder<B> {
        SemaphoreBuilder {
            builder: crate::Semaphore::builder(client.backend.clone(), name, permits),
            runtime: Arc::clone(&client.runtime),
        }
    }

    /// The same semaphore for async code.
    pub fn as_async(&self) -> &crate::Semaphore<B> {
        &self.semaphore
    }

    /// The semaphore's name.
    pub fn name(&self) -> &str {
        self.semaphore.name()
    }

    /// Its keys in the store.
    pub fn keys(&self) -> &LockKeys {
        self.semaphore.keys()
    }

    /// One permit seen as a lock (for tools that handle locks and permits alike).
    pub fn permit_lock(&self) -> Lock<Permits<B>> {
        Lock::from_async(
            self.semaphore.permit_lock().clone(),
            Arc::clone(&self.runtime),
        )
    }

    /// Blocks until one permit is ours.
    ///
    /// # Errors
    /// Store failures; `InvalidArgument` inside a runtime.
    pub fn acquire(&self) -> Result<SemaphorePermit<B>> {
        self.runtime
            .call(|| self.semaphore.acquire())
            .map(|g| LockGuard::new(g, Arc::clone(&self.runtime)))
    }

    /// Blocks until `n` permits are ours, taken all at once.
    ///
    /// # Errors
    /// As [`crate::Semaphore::acquire_many`]; `InvalidArgument` inside a runtime.
    pub fn acquire_many(&self, n: u32) -> Result<SemaphorePermit<B>> {
        self.runtime
            .call(|| self.semaphore.acquire_many(n))
            .map(|g| LockGuard::new(g, Arc::clone(&self.runtime)))
    }

    /// One permit if one is free now.
    ///
    /// # Errors
    /// Store failures; `InvalidArgument` inside a runtime.
    pub fn try_acquire(&self) -> Result<Option<SemaphorePermit<B>>> {
        self.runtime
            .call(|| self.semaphore.try_acquire())
            .map(|g| held(&self.runtime, g))
    }

    /// `n` permits if they are free now.
    ///
    /// # Errors
    /// As [`crate::Semaphore::try_acquire_many`]; `InvalidArgument` inside a runtime.
    pub fn try_acquire_many(&self, n: u32) -> Result<Option<SemaphorePermit<B>>> {
        self.runtime
            .call(|| self.semaphore.try_acquire_many(n))
            .map(|g| held(&self.runtime, g))
    }

    /// One permit, blocking at most `timeout`.
    ///
    /// # Errors
    /// Store failures; `InvalidArgument` inside a runtime.
    pub fn try_acquire_for(&self, timeout: Duration) -> Result<Option<SemaphorePermit<B>>> {
        self.runtime
            .call(|| self.semaphore.try_acquire_for(timeout))
            .map(|g| held(&self.runtime, g))
    }

    /// Permits free now (a snapshot).
    ///
    /// # Errors
    /// Store failures; `InvalidArgument` inside a runtime.
    pub fn available_permits(&self) -> Result<u32> {
        self.runtime.call(|| self.semaphore.available_permits())
    }

    /// Sets the permit count for every client (as [`crate::Semaphore::set_permits`]).
    ///
    /// # Errors
    /// As [`crate::Semaphore::set_permits`]; `InvalidArgument` inside a runtime.
    pub fn set_permits(&self, permits: u32) -> Result<()> {
        self.runtime.call(|| self.semaphore.set_permits(permits))
    }

    /// Adds `n` permits (negative: removes them); returns the new count (as
    /// [`crate::Semaphore::add_permits`]).
    ///
    /// # Errors
    /// As [`crate::Semaphore::add_permits`]; `InvalidArgument` inside a runtime.
    pub fn add_permits(&self, n: i64) -> Result<u32> {
        self.runtime.call(|| self.semaphore.add_permits(n))
    }

    /// Permits in use, live holders and the latest lease's remaining ttl.
    ///
    /// # Errors
    /// Store failures; `InvalidArgument` inside a runtime.
    pub fn state(&self) -> Result<LockState> {
        self.runtime.call(|| self.semaphore.state())
    }

    /// Whether any permit is held now.
    ///
    /// # Errors
    /// Store failures; `InvalidArgument` inside a runtime.
    pub fn is_locked(&self) -> Result<bool> {
        self.runtime.call(|| self.semaphore.is_locked())
    }

    /// Takes every permit back from every holder. **Dangerous**: see
    /// [`crate::Semaphore::force_unlock`].
    ///
    /// # Errors
    /// Store failures; `InvalidArgument` inside a runtime.
    pub fn force_unlock(&self) -> Result<bool> {
        self.runtime.call(|| self.semaphore.force_unlock())
    }
}

/// The calling thread as a [`ReentrantLock`] owner: `<process id>/thread-<n>`, with `n`
/// unique to the thread for the life of the process (thread ids are never reused).
///
/// Synchronous code re-enters on the same thread, so the thread is the natural owner
/// there; a guard moved to another thread keeps its owner (the owner is a value, not the
/// thread that happens to hold the guard). Async code uses
/// [`Owner::current_task`](crate::Owner::current_task) instead.
///
/// # Errors
/// Only if the process's random client id cannot be drawn (no OS randomness).
pub fn current_thread_owner() -> Result<Owner> {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local! {
        static THREAD: u64 = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    Owner::new(format!("thread-{}", THREAD.with(|n| *n)))
}

/// A lock its owner may take again while holding it: [`crate::ReentrantLock`] for
/// synchronous code. Owners are explicit values; [`current_thread_owner`] names the
/// calling thread.
///
/// ```
/// use fencelock::backend::Memory;
/// use fencelock::blocking::{Client, ReentrantLock, current_thread_owner};
///
/// let client = Client::from_backend(Memory::new())?;
/// let lock = ReentrantLock::new(&client, "ledger")?;
/// let me = current_thread_owner()?;
/// let outer = lock.lock(&me)?;
/// let inner = lock.lock(&me)?; // the same owner enters again
/// assert_eq!(inner.fencing_token(), outer.fencing_token());
/// assert_eq!(lock.hold_count(&me)?, 2);
/// inner.release()?;
/// outer.release()?;
/// # Ok::<(), fencelock::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct ReentrantLock<B: RawReentrant> {
    lock: crate::ReentrantLock<B>,
    runtime: Arc<Runtime>,
}

/// Options for a blocking [`ReentrantLock`]; made by [`ReentrantLock::builder`].
#[must_use = "a builder does nothing until .build()"]
#[derive(Debug)]
pub struct ReentrantLockBuilder<B: RawReentrant> {
    builder: crate::ReentrantLockBuilder<B>,
    runtime: Arc<Runtime>,
}

forward_options!(ReentrantLockBuilder<B: RawReentrant>, "ReentrantLockBuilder");

impl<B: RawReentrant> ReentrantLockBuilder<B> {
    /// Reentrancy limit (as [`crate::ReentrantLockBuilder::max_holds`]).
    pub fn max_holds(self, limit: u32) -> Self {
        Self {
            builder: self.builder.max_holds(limit),
            ..self
        }
    }

    /// Checks the options and makes the lock.
    ///
    /// # Errors
    /// As [`crate::ReentrantLockBuilder::build`].
    pub fn build(self) -> Result<ReentrantLock<B>> {
        Ok(ReentrantLock {
            lock: self.builder.build()?,
            runtime: self.runtime,
        })
    }
}

impl<B: RawReentrant> ReentrantLock<B> {
    /// A reentrant lock named `name` with default options.
    ///
    /// # Errors
    /// As [`crate::ReentrantLock::new`].
    pub fn new(client: &Client<B>, name: impl Into<String>) -> Result<ReentrantLock<B>> {
        ReentrantLock::builder(client, name).build()
    }

    /// Options for a reentrant lock named `name`.
    pub fn builder(client: &Client<B>, name: impl Into<String>) -> ReentrantLockBuilder<B> {
        ReentrantLockBuilder {
            builder: crate::ReentrantLock::builder(client.backend.clone(), name),
            runtime: Arc::clone(&client.runtime),
        }
    }

    /// The same lock for async code.
    pub fn as_async(&self) -> &crate::ReentrantLock<B> {
        &self.lock
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        self.lock.name()
    }

    /// Its keys in the store.
    pub fn keys(&self) -> &LockKeys {
        self.lock.keys()
    }

    /// The lock as seen by `owner` (as [`crate::ReentrantLock::holds_of`]).
    ///
    /// # Errors
    /// As [`crate::ReentrantLock::holds_of`].
    pub fn holds_of(&self, owner: &Owner) -> Result<Lock<Holds<B>>> {
        Ok(Lock::from_async(
            self.lock.holds_of(owner)?,
            Arc::clone(&self.runtime),
        ))
    }

    /// Blocks until `owner` holds the lock (at once if it already does: one more hold).
    ///
    /// # Errors
    /// `LimitReached` at the reentrancy limit; store failures; `InvalidArgument` inside a
    /// runtime.
    pub fn lock(&self, owner: &Owner) -> Result<ReentrantGuard<B>> {
        self.runtime
            .call(|| self.lock.lock(owner))
            .map(|g| LockGuard::new(g, Arc::clone(&self.runtime)))
    }

    /// One hold for `owner` if the lock is free or already `owner`'s; `Ok(None)` if another
    /// owner holds it.
    ///
    /// # Errors
    /// As [`lock`](ReentrantLock::lock).
    pub fn try_lock(&self, owner: &Owner) -> Result<Option<ReentrantGuard<B>>> {
        self.runtime
            .call(|| self.lock.try_lock(owner))
            .map(|g| held(&self.runtime, g))
    }

    /// As [`lock`](ReentrantLock::lock), blocking at most `timeout`.
    ///
    /// # Errors
    /// As [`lock`](ReentrantLock::lock).
    pub fn try_lock_for(
        &self,
        owner: &Owner,
        timeout: Duration,
    ) -> Result<Option<ReentrantGuard<B>>> {
        self.runtime
            .call(|| self.lock.try_lock_for(owner, timeout))
            .map(|g| held(&self.runtime, g))
    }

    /// How many holds `owner` has now (0 if it does not hold the lock).
    ///
    /// # Errors
    /// Store failures; `InvalidArgument` inside a runtime.
    pub fn hold_count(&self, owner: &Owner) -> Result<u32> {
        self.runtime.call(|| self.lock.hold_count(owner))
    }

    /// The holder (owner string), its hold count, remaining ttl and last fence.
    ///
    /// # Errors
    /// Store failures; `InvalidArgument` inside a runtime.
    pub fn state(&self) -> Result<LockState> {
        self.runtime.call(|| self.lock.state())
    }

    /// Whether any owner holds the lock now.
    ///
    /// # Errors
    /// Store failures; `InvalidArgument` inside a runtime.
    pub fn is_locked(&self) -> Result<bool> {
        self.runtime.call(|| self.lock.is_locked())
    }

    /// Deletes the lock with all its holds. **Dangerous**: see
    /// [`crate::ReentrantLock::force_unlock`].
    ///
    /// # Errors
    /// Store failures; `InvalidArgument` inside a runtime.
    pub fn force_unlock(&self) -> Result<bool> {
        self.runtime.call(|| self.lock.force_unlock())
    }
}

/// Many readers or one writer, writers first: [`crate::RwLock`] for synchronous code.
#[derive(Clone, Debug)]
pub struct RwLock<B: RawRwLock> {
    lock: crate::RwLock<B>,
    runtime: Arc<Runtime>,
}

/// Options for a blocking [`RwLock`]; made by [`RwLock::builder`].
#[must_use = "a builder does nothing until .build()"]
#[derive(Debug)]
pub struct RwLockBuilder<B: RawRwLock> {
    builder: crate::RwLockBuilder<B>,
    runtime: Arc<Runtime>,
}

forward_options!(RwLockBuilder<B: RawRwLock>, "RwLockBuilder");

impl<B: RawRwLock> RwLockBuilder<B> {
    /// How long a waiting writer's claim outlives its next expected attempt (as
    /// [`crate::RwLockBuilder::writer_grace`]).
    pub fn writer_grace(self, grace: Duration) -> Self {
        Self {
            builder: self.builder.writer_grace(grace),
            ..self
        }
    }

    /// Checks the options and makes the lock.
    ///
    /// # Errors
    /// As [`crate::RwLockBuilder::build`].
    pub fn build(self) -> Result<RwLock<B>> {
        Ok(RwLock {
            lock: self.builder.build()?,
            runtime: self.runtime,
        })
    }
}

impl<B: RawRwLock> RwLock<B> {
    /// A read-write lock named `name` with default options.
    ///
    /// # Errors
    /// As [`crate::RwLock::new`].
    pub fn new(client: &Client<B>, name: impl Into<String>) -> Result<RwLock<B>> {
        RwLock::builder(client, name).build()
    }

    /// Options for a read-write lock named `name`.
    pub fn builder(client: &Client<B>, name: impl Into<String>) -> RwLockBuilder<B> {
        RwLockBuilder {
            builder: crate::RwLock::builder(client.backend.clone(), name),
            runtime: Arc::clone(&client.runtime),
        }
    }

    /// The same lock for async code.
    pub fn as_async(&self) -> &crate::RwLock<B> {
        &self.lock
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        self.lock.name()
    }

    /// Its keys in the store.
    pub fn keys(&self) -> &LockKeys {
        self.lock.keys()
    }

    /// Blocks until we read (shared with other readers).
    ///
    /// # Errors
    /// Store failures; `InvalidArgument` inside a runtime.
    pub fn read(&self) -> Result<ReadGuard<B>> {
        self.runtime
            .call(|| self.lock.read())
            .map(|g| LockGuard::new(g, Arc::clone(&self.runtime)))
    }

    /// A read hold if no writer holds or waits now.
    ///
    /// # Errors
    /// Store failures; `InvalidArgument` inside a runtime.
    pub fn try_read(&self) -> Result<Option<ReadGuard<B>>> {
        self.runtime
            .call(|| self.lock.try_read())
            .map(|g| held(&self.runtime, g))
    }

    /// A read hold, blocking at most `timeout`.
    ///
    /// # Errors
    /// Store failures; `InvalidArgument` inside a runtime.
    pub fn try_read_for(&self, timeout: Duration) -> Result<Option<ReadGuard<B>>> {
        self.runtime
            .call(|| self.lock.try_read_for(timeout))
            .map(|g| held(&self.runtime, g))
    }

    /// Blocks until we write (alone).
    ///
    /// # Errors
    /// Store failures; `InvalidArgument` inside a runtime.
    pub fn write(&self) -> Result<WriteGuard<B>> {
        self.runtime
            .call(|| self.lock.write())
            .map(|g| LockGuard::new(g, Arc::clone(&self.runtime)))
    }

    /// The write hold if the lock is free now.
    ///
    /// # Errors
    /// Store failures; `InvalidArgument` inside a runtime.
    pub fn try_write(&self) -> Result<Option<WriteGuard<B>>> {
        self.runtime
            .call(|| self.lock.try_write())
            .map(|g| held(&self.runtime, g))
    }

    /// The write hold, blocking at most `timeout`.
    ///
    /// # Errors
    /// Store failures; `InvalidArgument` inside a runtime.
    pub fn try_write_for(&self, timeout: Duration) -> Result<Option<WriteGuard<B>>> {
        self.runtime
            .call(|| self.lock.try_write_for(timeout))
            .map(|g| held(&self.runtime, g))
    }

    /// Turns our write hold into a read hold without letting another writer in between
    /// (as [`crate::RwLock::downgrade`]).
    ///
    /// # Errors
    /// As [`crate::RwLock::downgrade`]; `InvalidArgument` inside a runtime (the write
    /// guard is then dropped: released in the background).
    pub fn downgrade(&self, guard: WriteGuard<B>) -> Result<ReadGuard<B>> {
        super::outside_runtime()?;
        let (guard, runtime) = guard.into_parts();
        runtime
            .call(|| self.lock.downgrade(guard))
            .map(|g| LockGuard::new(g, Arc::clone(&self.runtime)))
    }

    /// Holder, readers, remaining ttl and last fence.
    ///
    /// # Errors
    /// Store failures; `InvalidArgument` inside a runtime.
    pub fn state(&self) -> Result<LockState> {
        self.runtime.call(|| self.lock.state())
    }

    /// Whether anyone reads or writes now.
    ///
    /// # Errors
    /// Store failures; `InvalidArgument` inside a runtime.
    pub fn is_locked(&self) -> Result<bool> {
        self.runtime.call(|| self.lock.is_locked())
    }

    /// Deletes every hold, whoever holds it. **Dangerous**: see
    /// [`crate::RwLock::force_unlock`].
    ///
    /// # Errors
    /// Store failures; `InvalidArgument` inside a runtime.
    pub fn force_unlock(&self) -> Result<bool> {
        self.runtime.call(|| self.lock.force_unlock())
    }
}

/// A lock granted in arrival order: [`crate::FairLock`] for synchronous code.
#[derive(Clone, Debug)]
pub struct FairLock<B: RawFair> {
    lock: crate::FairLock<B>,
    runtime: Arc<Runtime>,
}

/// Options for a blocking [`FairLock`]; made by [`FairLock::builder`].
#[must_use = "a builder does nothing until .build()"]
#[derive(Debug)]
pub struct FairLockBuilder<B: RawFair> {
    builder: crate::FairLockBuilder<B>,
    runtime: Arc<Runtime>,
}

forward_options!(FairLockBuilder<B: RawFair>, "FairLockBuilder");

impl<B: RawFair> FairLockBuilder<B> {
    /// How long a waiter's place outlives its next expected attempt (as
    /// [`crate::FairLockBuilder::waiter_grace`]).
    pub fn waiter_grace(self, grace: Duration) -> Self {
        Self {
            builder: self.builder.waiter_grace(grace),
            ..self
        }
    }

    /// Checks the options and makes the lock.
    ///
    /// # Errors
    /// As [`crate::FairLockBuilder::build`].
    pub fn build(self) -> Result<FairLock<B>> {
        Ok(FairLock {
            lock: self.builder.build()?,
            runtime: self.runtime,
        })
    }
}

impl<B: RawFair> FairLock<B> {
    /// A fair lock named `name` with default options.
    ///
    /// # Errors
    /// As [`crate::FairLock::new`].
    pub fn new(client: &Client<B>, name: impl Into<String>) -> Result<FairLock<B>> {
        FairLock::builder(client, name).build()
    }

    /// Options for a fair lock named `name`.
    pub fn builder(client: &Client<B>, name: impl Into<String>) -> FairLockBuilder<B> {
        FairLockBuilder {
            builder: crate::FairLock::builder(client.backend.clone(), name),
            runtime: Arc::clone(&client.runtime),
        }
    }

    /// The same lock for async code.
    pub fn as_async(&self) -> &crate::FairLock<B> {
        &self.lock
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        self.lock.name()
    }

    /// Its keys in the store.
    pub fn keys(&self) -> &LockKeys {
        self.lock.keys()
    }

    /// Queues and blocks until the lock is ours.
    ///
    /// # Errors
    /// Store failures; `InvalidArgument` inside a runtime.
    pub fn lock(&self) -> Result<FairGuard<B>> {
        self.runtime
            .call(|| self.lock.lock())
            .map(|g| LockGuard::new(g, Arc::clone(&self.runtime)))
    }

    /// The lock if it is free and nobody is queued before us.
    ///
    /// # Errors
    /// Store failures; `InvalidArgument` inside a runtime.
    pub fn try_lock(&self) -> Result<Option<FairGuard<B>>> {
        self.runtime
            .call(|| self.lock.try_lock())
            .map(|g| held(&self.runtime, g))
    }

    /// Queues and blocks at most `timeout` (leaving the queue if it runs out).
    ///
    /// # Errors
    /// Store failures; `InvalidArgument` inside a runtime.
    pub fn try_lock_for(&self, timeout: Duration) -> Result<Option<FairGuard<B>>> {
        self.runtime
            .call(|| self.lock.try_lock_for(timeout))
            .map(|g| held(&self.runtime, g))
    }

    /// Holder token, remaining ttl, last fence and queued waiters.
    ///
    /// # Errors
    /// Store failures; `InvalidArgument` inside a runtime.
    pub fn state(&self) -> Result<LockState> {
        self.runtime.call(|| self.lock.state())
    }

    /// Whether anyone holds the lock now.
    ///
    /// # Errors
    /// Store failures; `InvalidArgument` inside a runtime.
    pub fn is_locked(&self) -> Result<bool> {
        self.runtime.call(|| self.lock.is_locked())
    }

    /// Deletes the holder whoever it is and wakes the next in line. **Dangerous**: see
    /// [`crate::FairLock::force_unlock`].
    ///
    /// # Errors
    /// Store failures; `InvalidArgument` inside a runtime.
    pub fn force_unlock(&self) -> Result<bool> {
        self.runtime.call(|| self.lock.force_unlock())
    }
}
