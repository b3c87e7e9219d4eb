//! Distributed locks that say what they guarantee.
//!
//! fencelock gives many processes on many machines mutual exclusion over one resource: a
//! lease in a shared store (Redis, memcached, etcd, PostgreSQL or ZooKeeper, or in-process
//! [`Memory`](backend::Memory) for tests and single-process programs), renewed by a
//! watchdog while you hold it, with a fencing token that lets the resource itself reject a
//! holder whose lease silently ran out.
//!
//! # Stores and features
//!
//! Each store is a cargo feature; only `redis` is on by default.
//!
//! | Feature | Store | URL |
//! |---|---|---|
//! | `redis` (default) | [`backend::Redis`]; [`backend::Quorum`] of several masters is RedLock | `redis://`, `redis+unix://`, `redis+sentinel://`, `redis+cluster://` |
//! | `redis-tls` | TLS for Redis (rustls) | `rediss://` |
//! | `memcached` | [`backend::Memcached`] (memcached 1.6+) | `memcache://` |
//! | `etcd` | [`backend::Etcd`] (building it needs `protoc` on `PATH`) | `etcd://` |
//! | `postgres` | [`backend::Postgres`] (leases in rows), [`backend::PgAdvisory`] (session advisory locks), [`fenced::PgFencedTable`] | `postgres://`, `postgresql://` |
//! | `postgres-tls` | TLS for PostgreSQL (rustls) | `?sslmode=require`, `verify-ca`, `verify-full` |
//! | `zookeeper` | [`backend::ZooKeeper`] | `zk://` |
//! | (always) | [`backend::Memory`] (in-process), [`backend::Quorum`] over any of them | |
//! | `simulation` | hooks for the workspace's deterministic simulator (seeded tokens, planted bugs): test kit only, never in production | |
//!
//! ```toml
//! [dependencies]
//! fencelock = { version = "0.1", features = ["redis", "postgres", "zookeeper"] }
//! ```
//!
//! # Which primitive runs where
//!
//! | Store | [`Lock`] (fenced) | [`ReentrantLock`], [`RwLock`], [`FairLock`], [`Semaphore`] | [`Election`] |
//! |---|---|---|---|
//! | Redis, PostgreSQL, ZooKeeper, etcd, memory | yes | yes | yes |
//! | memcached | yes | yes (waiters poll: no notifications) | yes |
//! | RedLock ([`backend::Quorum`]), PostgreSQL advisory locks | yes, without a fence | no | no |
//!
//! [`MultiLock`] takes several locks of any of these at once; [`blocking`] runs every one
//! from synchronous code; [`fenced`] has resource-side fence checks (a Redis value, rows
//! of a PostgreSQL table); [`raw`] has the traits a store implements.
//!
//! # Deduct stock without overselling
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> fencelock::Result<()> {
//! use fencelock::{Lock, backend::Memory};
//! use std::time::Duration;
//!
//! let store = Memory::new(); // or fencelock::backend::Redis::connect("redis://127.0.0.1/").await?
//! let lock = Lock::builder(store, "stock:sku-42")
//!     .ttl(Duration::from_secs(10))
//!     .build()?;
//!
//! let guard = lock.lock().await?;          // waits; renewed every ttl/3 while held
//! let fence = guard.fencing_token();       // send it with every write
//! // ... read stock, check, write stock - 1 (the store rejects fences below its maximum)
//! # let _ = fence;
//! guard.release().await?;                  // Err(LockLost) if it was not ours any more
//! # Ok(()) }
//! ```
//!
//! # The lock family
//!
//! Beside [`Lock`]: [`ReentrantLock`] (hold counts per explicit [`Owner`]), [`RwLock`]
//! (many readers or one writer, writers first), [`FairLock`] (first come, first served),
//! [`Semaphore`] (permits as leases) and [`MultiLock`] (several locks, all or nothing).
//! Each is an adapter over the same lock machinery, so each has the same watchdog,
//! `lost()`, waiting, cancel safety and retry safety, on every backend that implements its
//! [`raw`] trait.
//!
//! # Leader election
//!
//! [`Election`] picks one leader among candidates on every store with a fence: the lock's
//! queue, lease and watchdog, plus one record of the leader's advertised value. A
//! [`Leadership`] carries the **term** (the grant's fence: strictly increasing per
//! election), `lost()`, [`proclaim`](Leadership::proclaim) and
//! [`resign`](Leadership::resign) (the next candidate leads at once);
//! [`Election::leader`] and [`Election::observe`] (a stream of changes) tell everyone else
//! who leads.
//!
//! # Contention is a value, failure is an error
//!
//! [`Lock::try_lock`] returns `Ok(None)` when someone else holds the lock; an [`Error`]
//! means the store failed or a guarantee broke ([`ErrorKind::LockLost`]).
//!
//! # Observability
//!
//! Every remote call and every wait is a [`tracing`] span (at `DEBUG`), and acquire
//! latency, wait time, holds, waiters, renewals, lost leases, hand-offs and retries are
//! recorded through the [`metrics`] facade, labelled by store and primitive. fencelock
//! installs no subscriber and no exporter; [`observe`] lists every name, and
//! `docs/observability.md` shows Prometheus and OpenTelemetry set-ups.
//!
//! # Safety: what a lease lock can and cannot promise
//!
//! A lease lock guarantees that *the store* grants the key to one token at a time. It
//! cannot guarantee that only one *process* acts at a time: a holder that pauses longer
//! than its lease (GC, `SIGSTOP`, a stalled VM) or whose writes are delayed in the network
//! keeps acting after its lease expired and another holder was granted the lock. No
//! library can prevent that. What fencelock does:
//!
//! * [`LockGuard::lost`] resolves, and [`LockGuard::is_lost`] turns true, as soon as the
//!   lease can no longer be guaranteed (renewals failed until the validity — measured on
//!   the monotonic clock from when the request was sent, minus a drift allowance — ran
//!   out, or the store reported the key gone). Stop work when it fires.
//! * [`LockGuard::release`] returns [`ErrorKind::LockLost`] if the lock was no longer ours
//!   — never silent success.
//! * [`LockGuard::fencing_token`] is a number minted atomically with each grant that
//!   strictly increases per lock name. A resource that remembers the highest fence it has
//!   accepted and **rejects writes with a smaller one** turns a stale holder into a
//!   rejected writer. That check is the only thing that makes the protected resource safe
//!   under pauses:
//!
//! ```text
//! write(value, fence):   if fence < max_fence_seen: reject
//!                        else: max_fence_seen = fence; apply(value)
//! ```
//!
//! (In SQL: `UPDATE stock SET qty = qty - 1, fence = $f WHERE sku = $s AND fence <= $f`.)
//!
//! Per backend: a single Redis master loses locks on failover, because replication is
//! asynchronous (Sentinel and Cluster included; `min_replicas` narrows the window); a
//! restart without persistence forgets locks *and* resets fence counters (use
//! `appendonly yes`, `appendfsync always` where fences must survive restarts).
//! [`Quorum`](backend::Quorum) (RedLock) survives a minority of failed nodes but has no
//! fencing token. Memcached forgets everything on restart or eviction; etcd persists
//! through raft and its create revision is a fence that never repeats. PostgreSQL (feature
//! `postgres`) keeps holds and fences in committed rows, so they survive a crash of its
//! one primary (an asynchronous standby promoted on failover can repeat fences). ZooKeeper
//! (feature `zookeeper`) holds a lock in an ephemeral node for as long as the client's
//! session lives, so a hold's validity is capped at the session timeout, and fences with the
//! node's creation zxid, which survives restarts and elections. The memory backend
//! is exact within one process and nothing outside it. `SAFETY.md` in the repository has
//! the whole table, fault by fault.
//!

// Without a store's feature, its items in the tables above link to the `backend` (or
// `fenced`) module, whose page lists them on docs.rs, where every feature is on.
#![cfg_attr(not(feature = "redis"), doc = "[`backend::Redis`]: crate::backend")]
#![cfg_attr(
    not(feature = "memcached"),
    doc = "[`backend::Memcached`]: crate::backend"
)]
#![cfg_attr(not(feature = "etcd"), doc = "[`backend::Etcd`]: crate::backend")]
#![cfg_attr(
    not(feature = "postgres"),
    doc = "[`backend::Postgres`]: crate::backend\n[`backend::PgAdvisory`]: \
           crate::backend\n[`fenced::PgFencedTable`]: crate::fenced"
)]
#![cfg_attr(
    not(feature = "zookeeper"),
    doc = "[`backend::ZooKeeper`]: crate::backend"
)]
// docs.rs (nightly) marks each item with the features it needs.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod backend;
pub mod blocking;
mod election;
pub mod engine;
mod error;
mod fair;
pub mod fenced;
mod holder;
pub mod keys;
mod lock;
mod multi;
pub mod observe;
mod options;
pub mod raw;
mod reentrant;
mod rwlock;
mod semaphore;
#[cfg(feature = "simulation")]
pub mod simulation;
#[cfg(not(feature = "simulation"))]
mod simulation;
mod token;
pub mod validity;

