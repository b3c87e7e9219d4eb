//! A counting semaphore whose permits are leases.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use crate::engine::LeaseKind;
use crate::error::{Error, Result};
use crate::keys::LockKeys;
use crate::lock::{Lock, LockGuard};
use crate::options::{Options, builder_options};
use crate::raw::{Acquire, LockState, RawLock, RawSemaphore, ReleaseWatch};
use crate::token::Token;

/// Default key prefix of semaphores (apart from locks, so names never collide).
pub const DEFAULT_SEMAPHORE_PREFIX: &str = "dlock-sem:";

/// The most permits one semaphore can have.
pub const MAX_PERMITS: u32 = 1_000_000;

/// What a [`Semaphore`] does when the store holds a permit count for its name other than
/// the one it was built with (see [`SemaphoreBuilder::on_other_count`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum OtherCount {
    /// Every acquire refuses: [`ErrorKind::PermitsMismatch`](crate::ErrorKind::PermitsMismatch),
    /// nothing taken or queued. The default.
    #[default]
    Refuse,
    /// Every acquire (`acquire`, `try_acquire`, … — once per call, not per attempt) first
    /// sets the stored count to this semaphore's, as
    /// [`set_permits`](Semaphore::set_permits) does, then waits under whatever count is
    /// stored (another client that sets it meanwhile wins).
    Set,
    /// Acquires use the stored count whatever this semaphore's is (this semaphore's
    /// count is stored only where none is yet).
    Adopt,
}

/// A backend seen through one semaphore: acquiring takes `count` permits. This is what
/// lets a permit reuse the lock's guard, watchdog, `lost()` and waiting unchanged; its
/// leases are renewed by the client's engine together with every other lease of it.
#[derive(Clone, Debug)]
pub struct Permits<B> {
    backend: B,
    /// The semaphore's own count, shared by its clones (its own `set_permits` and
    /// `add_permits` change it).
    permits: Arc<AtomicU32>,
    count: u32,
    /// Refuse an attempt that finds another count stored.
    strict: bool,
}

impl<B: RawSemaphore> Permits<B> {
    fn permits(&self) -> u32 {
        self.permits.load(Ordering::Relaxed)
    }
}

impl<B: RawSemaphore> RawLock for Permits<B> {
    const LEASE_KIND: LeaseKind = LeaseKind::Permits;
    const PRIMITIVE: &'static str = crate::observe::primitive::SEMAPHORE;
    const QUEUES_WAITERS: bool = B::QUEUES_WAITERS;
    const QUEUES_ONLY_LISTENERS: bool = B::QUEUES_ONLY_LISTENERS;

    async fn acquire(&self, keys: &LockKeys, token: &Token, ttl: Duration) -> Result<Acquire> {
        self.backend
            .acquire_permits(
                keys,
                token,
                self.count,
                self.permits(),
                self.strict,
                ttl,
                false,
            )
            .await
    }

    async fn acquire_or_queue(
        &self,
        keys: &LockKeys,
        token: &Token,
        ttl: Duration,
    ) -> Result<Acquire> {
        self.backend
            .acquire_permits(
                keys,
                token,
                self.count,
                self.permits(),
                self.strict,
                ttl,
                true,
            )
            .await
    }

    /// A queued waiter listens for its own wake-up (or hand-over), where the store serves
    /// one waiter per freed permit.
    async fn watch_for(&self, keys: &LockKeys, token: &Token) -> Result<ReleaseWatch> {
        self.backend.watch_for(keys, token).await
    }

    fn watch_ready(&self, keys: &LockKeys, token: &Token) -> Option<ReleaseWatch> {
        self.backend.watch_ready(keys, token)
    }

    async fn abandon(&self, keys: &LockKeys, token: &Token, ttl: Duration) -> Result<()> {
        self.backend
            .abandon_permits(keys, token, self.count, ttl)
            .await
    }

    async fn release(&self, keys: &LockKeys, token: &Token) -> Result<bool> {
        self.backend.release_permits(keys, token).await
    }

    async fn extend(&self, keys: &LockKeys, token: &Token, ttl: Duration) -> Result<bool> {
        self.backend.extend_permits(keys, token, ttl).await
    }

    /// A woken waiter that got permits passes the wake-up on: more may be free.
    fn shares_grants(&self) -> bool {
        self.permits() > 1
    }

    crate::raw::client_hooks!(backend);
}

/// Held permits: released (given back) by `release().await`, in the background when
/// dropped, or by themselves when their lease runs out. `fencing_token()` does not exist
/// for permits: holders of a semaphore do not exclude each other.
pub type SemaphorePermit<B> = LockGuard<Permits<B>>;

