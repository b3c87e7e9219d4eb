//! The blocking API under the conformance suite's core behaviours: plain `#[test]`s, with
//! no async runtime on the test's threads, against real servers (and the memory store).

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use dlock_test::conformance::{Target, freeze, unique};
use dlock_test::targets::{
    EtcdTarget, MemcachedTarget, MemoryTarget, PostgresTarget, RedisTarget, ZooKeeperTarget,
};
use fencelock::backend::{Etcd, Postgres, Redis, ZooKeeper};
use fencelock::blocking::{
    Client, DROP_RELEASE_WAIT, Election, FairLock, Lock, ReentrantLock, RwLock, SHUTDOWN_WAIT,
    Semaphore, current_thread_owner,
};
use fencelock::raw::{RawElection, RawFair, RawLock, RawReentrant, RawRwLock, RawSemaphore};
use fencelock::{ErrorKind, Owner};

/// A store the conformance suite's (async) target starts and administers: blocking
/// clients connect with `connect`, keys are deleted and ttls chosen as the target does.
struct Store<T: Target> {
    target: T,
    connect: fn(&T) -> fencelock::Result<Client<T::Backend>>,
    /// The memory store's one client, which every "process" shares (threads of one
    /// process share theirs).
    shared: Option<Client<T::Backend>>,
}

impl<T: Target> Store<T>
where
    T::Backend: RawLock,
{
    /// A client, as another process would have (the memory store: the shared one).
    /// Retried for a few seconds: a fresh etcd member may still be electing itself.
    fn client(&self) -> Client<T::Backend> {
        if let Some(client) = &self.shared {
            return client.clone();
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match (self.connect)(&self.target) {
                Ok(client) => return client,
                Err(_) if Instant::now() < deadline => thread::sleep(Duration::from_millis(100)),
                Err(e) => panic!("connect: {e}"),
            }
        }
    }

    /// Deletes a key behind every holder's back, on a runtime of the test thread's own
    /// for the call (no blocking client's).
    fn delete_key(&self, key: &str) {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
            .block_on(self.target.delete_key(key));
    }

    /// The ttl to test with where a behaviour wants `wanted` (the target's).
    fn ttl(&self, wanted: Duration) -> Duration {
        self.target.ttl(wanted)
    }
}

/// The in-process store, one client shared by every thread.
fn memory_store() -> Store<MemoryTarget> {
    let target = MemoryTarget::default();
    let shared = Client::from_backend(target.store()).expect("client");
    Store {
        target,
        connect: |t| Client::from_backend(t.store()),
        shared: Some(shared),
    }
}

/// A private `redis-server`.
fn redis_store() -> Store<RedisTarget> {
    Store {
        target: RedisTarget::start(),
        connect: |t| Client::connect_redis(t.server.url()),
        shared: None,
    }
}

/// A private memcached (expiry on a one-second clock: the target lengthens short ttls).
fn memcached_store() -> Store<MemcachedTarget> {
    Store {
        target: MemcachedTarget::start(),
        connect: |t| Client::connect_memcached(&t.server.url()),
        shared: None,
    }
}

/// A single-member etcd (leases of whole seconds: the target lengthens short ttls).
fn etcd_store() -> Store<EtcdTarget> {
    Store {
        target: EtcdTarget::start(),
        connect: |t| Client::<Etcd>::connect_etcd(&t.cluster.url()),
        shared: None,
    }
}

/// A private PostgreSQL (lease mode).
fn postgres_store() -> Store<PostgresTarget> {
    Store {
        target: PostgresTarget::start(),
        connect: |t| Client::<Postgres>::connect_postgres(&t.server.url()),
        shared: None,
    }
}

/// A chroot of its own on the shared ZooKeeper; each client its own session.
fn zookeeper_store() -> Store<ZooKeeperTarget> {
    Store {
        target: ZooKeeperTarget::start(),
        connect: |t| Client::<ZooKeeper>::connect_zookeeper(&t.url()),
        shared: None,
    }
}

/// One `#[test]` per behaviour, against a fresh store each.
macro_rules! blocking_tests {
    ($store:expr; $($behaviour:ident),* $(,)?) => {
        $(
            #[test]
            fn $behaviour() {
                super::$behaviour(&$store);
            }
        )*
    };
}

mod memory {
    use super::memory_store;

