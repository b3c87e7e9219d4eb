//! The memory backend against the conformance suite, plus what only it can show.

use std::time::Duration;

use dlock_test::targets::MemoryTarget;
use fencelock::backend::Memory;
use fencelock::{Lock, LockGuard};

mod conformance {
    crate::all_conformance_tests!(dlock_test::targets::MemoryTarget::default());
}

mod election {
    crate::election_tests!(dlock_test::targets::MemoryTarget::default());
}

fn assert_send<T: Send>(_: &T) {}
fn assert_send_static<T: Send + 'static>(_: &T) {}

#[tokio::test]
async fn public_futures_and_guards_are_send_and_static() {
    let lock = Lock::new(Memory::new(), "send").expect("valid");
    assert_send(&lock.lock());
    assert_send(&lock.try_lock());
    assert_send(&lock.try_lock_for(Duration::from_millis(1)));
    let guard: LockGuard<Memory> = lock.try_lock().await.expect("ok").expect("free");
    assert_send_static(&guard.lost());
    assert_send(&guard.extend(Duration::from_secs(1)));
    assert_send_static(&guard);
    let release = guard.release();
    assert_send_static(&release);
    release.await.expect("release");
}

#[test]
fn dropping_a_guard_outside_any_runtime_does_not_panic_and_the_lease_expires() {
    let store = Memory::new();
    let lock = Lock::builder(store.clone(), "no-runtime")
        .ttl(Duration::from_millis(200))
        .build()
        .expect("valid");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let guard = rt.block_on(lock.try_lock()).expect("store").expect("free");
    drop(rt); // the watchdog dies with its runtime
    drop(guard); // no runtime: nothing can be spawned, nothing panics
    assert!(
        store.remaining(lock.keys().lock()).is_some(),
        "still held until its ttl"
    );
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        store.remaining(lock.keys().lock()).is_none(),
        "the lease expired by itself"
    );
}

#[tokio::test]
async fn one_release_wakes_one_local_waiter() {
    // Three waiters on one store; each release lets exactly one more through.
    let target = MemoryTarget::default();
    let store = dlock_test::conformance::Target::client(&target).await;
    let lock = Lock::builder(store, "herd")
        .ttl(Duration::from_secs(20))
        .build()
        .expect("valid");
    let first = lock.try_lock().await.expect("ok").expect("free");
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    for i in 0..3 {
        let lock = lock.clone();
        let tx = tx.clone();
        tokio::spawn(async move {
            let g = lock.lock().await.expect("lock");
            tx.send((i, g)).expect("send");
        });
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(rx.try_recv().is_err());
    first.release().await.expect("release");
    let (_, g) = tokio::time::timeout(Duration::from_secs(5), rx.recv())
        .await
        .expect("one waiter woke")
        .expect("channel");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(rx.try_recv().is_err(), "a second waiter got a held lock");
    g.release().await.expect("release");
    for _ in 0..2 {
        let (_, g) = tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .expect("next waiter woke")
            .expect("channel");
        g.release().await.expect("release");
    }
}
