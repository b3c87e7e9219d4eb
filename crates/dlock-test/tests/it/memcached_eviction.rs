//! Memcached's lock family when the item that lists the holders vanishes while they hold
//! (an LRU eviction, `flush_all`, an operator's `delete`): a raw `md` on the index item
//! stands in for it. Whatever the store does then — refuse the next acquirer, or grant it
//! and end the old holds — the primitive's bound must hold once the old holders had a
//! renewal to notice: never more holders than permits, never a writer beside a reader,
//! never two owners of a reentrant lock.

use std::time::Duration;

use dlock_test::conformance::{Target, unique};
use dlock_test::targets::MemcachedTarget;
use fencelock::backend::memcached::memcached_key;
use fencelock::raw::RawLock;
use fencelock::{LockGuard, Owner, ReentrantLock, RwLock, Semaphore};
use tokio::time::{Instant, sleep};

/// The holds' lease: renewed every third of it.
const TTL: Duration = Duration::from_secs(3);

/// Deletes memcached item `item` (already a memcached key) with a raw `md`.
fn delete_item(target: &MemcachedTarget, item: &str) {
    let reply = target
        .server
        .command(&format!("md {item}\r\n"))
        .expect("md");
    assert!(reply.starts_with("HD"), "the item was there: {reply}");
}

/// Lets a renewal go by and checks that `holds` kept their leases: the bound checked
/// after the item vanished is not met by holds that end by themselves.
async fn renewed<B: RawLock>(holds: &[&LockGuard<B>]) {
    sleep(TTL / 2).await;
    assert_eq!(alive(holds), holds.len(), "a renewal lost a hold");
}

/// How many of `holds` have not lost their lease.
fn alive<B: RawLock>(holds: &[&LockGuard<B>]) -> usize {
    holds.iter().filter(|g| !g.is_lost()).count()
}

/// Waits (at most two ttls: a renewal comes every third of one) until `settled` says the
/// holds are within the bound, and returns whether they got there.
async fn settles(mut settled: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + TTL * 2;
    while Instant::now() < deadline {
        if settled() {
            return true;
        }
        sleep(Duration::from_millis(100)).await;
    }
    settled()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_whose_index_vanished_never_exceeds_its_permits() {
    let target = MemcachedTarget::start();
    let name = unique("evicted-sem");
    let sem = |mc| Semaphore::builder(mc, &name, 2).ttl(TTL).build();
    let first = sem(target.client().await).expect("valid");
    let second = sem(target.client().await).expect("valid");
    let a = first.try_acquire().await.expect("store").expect("free");
    let b = second.try_acquire().await.expect("store").expect("free");
    renewed(&[&a, &b]).await;
    delete_item(&target, &memcached_key(first.keys().lock()));

    let third = sem(target.client().await).expect("valid");
    let c = third.try_acquire().await.expect("store");
    let holds: Vec<_> = [Some(&a), Some(&b), c.as_ref()]
        .into_iter()
        .flatten()
        .collect();
    assert!(
        settles(|| alive(&holds) <= 2).await,
        "{} holders of 2 permits, {} ttls after the index vanished (c granted: {})",
        alive(&holds),
        2,
        c.is_some()
    );
    // And it stays so: a lost hold does not come back, a later acquirer counts too.
    let fourth = sem(target.client().await).expect("valid");
    let d = fourth.try_acquire().await.expect("store");
    sleep(TTL / 2).await;
    let mut holds = holds;
    holds.extend(d.as_ref());
    assert!(alive(&holds) <= 2, "{} holders of 2 permits", alive(&holds));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_write_lock_whose_index_vanished_never_lets_a_writer_beside_a_reader() {
    let target = MemcachedTarget::start();
    let name = unique("evicted-rw");
    let rw = |mc| RwLock::builder(mc, &name).ttl(TTL).build();
    let readers = rw(target.client().await).expect("valid");
    let r1 = readers.try_read().await.expect("store").expect("free");
    let r2 = readers.try_read().await.expect("store").expect("shared");
    renewed(&[&r1, &r2]).await;
    let index = format!("{}~rw", memcached_key(readers.keys().lock()));
    delete_item(&target, &index);

    let writers = rw(target.client().await).expect("valid");
    let w = writers.try_write().await.expect("store");
    let reads = [&r1, &r2];
    let writer_alive = || w.as_ref().is_some_and(|w| !w.is_lost());
    assert!(
        settles(|| !(writer_alive() && alive(&reads) > 0)).await,
        "a writer beside {} readers, {} ttls after the index vanished",
        alive(&reads),
        2
    );

    // A writer holding when the index vanishes: readers see its item, not the index.
    drop((r1, r2, w));
    let lock = rw(target.client().await).expect("valid");
    let w = lock
        .try_write_for(TTL * 3)
        .await
        .expect("store")
        .expect("free once the old holds ended");
    renewed(&[&w]).await;
    delete_item(&target, &index);
    let other = rw(target.client().await).expect("valid");
    assert!(
        other.try_read().await.expect("store").is_none(),
        "a reader beside the writer"
    );
    assert!(!w.is_lost());
    w.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reentrant_lock_whose_item_vanished_never_has_two_owners() {
    let target = MemcachedTarget::start();
    let name = unique("evicted-reentrant");
    let lock = |mc| ReentrantLock::builder(mc, &name).ttl(TTL).build();
    let mine = lock(target.client().await).expect("valid");
    let me = Owner::new("me").expect("valid");
    let outer = mine.try_lock(&me).await.expect("store").expect("free");
    let inner = mine.try_lock(&me).await.expect("store").expect("mine");
    renewed(&[&outer, &inner]).await;
    delete_item(&target, &memcached_key(mine.keys().lock()));

    let theirs = lock(target.client().await).expect("valid");
    let them = Owner::new("them").expect("valid");
    let other = theirs.try_lock(&them).await.expect("store");
    let holds = [&outer, &inner];
    let other_alive = || other.as_ref().is_some_and(|g| !g.is_lost());
    assert!(
        settles(|| !(other_alive() && alive(&holds) > 0)).await,
        "two owners: {} holds of mine beside theirs",
        alive(&holds)
    );
}
