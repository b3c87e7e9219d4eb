//! The memcached backend against the lock conformance suite, plus what only it has.

use std::time::Duration;

use dlock::{ErrorKind, Lock};
use dlock_test::conformance::{Target, unique};
use dlock_test::targets::MemcachedTarget;
use tokio::time::timeout;

mod conformance {
    crate::lock_conformance_tests!(dlock_test::targets::MemcachedTarget::start());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttls_memcached_cannot_express_are_refused_and_validity_is_a_second_shorter() {
    let target = MemcachedTarget::start();
    let mc = target.client().await;
    for ttl in [Duration::from_secs(1), Duration::from_millis(1999)] {
        let lock = Lock::builder(mc.clone(), unique("ttl"))
            .ttl(ttl)
            .build()
            .expect("valid for the lock itself");
        let err = lock
            .try_lock()
            .await
            .expect_err("below memcached's minimum");
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
        assert!(
            !lock.is_locked().await.expect("store"),
            "nothing was stored"
        );
    }
    let lock = Lock::builder(mc.clone(), unique("ttl"))
        .ttl(Duration::from_millis(2500))
        .build()
        .expect("valid");
    let guard = lock.try_lock().await.expect("store").expect("free");
    // Stored as 3 s (rounded up); relied on for at most 2.5 s − drift − 1 s.
    assert!(
        guard.remaining() <= Duration::from_millis(1500),
        "{:?}",
        guard.remaining()
    );
    let state = lock.state().await.expect("store");
    assert!(
        state.remaining.is_some_and(|r| r <= Duration::from_secs(3)),
        "{state:?}"
    );
    guard.release().await.expect("release");
    for bad in [Duration::ZERO, Duration::from_secs(30 * 24 * 3600 + 1)] {
        assert_eq!(
            Lock::builder(mc.clone(), "x")
                .ttl(bad)
                .build()
                .map(|_| ())
                .map_err(|e| e.kind()),
            Err(ErrorKind::InvalidArgument)
        );
    }
    assert_eq!(
        dlock::backend::memcached::expiry_seconds(Duration::from_secs(30 * 24 * 3600 + 1))
            .map_err(|e| e.kind()),
        Err(ErrorKind::InvalidArgument),
        "30 days + 1 s would be read as an absolute time"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_name_works_even_10_kb_with_spaces_and_names_do_not_collide() {
    let target = MemcachedTarget::start();
    let mc = target.client().await;
    let long = format!("{} with spaces\tand tabs é", "x".repeat(10_000));
    let keys = dlock::keys::LockKeys::new("", &long[..1000]).expect("keys");
    let mapped = dlock::backend::memcached::memcached_key(keys.lock());
    assert!(mapped.len() <= 250, "{mapped}");
    let a = Lock::builder(mc.clone(), &long[..1000])
        .build()
        .expect("valid");
    let b = Lock::builder(mc.clone(), format!("{}!", &long[..999]))
        .build()
        .expect("valid");
    let ga = a.try_lock().await.expect("store").expect("free");
    let gb = b
        .try_lock()
        .await
        .expect("store")
        .expect("a different name is a different lock");
    assert!(a.try_lock().await.expect("store").is_none());
    ga.release().await.expect("release");
    gb.release().await.expect("release");
    // Names over the library's own 1024-byte limit are refused before the store.
    assert_eq!(
        Lock::new(mc, long).map(|_| ()).map_err(|e| e.kind()),
        Err(ErrorKind::InvalidArgument)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eviction_of_a_held_lock_fires_lost_and_a_waiter_polls_its_way_in() {
    let target = MemcachedTarget::start();
    let lock = Lock::builder(target.client().await, unique("evicted"))
        .ttl(Duration::from_secs(3))
        .build()
        .expect("valid");
    let guard = lock.try_lock().await.expect("store").expect("free");
    let lost = guard.lost();
    // flush_all stands in for an eviction under memory pressure.
    assert!(
        target
            .server
            .command("flush_all\r\n")
            .expect("flush")
            .starts_with("OK")
    );
    timeout(Duration::from_secs(3), lost)
        .await
        .expect("lost() fires at the next renewal once the key vanished");
    assert_eq!(
        guard.release().await.expect_err("gone").kind(),
        ErrorKind::LockLost
    );

    // No notification: a waiter backs off (at most 500 ms) and gets in soon after a
    // release, far before the holder's ttl.
    let holder = lock.try_lock().await.expect("store").expect("free again");
    let waiter = Lock::builder(target.client().await, lock.name())
        .ttl(Duration::from_secs(20))
        .build()
        .expect("valid");
    let waiting = tokio::spawn(async move {
        waiter
            .lock()
            .await
            .map(|g| (tokio::time::Instant::now(), g))
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released = tokio::time::Instant::now();
    holder.release().await.expect("release");
    let (at, g) = timeout(Duration::from_secs(3), waiting)
        .await
        .expect("the waiter polls its way in")
        .expect("task")
        .expect("lock");
    assert!(at >= released);
    g.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_forgets_locks_and_fences_as_documented() {
    let mut target = MemcachedTarget::start();
    let name = unique("restart");
    let lock = Lock::builder(target.client().await, &name)
        .ttl(Duration::from_secs(3))
        .build()
        .expect("valid");
    let g = lock.try_lock().await.expect("store").expect("free");
    let first = g.fencing_token();
    g.release().await.expect("release");
    let g = lock.try_lock().await.expect("store").expect("free");
    assert!(g.fencing_token() > first);
    let lost = g.lost();
    target.server.restart().expect("restart");
    timeout(Duration::from_secs(3), lost)
        .await
        .expect("lost() fires after the restart");
    drop(g);
    let again = lock
        .try_lock_for(Duration::from_secs(5))
        .await
        .expect("the client reconnects")
        .expect("free: the restart forgot the lock");
    assert_eq!(
        again.fencing_token().get(),
        1,
        "the counter restarted at 1 (documented)"
    );
    again.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_call_leaves_no_replies_for_the_next_one() {
    use dlock_test::proxy::{Fault, Proxy};
    let target = MemcachedTarget::start();
    let proxy = Proxy::start(
        format!("127.0.0.1:{}", target.server.port())
            .parse()
            .expect("addr"),
    )
    .await
    .expect("proxy");
    let mc = dlock::backend::Memcached::connect(&format!("memcache://{}", proxy.addr()))
        .await
        .expect("connect");
    let name = unique("cancelled");
    let a = Lock::builder(mc.clone(), &name)
        .ttl(Duration::from_secs(3))
        .build()
        .expect("valid");
    proxy.set_fault(Fault::Delay(Duration::from_millis(300)));
    assert!(
        timeout(Duration::from_millis(100), a.lock()).await.is_err(),
        "answered through a 300 ms delay"
    );
    proxy.set_fault(Fault::Pass);
    tokio::time::sleep(Duration::from_millis(800)).await; // the delayed bytes arrive
    for i in 0..3 {
        let lock = Lock::builder(mc.clone(), format!("{name}-{i}"))
            .ttl(Duration::from_secs(3))
            .build()
            .expect("valid");
        let g = lock
            .try_lock()
            .await
            .expect("a later call reads its own replies")
            .expect("free");
        g.release().await.expect("release");
    }
    // The cancelled grant is given back in the background — or, if the delayed add lands
    // after that release, it expires by its ttl: either way it is free within the ttl.
    let other = Lock::builder(target.client().await, &name)
        .ttl(Duration::from_secs(3))
        .build()
        .expect("valid");
    let g = other
        .try_lock_for(Duration::from_secs(5))
        .await
        .expect("store")
        .expect("the cancelled grant was released or expired");
    g.release().await.expect("release");
}
