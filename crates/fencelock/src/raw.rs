//! The contract between the primitives and the stores.
//!
//! Every user-facing primitive ([`Lock`](crate::Lock) and its guard, the watchdog, waiting)
//! is written once, generic over these traits; a store implements only the small
//! operations below. What a store cannot guarantee is a missing trait impl, so the
//! compiler refuses code that relies on it (a [`LockGuard`](crate::LockGuard) only has
//! `fencing_token()` when its backend implements [`RawFencing`]).

use std::future::Future;
use std::time::Duration;

use crate::engine::Engine;
use crate::error::Result;
use crate::keys::LockKeys;
use crate::token::Token;

pub use crate::engine::{Acquire, LeaseKind, ReleaseWatch, Renewal, Subscription};
pub use crate::keys::RECORD;

/// A mutual-exclusion lease in a store.
///
/// # Correctness
///
/// An implementation must guarantee, for each lock key:
///
/// 1. **Atomic acquire with expiry.** [`acquire`](RawLock::acquire) sets the key to the
///    token *and* its expiry in one indivisible step, and only if the key is absent. There
///    must be no moment at which the key exists without an expiry (the classic articles'
///    `SETNX`-then-`EXPIRE` is the bug this rules out).
/// 2. **Owner-checked mutation.** [`release`](RawLock::release) and
///    [`extend`](RawLock::extend) act only if the key still holds *this* token, checked
///    and applied in one indivisible step (never `GET` then `DEL`), and report whether they
///    did. They are idempotent: repeating one whose reply was lost does no harm.
///    Acquire is idempotent per token too: an acquire repeated with the token that
///    already holds the key reports `Acquired` again (and renews the expiry), because the
///    caller repeats an acquire whose reply it never saw with the same token.
/// 3. **Expiry is the store's.** The key disappears when its time to live runs out, by the
///    store's own clock; the client never decides expiry from its wall clock.
/// 4. **Release notification is advisory.** [`watch`](RawLock::watch) may miss messages;
///    waiters always also wake on the holder's remaining ttl, so a lost message costs
///    latency, never liveness.
///
/// Errors are [`crate::Error`]s: `Unavailable` / `TimedOut` when the outcome is unknown,
/// `Backend` when the store refused.
pub trait RawLock: Clone + Send + Sync + 'static {
    /// Whether an attempt that finds the lock held leaves a waiter entry in the store that
    /// [`abandon`](RawLock::abandon) must withdraw.
    const QUEUES_WAITERS: bool = false;

    /// Whether only [`acquire_or_queue`](RawLock::acquire_or_queue) queues (a plain
    /// [`acquire`](RawLock::acquire) never leaves an entry), so that a `try_lock` that
    /// found the lock held has nothing to withdraw.
    const QUEUES_ONLY_LISTENERS: bool = false;

    /// Whether [`acquire_or_queue`](RawLock::acquire_or_queue) may wait inside the store
    /// until the lock is free (PostgreSQL's waiters queue in its lock manager) rather than
    /// answer at once: a caller with a deadline then bounds the call by it (cancelling
    /// it, which the implementation must make safe).
    const WAITS_IN_STORE: bool = false;

    /// Which renewal the store applies to this primitive's leases (see
    /// [`extend_many`](RawLock::extend_many)). Adapters over the capability traits set
    /// their own.
    const LEASE_KIND: LeaseKind = LeaseKind::Lock;

    /// The primitive's name in spans and metric labels ([`observe`](crate::observe)): a
    /// short fixed word, one of [`observe::primitive`](crate::observe::primitive) for
    /// dlock's own adapters. Stores keep the default, `lock`.
    const PRIMITIVE: &'static str = crate::observe::primitive::LOCK;

    /// Tries once to set `keys.lock()` to `token` with a time to live of `ttl`, if absent.
    /// On success, a store that implements [`RawFencing`] mints the next fence of the name
    /// in the same atomic step.
    fn acquire(
        &self,
        keys: &LockKeys,
        token: &Token,
        ttl: Duration,
    ) -> impl Future<Output = Result<Acquire>> + Send;

    /// Like [`acquire`](RawLock::acquire), for a waiter already listening for its wake-up
    /// ([`watch_for`](RawLock::watch_for)): if the lock cannot be granted now, a store
    /// that wakes one waiter per release takes it into its waiter queue (withdrawn by
    /// [`abandon`](RawLock::abandon), or lapsing by itself if the waiter crashes). The
    /// default is a plain attempt.
    fn acquire_or_queue(
        &self,
        keys: &LockKeys,
        token: &Token,
        ttl: Duration,
    ) -> impl Future<Output = Result<Acquire>> + Send {
        self.acquire(keys, token, ttl)
    }

    /// One attempt as a member of a quorum ([`Quorum`](crate::backend::Quorum), RedLock):
    /// the key set to `token` with its expiry if absent — and nothing RedLock does not
    /// use: no fence minted, no waiter queued, no announcement. A store may report a
    /// repeat of its own granted request as `Held` here (the quorum then gives its grants
    /// back and tries again). The default is [`acquire`](RawLock::acquire).
    fn acquire_member(
        &self,
        keys: &LockKeys,
        token: &Token,
        ttl: Duration,
    ) -> impl Future<Output = Result<Acquire>> + Send {
        self.acquire(keys, token, ttl)
    }

    /// Releases a quorum member's key if it holds `token`, announcing nothing. The
    /// default is [`release`](RawLock::release).
    fn release_member(
        &self,
        keys: &LockKeys,
        token: &Token,
    ) -> impl Future<Output = Result<bool>> + Send {
        self.release(keys, token)
    }

    /// Deletes the lock key if it holds `token`, announcing the release to waiters.
    /// Returns whether the key held our token.
    fn release(&self, keys: &LockKeys, token: &Token) -> impl Future<Output = Result<bool>> + Send;

    /// Resets the lock key's time to live to `ttl` if it holds `token`. Returns whether it
    /// did.
    fn extend(
        &self,
        keys: &LockKeys,
        token: &Token,
        ttl: Duration,
    ) -> impl Future<Output = Result<bool>> + Send;

    /// Renews many leases at once: the engine's call, with every lease of this client
    /// that is due, of every primitive (each [`Renewal`] names its [`LeaseKind`]).
    /// Returns one result per renewal, in order.
    ///
    /// The default renews one after the other with [`extend`](RawLock::extend), which is
    /// right for a store that only implements the plain lock. A store that implements
    /// capability traits ([`RawSemaphore`], [`RawReentrant`], [`RawRwLock`]) must override
    /// it and apply each renewal by its kind; a store that can batch round trips should
    /// send the whole batch at once. Adapters pass batches to their client untouched.
    fn extend_many(&self, renewals: &[Renewal]) -> impl Future<Output = Vec<Result<bool>>> + Send {
        async move {
            let mut out = Vec::with_capacity(renewals.len());
            for r in renewals {
                out.push(self.extend(&r.keys, &r.token, r.ttl).await);
            }
            out
        }
    }

    /// Starts listening for releases of `keys`, so a waiter can sleep until one happens.
    /// The default returns [`ReleaseWatch::none`]: waiters then back off and retry.
    ///
    /// The subscription must be in effect when the returned future completes, so that a
    /// release after that moment is heard.
    fn watch(&self, keys: &LockKeys) -> impl Future<Output = Result<ReleaseWatch>> + Send {
        let _ = keys;
        async { Ok(ReleaseWatch::none()) }
    }

    /// Starts listening for the moment `token`'s holder-to-be may try again. Primitives
    /// that wake one chosen waiter (the fair lock's next in line) listen on a channel of
    /// their own; the default listens to every release of `keys`.
    fn watch_for(
        &self,
        keys: &LockKeys,
        token: &Token,
    ) -> impl Future<Output = Result<ReleaseWatch>> + Send {
        let _ = token;
        self.watch(keys)
    }

    /// A watch for `token` that is in effect already, without a round trip (the client
    /// still listens from an earlier wait), or `None`. With one, the first attempt of a
    /// wait can already queue. The default is `None`.
    fn watch_ready(&self, keys: &LockKeys, token: &Token) -> Option<ReleaseWatch> {
        let _ = (keys, token);
        None
    }

    /// Withdraws a waiter that stopped waiting (cancelled, timed out, failed) without
    /// being granted: primitives that queue waiters (fair lock, writers of a read-write
    /// lock) remove its entry here, so no queue position outlives it. `ttl` is the lease
    /// its attempts asked for. A store that hands the lock over to a queued waiter at
    /// release gives the lock on if it was handed to this waiter as it left. The default
    /// does nothing.
    fn abandon(
        &self,
        keys: &LockKeys,
        token: &Token,
        ttl: Duration,
    ) -> impl Future<Output = Result<()>> + Send {
        let _ = (keys, token, ttl);
        async { Ok(()) }
    }

    /// Whether one grant leaves room for more (readers, permits): a waiter that was woken
    /// and granted then passes the wake-up on to the next local waiter.
    fn shares_grants(&self) -> bool {
        false
    }

    /// The clock-drift allowance subtracted from this store's lease validity.
    fn drift(&self) -> crate::validity::Drift {
        crate::validity::Drift::DEFAULT
    }

    /// How long a grant or renewal that asked for `ttl` may count on (before the drift
    /// allowance). A store whose holds do not end per lock but with the client's session
    /// (ZooKeeper's ephemeral nodes) caps it at what the session guarantees; the default
    /// is `ttl`.
    fn lease_validity(&self, ttl: Duration) -> Duration {
        ttl
    }

    /// Names the store (not the client): clients of one store should return the same
    /// string. [`MultiLock`](crate::MultiLock) orders locks by key, then by this.
    fn store_id(&self) -> String {
        String::new()
    }

    /// The kind of store, for the `store` label of spans and metrics: a short fixed
    /// lowercase word (`"redis"`, `"etcd"`, …; never an address), declared by the store.
    /// The built-in stores name themselves (a [`Quorum`](crate::backend::Quorum) of Redis
    /// nodes is `"redlock"`); the default is `"other"`.
    fn store_label(&self) -> &'static str {
        "other"
    }

    /// The client's engine: one lease registry and renewal task for every primitive on
    /// this client. Clones of a client, and adapters over it, return the same engine.
    fn engine(&self) -> &Engine;
}

