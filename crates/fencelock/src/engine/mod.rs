//! The client engine: what every primitive on every store shares.
//!
//! Each backend client owns ONE [`Engine`] (clones of the client share it, and so do the
//! primitives built on them — locks, semaphores, reentrant, read-write and fair locks,
//! multi-lock members). It has two halves:
//!
//! * **leases** ([`watchdog`](self) internals): one registry and one renewal task per
//!   client. Every lease due within [`BATCH_WINDOW`] of another is renewed in the same
//!   batch, one store call for all of them, whatever primitive holds it: a [`Renewal`]
//!   carries its [`LeaseKind`] and the store applies the matching renewal (on Redis, one
//!   pipeline of `EVALSHA`s of the matching scripts);
//! * **acquiring and waiting** ([`acquire`](self), [`wait`](self) internals): the loop
//!   every acquire runs, for every primitive — one attempt (repeated under the same
//!   token when its reply is lost), a subscription to the store's wake-up for *this*
//!   waiter, the fallback timer from the holder's remaining lease, jittered backoff where
//!   the store cannot notify, the hand-on of a wake-up that a waiter consumed but could
//!   not use, and the guards that keep it cancel-safe (a grant that arrives after its
//!   caller was cancelled or timed out is given back). A primitive hands the loop its
//!   store's single steps (an attempt, a watch, a withdrawal, a release); the loop is
//!   never a store's. The wake registry ([`wake`](self) internals) that every notifying
//!   store's transport feeds: per name a notifier and a hand-over slot, one parser for
//!   the hand-over message;
//! * **background work** ([`background`](self) internals): what is finished after its
//!   caller left — a dropped guard's release, a give-back, a withdrawal, a store's
//!   release tried again until it answers — bounded in time, under one retry policy.
//!
//! Which waiter a release wakes is the store's side of the contract
//! ([`RawLock::watch_for`](crate::raw::RawLock::watch_for)): on Redis a waiter queue with
//! a channel per waiter (one waiter woken per release, across processes), on etcd each
//! waiter watches its predecessor, in memory a queue of local waiters.
//!
//! The engine knows nothing of the raw traits: a client hands it a [`Renewal`] batch
//! sender when a lease is registered, a lock hands the acquire loop its steps, and the
//! contract (`raw`) names the engine, never the other way round.

pub(crate) mod acquire;
pub(crate) mod background;
#[cfg(any(feature = "etcd", feature = "zookeeper"))]
pub(crate) mod follow;
mod lease;
pub(crate) mod wait;
#[cfg(any(
    feature = "redis",
    feature = "etcd",
    feature = "postgres",
    feature = "zookeeper"
))]
pub(crate) mod wake;
mod watchdog;

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::Result;
use crate::keys::LockKeys;
use crate::token::Token;

pub use acquire::Acquire;
pub(crate) use lease::{End, Lease};
pub use wait::{ReleaseWatch, Subscription};
pub use watchdog::BATCH_WINDOW;
pub(crate) use watchdog::Renew;

/// Which primitive holds a lease, i.e. which renewal the store must apply to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LeaseKind {
    /// A plain (or fair) lock: the lock key holds the token.
    Lock,
    /// A semaphore holder's permits.
    Permits,
    /// One hold of a reentrant lock.
    Reentrant,
    /// A read-write lock's writer or one of its readers.
    ReadWrite,
}

/// One lease to renew, as handed to [`RawLock::extend_many`](crate::raw::RawLock::extend_many).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Renewal {
    /// The lock's keys.
    pub keys: LockKeys,
    /// Our token (the lock key's value, the permit holder, the hold or the reader).
    pub token: Token,
    /// The new time to live, counted from when the store applies it.
    pub ttl: Duration,
    /// Which renewal to apply.
    pub kind: LeaseKind,
}

impl Renewal {
    /// A renewal of `kind` (for stores and tests that build batches themselves).
    pub fn new(keys: LockKeys, token: Token, ttl: Duration, kind: LeaseKind) -> Renewal {
        Renewal {
            keys,
            token,
            ttl,
            kind,
        }
    }
}

/// What a client's engine is doing now (for tests, operators and benchmarks).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct EngineStats {
    /// Leases under renewal now, of every primitive.
    pub leases: usize,
    /// Whether the client's renewal task is alive.
    pub renewal_task_running: bool,
    /// How many renewal tasks this client has started in its life (a new one only after
    /// the previous exited, idle).
    pub renewal_tasks_started: u64,
    /// Renewal batches sent to the store.
    pub renewal_batches: u64,
    /// Leases renewed (summed over the batches).
    pub renewals: u64,
}

/// A client's engine: its lease registry and renewal task. Cheap to clone; clones share.
///
/// A backend client makes one with [`Engine::new`] and returns it from
/// [`RawLock::engine`](crate::raw::RawLock::engine); adapters (semaphore permits,
/// reentrant holds, ...) return their client's. The renewal task runs on the tokio
/// runtime that registered the first lease while none was running; keep that runtime
/// alive (and not blocked) while locks are held.
#[derive(Clone, Default)]
pub struct Engine {
    registry: Arc<watchdog::Registry>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("leases", &self.stats().leases)
            .finish()
    }
}

impl Engine {
    /// An engine with no leases.
    pub fn new() -> Engine {
        Engine::default()
    }

    /// A snapshot of the engine's counters.
    pub fn stats(&self) -> EngineStats {
        self.registry.stats()
    }

    /// How many leases are under renewal now.
    pub fn leases(&self) -> usize {
        self.stats().leases
    }

    /// Whether `self` and `other` are the same engine (clones of one client's).
    pub fn same_as(&self, other: &Engine) -> bool {
        Arc::ptr_eq(&self.registry, &other.registry)
    }

    pub(crate) fn register<R: Renew>(&self, renewer: &R, lease: Arc<Lease>) -> Result<u64> {
        self.registry.register(renewer, lease)
    }

    pub(crate) fn reschedule(&self, id: u64, due: Instant) {
        self.registry.reschedule(id, due);
    }

    pub(crate) fn deregister(&self, id: u64) {
        self.registry.deregister(id);
    }
}