/// At most `permits` holders across every process using the same name on the same store.
///
/// Every holder's permits are a lease renewed by the watchdog while held, so a crashed
/// holder's permits come back within the ttl (a semaphore whose permits never expire
/// leaks them for good).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> fencelock::Result<()> {
/// use fencelock::{Semaphore, backend::Memory};
///
/// let sem = Semaphore::new(Memory::new(), "exports", 2)?;
/// let a = sem.acquire().await?;
/// let b = sem.try_acquire().await?.expect("a second permit");
/// assert!(sem.try_acquire().await?.is_none()); // both taken
/// assert_eq!(sem.available_permits().await?, 0);
/// a.release().await?;
/// assert_eq!(sem.available_permits().await?, 1);
/// # drop(b);
/// # Ok(()) }
/// ```
///
/// # The permit count
///
/// The count is stored with the semaphore's name, shared by every client: the first to
/// acquire stores its own, [`set_permits`](Semaphore::set_permits) and
/// [`add_permits`](Semaphore::add_permits) change it. A semaphore built with another count
/// than the stored one is **refused** by default: every acquire fails with
/// [`ErrorKind::PermitsMismatch`](crate::ErrorKind::PermitsMismatch) (the message names
/// the stored count) and takes nothing, rather than silently running under a count its
/// caller did not ask for. [`SemaphoreBuilder::on_other_count`] sets the count instead
/// ([`OtherCount::Set`]) or adopts the stored one ([`OtherCount::Adopt`]). A semaphore's
/// own `set_permits` and `add_permits` make the new count its own too. A waiter whose
/// count an operator changes meanwhile is refused at its next attempt.
///
/// On ZooKeeper the count lives in the semaphore's directory, which the server reaps once
/// no holder or waiter is left in it: the next client then stores its own count. On etcd
/// it is a key without a lease, kept after the last holder.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> fencelock::Result<()> {
/// use fencelock::{ErrorKind, OtherCount, Semaphore, backend::Memory};
///
/// let store = Memory::new();
/// let five = Semaphore::new(store.client(), "exports", 5)?;
/// let _permit = five.acquire().await?; // the store's count is now 5
/// let one = Semaphore::new(store.client(), "exports", 1)?;
/// let err = one.try_acquire().await.unwrap_err();
/// assert_eq!(err.kind(), ErrorKind::PermitsMismatch);
/// let one = Semaphore::builder(store.client(), "exports", 1)
///     .on_other_count(OtherCount::Set)
///     .build()?;
/// assert!(one.try_acquire().await?.is_none()); // set to 1, held by the first
/// assert_eq!(five.stored_permits().await?, Some(1));
/// # Ok(()) }
/// ```
///
/// # Correctness
///
/// While the store keeps its keys, at most `permits` permits are held by leases that are
/// valid by the store's clock: every acquire first drops the leases that ran out, then
/// grants only within the count, in one atomic step. A holder paused past its lease may
/// still act on a permit it no longer has (as with any lease; permits carry no fence), a
/// restart without persistence forgets every permit, and lowering the count with
/// `set_permits` does not take permits back from their holders.
#[derive(Clone, Debug)]
pub struct Semaphore<B: RawSemaphore> {
    /// One permit seen as a lock; `acquire_many` reuses its options with another count.
    one: Lock<Permits<B>>,
    /// [`OtherCount::Set`]: each acquire sets the stored count first.
    sets_count: bool,
}

/// Options for a [`Semaphore`]; made by [`Semaphore::builder`].
#[must_use = "a builder does nothing until .build()"]
#[derive(Debug)]
pub struct SemaphoreBuilder<B: RawSemaphore> {
    backend: B,
    permits: u32,
    other_count: OtherCount,
    options: Options,
}

builder_options!(SemaphoreBuilder<B: RawSemaphore>, DEFAULT_SEMAPHORE_PREFIX);

impl<B: RawSemaphore> SemaphoreBuilder<B> {
    /// What acquiring does when the store holds another permit count for the name than
    /// this semaphore's: refuse with
    /// [`ErrorKind::PermitsMismatch`](crate::ErrorKind::PermitsMismatch) (the default),
    /// set the stored count to this one, or adopt the stored one (see [`OtherCount`] and
    /// [the permit count](Semaphore#the-permit-count)).
    pub fn on_other_count(mut self, rule: OtherCount) -> Self {
        self.other_count = rule;
        self
    }

    /// Checks the options and makes the semaphore.
    ///
    /// # Errors
    /// `InvalidArgument` for a bad name, prefix, ttl or retry, or `permits` of 0 or above
    /// [`MAX_PERMITS`].
    pub fn build(self) -> Result<Semaphore<B>> {
        check_permits(self.permits)?;
        let adapter = Permits {
            backend: self.backend,
            permits: Arc::new(AtomicU32::new(self.permits)),
            count: 1,
            strict: self.other_count == OtherCount::Refuse,
        };
        Ok(Semaphore {
            one: Lock::from_options(adapter, &self.options)?,
            sets_count: self.other_count == OtherCount::Set,
        })
    }
}