/// The [`RawLock`] hooks an adapter over a client (a semaphore's, a reentrant lock's, a
/// read-write lock's side, a fair lock's queue) takes from the client in its field
/// `$field` unchanged: the store's identity and label, its drift and lease bound, its
/// engine, and renewals (they go to the client's batch, whatever primitive they belong
/// to). One list, so that a hook added to the contract is forwarded by every adapter.
macro_rules! client_hooks {
    ($field:ident) => {
        fn store_id(&self) -> String {
            self.$field.store_id()
        }

        fn store_label(&self) -> &'static str {
            self.$field.store_label()
        }

        fn drift(&self) -> crate::validity::Drift {
            self.$field.drift()
        }

        fn lease_validity(&self, ttl: std::time::Duration) -> std::time::Duration {
            self.$field.lease_validity(ttl)
        }

        fn engine(&self) -> &crate::engine::Engine {
            self.$field.engine()
        }

        fn extend_many(
            &self,
            renewals: &[crate::engine::Renewal],
        ) -> impl std::future::Future<Output = Vec<crate::error::Result<bool>>> + Send {
            self.$field.extend_many(renewals)
        }
    };
}
pub(crate) use client_hooks;

/// `RawFair` for a store whose plain lock is already first come, first served (etcd's and
/// ZooKeeper's queues): the fair lock is the plain lock's recipe under the fair lock's
/// keys, and its waiters listen as the plain lock's do.
#[cfg(any(feature = "etcd", feature = "zookeeper"))]
macro_rules! fair_is_the_plain_lock {
    ($store:ty) => {
        /// The plain lock is already first come, first served here: the fair lock is the
        /// same recipe.
        impl crate::raw::RawFair for $store {
            async fn acquire_fair(
                &self,
                keys: &crate::keys::LockKeys,
                token: &crate::token::Token,
                ttl: std::time::Duration,
                _grace: std::time::Duration,
            ) -> crate::error::Result<crate::raw::Acquire> {
                crate::raw::RawLock::acquire(self, keys, token, ttl).await
            }

            async fn release_fair(
                &self,
                keys: &crate::keys::LockKeys,
                token: &crate::token::Token,
            ) -> crate::error::Result<bool> {
                crate::raw::RawLock::release(self, keys, token).await
            }

            async fn abandon_fair(
                &self,
                keys: &crate::keys::LockKeys,
                token: &crate::token::Token,
            ) -> crate::error::Result<()> {
                crate::raw::RawLock::release(self, keys, token)
                    .await
                    .map(|_| ())
            }

            async fn watch_fair(
                &self,
                keys: &crate::keys::LockKeys,
                token: &crate::token::Token,
            ) -> crate::error::Result<crate::raw::ReleaseWatch> {
                crate::raw::RawLock::watch_for(self, keys, token).await
            }
        }
    };
}
#[cfg(any(feature = "etcd", feature = "zookeeper"))]
pub(crate) use fair_is_the_plain_lock;