    blocking_tests!(memory_store();
        mutual_exclusion,
        try_lock_is_none_while_held_and_release_frees_at_once,
        without_watchdog_lease_ends_at_ttl,
        watchdog_renews_while_the_thread_sleeps,
        wait_lost_fires_on_external_delete,
        fences_strictly_increase,
        extend_resets_lease,
        dropped_guard_is_released_when_drop_returns,
        guards_outlive_their_client,
        inside_a_runtime_is_a_typed_error,
        semaphore_permits,
        reentrant_reentry_keeps_the_fence,
        rwlock_readers_share_writer_excludes,
        fair_lock_grants_in_arrival_order,
        election_leads_observes_and_hands_over,
    );
}

mod redis {
    use super::redis_store;

    blocking_tests!(redis_store();
        mutual_exclusion,
        try_lock_is_none_while_held_and_release_frees_at_once,
        without_watchdog_lease_ends_at_ttl,
        watchdog_renews_while_the_thread_sleeps,
        wait_lost_fires_on_external_delete,
        fences_strictly_increase,
        extend_resets_lease,
        dropped_guard_is_released_when_drop_returns,
        guards_outlive_their_client,
        inside_a_runtime_is_a_typed_error,
        semaphore_permits,
        reentrant_reentry_keeps_the_fence,
        rwlock_readers_share_writer_excludes,
        fair_lock_grants_in_arrival_order,
        election_leads_observes_and_hands_over,
    );

    #[test]
    fn drop_returns_while_the_store_is_frozen() {
        super::drop_returns_while_the_store_is_frozen(&redis_store());
    }

    #[test]
    fn dropped_leadership_returns_while_the_store_is_frozen() {
        super::dropped_leadership_returns_while_the_store_is_frozen(&redis_store());
    }
}

mod memcached {
    use super::memcached_store;

    blocking_tests!(memcached_store();
        mutual_exclusion,
        try_lock_is_none_while_held_and_release_frees_at_once,
        without_watchdog_lease_ends_at_ttl,
        watchdog_renews_while_the_thread_sleeps,
        wait_lost_fires_on_external_delete,
        fences_strictly_increase,
        dropped_guard_is_released_when_drop_returns,
        semaphore_permits,
        reentrant_reentry_keeps_the_fence,
        rwlock_readers_share_writer_excludes,
        fair_lock_grants_in_arrival_order,
    );
}

/// etcd has every primitive: every behaviour.
mod etcd {
    blocking_tests!(super::etcd_store();
        mutual_exclusion,
        try_lock_is_none_while_held_and_release_frees_at_once,
        without_watchdog_lease_ends_at_ttl,
        watchdog_renews_while_the_thread_sleeps,
        wait_lost_fires_on_external_delete,
        fences_strictly_increase,
        extend_resets_lease,
        dropped_guard_is_released_when_drop_returns,
        guards_outlive_their_client,
        inside_a_runtime_is_a_typed_error,
        semaphore_permits,
        reentrant_reentry_keeps_the_fence,
        rwlock_readers_share_writer_excludes,
        fair_lock_grants_in_arrival_order,
        election_leads_observes_and_hands_over,
    );
}

mod postgres {
    blocking_tests!(super::postgres_store();
        mutual_exclusion,
        try_lock_is_none_while_held_and_release_frees_at_once,
        without_watchdog_lease_ends_at_ttl,
        watchdog_renews_while_the_thread_sleeps,
        wait_lost_fires_on_external_delete,
        fences_strictly_increase,
        extend_resets_lease,
        dropped_guard_is_released_when_drop_returns,
        guards_outlive_their_client,
        inside_a_runtime_is_a_typed_error,
        semaphore_permits,
        reentrant_reentry_keeps_the_fence,
        rwlock_readers_share_writer_excludes,
        fair_lock_grants_in_arrival_order,
        election_leads_observes_and_hands_over,
    );
}

/// Holds live in the client's session; a lease that is not renewed is ended by its own
/// client (see the backend's docs), so the expiry behaviours hold here too.
mod zookeeper {
    blocking_tests!(super::zookeeper_store();
        mutual_exclusion,
        try_lock_is_none_while_held_and_release_frees_at_once,
        without_watchdog_lease_ends_at_ttl,
        watchdog_renews_while_the_thread_sleeps,
        wait_lost_fires_on_external_delete,
        fences_strictly_increase,
        extend_resets_lease,
        dropped_guard_is_released_when_drop_returns,
        guards_outlive_their_client,
        inside_a_runtime_is_a_typed_error,
        semaphore_permits,
        reentrant_reentry_keeps_the_fence,
        rwlock_readers_share_writer_excludes,
        fair_lock_grants_in_arrival_order,
        election_leads_observes_and_hands_over,
    );
}

