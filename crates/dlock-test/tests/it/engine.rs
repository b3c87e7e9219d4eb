//! The client engine: one renewal task per client whatever it holds, and waking one
//! waiter per release without losing a wake-up for good.

use std::time::Duration;

use dlock_test::conformance::{Target, unique};
use dlock_test::targets::RedisTarget;
use fencelock::backend::{Memory, Redis};
use fencelock::raw::{Acquire, RawLock};
use fencelock::{FairLock, Lock, Owner, ReentrantLock, RwLock, Semaphore, Token};

use crate::redis::calls;
use tokio::time::{sleep, timeout};

/// Holds one of everything on `client` with a short ttl, lets the watchdog renew for a
/// while, and checks that one task renewed all of it, in shared batches.
async fn every_primitive_renewed_by_one_task<B>(client: B)
where
    B: fencelock::raw::RawSemaphore
        + fencelock::raw::RawReentrant
        + fencelock::raw::RawRwLock
        + fencelock::raw::RawFair,
{
    let ttl = Duration::from_millis(600);
    let lock = Lock::builder(client.clone(), unique("mix-lock"))
        .ttl(ttl)
        .build()
        .expect("valid");
    let sem = Semaphore::builder(client.clone(), unique("mix-sem"), 3)
        .ttl(ttl)
        .build()
        .expect("valid");
    let re = ReentrantLock::builder(client.clone(), unique("mix-re"))
        .ttl(ttl)
        .build()
        .expect("valid");
    let rw_read = RwLock::builder(client.clone(), unique("mix-rw-r"))
        .ttl(ttl)
        .build()
        .expect("valid");
    let rw_write = RwLock::builder(client.clone(), unique("mix-rw-w"))
        .ttl(ttl)
        .build()
        .expect("valid");
    let fair = FairLock::builder(client.clone(), unique("mix-fair"))
        .ttl(ttl)
        .build()
        .expect("valid");
    let owner = Owner::new("mix-owner").expect("valid");

    let before = client.engine().stats();
    let g_lock = lock.lock().await.expect("lock");
    let g_sem = sem.acquire().await.expect("permit");
    let g_re1 = re.lock(&owner).await.expect("first hold");
    let g_re2 = re.lock(&owner).await.expect("re-entry");
    let g_read = rw_read.read().await.expect("read");
    let g_write = rw_write.write().await.expect("write");
    let g_fair = fair.lock().await.expect("fair");
    assert_eq!(
        client.engine().leases(),
        7,
        "every hold is one lease of the client"
    );

    sleep(ttl * 3).await; // several renewal rounds
    for (what, lost) in [
        ("lock", g_lock.is_lost()),
        ("permit", g_sem.is_lost()),
        ("reentrant 1", g_re1.is_lost()),
        ("reentrant 2", g_re2.is_lost()),
        ("read", g_read.is_lost()),
        ("write", g_write.is_lost()),
        ("fair", g_fair.is_lost()),
    ] {
        assert!(!lost, "the {what} lease was not renewed");
    }
    let after = client.engine().stats();
    assert!(after.renewal_task_running);
    assert_eq!(
        after.renewal_tasks_started - before.renewal_tasks_started,
        u64::from(!before.renewal_task_running),
        "one renewal task for the whole client (at most the one this test started)"
    );
    let (batches, renewals) = (
        after.renewal_batches - before.renewal_batches,
        after.renewals - before.renewals,
    );
    assert!(
        renewals >= 7 * 4,
        "{renewals} renewals in {batches} batches"
    );
    assert!(
        batches * 3 <= renewals,
        "leases of different primitives must share batches: {renewals} renewals in {batches} batches"
    );

    g_lock.release().await.expect("release");
    g_sem.release().await.expect("release");
    g_re2.release().await.expect("release");
    g_re1.release().await.expect("release");
    g_read.release().await.expect("release");
    g_write.release().await.expect("release");
    g_fair.release().await.expect("release");
    assert_eq!(client.engine().leases(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_renewal_task_per_redis_client_whatever_it_holds() {
    let t = RedisTarget::start();
    let client = t.client().await;
    let mut admin = t.admin().await;
    every_primitive_renewed_by_one_task(client.clone()).await;
    // Another client of the same server has an engine of its own; clones share one.
    let other = t.client().await;
    assert!(!client.engine().same_as(other.engine()));
    assert!(client.engine().same_as(client.clone().engine()));
    let _: () = redis::cmd("PING")
        .query_async(&mut admin)
        .await
        .expect("ping");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_renewal_task_per_memory_store_whatever_it_holds() {
    every_primitive_renewed_by_one_task(Memory::new()).await;
}

/// Puts `token` in the store's waiter queue of `lock` the way a waiter does, then
/// "crashes": nobody waits for it in `client`, nobody withdraws it. If `client` listens on
/// its waiter channel of the lock (`listening`), a release hands the lock over to it.
async fn queue_a_crashed_waiter(client: &Redis, lock: &Lock<Redis>, token: &Token) {
    let reply = client
        .acquire_or_queue(lock.keys(), token, lock.ttl())
        .await
        .expect("store");
    assert!(matches!(reply, Acquire::Held { .. }), "the lock is held");
}

/// Makes `client` listen on its waiter channel of `lock`, as a client with a live waiter
/// does (the watch keeps the subscription while it is held).
async fn listening(client: &Redis, lock: &Lock<Redis>) -> fencelock::raw::ReleaseWatch {
    let watch = client
        .watch_for(lock.keys(), &Token::random().expect("token"))
        .await
        .expect("subscribe");
    assert!(watch.is_active());
    watch
}

async fn wait_queued(lock: &Lock<Redis>, n: u32) {
    let queued = async {
        while lock.state().await.expect("store").queued != Some(n) {
            sleep(Duration::from_millis(10)).await;
        }
    };
    timeout(Duration::from_secs(5), queued)
        .await
        .unwrap_or_else(|_| panic!("{n} waiters never queued"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_whose_client_is_gone_is_skipped_by_the_same_release() {
    let t = RedisTarget::start();
    let ttl = Duration::from_secs(30); // a fallback timer would take this long
    let client = t.client().await;
    let lock = Lock::builder(client.clone(), unique("gone-head"))
        .ttl(ttl)
        .build()
        .expect("valid");
    let holder = lock.try_lock().await.expect("store").expect("free");
    // Its client listens on nothing: the hand-over's message reaches nobody.
    queue_a_crashed_waiter(&client, &lock, &Token::random().expect("token")).await;
    let waiter = Lock::builder(t.client().await, lock.name())
        .ttl(ttl)
        .build()
        .expect("valid");
    let next = tokio::spawn(async move { waiter.lock().await });
    wait_queued(&lock, 2).await;
    let mut admin = t.admin().await;
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut admin)
        .await
        .expect("resetstat");
    holder.release().await.expect("release");
    let g = timeout(Duration::from_secs(5), next)
        .await
        .expect("the release must pass over the gone head to the next waiter")
        .expect("task")
        .expect("lock");
    assert_eq!(
        lock.state().await.expect("store").queued,
        Some(0),
        "both left the queue"
    );
    // The release alone: no attempt of the waiter's between the release and its hold.
    // Two scripts: the holder never waited on the name, so its release is first the
    // compare-and-delete that finds waiters queued, then the hand-over.
    assert_eq!(calls(&mut admin, "evalsha").await, 2);
    assert_eq!(
        calls(&mut admin, "publish").await,
        2,
        "one to the gone head, one to the next"
    );
    g.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_head_is_covered_by_the_fallback_timer() {
    let t = RedisTarget::start();
    let ttl = Duration::from_secs(2);
    let client = t.client().await;
    let lock = Lock::builder(client.clone(), unique("crashed-head"))
        .ttl(ttl)
        .build()
        .expect("valid");
    let holder = lock.try_lock().await.expect("store").expect("free");
    // Its client still listens (another wait of it), so the release hands the lock over
    // to the crashed waiter: it holds it for its ttl.
    let _listening = listening(&client, &lock).await;
    queue_a_crashed_waiter(&client, &lock, &Token::random().expect("token")).await;
    let waiter = Lock::builder(t.client().await, lock.name())
        .ttl(ttl)
        .build()
        .expect("valid");
    let next = tokio::spawn(async move { waiter.lock().await });
    wait_queued(&lock, 2).await;
    holder.release().await.expect("release"); // hands over to the crashed head
    sleep(Duration::from_millis(100)).await;
    assert!(
        !next.is_finished(),
        "the lock is the crashed head's until its lease runs out"
    );
    // Liveness, not speed: the next waiter's fallback timer is the holder's ttl (2 s).
    let g = timeout(ttl * 5, next)
        .await
        .expect("the next waiter must not hang: its fallback timer covers the crashed head")
        .expect("task")
        .expect("lock");
    g.release().await.expect("release");
    wait_queued(&lock, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_that_leaves_after_the_hand_over_passes_the_lock_on() {
    let t = RedisTarget::start();
    let ttl = Duration::from_secs(30); // a fallback timer would take this long
    let client = t.client().await;
    let lock = Lock::builder(client.clone(), unique("leaving-head"))
        .ttl(ttl)
        .build()
        .expect("valid");
    let holder = lock.try_lock().await.expect("store").expect("free");
    let _listening = listening(&client, &lock).await;
    let head = Token::random().expect("token");
    queue_a_crashed_waiter(&client, &lock, &head).await;
    let waiter = Lock::builder(t.client().await, lock.name())
        .ttl(ttl)
        .build()
        .expect("valid");
    let next = tokio::spawn(async move { waiter.lock().await });
    wait_queued(&lock, 2).await;
    holder.release().await.expect("release"); // hands over to the head, which now leaves
    sleep(Duration::from_millis(100)).await;
    assert!(!next.is_finished(), "the lock was handed to the head");
    assert_eq!(
        lock.state().await.expect("store").holder.as_deref(),
        Some(head.as_str()),
        "the release set the lock to the head's token"
    );
    client
        .abandon(lock.keys(), &head, ttl)
        .await
        .expect("leave"); // what a cancelled waiter does
    let g = timeout(Duration::from_secs(5), next)
        .await
        .expect("leaving with the lock handed over must pass it on at once")
        .expect("task")
        .expect("lock");
    g.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_waiter_that_leaves_after_the_hand_over_passes_the_permit_on() {
    use fencelock::raw::RawSemaphore;
    let t = RedisTarget::start();
    let ttl = Duration::from_secs(30); // a fallback timer would take this long
    let client = t.client().await;
    let sem = Semaphore::builder(client.clone(), unique("leaving-permit-head"), 1)
        .ttl(ttl)
        .build()
        .expect("valid");
    let held = sem.acquire().await.expect("permit");
    // The head: queued by a client that listens on its waiter channel, then "crashed".
    let _listening = client
        .watch_for(sem.keys(), &Token::random().expect("token"))
        .await
        .expect("subscribe");
    let head = Token::random().expect("token");
    let reply = client
        .acquire_permits(sem.keys(), &head, 1, 1, true, ttl, true)
        .await
        .expect("store");
    assert!(matches!(reply, Acquire::Held { .. }), "no permit free");
    let waiter = Semaphore::builder(t.client().await, sem.name(), 1)
        .ttl(ttl)
        .build()
        .expect("valid");
    let next = tokio::spawn(async move { waiter.acquire().await });
    let mut admin = t.admin().await;
    wait_zcard(&mut admin, &sem.keys().companion("waiters"), 2).await;
    held.release().await.expect("release"); // hands the permit over to the head
    sleep(Duration::from_millis(100)).await;
    assert!(!next.is_finished(), "the permit was handed to the head");
    client
        .abandon_permits(sem.keys(), &head, 1, ttl)
        .await
        .expect("leave"); // what a cancelled waiter does
    let p = timeout(Duration::from_secs(5), next)
        .await
        .expect("leaving with the permit handed over must pass it on at once")
        .expect("task")
        .expect("permit");
    p.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_waiter_leaves_the_queue() {
    let t = RedisTarget::start();
    let ttl = Duration::from_secs(30);
    let lock = Lock::builder(t.client().await, unique("cancelled"))
        .ttl(ttl)
        .build()
        .expect("valid");
    let holder = lock.try_lock().await.expect("store").expect("free");
    let first = Lock::builder(t.client().await, lock.name())
        .ttl(ttl)
        .build()
        .expect("valid");
    let cancelled = tokio::spawn(async move { first.lock().await });
    wait_queued(&lock, 1).await;
    let second = Lock::builder(t.client().await, lock.name())
        .ttl(ttl)
        .build()
        .expect("valid");
    let next = tokio::spawn(async move { second.lock().await });
    wait_queued(&lock, 2).await;
    cancelled.abort();
    wait_queued(&lock, 1).await; // withdrawn in the background
    holder.release().await.expect("release");
    let g = timeout(Duration::from_secs(5), next)
        .await
        .expect("the release must wake the remaining waiter")
        .expect("task")
        .expect("lock");
    g.release().await.expect("release");
    // A try_lock that found the lock held leaves nothing behind.
    let g = lock.try_lock().await.expect("store").expect("free");
    let other = Lock::new(t.client().await, lock.name()).expect("valid");
    assert!(other.try_lock().await.expect("store").is_none());
    assert_eq!(lock.state().await.expect("store").queued, Some(0));
    g.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_release_is_covered_by_the_ttl_fallback() {
    let t = RedisTarget::start();
    let name = unique("foreign");
    let lock = Lock::builder(t.client().await, &name)
        .prefix("")
        .ttl(Duration::from_secs(30))
        .build()
        .expect("valid");
    let mut raw = t.admin().await;
    // redis-py's Lock: SET NX PX, and a compare-and-delete that announces nothing.
    let set: Option<String> = redis::cmd("SET")
        .arg(&name)
        .arg("foreign")
        .arg("NX")
        .arg("PX")
        .arg(1500)
        .query_async(&mut raw)
        .await
        .expect("set");
    assert_eq!(set.as_deref(), Some("OK"));
    let waiter = lock.clone();
    let next = tokio::spawn(async move { waiter.lock().await });
    wait_queued(&lock, 1).await;
    let _: i64 = redis::Script::new(
        "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0",
    )
    .key(&name)
    .arg("foreign")
    .invoke_async(&mut raw)
    .await
    .expect("foreign release");
    let g = timeout(Duration::from_secs(5), next)
        .await
        .expect("the waiter gets in by its fallback timer (the foreign holder's ttl) at worst")
        .expect("task")
        .expect("lock");
    g.release().await.expect("release");
}

/// Waits until the sorted set `key` has `n` members (waiters queued in the store).
async fn wait_zcard(admin: &mut redis::aio::MultiplexedConnection, key: &str, n: u64) {
    let queued = async {
        loop {
            let have: u64 = redis::cmd("ZCARD")
                .arg(key)
                .query_async(&mut *admin)
                .await
                .expect("zcard");
            if have == n {
                return;
            }
            sleep(Duration::from_millis(10)).await;
        }
    };
    timeout(Duration::from_secs(10), queued)
        .await
        .unwrap_or_else(|_| panic!("{n} waiters never queued in {key}"));
}

/// After `queued` waiters (each its own client) queued under `queue_key`, one release
/// (`release`) must let exactly one waiter in, for `evalshas` EVALSHAs in all: 2 where
/// the woken waiter takes it with an attempt of its own, 1 where the release hands it
/// over.
async fn one_release_one_attempt<G: Send + 'static>(
    t: &RedisTarget,
    queue_key: &str,
    queued: u64,
    evalshas: u64,
    release: impl Future<Output = ()>,
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<G>,
) -> G {
    let mut admin = t.admin().await;
    wait_zcard(&mut admin, queue_key, queued).await;
    sleep(Duration::from_millis(100)).await; // every waiter asleep on its wake-up
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut admin)
        .await
        .expect("resetstat");
    release.await;
    let first = timeout(Duration::from_secs(5), rx.recv())
        .await
        .expect("a waiter woke on the release")
        .expect("channel");
    sleep(Duration::from_millis(300)).await;
    assert_eq!(
        calls(&mut admin, "evalsha").await,
        evalshas,
        "one release (and one waiter's acquire if it was woken): not one per client"
    );
    assert!(rx.try_recv().is_err(), "only one waiter got in");
    first
}

/// Starts `n` waiters, each in a client of its own (as `n` processes would be): `take`
/// builds a waiter's wait from its client and number. What they get arrives on the
/// returned channel.
async fn waiters_in_own_clients<G, F, Fut>(
    t: &RedisTarget,
    n: usize,
    take: F,
) -> tokio::sync::mpsc::UnboundedReceiver<G>
where
    F: Fn(Redis, usize) -> Fut,
    Fut: Future<Output = G> + Send + 'static,
    G: Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    for i in 0..n {
        let wait = take(t.client().await, i);
        let tx = tx.clone();
        tokio::spawn(async move {
            let _ = tx.send(wait.await);
        });
    }
    rx
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_release_wakes_one_waiter_across_clients() {
    let t = RedisTarget::start();
    let name = unique("sem-herd");
    let ttl = Duration::from_secs(30);
    let sem = Semaphore::builder(t.client().await, &name, 2)
        .ttl(ttl)
        .build()
        .expect("valid");
    let a = sem.acquire().await.expect("permit");
    let b = sem.acquire().await.expect("permit");
    let mut rx = waiters_in_own_clients(&t, 16, |client, _| {
        let s = Semaphore::builder(client, &name, 2)
            .ttl(ttl)
            .build()
            .expect("valid");
        async move { s.acquire().await.expect("permit") }
    })
    .await;
    let queue = sem.keys().companion("waiters");
    let first = one_release_one_attempt(
        &t,
        &queue,
        16,
        1, // the release hands the permit over
        async { a.release().await.expect("release") },
        &mut rx,
    )
    .await;
    // Adding two permits hands them over to exactly two more.
    sem.add_permits(2).await.expect("add");
    let mut more = Vec::new();
    for _ in 0..2 {
        more.push(
            timeout(Duration::from_secs(5), rx.recv())
                .await
                .expect("a waiter per added permit")
                .expect("channel"),
        );
    }
    sleep(Duration::from_millis(300)).await;
    assert!(
        rx.try_recv().is_err(),
        "more waiters got in than permits were added"
    );
    drop((first, b, more));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reentrant_release_wakes_one_waiter_across_clients() {
    let t = RedisTarget::start();
    let name = unique("re-herd");
    let ttl = Duration::from_secs(30);
    let re = ReentrantLock::builder(t.client().await, &name)
        .ttl(ttl)
        .build()
        .expect("valid");
    let owner = Owner::new("holder").expect("owner");
    let outer = re.lock(&owner).await.expect("lock");
    let inner = re.lock(&owner).await.expect("re-entry");
    let mut rx = waiters_in_own_clients(&t, 16, |client, i| {
        let r = ReentrantLock::builder(client, &name)
            .ttl(ttl)
            .build()
            .expect("valid");
        async move {
            let o = Owner::new(format!("waiter-{i}")).expect("owner");
            r.lock(&o).await.expect("lock")
        }
    })
    .await;
    inner.release().await.expect("the inner hold frees nothing");
    let queue = re.keys().companion("waiters");
    let first = one_release_one_attempt(
        &t,
        &queue,
        16,
        2, // the woken waiter takes the lock itself
        async { outer.release().await.expect("release") },
        &mut rx,
    )
    .await;
    drop(first);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_release_wakes_one_writer_across_clients() {
    let t = RedisTarget::start();
    let name = unique("rw-herd");
    let ttl = Duration::from_secs(30);
    let rw = RwLock::builder(t.client().await, &name)
        .ttl(ttl)
        .build()
        .expect("valid");
    let held = rw.write().await.expect("write");
    let mut rx = waiters_in_own_clients(&t, 16, |client, _| {
        let w = RwLock::builder(client, &name)
            .ttl(ttl)
            .build()
            .expect("valid");
        async move { w.write().await.expect("write") }
    })
    .await;
    let queue = rw.keys().companion("writers");
    let first = one_release_one_attempt(
        &t,
        &queue,
        16,
        2, // the woken writer takes the lock itself
        async { held.release().await.expect("release") },
        &mut rx,
    )
    .await;
    drop(first);
}

/// A client that waits on a lock again keeps its subscription from the last wait: the
/// wait costs no SUBSCRIBE, and its first attempt already queues (one EVALSHA to queue,
/// one to take the lock when woken).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_wait_reuses_the_subscription_and_queues_at_once() {
    let t = RedisTarget::start();
    let name = unique("rewait");
    let ttl = Duration::from_secs(30);
    let holder = Lock::builder(t.client().await, &name)
        .ttl(ttl)
        .build()
        .expect("valid");
    let waiter = Lock::builder(t.client().await, &name)
        .ttl(ttl)
        .build()
        .expect("valid");
    let mut admin = t.admin().await;
    for round in 0..2 {
        let held = holder.lock().await.expect("lock");
        if round == 1 {
            let _: () = redis::cmd("CONFIG")
                .arg("RESETSTAT")
                .query_async(&mut admin)
                .await
                .expect("resetstat");
        }
        let w = waiter.clone();
        let waiting = tokio::spawn(async move { w.lock().await.expect("lock") });
        timeout(Duration::from_secs(5), async {
            while holder.state().await.expect("store").queued != Some(1) {
                sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("the waiter queues");
        held.release().await.expect("release");
        let g = timeout(Duration::from_secs(5), waiting)
            .await
            .expect("woken")
            .expect("task");
        g.release().await.expect("release");
    }
    assert_eq!(
        calls(&mut admin, "subscribe").await,
        0,
        "the subscription lingered between waits"
    );
    assert_eq!(calls(&mut admin, "unsubscribe").await, 0);
    // Since the reset (after the holder's lock): the waiter's queueing attempt, the
    // holder's release (two scripts: the holder never waited on the name, so its
    // compare-and-delete finds waiters queued, then the hand-over), the waiter's release.
    // (A fresh subscription would add a first attempt that does not queue, a SUBSCRIBE
    // and an UNSUBSCRIBE.)
    assert_eq!(calls(&mut admin, "evalsha").await, 4);
}

/// The fallback timer on PostgreSQL: a waiter whose wake-up never comes still gets the lock
/// by the holder's remaining lease — with waiters waiting in the server on the name's gate
/// (the default) and without wait sessions (`?wait_connections=0`: the waiters table and
/// `NOTIFY` only). Bounds are liveness bounds: well past the lease the waiter was told to
/// wait for, well short of its own ttl (30 s) where that is the alternative.
mod on_postgres {
    use std::time::Duration;

    use dlock_test::conformance::{dies_after, unique};
    use dlock_test::targets::PostgresTarget;
    use fencelock::backend::Postgres;
    use fencelock::raw::{Acquire, RawLock};
    use fencelock::{Lock, Token};
    use tokio::time::{sleep, timeout};

    use crate::postgres::gate_in;

    /// The URL parameters of the two configurations.
    const GATE: &str = "";
    const NO_WAIT_SESSIONS: &str = "?wait_connections=0";

    async fn wait_queued(lock: &Lock<Postgres>, n: u32) {
        let queued = async {
            while lock.state().await.expect("store").queued != Some(n) {
                sleep(Duration::from_millis(10)).await;
            }
        };
        timeout(Duration::from_secs(10), queued)
            .await
            .unwrap_or_else(|_| panic!("{n} waiters never queued"));
    }

    /// A release hands the lock over to a crashed head (queued by a client that still
    /// listens, so the hand-over is made; nobody takes it, nobody withdraws it — and with
    /// wait sessions, its session keeps the name's gate for good): the next waiter, woken by
    /// nothing, gets in by its fallback timer once the head's lease runs out.
    async fn a_crashed_head_is_covered(params: &str) {
        let t = PostgresTarget::start();
        let ttl = Duration::from_secs(2);
        let url = format!("{}{params}", t.server.url());
        let client = Postgres::connect(&url).await.expect("connect");
        let lock = Lock::builder(client.clone(), unique("pg-crashed-head"))
            .ttl(ttl)
            .build()
            .expect("valid");
        let holder = lock.try_lock().await.expect("store").expect("free");
        let head = Token::random().expect("token");
        let reply = client
            .acquire_or_queue(lock.keys(), &head, ttl)
            .await
            .expect("store");
        assert!(matches!(reply, Acquire::Held { .. }), "the lock is held");
        let waiter = Lock::builder(Postgres::connect(&url).await.expect("connect"), lock.name())
            .ttl(ttl)
            .build()
            .expect("valid");
        let next = tokio::spawn(async move { waiter.lock().await });
        wait_queued(&lock, 2).await;
        let admin = t.server.admin().await;
        let key = lock.keys().lock().to_owned();
        if params == GATE {
            assert_eq!(
                gate_in(&admin, "dlock", &key).await.1,
                1,
                "the crashed head's wait session keeps the name's gate"
            );
        }
        holder.release().await.expect("release"); // hands over to the crashed head
        let state = lock.state().await.expect("store");
        assert_eq!(
            state.holder.as_deref(),
            Some(head.as_str()),
            "the release handed the lock over to the crashed head"
        );
        let handed = state.last_fence.expect("a fence");
        sleep(Duration::from_millis(100)).await;
        assert!(
            !next.is_finished(),
            "the lock is the crashed head's until its lease runs out"
        );
        let g = timeout(ttl * 5, next)
            .await
            .expect("the next waiter must not hang: its fallback timer covers the crashed head")
            .expect("task")
            .expect("lock");
        assert!(
            g.fencing_token().get() > handed,
            "{} after the hand-over's {handed}",
            g.fencing_token().get()
        );
        g.release().await.expect("release");
        wait_queued(&lock, 0).await;
        if params == GATE {
            assert_eq!(
                gate_in(&admin, "dlock", &key).await,
                (0, 1),
                "the waiter got in past the gate the crashed head still keeps"
            );
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_crashed_head_is_covered_by_the_fallback_timer() {
        a_crashed_head_is_covered(GATE).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_crashed_head_is_covered_by_the_fallback_timer_without_wait_sessions() {
        a_crashed_head_is_covered(NO_WAIT_SESSIONS).await;
    }

    /// Another program holds the row for 2 s and clears it with a statement of its own: no
    /// hand-over, no `NOTIFY`, no gate freed. The waiter gets in by its fallback timer —
    /// the foreign holder's remaining lease — not by its own ttl (30 s) nor a gate wait's
    /// bound (15 s).
    async fn a_foreign_release_is_covered(params: &str) {
        let t = PostgresTarget::start();
        let url = format!("{}{params}", t.server.url());
        let lock = Lock::builder(
            Postgres::connect(&url).await.expect("connect"),
            unique("pg-foreign"),
        )
        .ttl(Duration::from_secs(30))
        .build()
        .expect("valid");
        let key = lock.keys().lock().to_owned();
        let admin = t.server.admin().await;
        admin
            .execute(
                "INSERT INTO dlock.locks AS l (key, holder, expires_at)
                 VALUES ($1, 'foreign', clock_timestamp() + interval '2 s')
                 ON CONFLICT (key) DO UPDATE
                 SET holder = excluded.holder, expires_at = excluded.expires_at",
                &[&key],
            )
            .await
            .expect("a foreign hold");
        let waiter = lock.clone();
        let next = tokio::spawn(async move { waiter.lock().await });
        wait_queued(&lock, 1).await;
        assert_eq!(
            lock.state().await.expect("store").holder.as_deref(),
            Some("foreign"),
            "the waiter queued behind the foreign holder"
        );
        let cleared = admin
            .execute(
                "UPDATE dlock.locks SET holder = NULL, expires_at = NULL
                 WHERE key = $1 AND holder = 'foreign'",
                &[&key],
            )
            .await
            .expect("a foreign release");
        assert_eq!(cleared, 1, "released by the foreign program");
        let g = timeout(Duration::from_secs(8), next)
            .await
            .expect("the waiter gets in by its fallback timer (the foreign holder's lease)")
            .expect("task")
            .expect("lock");
        g.release().await.expect("release");
        wait_queued(&lock, 0).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_foreign_release_is_covered_by_the_ttl_fallback() {
        a_foreign_release_is_covered(GATE).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_foreign_release_is_covered_by_the_ttl_fallback_without_wait_sessions() {
        a_foreign_release_is_covered(NO_WAIT_SESSIONS).await;
    }

    /// The waiter's client loses every session it has in the server
    /// (`pg_terminate_backend` by its `application_name`: its `LISTEN` session, its wait
    /// session and the gate with it, its pooled connections), then the holder's process
    /// vanishes without a release: no wake-up can come. The waiter reconnects, waits on,
    /// and gets the lock by its fallback timer once the dead holder's lease runs out.
    async fn vanished_holder_after_lost_sessions(params: &str) {
        let t = PostgresTarget::start();
        let ttl = Duration::from_secs(3);
        let url = format!("{}{params}", t.server.url());
        let name = unique("pg-vanished");
        let (die, dying) = tokio::sync::oneshot::channel::<()>();
        let (held_tx, held) = tokio::sync::oneshot::channel::<u64>();
        let (holder_url, holder_name) = (url.clone(), name.clone());
        // The holder's whole client lives in a runtime of its own that is shut down when
        // told, as its process would end: no release, no renewal after that.
        let vanishing = tokio::task::spawn_blocking(move || {
            dies_after(async move {
                let pg = Postgres::connect(&holder_url).await.expect("connect");
                let lock = Lock::builder(pg, holder_name)
                    .ttl(ttl)
                    .build()
                    .expect("valid");
                let guard = lock.try_lock().await.expect("store").expect("free");
                let _ = held_tx.send(guard.fencing_token().get());
                let _ = dying.await; // renewed by its watchdog until then
                std::mem::forget(guard);
            });
        });
        let fence = held.await.expect("the holder holds the lock");
        let app = "dlock_fallback_waiter";
        let sep = if params.contains('?') { '&' } else { '?' };
        let lock = Lock::builder(
            Postgres::connect(&format!("{url}{sep}application_name={app}"))
                .await
                .expect("connect"),
            &name,
        )
        .ttl(Duration::from_secs(30))
        .build()
        .expect("valid");
        let waiter = lock.clone();
        let next = tokio::spawn(async move { waiter.lock().await });
        wait_queued(&lock, 1).await;
        let admin = t.server.admin().await;
        let key = lock.keys().lock().to_owned();
        if params == GATE {
            assert_eq!(
                gate_in(&admin, "dlock", &key).await,
                (0, 1),
                "the waiter waits at the head, its wait session keeping the gate"
            );
        }
        let killed: i64 = admin
            .query_one(
                "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                 WHERE application_name = $1) t",
                &[&app],
            )
            .await
            .expect("terminate")
            .get(0);
        assert!(
            killed >= 2,
            "the waiter's LISTEN session and its connections: {killed}"
        );
        // The holder still renews: the waiter, back on new sessions, still waits.
        sleep(ttl).await;
        assert!(!next.is_finished(), "the lock is still the live holder's");
        let _ = die.send(());
        vanishing.await.expect("the holder's process");
        let g = timeout(ttl * 5, next)
            .await
            .expect("the waiter must not hang: its fallback timer covers the vanished holder")
            .expect("task")
            .expect("lock");
        assert!(
            g.fencing_token().get() > fence,
            "{} after the vanished holder's {fence}",
            g.fencing_token().get()
        );
        g.release().await.expect("release");
        wait_queued(&lock, 0).await;
        let gate_freed = async {
            while gate_in(&admin, "dlock", &key).await != (0, 0) {
                sleep(Duration::from_millis(10)).await;
            }
        };
        timeout(Duration::from_secs(10), gate_freed)
            .await
            .expect("no gate left held");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_vanished_holder_is_covered_after_the_waiter_lost_its_sessions() {
        vanished_holder_after_lost_sessions(GATE).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_vanished_holder_is_covered_after_the_waiter_lost_its_sessions_without_wait_sessions()
    {
        vanished_holder_after_lost_sessions(NO_WAIT_SESSIONS).await;
    }
}
