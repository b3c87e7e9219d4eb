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
//! use fencelock::backend::Memory;
//! use fencelock::blocking::{Client, Lock};
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
//! # Ok::<(), fencelock::Error>(())
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
//! Blocking is fine on any thread that is not running async code: a plain thread, a
//! `tokio::task::spawn_blocking` closure (where synchronous code in async programs usually
//! lives), `tokio::task::block_in_place`, or under `Runtime::enter`. There a blocking call
//! works as anywhere else (as `reqwest::blocking` does).
//!
//! A blocking call made while the thread polls an async task or a `block_on` future would
//! stall that runtime's thread, so every blocking method checks first and returns
//! [`ErrorKind::InvalidArgument`] — never a panic — there. Use the async API in async code
//! ([`Lock::as_async`] hands out the same lock). This is the `InvalidArgument` every
//! `# Errors` section below means by "inside a runtime". The check reads tokio's
//! cooperative budget, which tokio gives every task poll and `block_on`: async code run
//! under `tokio::task::coop::unconstrained` has none, and is not recognised (a blocking
//! call there blocks the runtime's thread until it is answered).
//!
//! # Drop never blocks for long
//!
//! Dropping an unreleased guard releases it on the client's runtime and waits for the
//! store's answer at most [`DROP_RELEASE_WAIT`] (2 s), so that the next holder usually finds
//! the lock free as soon as `drop` returns. A store that does not answer in time (down,
//! frozen, partitioned) is left to the async guard's bounded background release, or the
//! lease's expiry. Dropped in async code (see above), a guard does not wait at all (its
//! release runs in the background). When the dropped value is the last user of its client's
//! runtime, shutting the runtime down takes at most [`SHUTDOWN_WAIT`] (1 s) more; in async
//! code that shutdown does not wait, and may cut a background release short (the
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
    /// use fencelock::backend::Memory;
    /// use fencelock::blocking::Client;
    ///
    /// let client = Client::new(|| async { Ok(Memory::new()) })?;
    /// # Ok::<(), fencelock::Error>(())
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

/// `InvalidArgument` when the calling thread is running async code (a task's poll or a
/// `block_on` future), where blocking would stall a runtime's thread; `Ok` on plain
/// threads, in `spawn_blocking` and `block_in_place`, and under `Runtime::enter`.
fn outside_runtime() -> Result<()> {
    if in_async_code() {
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            "fencelock::blocking was called from async code (a task or a block_on future), \
             where blocking would stall the runtime's thread: use fencelock's async API there, \
             or move the blocking code into tokio::task::spawn_blocking",
        ));
    }
    Ok(())
}

/// The most cooperative budget tokio gives a task poll (or a `block_on` future).
const MAX_TASK_BUDGET: usize = 128;

/// Whether this thread is running async code: polling a task or a `block_on` future.
///
/// Tokio gives every task poll and `block_on` a cooperative budget, and no budget
/// (unconstrained) to plain threads, `spawn_blocking` closures, `block_in_place` and code
/// under `Runtime::enter`. The budget is not readable, so this spends it one unit at a
/// time until tokio says it is exhausted (async code) or more has been spent than any
/// budget holds (no budget), then gives every unit back: the caller's budget is left as
/// it was.
fn in_async_code() -> bool {
    if Handle::try_current().is_err() {
        return false; // not even in a runtime's context: a plain thread
    }
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    let mut spent = Vec::with_capacity(MAX_TASK_BUDGET + 1);
    let limited = loop {
        if spent.len() > MAX_TASK_BUDGET {
            break false;
        }
        match tokio::task::coop::poll_proceed(&mut cx) {
            std::task::Poll::Ready(unit) => spent.push(unit),
            std::task::Poll::Pending => break true,
        }
    };
    // Each unit restores the budget it found: the last spent first, back to the start.
    while let Some(unit) = spent.pop() {
        drop(unit);
    }
    limited
}

