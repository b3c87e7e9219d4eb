//! The same locks for synchronous code: a [`Client`] that owns a small tokio runtime on a
//! background thread, and blocking twins of every primitive and guard.
//!
//! Shaped like `reqwest::blocking`: each blocking method runs the async method of the same
//! name to completion on the client's runtime, so the behaviour — waiting without polling,
//! fencing, cancel and retry safety, `LockLost` rather than silent success — is the async
//! API's, documented there. What the runtime adds is a thread that keeps working while
//! yours does not: the **watchdog renews every lease while your thread computes or
//! sleeps**, the store's connections stay alive, and [`LockGuard::is_lost`] turns true
//! when a lease can no longer be guaranteed.
//!
//! # Deduct stock without overselling, synchronously
//!
//! ```
//! use std::time::Duration;
//!
//! use dlock::backend::Memory;
//! use dlock::blocking::{Client, Lock};
//!
//! // or Client::connect_redis("redis://127.0.0.1/")?
//! let client = Client::from_backend(Memory::new())?;
//! let lock = Lock::builder(&client, "stock:sku-42")
//!     .ttl(Duration::from_secs(10))
//!     .build()?;
//!
//! let guard = lock.lock()?;              // blocks until it is ours
//! let fence = guard.fencing_token();     // send it with every write
//! // ... read stock, check, write stock - 1: the watchdog renews the lease meanwhile
//! # let _ = fence;
//! assert!(lock.try_lock()?.is_none());   // held: contention is a value
//! guard.release()?;                      // Err(LockLost) if it was not ours any more
//! # Ok::<(), dlock::Error>(())
//! ```
//!
//! # One runtime per client: share the client
//!
//! [`Client::new`] (and the `connect_*` shortcuts) start one runtime with one worker
//! thread named `dlock-blocking`. Clones of a client, and every primitive and guard made
//! from it, share that runtime and the client's one watchdog; make one client per store
//! and pass clones (or `&Client`) to your threads. The runtime ends when the last of the
//! client, its clones, primitives and guards is dropped. Locks, guards and clients are
//! `Send + Sync` where their backend is: lock from many threads at once.
//!
//! # Calling from async code
//!
//! A blocking call inside a tokio runtime would stall the runtime's thread, so every
//! blocking method checks first and returns [`ErrorKind::InvalidArgument`] — never a panic
//! — when the calling thread is in a tokio runtime's context: an async task, `block_on`,
//! `spawn_blocking`, or under `Runtime::enter`. Use the async API there
//! ([`Lock::as_async`] hands out the same lock). This is the `InvalidArgument` every
//! `# Errors` section below means by "inside a runtime".
//!
//! # Drop never blocks for long
//!
//! Dropping an unreleased guard releases it on the client's runtime and waits for the
//! store's answer at most [`DROP_RELEASE_WAIT`] (2 s), so that the next holder usually finds
//! the lock free as soon as `drop` returns. A store that does not answer in time (down,
//! frozen, partitioned) is left to the async guard's bounded background release, or the
//! lease's expiry. Dropped inside a tokio runtime, a guard does not wait at all (its release
//! runs in the background). When the dropped value is the last user of its client's
//! runtime, shutting the runtime down takes at most [`SHUTDOWN_WAIT`] (1 s) more; inside a
//! tokio runtime that shutdown does not wait, and may cut a background release short (the
//! lease then expires at its ttl).
//!
//! # Sharing a backend with async code
//!
//! [`Client::from_backend`] wraps a backend value made elsewhere. A backend's clones share
//! one watchdog, which runs on the runtime that registered the first lease; give each
//! client a backend of its own (connect another one) rather than a clone that async code
//! on another runtime also locks with, or leases of the longer-lived runtime may go
//! unrenewed for a moment after this client's runtime ends.

mod election;
mod family;
mod lock;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::Handle;

use crate::error::{Error, ErrorKind, Result};
use crate::raw::RawLock;

pub use election::{Election, ElectionBuilder, Leadership, Observer};
pub use family::{
    FairGuard, FairLock, FairLockBuilder, ReadGuard, ReentrantGuard, ReentrantLock,
    ReentrantLockBuilder, RwLock, RwLockBuilder, Semaphore, SemaphoreBuilder, SemaphorePermit,
    WriteGuard, current_thread_owner,
};
pub use lock::{Lock, LockBuilder, LockGuard};

/// Longest a dropped guard (or leadership) waits for its release to be answered.
pub const DROP_RELEASE_WAIT: Duration = Duration::from_secs(2);

/// Longest the end of a client's runtime (when its last client, primitive or guard is
/// dropped) waits for the runtime's threads to stop.
pub const SHUTDOWN_WAIT: Duration = Duration::from_secs(1);

/// A store client with its own runtime: what every blocking primitive is made from.
///
/// Cheap to clone; clones share the runtime, the backend's connections and its watchdog.
/// See the [module docs](self) for the runtime's life and the rules for async contexts.
pub struct Client<B> {
    backend: B,
    runtime: Arc<Runtime>,
}