/// [`RawInspect::inspect`] and [`RawInspect::force_unlock`] for a store that keeps every
/// kind its own way: each kind goes to the store's inherent `inspect_<kind>` /
/// `force_unlock_<kind>` (`plain`, `permits`, `reentrant`, `rw`, `fair`).
macro_rules! inspect_each_kind {
    () => {
        async fn inspect(
            &self,
            kind: $crate::raw::Kind,
            keys: &$crate::keys::LockKeys,
        ) -> $crate::error::Result<$crate::raw::LockState> {
            use $crate::raw::Kind;
            match kind {
                Kind::Lock => self.inspect_plain(keys).await,
                Kind::Semaphore => self.inspect_permits(keys).await,
                Kind::Reentrant => self.inspect_reentrant(keys).await,
                Kind::RwLock => self.inspect_rw(keys).await,
                Kind::Fair => self.inspect_fair(keys).await,
            }
        }

        async fn force_unlock(
            &self,
            kind: $crate::raw::Kind,
            keys: &$crate::keys::LockKeys,
        ) -> $crate::error::Result<bool> {
            use $crate::raw::Kind;
            match kind {
                Kind::Lock => self.force_unlock_plain(keys).await,
                Kind::Semaphore => self.force_unlock_permits(keys).await,
                Kind::Reentrant => self.force_unlock_reentrant(keys).await,
                Kind::RwLock => self.force_unlock_rw(keys).await,
                Kind::Fair => self.force_unlock_fair(keys).await,
            }
        }
    };
}
pub(crate) use inspect_each_kind;