/// Runs `future` to completion on this thread (parking it between polls), in `handle`'s
/// context, so that the runtime's worker drives the future's timers and IO. Unlike
/// `Handle::block_on`, it never panics, whatever the thread's context.
fn park_on<F: Future>(handle: &Handle, future: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
        fn wake_by_ref(self: &Arc<Self>) {
            self.0.unpark();
        }
    }
    let _entered = handle.enter();
    let waker = std::task::Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = std::task::Context::from_waker(&waker);
    let mut future = std::pin::pin!(future);
    loop {
        if let std::task::Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return out;
        }
        // A wake-up between the poll and the park leaves the token: park returns at once.
        std::thread::park();
    }
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
        Ok(park_on(&self.handle, make()))
    }

    /// [`run`](Runtime::run) for a fallible future.
    fn call<T, F: Future<Output = Result<T>>>(&self, make: impl FnOnce() -> F) -> Result<T> {
        self.run(make)?
    }

    /// Runs `end` (a dropped guard's release) for at most [`DROP_RELEASE_WAIT`], on the
    /// runtime, so that whatever it spawns when cut short lands there. In async code it
    /// is dropped unpolled instead: the async guard's drop releases in the background.
    fn settle(&self, end: impl Future<Output = ()>) {
        let nested = in_async_code();
        let _entered = self.handle.enter();
        if nested {
            drop(end);
            return;
        }
        park_on(&self.handle, async {
            // Cut short, `end` is dropped here, inside the runtime: the async guard then
            // sends its bounded release in the background.
            let _ = tokio::time::timeout(DROP_RELEASE_WAIT, end).await;
        });
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            if in_async_code() {
                // Waiting is not allowed (and would stall) in async code.
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::backend::Memory;

    fn lock_of(client: &Client<Memory>) -> Lock<Memory> {
        Lock::builder(client, "blocking-contexts")
            .ttl(Duration::from_secs(10))
            .build()
            .expect("valid")
    }

    /// A hold taken and released, and a client made and dropped, on this thread.
    fn lock_and_release(client: &Client<Memory>) -> Result<()> {
        let guard = lock_of(client).try_lock()?.expect("free");
        guard.release()?;
        let own = Client::from_backend(Memory::new())?;
        lock_of(&own).try_lock()?.expect("free").release()?;
        drop(own);
        Ok(())
    }

    /// Synchronous code in async programs lives in `spawn_blocking` and `block_in_place`:
    /// blocking works there, on both kinds of runtime; in a task it is refused.
    #[test]
    fn blocking_works_in_spawn_blocking_and_is_refused_in_tasks() {
        let client = Client::from_backend(Memory::new()).expect("client");
        for multi in [false, true] {
            let mut builder = if multi {
                tokio::runtime::Builder::new_multi_thread()
            } else {
                tokio::runtime::Builder::new_current_thread()
            };
            let rt = builder.enable_all().build().expect("runtime");
            let inner = client.clone();
            rt.block_on(async move {
                let refused = lock_of(&inner).try_lock().map(drop);
                let err = refused.expect_err("refused in a block_on future");
                assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
                assert!(err.to_string().contains("spawn_blocking"), "{err}");
                // The check gives back the budget it spent.
                assert!(tokio::task::coop::has_budget_remaining());
                let task = inner.clone();
                let in_task = tokio::spawn(async move { lock_of(&task).try_lock().map(drop) });
                let err = in_task
                    .await
                    .expect("no panic")
                    .expect_err("refused in a task");
                assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
                let worker = inner.clone();
                tokio::task::spawn_blocking(move || lock_and_release(&worker))
                    .await
                    .expect("no panic")
                    .expect("blocking works in spawn_blocking");
                if multi {
                    let task = inner.clone();
                    tokio::spawn(
                        async move { tokio::task::block_in_place(|| lock_and_release(&task)) },
                    )
                    .await
                    .expect("no panic")
                    .expect("blocking works in block_in_place");
                }
            });
            // Under Runtime::enter (no task polled): allowed.
            let _entered = rt.enter();
            lock_and_release(&client).expect("blocking works under Runtime::enter");
        }
    }
}