fn check_permits(permits: u32) -> Result<()> {
    if permits == 0 || permits > MAX_PERMITS {
        return Err(Error::invalid(format!(
            "a semaphore needs 1 to {MAX_PERMITS} permits, not {permits}"
        )));
    }
    Ok(())
}

impl<B: RawSemaphore> Semaphore<B> {
    /// A semaphore named `name` with `permits` permits (stored if the store has no count
    /// for it yet; another stored count refuses its acquires, see
    /// [the permit count](Semaphore#the-permit-count)) and default options (30 s leases,
    /// watchdog on, prefix `dlock-sem:`).
    ///
    /// # Errors
    /// `InvalidArgument` for a bad name, or `permits` of 0 or above [`MAX_PERMITS`].
    pub fn new(backend: B, name: impl Into<String>, permits: u32) -> Result<Semaphore<B>> {
        Semaphore::builder(backend, name, permits).build()
    }

    /// Options for a semaphore named `name` with `permits` permits.
    pub fn builder(backend: B, name: impl Into<String>, permits: u32) -> SemaphoreBuilder<B> {
        SemaphoreBuilder {
            backend,
            permits,
            other_count: OtherCount::default(),
            options: Options::new(name.into(), DEFAULT_SEMAPHORE_PREFIX),
        }
    }

    /// This semaphore's own permit count: what it was built with, or last set (or added
    /// to) through it.
    pub fn permits(&self) -> u32 {
        self.one.backend().permits()
    }

    /// With [`OtherCount::Set`], sets the stored count to this semaphore's (once per
    /// acquire call).
    async fn before_acquiring(&self) -> Result<()> {
        if self.sets_count {
            self.set_permits(self.permits()).await?;
        }
        Ok(())
    }

    /// The semaphore's name.
    pub fn name(&self) -> &str {
        self.one.name()
    }

    /// Its keys in the store.
    pub fn keys(&self) -> &LockKeys {
        self.one.keys()
    }

    /// One permit seen as a lock: what [`acquire`](Semaphore::acquire) and friends wait on
    /// (for tools that handle locks and permits alike). Acquiring through it follows this
    /// semaphore's rule for another stored count, except that it never sets the count
    /// ([`OtherCount::Set`] is applied by the semaphore's own methods; through this lock
    /// it adopts the stored count).
    pub fn permit_lock(&self) -> &Lock<Permits<B>> {
        &self.one
    }

    fn many(&self, n: u32) -> Result<Lock<Permits<B>>> {
        if n == 0 || n > self.permits() {
            return Err(Error::invalid(format!(
                "cannot take {n} permits of a semaphore of {}",
                self.permits()
            )));
        }
        Ok(self.one.with_backend(Permits {
            count: n,
            ..self.one.backend().clone()
        }))
    }

    /// Waits for one permit.
    ///
    /// # Errors
    /// `PermitsMismatch` if the store holds another permit count (see
    /// [the permit count](Semaphore#the-permit-count)); store failures.
    ///
    /// # Cancel safety
    /// Cancel-safe: a cancelled wait leaves no permit taken and no renewal behind.
    pub async fn acquire(&self) -> Result<SemaphorePermit<B>> {
        self.before_acquiring().await?;
        self.one.lock().await
    }

    /// Waits for `n` permits, taken all at once.
    ///
    /// # Errors
    /// `InvalidArgument` if `n` is 0 or more than the semaphore's permits; as
    /// [`acquire`](Semaphore::acquire).
    ///
    /// # Cancel safety
    /// Cancel-safe, as [`acquire`](Semaphore::acquire).
    pub async fn acquire_many(&self, n: u32) -> Result<SemaphorePermit<B>> {
        let many = self.many(n)?;
        self.before_acquiring().await?;
        many.lock().await
    }

    /// One permit if one is free now.
    ///
    /// # Errors
    /// As [`acquire`](Semaphore::acquire).
    ///
    /// # Cancel safety
    /// Cancel-safe, as [`acquire`](Semaphore::acquire).
    pub async fn try_acquire(&self) -> Result<Option<SemaphorePermit<B>>> {
        self.before_acquiring().await?;
        self.one.try_lock().await
    }

    /// `n` permits if they are free now.
    ///
    /// # Errors
    /// As [`acquire_many`](Semaphore::acquire_many).
    ///
    /// # Cancel safety
    /// Cancel-safe, as [`acquire`](Semaphore::acquire).
    pub async fn try_acquire_many(&self, n: u32) -> Result<Option<SemaphorePermit<B>>> {
        let many = self.many(n)?;
        self.before_acquiring().await?;
        many.try_lock().await
    }