/// A lock named `name` on `client` with lease `ttl`.
fn lock_on<B: RawElection>(client: &Client<B>, name: &str, ttl: Duration) -> Lock<B> {
    Lock::builder(client, name).ttl(ttl).build().expect("valid")
}

/// Threads of two clients increment a counter by read, sleep, write under the lock: no
/// two are ever inside at once, no increment is lost, fences rise in grant order.
fn mutual_exclusion<T: Target>(store: &Store<T>)
where
    T::Backend: RawElection,
{
    const THREADS: usize = 4;
    const ROUNDS: u64 = 10;
    let name = unique("blocking-mutex");
    let clients = [store.client(), store.client()];
    let value = AtomicU64::new(0);
    let inside = AtomicUsize::new(0);
    let overlaps = AtomicUsize::new(0);
    let fences = Mutex::new(Vec::new());
    thread::scope(|scope| {
        for i in 0..THREADS {
            let lock = lock_on(&clients[i % 2], &name, Duration::from_secs(10));
            let (value, inside, overlaps, fences) = (&value, &inside, &overlaps, &fences);
            scope.spawn(move || {
                for _ in 0..ROUNDS {
                    let guard = lock.lock().expect("lock");
                    if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    fences.lock().expect("fences").push(guard.fencing_token());
                    let v = value.load(Ordering::SeqCst);
                    thread::sleep(Duration::from_millis(1));
                    value.store(v + 1, Ordering::SeqCst);
                    inside.fetch_sub(1, Ordering::SeqCst);
                    guard.release().expect("release");
                }
            });
        }
    });
    assert_eq!(overlaps.load(Ordering::SeqCst), 0, "two holders at once");
    assert_eq!(
        value.load(Ordering::SeqCst),
        THREADS as u64 * ROUNDS,
        "lost increments"
    );
    let fences = fences.into_inner().expect("fences");
    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "fences not strictly increasing in grant order: {fences:?}"
    );
}

/// Contention is `Ok(None)`, bounded waits give up, and a release frees the lock for
/// another client at once.
fn try_lock_is_none_while_held_and_release_frees_at_once<T: Target>(store: &Store<T>)
where
    T::Backend: RawElection,
{
    let name = unique("blocking-try");
    let (a, b) = (store.client(), store.client());
    let mine = lock_on(&a, &name, Duration::from_secs(10));
    let theirs = lock_on(&b, &name, Duration::from_secs(10));
    let guard = mine.try_lock().expect("store").expect("free");
    assert!(theirs.try_lock().expect("store").is_none());
    let started = Instant::now();
    assert!(
        theirs
            .try_lock_for(Duration::from_millis(300))
            .expect("store")
            .is_none()
    );
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert!(
        theirs
            .try_lock_until(Instant::now() + Duration::from_millis(100))
            .expect("store")
            .is_none()
    );
    let state = theirs.state().expect("store");
    assert_eq!(state.holder.as_deref(), Some(guard.token().as_str()));
    assert!(theirs.is_locked().expect("store"));
    guard.release().expect("release");
    let next = theirs
        .try_lock()
        .expect("store")
        .expect("a released lock is free at once");
    next.release().expect("release");
    assert!(!theirs.is_locked().expect("store"));
}

/// Without the watchdog a hold ends at its ttl: another client gets the lock, the holder
/// sees it lost, and its release is `LockLost`.
fn without_watchdog_lease_ends_at_ttl<T: Target>(store: &Store<T>)
where
    T::Backend: RawElection,
{
    let name = unique("blocking-expiry");
    let ttl = store.ttl(Duration::from_millis(300));
    let client = store.client();
    let holder = Lock::builder(&client, &name)
        .ttl(ttl)
        .watchdog(false)
        .build()
        .expect("valid");
    let guard = holder.try_lock().expect("store").expect("free");
    let acquired = Instant::now();
    assert_eq!(client.backend().engine().leases(), 0);
    let other = lock_on(&store.client(), &name, Duration::from_secs(10));
    let next = other
        .try_lock_for(ttl * 10)
        .expect("store")
        .expect("the lease must expire by itself");
    assert!(
        acquired.elapsed() >= ttl - Duration::from_millis(50),
        "freed after {:?}, before its ttl {ttl:?}",
        acquired.elapsed()
    );
    assert!(guard.is_lost());
    assert!(guard.wait_lost(Duration::ZERO).expect("outside a runtime"));
    assert_eq!(guard.remaining(), Duration::ZERO);
    let err = guard.release().expect_err("must not report success");
    assert_eq!(err.kind(), ErrorKind::LockLost, "{err}");
    next.release().expect("the new holder still holds it");
}