/// Marker: the fence returned by [`RawLock::acquire`] strictly increases with every grant
/// of the same lock name, across all clients of the store, and is minted atomically with
/// the grant.
///
/// # Correctness
///
/// Implement it only if no two grants of one name can ever carry the same fence and a
/// later grant never carries a smaller one — for as long as the store's fence counter is
/// durable. Say in the backend's docs what loses the counter (a restart without
/// persistence, eviction).
pub trait RawFencing: RawLock {}

/// Counting permits in a store: each holder's permits are one lease (token, count,
/// expiry), so a crashed holder's permits come back by themselves.
///
/// # Correctness
///
/// [`acquire_permits`](RawSemaphore::acquire_permits) first drops the leases that ran out
/// (by the store's clock), then grants `n` permits only if the live holders' permits plus
/// `n` stay within the permit count — in one atomic step. Release and extend act only on
/// a live lease under the given token. The permit count is stored with the semaphore: the
/// first client's `permits` sets it, [`set_permits`](RawSemaphore::set_permits) changes it
/// (holders above a lowered count keep their permits until they release). An attempt
/// with `strict` that finds another count stored takes nothing, queues nothing, and fails
/// with [`ErrorKind::PermitsMismatch`](crate::ErrorKind::PermitsMismatch)
/// ([`Error::permits_mismatch`](crate::Error::permits_mismatch)), decided in the same
/// atomic step as the grant where the store can.
pub trait RawSemaphore: RawInspect {
    /// Takes `n` permits under `token` for `ttl`, if free; else reports when the earliest
    /// lease ends (`Held { remaining }`). `permits` is the count stored if none is yet;
    /// with `strict`, a stored count other than `permits` refuses the attempt
    /// ([`ErrorKind::PermitsMismatch`](crate::ErrorKind::PermitsMismatch)); without, the
    /// stored count is used. With `queue` (the caller listens for its wake-up), a store
    /// that wakes one waiter per release queues it, as [`RawLock::acquire_or_queue`] does.
    #[allow(clippy::too_many_arguments)]
    fn acquire_permits(
        &self,
        keys: &LockKeys,
        token: &Token,
        n: u32,
        permits: u32,
        strict: bool,
        ttl: Duration,
        queue: bool,
    ) -> impl Future<Output = Result<Acquire>> + Send;

    /// Withdraws a queued permit waiter that wanted `n` permits for `ttl` (see
    /// [`RawLock::abandon`]). The default does nothing.
    fn abandon_permits(
        &self,
        keys: &LockKeys,
        token: &Token,
        n: u32,
        ttl: Duration,
    ) -> impl Future<Output = Result<()>> + Send {
        let _ = (keys, token, n, ttl);
        async { Ok(()) }
    }

    /// Gives back the permits held under `token` and wakes waiters. Returns whether a live
    /// lease was released.
    fn release_permits(
        &self,
        keys: &LockKeys,
        token: &Token,
    ) -> impl Future<Output = Result<bool>> + Send;

    /// Renews the lease of the permits held under `token`. Returns whether it was live.
    fn extend_permits(
        &self,
        keys: &LockKeys,
        token: &Token,
        ttl: Duration,
    ) -> impl Future<Output = Result<bool>> + Send;