impl<B: Clone> Clone for Client<B> {
    fn clone(&self) -> Self {
        Client {
            backend: self.backend.clone(),
            runtime: Arc::clone(&self.runtime),
        }
    }
}

impl<B> std::fmt::Debug for Client<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("backend", &std::any::type_name::<B>())
            .finish_non_exhaustive()
    }
}

impl<B: RawLock> Client<B> {
    /// Starts the client's runtime and makes the backend on it with `connect` (an async
    /// constructor such as `|| Redis::connect(url)`), so that the backend's connections
    /// are driven by the runtime's thread.
    ///
    /// ```
    /// use dlock::backend::Memory;
    /// use dlock::blocking::Client;
    ///
    /// let client = Client::new(|| async { Ok(Memory::new()) })?;
    /// # Ok::<(), dlock::Error>(())
    /// ```
    ///
    /// # Errors
    /// What `connect` returns; `Unavailable` if the runtime's thread could not be started;
    /// `InvalidArgument` inside a runtime.
    pub fn new<F, Fut>(connect: F) -> Result<Client<B>>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<B>>,
    {
        outside_runtime()?;
        let runtime = Runtime::start()?;
        let backend = runtime.call(connect)?;
        Ok(Client { backend, runtime })
    }

    /// Wraps a backend already made (see the [module docs](self#sharing-a-backend-with-async-code)
    /// about sharing one with async code).
    ///
    /// # Errors
    /// `Unavailable` if the runtime's thread could not be started; `InvalidArgument` inside
    /// a runtime.
    pub fn from_backend(backend: B) -> Result<Client<B>> {
        outside_runtime()?;
        Ok(Client {
            backend,
            runtime: Runtime::start()?,
        })
    }

    /// The backend (for the async API, or its own options and statistics).
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// Runs `future` to completion on the client's runtime: for async calls the blocking
    /// API does not wrap (a [`MultiLock`](crate::MultiLock), a backend's own methods).
    ///
    /// # Errors
    /// `InvalidArgument` inside a runtime (the future is then dropped unpolled).
    pub fn block_on<F: Future>(&self, future: F) -> Result<F::Output> {
        self.runtime.run(|| future)
    }

    /// The client's runtime, for spawning work beside its locks.
    pub fn handle(&self) -> &Handle {
        &self.runtime.handle
    }
}

#[cfg(feature = "redis")]
impl Client<crate::backend::Redis> {
    /// A client of the Redis server at `url` (as [`Redis::connect`](crate::backend::Redis::connect)).
    ///
    /// # Errors
    /// As [`Redis::connect`](crate::backend::Redis::connect), and as [`Client::new`].
    pub fn connect_redis(url: impl Into<String>) -> Result<Client<crate::backend::Redis>> {
        let url = url.into();
        Client::new(|| crate::backend::Redis::connect(url))
    }
}

#[cfg(feature = "memcached")]
impl Client<crate::backend::Memcached> {
    /// A client of the memcached at `url` (as
    /// [`Memcached::connect`](crate::backend::Memcached::connect)).
    ///
    /// # Errors
    /// As [`Memcached::connect`](crate::backend::Memcached::connect), and as [`Client::new`].
    pub fn connect_memcached(url: &str) -> Result<Client<crate::backend::Memcached>> {
        Client::new(|| crate::backend::Memcached::connect(url))
    }
}

#[cfg(feature = "etcd")]
impl Client<crate::backend::Etcd> {
    /// A client of the etcd cluster at `url` (as [`Etcd::connect`](crate::backend::Etcd::connect)).
    ///
    /// # Errors
    /// As [`Etcd::connect`](crate::backend::Etcd::connect), and as [`Client::new`].
    pub fn connect_etcd(url: &str) -> Result<Client<crate::backend::Etcd>> {
        Client::new(|| crate::backend::Etcd::connect(url))
    }
}

#[cfg(feature = "postgres")]
impl Client<crate::backend::Postgres> {
    /// A client of the PostgreSQL database at `url` (as
    /// [`Postgres::connect`](crate::backend::Postgres::connect)).
    ///
    /// # Errors
    /// As [`Postgres::connect`](crate::backend::Postgres::connect), and as [`Client::new`].
    pub fn connect_postgres(url: &str) -> Result<Client<crate::backend::Postgres>> {
        Client::new(|| crate::backend::Postgres::connect(url))
    }
}

#[cfg(feature = "zookeeper")]
impl Client<crate::backend::ZooKeeper> {
    /// A client of the ZooKeeper ensemble at `url` (as
    /// [`ZooKeeper::connect`](crate::backend::ZooKeeper::connect)).
    ///
    /// # Errors
    /// As [`ZooKeeper::connect`](crate::backend::ZooKeeper::connect), and as
    /// [`Client::new`].
    pub fn connect_zookeeper(url: &str) -> Result<Client<crate::backend::ZooKeeper>> {
        Client::new(|| crate::backend::ZooKeeper::connect(url))
    }
}

