//! The plain Redis lock's grant without a script (`SET NX PX` + `INCR` in one
//! `MULTI`/`EXEC`, no queue check) and its release with nobody queued (compare-and-delete
//! + `EXISTS`): what they let through, and that the queue keeps its order around them.

use std::time::Duration;

use dlock_test::conformance::{Target, unique};
use dlock_test::targets::RedisTarget;
use fencelock::raw::{Acquire, RawLock};
use fencelock::{FairLock, Lock, Token};
use tokio::time::{sleep, timeout};

/// The lease of every lock here: long enough never to run out during a test.
const TTL: Duration = Duration::from_secs(30);

/// A plain lock on `name`, on a client of its own.
async fn lock_on(t: &RedisTarget, name: &str) -> Lock<fencelock::backend::Redis> {
    Lock::builder(t.client().await, name)
        .ttl(TTL)
        .build()
        .expect("valid")
}

/// A fair lock on `name`, on a client of its own.
async fn fair_on(t: &RedisTarget, name: &str) -> FairLock<fencelock::backend::Redis> {
    FairLock::builder(t.client().await, name)
        .ttl(TTL)
        .build()
        .expect("valid")
}

async fn wait_queued(lock: &Lock<fencelock::backend::Redis>, n: u32) {
    let queued = async {
        while lock.state().await.expect("store").queued != Some(n) {
            sleep(Duration::from_millis(10)).await;
        }
    };
    timeout(Duration::from_secs(5), queued)
        .await
        .unwrap_or_else(|_| panic!("{n} waiters never queued"));
}

/// A lock that is free while a waiter queues — its holder's lease ran out (here: its key
/// deleted, as expiry would) — goes to a newcomer's first attempt, ahead of the queue
/// (the documented trade-off of the plain lock, as Redisson's non-fair lock). The fence
/// still increases, and the newcomer's release hands the lock to the queue in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_freed_by_expiry_may_go_to_a_newcomer_whose_release_serves_the_queue() {
    let t = RedisTarget::start();
    let name = unique("barge");
    let lock = lock_on(&t, &name).await;
    let holder = lock.try_lock().await.expect("store").expect("free");
    let first_fence = holder.fencing_token().get();
    // A waiter of a client of its own queues (and listens).
    let waiter = lock_on(&t, &name).await;
    let waiting = tokio::spawn(async move { waiter.lock().await });
    wait_queued(&lock, 1).await;
    // The holder "crashes": its lease ends without a release.
    let mut admin = t.admin().await;
    let deleted: i64 = redis::cmd("DEL")
        .arg(lock.keys().lock())
        .query_async(&mut admin)
        .await
        .expect("DEL");
    assert_eq!(deleted, 1);
    std::mem::forget(holder);
    // A newcomer's first attempt takes the free lock; the waiter keeps its place.
    let newcomer = lock_on(&t, &name).await;
    let barged = newcomer
        .try_lock()
        .await
        .expect("store")
        .expect("a free lock goes to a first attempt, waiters queued or not");
    assert!(barged.fencing_token().get() > first_fence);
    assert_eq!(lock.state().await.expect("store").queued, Some(1));
    assert!(!waiting.is_finished());
    // Its release finds the waiter queued and hands the lock over to it.
    let barged_fence = barged.fencing_token().get();
    barged.release().await.expect("release");
    let next = timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the release hands the lock over to the queue")
        .expect("task")
        .expect("lock");
    assert!(next.fencing_token().get() > barged_fence);
    next.release().await.expect("release");
}

/// A waiter that the store hands the lock to is never overtaken: the key holds its token
/// from the release on, so a newcomer's grant without a script finds the lock held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_over_is_never_overtaken_by_a_first_attempt() {
    let t = RedisTarget::start();
    let name = unique("no-overtake");
    let lock = lock_on(&t, &name).await;
    for _ in 0..20 {
        let holder = lock.try_lock().await.expect("store").expect("free");
        let waiter = lock_on(&t, &name).await;
        let waiting = tokio::spawn(async move { waiter.lock().await });
        wait_queued(&lock, 1).await;
        let newcomer = lock_on(&t, &name).await;
        // Released and tried at once, from two clients.
        let (released, tried) = tokio::join!(holder.release(), newcomer.try_lock());
        released.expect("release");
        let next = timeout(Duration::from_secs(5), waiting)
            .await
            .expect("handed over")
            .expect("task")
            .expect("lock");
        // Whatever the newcomer got, it was not the waiter's turn: the waiter holds now.
        if let Some(g) = tried.expect("store") {
            panic!(
                "a first attempt overtook the queue: fence {} beside the waiter's {}",
                g.fencing_token().get(),
                next.fencing_token().get()
            );
        }
        next.release().await.expect("release");
    }
}

/// The fair lock stays strict: with a waiter queued, a free lock goes to nobody else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_lock_freed_by_expiry_still_goes_to_the_queue() {
    let t = RedisTarget::start();
    let name = unique("fair-barge");
    let fair = fair_on(&t, &name).await;
    let holder = fair.try_lock().await.expect("store").expect("free");
    let waiter = fair_on(&t, &name).await;
    let waiting = tokio::spawn(async move { waiter.lock().await });
    let queued = async {
        while fair.state().await.expect("store").queued != Some(1) {
            sleep(Duration::from_millis(10)).await;
        }
    };
    timeout(Duration::from_secs(5), queued)
        .await
        .expect("the waiter queues");
    let mut admin = t.admin().await;
    let _: i64 = redis::cmd("DEL")
        .arg(fair.keys().lock())
        .query_async(&mut admin)
        .await
        .expect("DEL");
    std::mem::forget(holder);
    let newcomer = fair_on(&t, &name).await;
    assert!(
        newcomer.try_lock().await.expect("store").is_none(),
        "a fair lock's newcomer waits its turn"
    );
    let next = timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the waiter takes it")
        .expect("task")
        .expect("lock");
    next.release().await.expect("release");
}

/// A repeat of a first attempt whose reply was lost (same token) is recognised: the
/// grant without a script finds its own token, and the script renews it and answers
/// with a fence above the first one's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_first_attempt_is_granted_again() {
    let t = RedisTarget::start();
    let client = t.client().await;
    let lock = Lock::new(client.clone(), unique("repeat")).expect("valid");
    let token = Token::random().expect("token");
    let Acquire::Acquired { fence: first } = client
        .acquire(lock.keys(), &token, TTL)
        .await
        .expect("store")
    else {
        panic!("free");
    };
    let Acquire::Acquired { fence: again } = client
        .acquire(lock.keys(), &token, TTL)
        .await
        .expect("store")
    else {
        panic!("the repeat is granted: the key holds its token");
    };
    assert!(again >= first, "{again} < {first}");
    let other = Token::random().expect("token");
    assert!(matches!(
        client
            .acquire(lock.keys(), &other, TTL)
            .await
            .expect("store"),
        Acquire::Held { .. }
    ));
    assert!(client.release(lock.keys(), &token).await.expect("store"));
}