    /// `(permits in use by live leases, the permit count)`; `permits` where none is stored.
    fn permits_in_use(
        &self,
        keys: &LockKeys,
        permits: u32,
    ) -> impl Future<Output = Result<(u32, u32)>> + Send;

    /// Sets the permit count (for operators).
    fn set_permits(&self, keys: &LockKeys, permits: u32)
    -> impl Future<Output = Result<()>> + Send;

    /// Adds `delta` permits (negative: removes them) to the stored count (`permits` if
    /// none is stored yet), atomically, keeping it within `1..=max`. Returns the new
    /// count, or `None` if it would leave that range (then nothing changed).
    fn add_permits(
        &self,
        keys: &LockKeys,
        delta: i64,
        permits: u32,
        max: u32,
    ) -> impl Future<Output = Result<Option<u32>>> + Send;
}

/// The permit count `delta` makes of `count` for [`RawSemaphore::add_permits`]: `None`
/// if it would leave `1..=max`. Stores that change the count by a read-and-write loop use
/// it as their step.
#[cfg(any(feature = "etcd", feature = "zookeeper", feature = "memcached"))]
pub(crate) fn added_permits(count: u32, delta: i64, max: u32) -> Option<u32> {
    u32::try_from(i64::from(count) + delta)
        .ok()
        .filter(|n| (1..=max).contains(n))
}

/// A lock that its holder may take again: a hold count per owner.
///
/// # Correctness
///
/// [`acquire_reentrant`](RawReentrant::acquire_reentrant) grants when the lock is free (hold
/// count 1, a new fence) or already held by `owner` (count + 1, the first grant's fence,
/// expiry renewed), in one atomic step. Every hold is recorded under its own request
/// `token`: a repeat of a granted request finds its token and is granted again without
/// counting twice; a release takes back only the hold of its token, so a repeated
/// release changes nothing; renewal checks that the token's hold is live.
pub trait RawReentrant: RawInspect {
    /// Takes one hold for `owner` under request `token`.
    ///
    /// # Errors
    /// [`ErrorKind::LimitReached`](crate::ErrorKind::LimitReached) if `owner` already holds
    /// `limit` holds; store failures.
    /// With `queue` (the caller listens for its wake-up), a store that wakes one waiter
    /// per release queues a caller that must wait, as [`RawLock::acquire_or_queue`] does;
    /// it withdraws through [`RawLock::abandon`].
    fn acquire_reentrant(
        &self,
        keys: &LockKeys,
        owner: &str,
        token: &Token,
        ttl: Duration,
        limit: u32,
        queue: bool,
    ) -> impl Future<Output = Result<Acquire>> + Send;

    /// Gives back `owner`'s hold taken under `token` (the last hold deletes the lock and
    /// announces it). Returns whether that hold was live.
    fn release_reentrant(
        &self,
        keys: &LockKeys,
        owner: &str,
        token: &Token,
    ) -> impl Future<Output = Result<bool>> + Send;

    /// Renews the lock's expiry if the hold under `token` is live.
    fn extend_reentrant(
        &self,
        keys: &LockKeys,
        token: &Token,
        ttl: Duration,
    ) -> impl Future<Output = Result<bool>> + Send;
}

/// Readers and writers: many readers or one writer, writers first.
///
/// # Correctness
///
/// The writer holds the lock key (as a plain lock: token, expiry, a new fence per grant);
/// every reader has a lease of its own with its own expiry (by the store's clock), so a
/// crashed reader cannot block writers for longer than its ttl. In one atomic step,
/// [`acquire_rw`](RawRwLock::acquire_rw) drops expired readers and expired writer-waiting
/// entries, then grants
/// * a read if no writer holds the lock and no writer waits (writers first: a stream of
///   readers cannot starve a writer);
/// * a write if no writer and no live reader holds the lock; otherwise it records the
///   writer as waiting until `remaining + grace` (refreshed at every attempt, withdrawn
///   by [`RawLock::abandon`]), so a crashed waiting writer holds readers back for a
///   bounded time only.
///
/// Repeats of a granted request (same token) are granted again, not twice.
pub trait RawRwLock: RawInspect {
    /// Whether a reader's attempt that finds the lock held leaves an entry in the store
    /// (ZooKeeper: the reader's node in the queue) that
    /// [`abandon_rw`](RawRwLock::abandon_rw) must withdraw. Writers always may.
    const READERS_QUEUE: bool = false;