/// `InvalidArgument` when the calling thread is in a tokio runtime's context, where
/// blocking would stall the runtime (and `Handle::block_on` would panic).
fn outside_runtime() -> Result<()> {
    if Handle::try_current().is_ok() {
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            "dlock::blocking was called inside a tokio runtime (an async task, block_on, \
             spawn_blocking or Runtime::enter), where blocking would stall the runtime: \
             use dlock's async API there",
        ));
    }
    Ok(())
}

/// A client's runtime: one worker thread that drives the store's connections, the
/// watchdog and background releases while the caller's thread blocks or works.
struct Runtime {
    /// Taken on drop, to be shut down with a bound.
    runtime: Option<tokio::runtime::Runtime>,
    handle: Handle,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime").finish_non_exhaustive()
    }
}

impl Runtime {
    fn start() -> Result<Arc<Runtime>> {
        // A multi-thread runtime (of one worker) rather than a current-thread one: its
        // worker drives timers and connections on its own, so the watchdog renews while
        // the caller is outside any `block_on`, and `Handle::block_on` from any thread
        // drives everything it needs.
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("dlock-blocking")
            .enable_all()
            .build()
            .map_err(|err| {
                Error::new(
                    ErrorKind::Unavailable,
                    "cannot start the blocking client's runtime thread",
                )
                .with_source(err)
            })?;
        let handle = runtime.handle().clone();
        Ok(Arc::new(Runtime {
            runtime: Some(runtime),
            handle,
        }))
    }

    /// Runs the future `make` returns on this thread, with the runtime driving its timers
    /// and IO. `make` is not called inside a runtime (the caller's values stay untouched).
    fn run<F: Future>(&self, make: impl FnOnce() -> F) -> Result<F::Output> {
        outside_runtime()?;
        Ok(self.handle.block_on(make()))
    }

    /// [`run`](Runtime::run) for a fallible future.
    fn call<T, F: Future<Output = Result<T>>>(&self, make: impl FnOnce() -> F) -> Result<T> {
        self.run(make)?
    }

    /// Runs `end` (a dropped guard's release) for at most [`DROP_RELEASE_WAIT`], on the
    /// runtime, so that whatever it spawns when cut short lands there. Inside a runtime it
    /// is dropped unpolled instead: the async guard's drop releases in the background.
    fn settle(&self, end: impl Future<Output = ()>) {
        let nested = Handle::try_current().is_ok();
        let _entered = self.handle.enter();
        if nested {
            drop(end);
            return;
        }
        self.handle.block_on(async {
            // Cut short, `end` is dropped here, inside the runtime: the async guard then
            // sends its bounded release in the background.
            let _ = tokio::time::timeout(DROP_RELEASE_WAIT, end).await;
        });
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            if Handle::try_current().is_ok() {
                // Waiting is not allowed (and would stall) inside a runtime.
                runtime.shutdown_background();
            } else {
                runtime.shutdown_timeout(SHUTDOWN_WAIT);
            }
        }
    }
}

/// The setters every blocking builder shares, forwarded to the async builder inside.
macro_rules! forward_options {
    ($builder:ident<B: $bound:path>, $async:literal) => {
        impl<B: $bound> $builder<B> {
            #[doc = concat!("Lease length: as [`", $async, "::ttl`](crate::", $async, "::ttl).")]
            pub fn ttl(self, ttl: std::time::Duration) -> Self {
                Self {
                    builder: self.builder.ttl(ttl),
                    ..self
                }
            }

            #[doc = concat!("Whether the watchdog renews holds: as [`", $async, "::watchdog`](crate::", $async, "::watchdog).")]
            pub fn watchdog(self, on: bool) -> Self {
                Self {
                    builder: self.builder.watchdog(on),
                    ..self
                }
            }

            #[doc = concat!("Backoff between attempts: as [`", $async, "::retry`](crate::", $async, "::retry).")]
            pub fn retry(self, retry: crate::Retry) -> Self {
                Self {
                    builder: self.builder.retry(retry),
                    ..self
                }
            }

            #[doc = concat!("Who the holder is, for operators: as [`", $async, "::holder_info`](crate::", $async, "::holder_info).")]
            pub fn holder_info(self, info: crate::HolderInfo) -> Self {
                Self {
                    builder: self.builder.holder_info(info),
                    ..self
                }
            }

            #[doc = concat!("Whether metrics carry the lock's name: as [`", $async, "::metrics_name_label`](crate::", $async, "::metrics_name_label).")]
            pub fn metrics_name_label(self, on: bool) -> Self {
                Self {
                    builder: self.builder.metrics_name_label(on),
                    ..self
                }
            }

            #[doc = concat!("Key prefix: as [`", $async, "::prefix`](crate::", $async, "::prefix).")]
            pub fn prefix(self, prefix: impl Into<String>) -> Self {
                Self {
                    builder: self.builder.prefix(prefix),
                    ..self
                }
            }
        }
    };
}
use forward_options;