/// The watchdog runs on the client's runtime thread: a short lease stays held while the
/// holder's own thread sleeps (no blocking call in progress) through many ttls.
fn watchdog_renews_while_the_thread_sleeps<T: Target>(store: &Store<T>)
where
    T::Backend: RawElection,
{
    let name = unique("blocking-watchdog");
    let ttl = store.ttl(Duration::from_millis(300));
    let client = store.client();
    let guard = lock_on(&client, &name, ttl)
        .try_lock()
        .expect("store")
        .expect("free");
    assert_eq!(client.backend().engine().leases(), 1);
    thread::sleep(ttl * 3);
    assert!(!guard.is_lost(), "the lease lapsed while the thread slept");
    let other = lock_on(&store.client(), &name, Duration::from_secs(10));
    assert!(
        other.try_lock().expect("store").is_none(),
        "another client got a lock the watchdog renews"
    );
    assert!(!guard.wait_lost(ttl).expect("outside a runtime"));
    assert!(guard.remaining() > Duration::ZERO);
    guard.release().expect("still ours");
    assert_eq!(
        client.backend().engine().leases(),
        0,
        "released lease still renewed"
    );
}

/// `wait_lost` returns as soon as the key is deleted behind the holder, and the release
/// then reports `LockLost`.
fn wait_lost_fires_on_external_delete<T: Target>(store: &Store<T>)
where
    T::Backend: RawElection,
{
    let name = unique("blocking-deleted");
    let ttl = store.ttl(Duration::from_millis(600));
    let lock = lock_on(&store.client(), &name, ttl);
    let guard = lock.try_lock().expect("store").expect("free");
    assert!(!guard.wait_lost(Duration::from_millis(10)).expect("ok"));
    store.delete_key(lock.keys().lock());
    assert!(
        guard.wait_lost(ttl * 3).expect("outside a runtime"),
        "lost must fire after the key was deleted"
    );
    assert!(guard.is_lost());
    let err = guard.release().expect_err("must not report success");
    assert_eq!(err.kind(), ErrorKind::LockLost, "{err}");
}

/// Fences strictly increase across grants by two clients, including after a holder whose
/// lease ran out without a release.
fn fences_strictly_increase<T: Target>(store: &Store<T>)
where
    T::Backend: RawElection,
{
    let name = unique("blocking-fence");
    let clients = [store.client(), store.client()];
    let mut seen = Vec::new();
    for i in 0..4 {
        let lock = lock_on(&clients[i % 2], &name, Duration::from_secs(10));
        let guard = lock.try_lock().expect("store").expect("free");
        seen.push(guard.fencing_token());
        guard.release().expect("release");
    }
    let short = Lock::builder(&clients[0], &name)
        .ttl(store.ttl(Duration::from_millis(200)))
        .watchdog(false)
        .build()
        .expect("valid");
    let guard = short.try_lock().expect("store").expect("free");
    seen.push(guard.fencing_token());
    guard.forget();
    let next = lock_on(&clients[1], &name, Duration::from_secs(10))
        .try_lock_for(Duration::from_secs(20))
        .expect("store")
        .expect("free after expiry");
    seen.push(next.fencing_token());
    next.release().expect("release");
    assert!(
        seen.windows(2).all(|w| w[0] < w[1]),
        "fences must strictly increase: {seen:?}"
    );
}

/// `extend` resets the lease; zero is refused; after the key is gone it is `LockLost`.
fn extend_resets_lease<T: Target>(store: &Store<T>)
where
    T::Backend: RawElection,
{
    let name = unique("blocking-extend");
    let ttl = store.ttl(Duration::from_millis(300));
    let lock = Lock::builder(&store.client(), &name)
        .ttl(ttl)
        .watchdog(false)
        .build()
        .expect("valid");
    let guard = lock.try_lock().expect("store").expect("free");
    guard.extend(Duration::from_secs(10)).expect("ours");
    assert!(guard.remaining() > Duration::from_secs(5));
    thread::sleep(ttl + Duration::from_millis(200));
    assert!(
        !guard.is_lost(),
        "the extended lease ran out at the old ttl"
    );
    let err = guard.extend(Duration::ZERO).expect_err("zero ttl refused");
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    guard.release().expect("still ours");

    let guard = lock.try_lock().expect("store").expect("free");
    store.delete_key(lock.keys().lock());
    let err = guard
        .extend(Duration::from_secs(5))
        .expect_err("not ours any more");
    assert_eq!(err.kind(), ErrorKind::LockLost, "{err}");
    assert!(guard.is_lost());
}