    /// Starts listening for the moment `token`'s reader (`write == false`) or writer may
    /// try again. The default listens on the side channels a release announces on
    /// (writers one at a time, readers all together).
    fn watch_rw(
        &self,
        keys: &LockKeys,
        token: &Token,
        write: bool,
    ) -> impl Future<Output = Result<ReleaseWatch>> + Send {
        let side = keys.side(if write { "w" } else { "r" });
        async move {
            if write {
                self.watch_for(&side, token).await
            } else {
                self.watch(&side).await
            }
        }
    }

    /// Tries once to take the lock for reading (`write == false`) or writing.
    fn acquire_rw(
        &self,
        keys: &LockKeys,
        token: &Token,
        write: bool,
        ttl: Duration,
        grace: Duration,
    ) -> impl Future<Output = Result<Acquire>> + Send;

    /// Releases the writer's or a reader's hold under `token` (announcing it when a writer
    /// may now come in). Returns whether it was live.
    fn release_rw(
        &self,
        keys: &LockKeys,
        token: &Token,
    ) -> impl Future<Output = Result<bool>> + Send;

    /// Renews the writer's or a reader's lease under `token`. Returns whether it was live.
    fn extend_rw(
        &self,
        keys: &LockKeys,
        token: &Token,
        ttl: Duration,
    ) -> impl Future<Output = Result<bool>> + Send;

    /// Turns the write hold under `token` into a read hold with a lease of `ttl`, in one
    /// atomic step (no other writer can come in between). Returns whether the write hold
    /// was live.
    fn downgrade_rw(
        &self,
        keys: &LockKeys,
        token: &Token,
        ttl: Duration,
    ) -> impl Future<Output = Result<bool>> + Send;

    /// Withdraws the waiting-writer entry of `token`.
    fn abandon_rw(&self, keys: &LockKeys, token: &Token)
    -> impl Future<Output = Result<()>> + Send;
}

/// First come, first served: a queue of waiters in the store.
///
/// # Correctness
///
/// The holder is the lock key, as a plain lock's (token, expiry, a fence per grant), so
/// [`RawLock::extend`] renews it. In one atomic step,
/// [`acquire_fair`](RawFair::acquire_fair) drops waiters whose claim expired, puts
/// `token` at the back of the queue if it is not in it, and grants only if the lock is
/// free and `token` is at the head. A waiter's claim lasts until its next expected attempt
/// plus `grace`, renewed at every attempt, so a crashed waiter leaves the queue by itself.
/// [`release_fair`](RawFair::release_fair) announces the release to the head waiter only
/// (on its own channel, see [`LockKeys::side`](crate::keys::LockKeys::side)).
pub trait RawFair: RawInspect {
    /// Tries once, queueing `token` if it must wait.
    fn acquire_fair(
        &self,
        keys: &LockKeys,
        token: &Token,
        ttl: Duration,
        grace: Duration,
    ) -> impl Future<Output = Result<Acquire>> + Send;

    /// Releases the lock if `token` holds it and wakes the next waiter in line.
    fn release_fair(
        &self,
        keys: &LockKeys,
        token: &Token,
    ) -> impl Future<Output = Result<bool>> + Send;

    /// Takes `token` out of the queue (waking the next in line if it was at the head).
    fn abandon_fair(
        &self,
        keys: &LockKeys,
        token: &Token,
    ) -> impl Future<Output = Result<()>> + Send;

    /// Starts listening for `token`'s turn. The default listens on the waiter's own
    /// channel ([`LockKeys::side`](crate::keys::LockKeys::side)), where
    /// [`release_fair`](RawFair::release_fair) announces the next in line; a store whose
    /// plain lock is already first come, first served listens as its plain waiters do.
    fn watch_fair(
        &self,
        keys: &LockKeys,
        token: &Token,
    ) -> impl Future<Output = Result<ReleaseWatch>> + Send {
        let side = keys.side(token.as_str());
        async move { self.watch(&side).await }
    }
}