/// The README's examples compile (and run, where they need no server).
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct ReadmeDoctests;

/// The examples of docs/library.md compile (and run, where they need no server).
#[cfg(doctest)]
#[doc = include_str!("../../../docs/library.md")]
struct LibraryDocDoctests;

/// The examples of docs/stores.md compile.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/stores.md")]
struct StoresDocDoctests;

pub use election::{
    DEFAULT_ELECTION_PREFIX, Election, ElectionBuilder, Leader, LeaderChange, Leadership,
    MAX_VALUE_LEN, Observer, Vacancy,
};
pub use engine::wait::Retry;
pub use error::{Error, ErrorKind, NodeErrors, PermitCounts, Result};
pub use fair::{
    DEFAULT_FAIR_PREFIX, DEFAULT_WAITER_GRACE, FairGuard, FairLock, FairLockBuilder, Queued,
};
pub use holder::HolderInfo;
pub use lock::{Lock, LockBuilder, LockGuard, MAX_TTL, MIN_TTL};
pub use multi::{BoxFuture, Held, Lockable, MultiGuard, MultiLock, MultiLockBuilder};
pub use options::DEFAULT_TTL;
pub use reentrant::{
    DEFAULT_MAX_HOLDS, DEFAULT_REENTRANT_PREFIX, Holds, MAX_OWNER_LEN, Owner, ReentrantGuard,
    ReentrantLock, ReentrantLockBuilder,
};
pub use rwlock::{
    DEFAULT_RWLOCK_PREFIX, DEFAULT_WRITER_GRACE, ReadGuard, RwLock, RwLockBuilder, RwSide,
    WriteGuard,
};
pub use semaphore::{
    DEFAULT_SEMAPHORE_PREFIX, MAX_PERMITS, OtherCount, Permits, Semaphore, SemaphoreBuilder,
    SemaphorePermit,
};
pub use token::{FencingToken, Token};