/// A dropped guard is released by the time `drop` returns (the store answered within the
/// drop's wait): another client gets the lock at once.
fn dropped_guard_is_released_when_drop_returns<T: Target>(store: &Store<T>)
where
    T::Backend: RawElection,
{
    let name = unique("blocking-drop");
    let client = store.client();
    let guard = lock_on(&client, &name, Duration::from_secs(20))
        .try_lock()
        .expect("store")
        .expect("free");
    let other = lock_on(&store.client(), &name, Duration::from_secs(20));
    drop(guard);
    assert_eq!(
        client.backend().engine().leases(),
        0,
        "dropped lease renewed"
    );
    let guard = other
        .try_lock()
        .expect("store")
        .expect("a dropped guard must be released before drop returns");
    // Forgotten guards are not released: the lock stays held until its ttl.
    guard.forget();
    assert!(other.try_lock().expect("store").is_none());
}

/// Guards keep their client's runtime (and watchdog) alive after the client, its clones
/// and the lock are dropped; dropping the last of them ends it without hanging.
fn guards_outlive_their_client<T: Target>(store: &Store<T>)
where
    T::Backend: RawElection,
{
    let name = unique("blocking-outlive");
    let ttl = store.ttl(Duration::from_millis(300));
    let client = store.client();
    let lock = lock_on(&client, &name, ttl);
    let guard = lock.try_lock().expect("store").expect("free");
    drop(lock);
    drop(client);
    thread::sleep(ttl * 3);
    assert!(!guard.is_lost(), "renewal stopped with the client");
    guard.extend(ttl).expect("the runtime still runs");
    let started = Instant::now();
    drop(guard);
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "dropping the last user of a runtime hung"
    );
    let other = lock_on(&store.client(), &name, Duration::from_secs(10));
    let guard = other.try_lock().expect("store").expect("released on drop");
    guard.release().expect("release");
}