/// The leader's record of an election: who leads, in which term, advertising what.
///
/// [`Election`](crate::Election) is the plain lock (its queue of candidates, its lease, its
/// fence as the term) plus this one record, written by the leader after its grant, on
/// every [`proclaim`](crate::Leadership::proclaim), and once more just before the release
/// of a resignation ([`resign`](crate::Leadership::resign)): then without a value (no line
/// break in `data`), saying since when the seat is empty, so that observers woken by its
/// announcement report the vacancy at once.
///
/// # Correctness
///
/// [`publish`](RawElection::publish) writes `(term, data)` only while `token` holds the
/// election's lock (the plain lock at `keys`), checked and written in one atomic step
/// where the store can (every store but memcached, which checks the holder just before a
/// compare-and-swap of the record), and then announces the write to
/// [`watch_record`](RawElection::watch_record)'s listeners, as a release is announced. So
/// a deposed leader that wakes up late cannot overwrite its successor's record, and an
/// announcement repeated after a store lost the lock (a restart) writes nothing. Terms are
/// **not** compared: a store whose fence counter was reset (a restart without persistence)
/// mints smaller terms again, and its elections must go on. The record has no expiry (like
/// the fence counter): readers compare its token with the lock's holder, so a record left
/// by a crashed leader is never shown as current.
pub trait RawElection: RawFencing + RawInspect {
    /// Writes the record if `token` holds the lock now. Returns whether it did (`false`:
    /// the lock is not `token`'s, the leadership is lost).
    fn publish(
        &self,
        keys: &LockKeys,
        token: &Token,
        term: u64,
        data: &str,
    ) -> impl Future<Output = Result<bool>> + Send;

    /// The stored record `(term, data)`, if any.
    fn record(&self, keys: &LockKeys)
    -> impl Future<Output = Result<Option<(u64, String)>>> + Send;

    /// Starts listening for writes of the record. The default listens on the record's
    /// side channel ([`RECORD`]) as a waiter listens for releases; a store that cannot
    /// notify returns [`ReleaseWatch::none`] (observers then read again at a fallback
    /// interval).
    fn watch_record(&self, keys: &LockKeys) -> impl Future<Output = Result<ReleaseWatch>> + Send {
        let side = keys.side(RECORD);
        async move { self.watch(&side).await }
    }
}

/// What the store says about one lock right now.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockState {
    /// The token at the lock key, if it is held.
    pub holder: Option<String>,
    /// The holder's remaining time to live (`None` if not held, or held without expiry).
    pub remaining: Option<Duration>,
    /// The last fence minted for this name (`None` if none ever was, or the store has no
    /// fences). It can be above the holder's own fence: on Redis a free lock's grant
    /// mints its fence in the same transaction as its `SET NX`, so an attempt that found
    /// the lock held took a number nobody holds (fences only have to increase).
    pub last_fence: Option<u64>,
    /// How many clients listen for its release (waiting), where the store can tell.
    pub waiting_clients: Option<u64>,
    /// A reentrant lock's hold count of its holder; a semaphore's permits in use.
    pub hold_count: Option<u32>,
    /// How many holders share it now: a read-write lock's live readers, a semaphore's
    /// live permit holders.
    pub holders: Option<u32>,
    /// Waiters with a place in the store's queue (fair lock; writers of a read-write
    /// lock).
    pub queued: Option<u32>,
    /// Who the holder said it is (host, pid, command, since), read from its token: `None`
    /// if it attached nothing (see [`HolderInfo`](crate::HolderInfo)).
    pub holder_info: Option<crate::HolderInfo>,
}

impl LockState {
    /// A state built by a backend.
    pub fn new(
        holder: Option<String>,
        remaining: Option<Duration>,
        last_fence: Option<u64>,
    ) -> Self {
        LockState {
            holder_info: holder.as_deref().and_then(crate::HolderInfo::from_token),
            holder,
            remaining,
            last_fence,
            waiting_clients: None,
            hold_count: None,
            holders: None,
            queued: None,
        }
    }

    /// With a reentrant lock's hold count.
    #[must_use]
    pub fn with_hold_count(mut self, n: u32) -> Self {
        self.hold_count = Some(n);
        self
    }

    /// With the number of holders sharing it (readers, permit holders).
    #[must_use]
    pub fn with_holders(mut self, n: u32) -> Self {
        self.holders = Some(n);
        self
    }

    /// With the number of queued waiters.
    #[must_use]
    pub fn with_queued(mut self, n: u32) -> Self {
        self.queued = Some(n);
        self
    }

    /// With the number of clients waiting for a release.
    #[must_use]
    pub fn with_waiting_clients(mut self, n: u64) -> Self {
        self.waiting_clients = Some(n);
        self
    }
}

/// Which primitive an operator's [`RawInspect`] call is about: each keeps its state at
/// its lock key its own way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Kind {
    /// A plain lock ([`Lock`](crate::Lock), and an [`Election`](crate::Election)'s).
    Lock,
    /// A semaphore ([`RawSemaphore`]).
    Semaphore,
    /// A reentrant lock ([`RawReentrant`]).
    Reentrant,
    /// A read-write lock ([`RawRwLock`]).
    RwLock,
    /// A fair lock ([`RawFair`]).
    Fair,
}