    /// One permit, waiting at most `timeout`.
    ///
    /// # Errors
    /// As [`acquire`](Semaphore::acquire).
    ///
    /// # Cancel safety
    /// Cancel-safe, as [`acquire`](Semaphore::acquire).
    pub async fn try_acquire_for(&self, timeout: Duration) -> Result<Option<SemaphorePermit<B>>> {
        self.before_acquiring().await?;
        self.one.try_lock_for(timeout).await
    }

    /// Permits free now (a snapshot).
    ///
    /// # Errors
    /// Store failures.
    pub async fn available_permits(&self) -> Result<u32> {
        let (used, permits) = crate::observe::observed!(
            self.one.obs(),
            self.one.name(),
            crate::observe::span::PERMITS,
            crate::observe::op::PERMITS_IN_USE,
            self.one
                .backend()
                .backend
                .permits_in_use(self.keys(), self.permits())
        )?;
        Ok(permits.saturating_sub(used))
    }

    /// The permit count the store holds for this semaphore's name, `None` if none is
    /// stored yet (nobody acquired it, or — ZooKeeper — its directory was reaped).
    ///
    /// # Errors
    /// Store failures.
    pub async fn stored_permits(&self) -> Result<Option<u32>> {
        // No count is 0, which no stored count can be.
        let (_, stored) = crate::observe::observed!(
            self.one.obs(),
            self.one.name(),
            crate::observe::span::PERMITS,
            crate::observe::op::PERMITS_IN_USE,
            self.one.backend().backend.permits_in_use(self.keys(), 0)
        )?;
        Ok((stored > 0).then_some(stored))
    }

    /// Sets the permit count for every client of this semaphore (operators), and makes it
    /// this semaphore's own count. Holders above a lowered count keep their permits until
    /// they release them; other clients built with another count are refused from now on
    /// (see [the permit count](Semaphore#the-permit-count)).
    ///
    /// # Errors
    /// `InvalidArgument` for 0 or more than [`MAX_PERMITS`]; store failures.
    pub async fn set_permits(&self, permits: u32) -> Result<()> {
        check_permits(permits)?;
        crate::observe::observed!(
            self.one.obs(),
            self.one.name(),
            crate::observe::span::PERMITS,
            crate::observe::op::SET_PERMITS,
            self.one.backend().backend.set_permits(self.keys(), permits)
        )?;
        self.one.backend().permits.store(permits, Ordering::Relaxed);
        Ok(())
    }

    /// Adds `n` permits (negative: removes them) to the stored count, atomically with
    /// other operators' changes, and wakes waiters. Returns the new count, which becomes
    /// this semaphore's own. Holders above a lowered count keep their permits until they
    /// release them.
    ///
    /// # Errors
    /// `InvalidArgument` if the count would leave 1 to [`MAX_PERMITS`] (nothing changes);
    /// store failures.
    pub async fn add_permits(&self, n: i64) -> Result<u32> {
        crate::observe::observed!(
            self.one.obs(),
            self.one.name(),
            crate::observe::span::PERMITS,
            crate::observe::op::ADD_PERMITS,
            self.one
                .backend()
                .backend
                .add_permits(self.keys(), n, self.permits(), MAX_PERMITS)
        )?
        .ok_or_else(|| {
            Error::invalid(format!(
                "adding {n} permits would leave the semaphore outside 1 to {MAX_PERMITS}"
            ))
        })
        .inspect(|&count| self.one.backend().permits.store(count, Ordering::Relaxed))
    }

    /// Permits in use (`hold_count`), live holders (`holders`) and the latest lease's
    /// remaining ttl (`remaining`).
    ///
    /// # Errors
    /// Store failures.
    pub async fn state(&self) -> Result<LockState> {
        crate::observe::observed!(
            self.one.obs(),
            self.one.name(),
            crate::observe::span::INSPECT,
            crate::observe::op::INSPECT,
            self.one
                .backend()
                .backend
                .inspect(crate::raw::Kind::Semaphore, self.keys())
        )
    }

    /// Whether any permit is held now.
    ///
    /// # Errors
    /// Store failures.
    pub async fn is_locked(&self) -> Result<bool> {
        Ok(self.state().await?.hold_count.unwrap_or(0) > 0)
    }

    /// Takes every permit back from every holder and wakes waiters. **Dangerous**: the
    /// holders keep working until their next renewal tells them (their `lost()` fires).
    /// Returns whether any permit was held.
    ///
    /// # Errors
    /// Store failures.
    pub async fn force_unlock(&self) -> Result<bool> {
        crate::observe::observed!(
            self.one.obs(),
            self.one.name(),
            crate::observe::span::FORCE_UNLOCK,
            crate::observe::op::FORCE_UNLOCK,
            self.one
                .backend()
                .backend
                .force_unlock(crate::raw::Kind::Semaphore, self.keys())
        )
    }
}