/// Every blocking call in async code (a `block_on` future) is a typed `InvalidArgument`,
/// never a panic, while `spawn_blocking` works; guards and clients dropped there release and shut down in the background.
fn inside_a_runtime_is_a_typed_error<T: Target>(store: &Store<T>)
where
    T::Backend: RawElection,
{
    let name = unique("blocking-nested");
    let client = store.client();
    let lock = lock_on(&client, &name, Duration::from_secs(10));
    let guard = lock.try_lock().expect("store").expect("free");
    let invalid = |r: fencelock::Result<()>| {
        let err = r.expect_err("refused inside a runtime");
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let other = lock_on(&store.client(), &name, Duration::from_secs(10));
    let (nested_try, lock) = rt.block_on(async {
        invalid(lock.try_lock().map(drop));
        invalid(lock.lock().map(drop));
        invalid(lock.state().map(drop));
        invalid(guard.extend(Duration::from_secs(10)));
        invalid(guard.wait_lost(Duration::ZERO).map(drop));
        invalid(client.block_on(async {}));
        invalid(Client::from_backend(client.backend().clone()).map(drop));
        // spawn_blocking is where synchronous code belongs in async programs: it works.
        let inner = lock.clone();
        let held = tokio::task::spawn_blocking(move || inner.try_lock().map(|g| g.is_some()))
            .await
            .expect("no panic");
        assert!(
            !held.expect("blocking works in spawn_blocking"),
            "held by the guard"
        );
        // A guard dropped here is released in the background, without blocking.
        let started = std::time::Instant::now();
        drop(guard);
        assert!(started.elapsed() < DROP_RELEASE_WAIT, "drop blocked");
        (other.try_lock_for(Duration::ZERO), lock)
    });
    invalid(nested_try.map(drop));
    let guard = other
        .try_lock_for(Duration::from_secs(5))
        .expect("store")
        .expect("the guard dropped inside the runtime was released in the background");
    // A release refused inside a runtime drops the guard: released in the background.
    let refused = rt.block_on(async move { guard.release() });
    invalid(refused);
    other
        .try_lock_for(Duration::from_secs(5))
        .expect("store")
        .expect("released in the background")
        .release()
        .expect("release");
    // The last user of a client's runtime dropped inside another runtime shuts it down in
    // the background, without a panic (a blocking shutdown is not allowed there).
    rt.block_on(async move {
        drop(lock);
        drop(client);
        drop(other);
    });
}

/// Permits as leases: never more holders than permits, counts right, a release frees one.
fn semaphore_permits<T: Target>(store: &Store<T>)
where
    T::Backend: RawSemaphore,
{
    let name = unique("blocking-sem");
    let (a, b) = (store.client(), store.client());
    let sem = Semaphore::builder(&a, &name, 2)
        .ttl(Duration::from_secs(10))
        .build()
        .expect("valid");
    let theirs = Semaphore::new(&b, &name, 2).expect("valid");
    let first = sem.acquire().expect("store");
    let second = theirs
        .try_acquire()
        .expect("store")
        .expect("a second permit");
    assert!(
        theirs.try_acquire().expect("store").is_none(),
        "a third permit"
    );
    assert!(
        theirs
            .try_acquire_for(Duration::from_millis(100))
            .expect("store")
            .is_none()
    );
    assert_eq!(sem.available_permits().expect("store"), 0);
    first.release().expect("release");
    assert_eq!(theirs.available_permits().expect("store"), 1);
    second.release().expect("release");
    let both = sem.try_acquire_many(2).expect("store").expect("both free");
    assert!(theirs.try_acquire().expect("store").is_none());
    both.release().expect("release");

    let inside = AtomicUsize::new(0);
    let most = AtomicUsize::new(0);
    thread::scope(|scope| {
        for i in 0..5 {
            let sem = if i % 2 == 0 { &sem } else { &theirs };
            let (inside, most) = (&inside, &most);
            scope.spawn(move || {
                for _ in 0..4 {
                    let permit = sem.acquire().expect("acquire");
                    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    thread::sleep(Duration::from_millis(5));
                    inside.fetch_sub(1, Ordering::SeqCst);
                    permit.release().expect("release");
                }
            });
        }
    });
    assert!(
        most.load(Ordering::SeqCst) <= 2,
        "more holders than permits"
    );
    assert_eq!(sem.available_permits().expect("store"), 2);
}

/// A thread re-enters its own reentrant lock (same fence, counted holds); another thread,
/// another owner, waits until the last hold is released.
fn reentrant_reentry_keeps_the_fence<T: Target>(store: &Store<T>)
where
    T::Backend: RawReentrant,
{
    let name = unique("blocking-reentrant");
    let lock = ReentrantLock::builder(&store.client(), &name)
        .ttl(Duration::from_secs(10))
        .build()
        .expect("valid");
    let other = ReentrantLock::new(&store.client(), &name).expect("valid");
    let me = current_thread_owner().expect("owner");
    assert_eq!(
        me,
        current_thread_owner().expect("owner"),
        "stable per thread"
    );
    let outer = lock.lock(&me).expect("lock");
    let inner = lock.lock(&me).expect("re-entry");
    let fence = outer.fencing_token();
    assert_eq!(inner.fencing_token(), fence);
    assert_eq!(lock.hold_count(&me).expect("store"), 2);
    let them: Owner = thread::scope(|scope| {
        scope
            .spawn(|| {
                let them = current_thread_owner().expect("owner");
                assert_ne!(them, me, "threads are different owners");
                assert!(other.try_lock(&them).expect("store").is_none());
                them
            })
            .join()
            .expect("thread")
    });
    inner.release().expect("release");
    assert!(
        other.try_lock(&them).expect("store").is_none(),
        "one hold left"
    );
    outer.release().expect("release");
    let theirs = other
        .try_lock(&them)
        .expect("store")
        .expect("free after the last hold");
    assert!(
        theirs.fencing_token() > fence,
        "the next owner's fence is greater"
    );
    theirs.release().expect("release");
}

/// Readers share, a writer excludes everyone, a downgrade lets readers back in.
fn rwlock_readers_share_writer_excludes<T: Target>(store: &Store<T>)
where
    T::Backend: RawRwLock,
{
    let name = unique("blocking-rw");
    let mine = RwLock::builder(&store.client(), &name)
        .ttl(Duration::from_secs(10))
        .build()
        .expect("valid");
    let theirs = RwLock::new(&store.client(), &name).expect("valid");
    let r1 = mine.read().expect("read");
    let r2 = theirs.try_read().expect("store").expect("readers share");
    assert!(
        theirs.try_write().expect("store").is_none(),
        "writer among readers"
    );
    r1.release().expect("release");
    r2.release().expect("release");
    let w = theirs.write().expect("write");
    assert!(
        mine.try_read().expect("store").is_none(),
        "reader beside a writer"
    );
    assert!(mine.try_write().expect("store").is_none(), "two writers");
    let r = theirs.downgrade(w).expect("downgrade");
    let r3 = mine
        .try_read_for(Duration::from_secs(5))
        .expect("store")
        .expect("readers share after a downgrade");
    assert!(mine.try_write().expect("store").is_none());
    r.release().expect("release");
    r3.release().expect("release");
    let w = mine.try_write().expect("store").expect("free");
    w.release().expect("release");
}

/// Waiters blocked in `lock()` on threads of their own are granted in arrival order.
fn fair_lock_grants_in_arrival_order<T: Target>(store: &Store<T>)
where
    T::Backend: RawFair,
{
    let name = unique("blocking-fair");
    let holder = FairLock::builder(&store.client(), &name)
        .ttl(Duration::from_secs(20))
        .build()
        .expect("valid");
    let first = holder.lock().expect("lock");
    let order = Mutex::new(Vec::new());
    let clients: Vec<_> = (0..3).map(|_| store.client()).collect();
    thread::scope(|scope| {
        for (i, client) in clients.iter().enumerate() {
            let fair = FairLock::builder(client, &name)
                .ttl(Duration::from_secs(20))
                .build()
                .expect("valid");
            let order = &order;
            scope.spawn(move || {
                let guard = fair.lock().expect("lock");
                order.lock().expect("order").push(i);
                guard.release().expect("release");
            });
            // The next waiter arrives once this one has its place in the queue.
            let deadline = Instant::now() + Duration::from_secs(10);
            while holder.state().expect("store").queued != Some(i as u32 + 1) {
                assert!(Instant::now() < deadline, "waiter {i} never queued");
                thread::sleep(Duration::from_millis(10));
            }
        }
        first.release().expect("release");
    });
    assert_eq!(*order.lock().expect("order"), vec![0, 1, 2]);
    assert_eq!(holder.state().expect("store").queued, Some(0));
}

/// The next leader `observer` reports within 5 s, passing over vacancies (a resignation
/// handed on to a waiting candidate may be reported as one just before it).
fn next_leader<B: fencelock::raw::RawElection>(
    observer: &mut fencelock::blocking::Observer<B>,
) -> fencelock::Leader {
    for _ in 0..3 {
        let seen = observer
            .next_timeout(Duration::from_secs(5))
            .expect("store")
            .expect("the observer sees the leader");
        if let fencelock::LeaderChange::Leader(leader) = seen {
            return leader;
        }
    }
    panic!("no leader reported after three vacancies");
}

/// One leader at a time: the leader is observed, a rival waits, resigning hands over to
/// it under a greater term, and the observer sees the change.
fn election_leads_observes_and_hands_over<T: Target>(store: &Store<T>)
where
    T::Backend: RawElection,
{
    let name = unique("blocking-election");
    let ours = Election::builder(&store.client(), &name)
        .ttl(Duration::from_secs(10))
        .build()
        .expect("valid");
    let rival = Election::new(&store.client(), &name).expect("valid");
    let mut observer = rival.observe();
    let mut leadership = ours.campaign("host-a").expect("campaign");
    let term = leadership.term();
    assert!(rival.try_campaign("host-b").expect("store").is_none());
    let leader = rival.leader().expect("store").expect("someone leads");
    assert_eq!(leader.term, term);
    assert_eq!(leader.value.as_deref(), Some("host-a"));
    let seen = next_leader(&mut observer);
    assert_eq!((seen.term, seen.value.as_deref()), (term, Some("host-a")));
    leadership.proclaim("host-a:2").expect("still leads");
    let seen = observer.next().expect("never ends").expect("store");
    let seen = seen.leader().expect("a leader");
    assert_eq!((seen.term, seen.value.as_deref()), (term, Some("host-a:2")));
    thread::scope(|scope| {
        let next = scope.spawn(|| {
            rival
                .campaign_for(Duration::from_secs(10), "host-b")
                .expect("store")
                .expect("leads after the resignation")
        });
        // The rival is queued (or about to be): resigning wakes it, not its timeout.
        thread::sleep(Duration::from_millis(100));
        leadership.resign().expect("resign");
        let next = next.join().expect("rival");
        assert!(next.term() > term, "terms must increase");
        let seen = next_leader(&mut observer);
        assert_eq!(seen.term, next.term());
        assert!(!next.wait_lost(Duration::from_millis(10)).expect("ok"));
        drop(next); // resigns before drop returns
    });
    assert!(rival.leader().expect("store").is_none(), "nobody leads");
}

/// With the store frozen (SIGSTOP: connections open, nothing answered), dropping a guard,
/// and then the last user of its client's runtime, returns within the documented bounds.
fn drop_returns_while_the_store_is_frozen(store: &Store<RedisTarget>) {
    let name = unique("blocking-frozen");
    let ttl = Duration::from_secs(2);
    let client = store.client();
    let lock = lock_on(&client, &name, ttl);
    let guard = lock.try_lock().expect("store").expect("free");
    let survivor = lock.try_lock().expect("store");
    assert!(survivor.is_none());
    let frozen = freeze(&store.target);
    let started = Instant::now();
    drop(guard);
    let dropped = started.elapsed();
    drop(lock);
    let started = Instant::now();
    drop(client);
    let shut_down = started.elapsed();
    drop(frozen);
    // Liveness, not speed: the waits are bounded (2 s, 1 s documented); a drop that
    // blocked on the frozen store would never return. Generous for a busy machine.
    let margin = Duration::from_secs(5);
    assert!(
        dropped < fencelock::blocking::DROP_RELEASE_WAIT + margin,
        "drop blocked {dropped:?} on a frozen store"
    );
    assert!(
        shut_down < fencelock::blocking::SHUTDOWN_WAIT + margin,
        "dropping the client blocked {shut_down:?} on a frozen store"
    );
    // The lease expires by itself (or was released once the server woke).
    let other = lock_on(&store.client(), &name, Duration::from_secs(10));
    let guard = other
        .try_lock_for(ttl * 5)
        .expect("store")
        .expect("the abandoned lease expires");
    guard.release().expect("release");
}

/// With the store frozen, dropping a leadership (it resigns) returns within the documented
/// bound, and so does the end of its client's runtime after it; once the store wakes, the
/// rival leads (the resignation went through, or the lease expired) under a greater term.
fn dropped_leadership_returns_while_the_store_is_frozen(store: &Store<RedisTarget>) {
    let name = unique("blocking-frozen-leader");
    let ttl = Duration::from_secs(2);
    let client = store.client();
    let election = Election::builder(&client, &name)
        .ttl(ttl)
        .build()
        .expect("valid");
    let leadership = election.campaign("host-a").expect("campaign");
    let term = leadership.term();
    let rival = Election::builder(&store.client(), &name)
        .ttl(ttl)
        .build()
        .expect("valid");
    assert!(rival.try_campaign("host-b").expect("store").is_none());
    let frozen = freeze(&store.target);
    // The drops on a thread of their own: one that never returned fails the test (the
    // wait below runs out) instead of hanging it.
    let (done, finished) = std::sync::mpsc::channel();
    let dropper = thread::spawn(move || {
        let started = Instant::now();
        drop(leadership);
        let dropped = started.elapsed();
        drop(election);
        let started = Instant::now();
        drop(client);
        let _ = done.send((dropped, started.elapsed()));
    });
    // Liveness, not speed: the waits are bounded (2 s, 1 s documented); generous margins
    // for a busy machine.
    let margin = Duration::from_secs(5);
    let outcome = finished.recv_timeout(DROP_RELEASE_WAIT + SHUTDOWN_WAIT + 2 * margin);
    drop(frozen);
    let (dropped, shut_down) =
        outcome.expect("dropping a leadership on a frozen store never returned");
    dropper.join().expect("the dropping thread");
    assert!(
        dropped < DROP_RELEASE_WAIT + margin,
        "dropping the leadership blocked {dropped:?} on a frozen store"
    );
    assert!(
        shut_down < SHUTDOWN_WAIT + margin,
        "dropping the client blocked {shut_down:?} on a frozen store"
    );
    let next = rival
        .campaign_for(ttl * 5, "host-b")
        .expect("store")
        .expect("the abandoned term ends");
    assert!(next.term() > term, "terms must increase");
    next.resign().expect("resign");
    assert!(rival.leader().expect("store").is_none(), "nobody leads");
}

#[test]
fn clients_guards_and_locks_are_send_and_sync() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Client<Redis>>();
    send_sync::<Lock<Redis>>();
    send_sync::<fencelock::blocking::LockGuard<Redis>>();
    send_sync::<fencelock::blocking::Leadership<Redis>>();
    send_sync::<Semaphore<Redis>>();
}