impl Kind {
    /// The kind in a sentence: "a lock", "a semaphore", …
    pub fn described(self) -> &'static str {
        match self {
            Kind::Lock => "a lock",
            Kind::Semaphore => "a semaphore",
            Kind::Reentrant => "a reentrant lock",
            Kind::RwLock => "a read-write lock",
            Kind::Fair => "a fair lock",
        }
    }

    /// The error of a store that does not offer this kind:
    /// [`ErrorKind::Unsupported`](crate::ErrorKind::Unsupported), naming the store's
    /// label and the kind.
    pub fn unsupported(self, store: &str) -> crate::Error {
        crate::Error::new(
            crate::ErrorKind::Unsupported,
            format!("the {store} store does not offer {}", self.described()),
        )
    }
}

/// Inspection and administration of locks, for operators and tooling.
///
/// One [`inspect`](RawInspect::inspect) and one [`force_unlock`](RawInspect::force_unlock)
/// serve every primitive: the [`Kind`] says which one's state is at `keys`. Every
/// capability trait ([`RawSemaphore`], [`RawReentrant`], [`RawRwLock`], [`RawFair`])
/// requires this one, so a store that offers a kind also inspects it. A store answers a
/// kind it does not offer with
/// [`ErrorKind::Unsupported`](crate::ErrorKind::Unsupported) ([`Kind::unsupported`]),
/// sending nothing.
///
/// # Correctness
///
/// [`force_unlock`](RawInspect::force_unlock) deletes whatever holds the key and announces
/// the release; the holder learns it at its next renewal (its `lost()` fires). It breaks
/// mutual exclusion for as long as that holder keeps working: an operator's last resort.
/// [`list`](RawInspect::list) must never block the store (iterate, e.g. `SCAN`, never
/// `KEYS`), and lists only held lock keys (keys with an expiry), not companion keys.
pub trait RawInspect: RawLock {
    /// Whether one kind's [`inspect`](RawInspect::inspect) tells a hold of another kind at
    /// the same lock key apart from its own: under one prefix every kind of a name has
    /// the same lock key, and a tool that holds one kind there asks whether the name is
    /// also held as another (`dlock run` under `--prefix`). `true` where a hold of
    /// another kind there shows as that kind's, told apart from this one's (Redis: its
    /// value is of another type; PostgreSQL; the in-memory store); `false` (the default:
    /// the check is skipped) where the kinds share one queue or one item and read each
    /// other's holds as their own (etcd, ZooKeeper's nodes, memcached's item).
    const KINDS_TOLD_APART_UNDER_ONE_PREFIX: bool = false;

    /// The current state of the primitive of `kind` at `keys` (one consistent snapshot
    /// where the store allows):
    ///
    /// * [`Kind::Lock`]: holder token, remaining ttl, last fence (and the waiting clients
    ///   or queued waiters where the store can tell);
    /// * [`Kind::Semaphore`]: permits in use (`hold_count`), live holders, the latest
    ///   lease's remaining ttl;
    /// * [`Kind::Reentrant`]: holder (its owner string), hold count, remaining ttl, last
    ///   fence;
    /// * [`Kind::RwLock`]: writer token, live readers (`holders`), waiting writers
    ///   (`queued`), remaining ttl, last fence;
    /// * [`Kind::Fair`]: holder, remaining ttl, last fence, queued waiters.
    fn inspect(
        &self,
        kind: Kind,
        keys: &LockKeys,
    ) -> impl Future<Output = Result<LockState>> + Send;

    /// Deletes every hold of the primitive of `kind` at `keys`, whoever holds it, and
    /// wakes waiters: the lock key (a plain or fair lock: the fair lock's queue stays),
    /// every permit of every holder (semaphore), the lock however many holds (reentrant),
    /// the writer, every reader and every waiting writer (read-write lock). Returns
    /// whether anything held was deleted.
    fn force_unlock(
        &self,
        kind: Kind,
        keys: &LockKeys,
    ) -> impl Future<Output = Result<bool>> + Send;

    /// Names of the held locks under `prefix` (keys with the prefix stripped) that match
    /// the glob `pattern` (`*` any run, `?` one character), at most `limit` of them, in no
    /// particular order. With an empty prefix every key with an expiry in the store
    /// counts as a lock.
    fn list(
        &self,
        prefix: &str,
        pattern: &str,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<String>>> + Send;
}
