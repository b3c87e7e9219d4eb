//! Conformance behaviours of the lock family beyond the plain lock: reentrant lock,
//! read-write lock, fair lock, multi-lock. Each panics if the backend misbehaves.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use fencelock::raw::RawSemaphore;
use fencelock::raw::{RawFair, RawReentrant, RawRwLock};
use fencelock::{
    ErrorKind, FairLock, Lock, MultiLock, Owner, ReentrantLock, RwLock, Semaphore, Token,
};
use tokio::time::{Instant, sleep, timeout};

use crate::conformance::{Target, unique};

/// Counts how many workers are inside a critical section at once.
#[derive(Default)]
struct Inside {
    now: AtomicUsize,
    most: AtomicUsize,
    entries: AtomicUsize,
}

impl Inside {
    fn enter(&self) {
        let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(n, Ordering::SeqCst);
        self.entries.fetch_add(1, Ordering::SeqCst);
    }

    fn leave(&self) {
        self.now.fetch_sub(1, Ordering::SeqCst);
    }

    fn most(&self) -> usize {
        self.most.load(Ordering::SeqCst)
    }
}

/// Many owners (each on its own client) nest two holds per critical section: never two
/// owners inside at once, and every owner gets in.
pub async fn reentrant_excludes_other_owners<T: Target>(target: &T)
where
    T::Backend: RawReentrant,
{
    let name = unique("re-mutex");
    let inside = Arc::new(Inside::default());
    let mut tasks = Vec::new();
    for w in 0..6 {
        let lock = ReentrantLock::builder(target.client().await, &name)
            .ttl(Duration::from_secs(10))
            .build()
            .expect("valid");
        let inside = Arc::clone(&inside);
        tasks.push(tokio::spawn(async move {
            let me = Owner::new(format!("worker-{w}")).expect("owner");
            for _ in 0..5 {
                let outer = lock.lock(&me).await.expect("lock");
                inside.enter();
                let inner = lock.lock(&me).await.expect("re-enter");
                assert_eq!(inner.fencing_token(), outer.fencing_token());
                sleep(Duration::from_millis(2)).await;
                inner.release().await.expect("inner release");
                inside.leave();
                outer.release().await.expect("outer release");
            }
        }));
    }
    for t in tasks {
        t.await.expect("worker");
    }
    assert_eq!(inside.most(), 1, "two owners inside at once");
    assert_eq!(inside.entries.load(Ordering::SeqCst), 30);
}

/// N acquires need N releases; re-entry keeps the fence; the limit is a typed error that
/// changes nothing; a new tenure gets a larger fence; inspection tells holder and count.
pub async fn reentrant_counts_holds<T: Target>(target: &T)
where
    T::Backend: RawReentrant,
{
    let name = unique("re-count");
    let lock = ReentrantLock::builder(target.client().await, &name)
        .max_holds(3)
        .build()
        .expect("valid");
    let (me, other) = (
        Owner::new("me").expect("owner"),
        Owner::new("other").expect("owner"),
    );
    assert!(!lock.is_locked().await.expect("store"));
    let a = lock.lock(&me).await.expect("first");
    let b = lock.try_lock(&me).await.expect("store").expect("re-entry");
    let c = lock
        .try_lock_for(&me, Duration::from_millis(10))
        .await
        .expect("store")
        .expect("re-entry");
    assert_eq!(lock.hold_count(&me).await.expect("store"), 3);
    assert_eq!(lock.hold_count(&other).await.expect("store"), 0);
    assert!(a.fencing_token() == b.fencing_token() && b.fencing_token() == c.fencing_token());
    let err = lock.try_lock(&me).await.expect_err("over the limit");
    assert_eq!(err.kind(), ErrorKind::LimitReached);
    assert_eq!(
        lock.hold_count(&me).await.expect("store"),
        3,
        "refused hold counted"
    );
    let state = lock.state().await.expect("store");
    assert_eq!(state.holder.as_deref(), Some(me.as_str()));
    assert_eq!(state.hold_count, Some(3));
    assert_eq!(state.last_fence, Some(a.fencing_token().get()));
    if target.session_bound() {
        assert_eq!(state.remaining, None, "a session's hold has no stored ttl");
    } else {
        assert!(state.remaining.is_some_and(|r| r > Duration::ZERO));
    }

    assert!(lock.try_lock(&other).await.expect("store").is_none());
    b.release()
        .await
        .expect("release b (not the last, out of order)");
    a.release().await.expect("release a");
    assert_eq!(lock.hold_count(&me).await.expect("store"), 1);
    assert!(
        lock.try_lock(&other).await.expect("store").is_none(),
        "free after 2 of 3 releases"
    );
    let first_fence = c.fencing_token();
    c.release().await.expect("release c");
    assert!(!lock.is_locked().await.expect("store"));
    let theirs = lock.try_lock(&other).await.expect("store").expect("free");
    assert!(theirs.fencing_token() > first_fence);
    assert_eq!(
        ReentrantLock::builder(target.client().await, "x")
            .max_holds(0)
            .build()
            .map(|_| ())
            .map_err(|e| e.kind()),
        Err(ErrorKind::InvalidArgument)
    );

    // Force-unlock drops every hold; the holder learns it.
    let lost = theirs.lost();
    assert!(lock.force_unlock().await.expect("store"));
    assert!(!lock.is_locked().await.expect("store"));
    drop(lost);
    assert_eq!(
        theirs.release().await.expect_err("deleted").kind(),
        ErrorKind::LockLost
    );
}

/// A reentrant lock deleted behind its holder's back fires `lost()` on every hold; a
/// cancelled waiter leaves no hold; a dead owner's holds free within the ttl.
pub async fn reentrant_lost_cancel_and_expiry<T: Target>(target: &T)
where
    T::Backend: RawReentrant,
{
    let name = unique("re-lost");
    let ttl = target.ttl(Duration::from_millis(600));
    let lock = ReentrantLock::builder(target.client().await, &name)
        .ttl(ttl)
        .build()
        .expect("valid");
    let me = Owner::new("me").expect("owner");
    let outer = lock.lock(&me).await.expect("lock");
    let inner = lock.lock(&me).await.expect("re-enter");

    let waiter_lock = ReentrantLock::builder(target.client().await, &name)
        .ttl(ttl)
        .build()
        .expect("valid");
    let them = Owner::new("them").expect("owner");
    let cancelled = timeout(Duration::from_millis(150), waiter_lock.lock(&them)).await;
    assert!(cancelled.is_err(), "waited while held");
    assert_eq!(lock.hold_count(&them).await.expect("store"), 0);

    target.delete_key(lock.keys().lock()).await;
    timeout(ttl, outer.lost())
        .await
        .expect("outer lost() fires");
    timeout(ttl, inner.lost())
        .await
        .expect("inner lost() fires");
    drop((outer, inner));

    // A dead owner: holds forgotten, the lock frees within the ttl.
    let g = lock.lock(&me).await.expect("lock");
    let g2 = lock.lock(&me).await.expect("re-enter");
    // What the holder was promised: the store may end the lease no earlier (memcached's
    // one-second clock can end it up to a second before the ttl; its validity is a second
    // shorter).
    let promised = g2.remaining();
    let gone = Instant::now();
    g.forget();
    g2.forget();
    let next = waiter_lock
        .try_lock_for(&them, ttl * 10)
        .await
        .expect("store")
        .expect("freed by expiry");
    let waited = gone.elapsed();
    assert!(
        waited + Duration::from_millis(100) >= promised,
        "freed after {waited:?}, before the validity the holder was promised ({promised:?}, ttl {ttl:?})"
    );
    next.release().await.expect("release");
}

/// `Owner::current_task()` is one value per task, the same wherever the task runs.
pub async fn owners_follow_tasks_not_threads<T: Target>(_target: &T) {
    let (here, again) = tokio::spawn(async { (Owner::current_task(), Owner::current_task()) })
        .await
        .expect("task");
    let here = here.expect("in a task");
    assert_eq!(here, again.expect("in a task"));
    let there = tokio::spawn(async {
        let before = Owner::current_task().expect("in a task");
        for _ in 0..20 {
            tokio::task::yield_now().await; // may resume on another worker thread
        }
        (before, Owner::current_task().expect("in a task"))
    })
    .await
    .expect("task");
    assert_eq!(there.0, there.1, "a task's owner changed");
    assert_ne!(here, there.0, "two tasks share an owner");
    assert!(
        std::thread::spawn(Owner::current_task)
            .join()
            .expect("thread")
            .is_err()
    );
    assert_eq!(
        Owner::new("").map_err(|e| e.kind()),
        Err(ErrorKind::InvalidArgument)
    );
    assert_eq!(
        Owner::new("x".repeat(600)).map_err(|e| e.kind()),
        Err(ErrorKind::InvalidArgument)
    );
}

/// Readers and writers on many clients: a writer is always alone, readers do share.
pub async fn rwlock_readers_share_writers_exclude<T: Target>(target: &T)
where
    T::Backend: RawRwLock,
{
    let name = unique("rw-mix");
    let readers = Arc::new(Inside::default());
    let writers = Arc::new(Inside::default());
    let mut tasks = Vec::new();
    for w in 0..8 {
        let rw = RwLock::builder(target.client().await, &name)
            .ttl(Duration::from_secs(10))
            .build()
            .expect("valid");
        let (readers, writers) = (Arc::clone(&readers), Arc::clone(&writers));
        tasks.push(tokio::spawn(async move {
            for i in 0..6 {
                if (w + i) % 4 == 0 {
                    let g = rw.write().await.expect("write");
                    writers.enter();
                    assert_eq!(
                        readers.now.load(Ordering::SeqCst),
                        0,
                        "a reader with a writer"
                    );
                    sleep(Duration::from_millis(3)).await;
                    assert_eq!(
                        readers.now.load(Ordering::SeqCst),
                        0,
                        "a reader with a writer"
                    );
                    writers.leave();
                    g.release().await.expect("release");
                } else {
                    let g = rw.read().await.expect("read");
                    readers.enter();
                    assert_eq!(
                        writers.now.load(Ordering::SeqCst),
                        0,
                        "a writer with a reader"
                    );
                    sleep(Duration::from_millis(15)).await;
                    assert_eq!(
                        writers.now.load(Ordering::SeqCst),
                        0,
                        "a writer with a reader"
                    );
                    readers.leave();
                    g.release().await.expect("release");
                }
            }
        }));
    }
    for t in tasks {
        t.await.expect("worker");
    }
    assert_eq!(writers.most(), 1, "two writers at once");
    assert!(readers.most() > 1, "readers never shared the lock");
    let rw = RwLock::new(target.client().await, &name).expect("valid");
    assert!(!rw.is_locked().await.expect("store"));
}

/// A writer gets in while a stream of overlapping readers never leaves the lock free.
pub async fn rwlock_writer_is_not_starved<T: Target>(target: &T)
where
    T::Backend: RawRwLock,
{
    let name = unique("rw-starve");
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut stream = Vec::new();
    for r in 0..4u64 {
        let rw = RwLock::new(target.client().await, &name).expect("valid");
        let stop = Arc::clone(&stop);
        stream.push(tokio::spawn(async move {
            sleep(Duration::from_millis(20 * r)).await;
            let mut reads = 0u32;
            while !stop.load(Ordering::SeqCst) {
                // Readers overlap: each holds 80 ms, four of them 20 ms apart.
                if let Some(g) = rw
                    .try_read_for(Duration::from_millis(200))
                    .await
                    .expect("read")
                {
                    reads += 1;
                    sleep(Duration::from_millis(80)).await;
                    g.release().await.expect("release");
                }
            }
            reads
        }));
    }
    // The writer comes while the readers hold the lock (their first grants may take a
    // while on a loaded machine: wait for them, within a bound).
    let rw = RwLock::new(target.client().await, &name).expect("valid");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !rw.is_locked().await.expect("store") {
        assert!(Instant::now() < deadline, "the readers never held it");
        sleep(Duration::from_millis(20)).await;
    }
    sleep(Duration::from_millis(100)).await;
    assert!(rw.is_locked().await.expect("store"), "the readers hold it");
    let w = timeout(Duration::from_secs(5), rw.write())
        .await
        .expect("the writer starved behind a stream of readers")
        .expect("write");
    assert_eq!(rw.state().await.expect("store").holders, Some(0));
    w.release().await.expect("release");
    sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::SeqCst);
    let mut reads = 0;
    for t in stream {
        reads += t.await.expect("reader");
    }
    assert!(
        reads > 8,
        "the reader stream stalled after the writer: {reads} reads"
    );
}

/// Downgrade keeps the lock (no writer between), readers join; a crashed reader frees at
/// its ttl; a deleted lock fires `lost()`; a cancelled writer leaves no claim behind.
pub async fn rwlock_downgrade_expiry_and_cancel<T: Target>(target: &T)
where
    T::Backend: RawRwLock,
{
    let name = unique("rw-down");
    let ttl = target.ttl(Duration::from_millis(600));
    let rw = RwLock::builder(target.client().await, &name)
        .ttl(ttl)
        .build()
        .expect("valid");
    let other = RwLock::builder(target.client().await, &name)
        .ttl(ttl)
        .build()
        .expect("valid");
    let w = rw.write().await.expect("write");
    let fence = w.fencing_token();
    let state = rw.state().await.expect("store");
    assert_eq!(state.holder.as_deref(), Some(w.token().as_str()));
    assert_eq!(state.last_fence, Some(fence.get()));
    let r = rw.downgrade(w).await.expect("downgrade");
    assert!(
        other.try_write().await.expect("store").is_none(),
        "a writer after a downgrade"
    );
    let joined = other
        .try_read()
        .await
        .expect("store")
        .expect("a reader joins");
    assert_eq!(rw.state().await.expect("store").holders, Some(2));
    joined.release().await.expect("release");

    // A crashed reader (no renewal, no release) blocks a writer for at most its ttl.
    // No earlier than the validity the reader was promised (memcached's one-second clock
    // can end a lease up to a second before its ttl; its validity is a second shorter).
    let promised = r.remaining();
    let gone = Instant::now();
    r.forget();
    let w2 = other
        .try_write_for(ttl * 10)
        .await
        .expect("store")
        .expect("the crashed reader's lease expired");
    let waited = gone.elapsed();
    assert!(
        waited + Duration::from_millis(100) >= promised,
        "a writer came in {waited:?} after the reader crashed, before its validity {promised:?}"
    );
    assert!(w2.fencing_token() > fence);

    // A cancelled waiting writer leaves no claim: readers are not held back by it.
    let cancelled = timeout(Duration::from_millis(150), rw.write()).await;
    assert!(cancelled.is_err(), "got a held write lock");
    sleep(Duration::from_millis(100)).await; // the withdrawal runs in the background
    assert_eq!(rw.state().await.expect("store").queued, Some(0));
    w2.release().await.expect("release");
    let r = rw
        .try_read()
        .await
        .expect("store")
        .expect("no claim holds readers back");

    // Deleted behind its back: lost() fires.
    assert!(rw.force_unlock().await.expect("store"));
    timeout(ttl, r.lost()).await.expect("lost() fires");
    assert_eq!(
        r.release().await.expect_err("deleted").kind(),
        ErrorKind::LockLost
    );
    assert!(!rw.is_locked().await.expect("store"));
}

/// Waiters on many clients, arriving 40 ms apart behind a holder, get the fair lock in
/// arrival order, one at a time, each woken by its predecessor's release.
pub async fn fair_lock_grants_in_arrival_order<T: Target>(target: &T)
where
    T::Backend: RawFair,
{
    let name = unique("fair");
    let holder = FairLock::builder(target.client().await, &name)
        .ttl(Duration::from_secs(20))
        .build()
        .expect("valid");
    let first = holder.lock().await.expect("lock");
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let inside = Arc::new(Inside::default());
    let mut tasks = Vec::new();
    for i in 0..6 {
        let fair = FairLock::builder(target.client().await, &name)
            .ttl(Duration::from_secs(20))
            .build()
            .expect("valid");
        let (order, inside) = (Arc::clone(&order), Arc::clone(&inside));
        tasks.push(tokio::spawn(async move {
            let g = fair.lock().await.expect("lock");
            inside.enter();
            order.lock().expect("order").push(i);
            sleep(Duration::from_millis(5)).await;
            inside.leave();
            g.release().await.expect("release");
        }));
        sleep(Duration::from_millis(40)).await;
    }
    assert_eq!(holder.state().await.expect("store").queued, Some(6));
    let released = Instant::now();
    first.release().await.expect("release");
    for t in tasks {
        timeout(Duration::from_secs(10), t)
            .await
            .expect("each waiter is woken by its predecessor, not its ttl")
            .expect("waiter");
    }
    assert!(
        released.elapsed() < Duration::from_secs(10),
        "hand-offs waited for timers"
    );
    assert_eq!(*order.lock().expect("order"), vec![0, 1, 2, 3, 4, 5]);
    assert_eq!(inside.most(), 1);
    assert_eq!(holder.state().await.expect("store").queued, Some(0));
}

/// `try_lock` does not jump the queue; a cancelled waiter leaves it at once; a crashed
/// waiter (queued, never back) delays the next one by at most the holder's ttl plus the
/// grace.
pub async fn fair_lock_cancelled_and_crashed_waiters<T: Target>(target: &T)
where
    T::Backend: RawFair,
{
    let name = unique("fair-crash");
    let ttl = target.ttl(Duration::from_millis(900));
    let grace = Duration::from_millis(300);
    let make = |client| {
        FairLock::builder(client, &name)
            .ttl(ttl)
            .waiter_grace(grace)
            .build()
            .expect("valid")
    };
    let holder = make(target.client().await);
    let g = holder.lock().await.expect("lock");

    // A cancelled waiter leaves no place behind.
    let waiter = make(target.client().await);
    assert!(
        timeout(Duration::from_millis(150), waiter.lock())
            .await
            .is_err()
    );
    sleep(Duration::from_millis(100)).await;
    assert_eq!(holder.state().await.expect("store").queued, Some(0));

    // A crashed waiter: queued once by hand, never back.
    let client = target.client().await;
    let dead = Token::random().expect("rng");
    let attempt = client
        .acquire_fair(holder.keys(), &dead, ttl, grace)
        .await
        .expect("store");
    assert!(matches!(attempt, fencelock::raw::Acquire::Held { .. }));
    let live = tokio::spawn(async move { waiter.lock().await.map(|g| (Instant::now(), g)) });
    sleep(Duration::from_millis(100)).await;
    assert_eq!(holder.state().await.expect("store").queued, Some(2));
    // While they wait, the lock is never granted out of turn.
    g.release().await.expect("release");
    assert!(
        holder.try_lock().await.expect("store").is_none(),
        "try_lock jumped the queue"
    );
    let released = Instant::now();
    let (got_at, next) = timeout(ttl + grace + Duration::from_secs(3), live)
        .await
        .expect("the crashed waiter stalled the queue")
        .expect("task")
        .expect("lock");
    assert!(got_at.duration_since(released) <= ttl + grace + Duration::from_secs(3));
    let lost = next.lost();
    assert!(holder.force_unlock().await.expect("store"));
    timeout(ttl * 2, lost).await.expect("lost() fires");
    assert!(!holder.is_locked().await.expect("store"));
}

/// A multi-lock takes every member or none: with one member held elsewhere, nothing is
/// left held; members may be different primitives on different backends.
pub async fn multi_lock_is_all_or_nothing<T: Target>(target: &T)
where
    T::Backend: RawSemaphore + fencelock::raw::RawInspect,
{
    let name = unique("multi");
    let client = target.client().await;
    let short = |n: String| {
        Lock::builder(client.clone(), n)
            .ttl(Duration::from_secs(2))
            .build()
            .expect("valid")
    };
    let a = short(format!("{name}-a"));
    let b = short(format!("{name}-b"));
    let sem = Semaphore::new(client.clone(), format!("{name}-sem"), 1).expect("valid");
    let local =
        Lock::new(fencelock::backend::Memory::new(), format!("{name}-local")).expect("valid");
    let multi = MultiLock::new()
        .with(b.clone())
        .with(local.clone())
        .with(a.clone())
        .with(sem.permit_lock().clone())
        .build()
        .expect("valid");
    assert_eq!(multi.len(), 4);

    let elsewhere = Lock::new(target.client().await, format!("{name}-b")).expect("valid");
    let held_b = elsewhere.try_lock().await.expect("store").expect("free");
    assert!(multi.try_lock().await.expect("store").is_none());
    assert!(
        multi
            .try_lock_for(Duration::from_millis(200))
            .await
            .expect("store")
            .is_none()
    );
    // Nothing was left held by the failed attempts.
    assert!(
        !a.is_locked().await.expect("store"),
        "a partial acquisition kept a member"
    );
    assert!(local.try_lock().await.expect("store").is_some());
    assert_eq!(sem.available_permits().await.expect("store"), 1);

    let waiting = tokio::spawn(async move { multi.lock().await.map(|g| (g, multi)) });
    sleep(Duration::from_millis(100)).await;
    held_b.release().await.expect("release");
    let (all, _multi) = timeout(Duration::from_secs(10), waiting)
        .await
        .expect("a waiting multi-lock gets every member once the last is released")
        .expect("task")
        .expect("lock");
    assert!(a.try_lock().await.expect("store").is_none());
    assert_eq!(sem.available_permits().await.expect("store"), 0);
    assert!(!all.is_lost());
    let lost = all.lost();
    target.delete_key(a.keys().lock()).await;
    timeout(Duration::from_secs(15), lost)
        .await
        .expect("lost() fires when any member is lost");
    let err = all.release().await.expect_err("a member was deleted");
    assert_eq!(err.kind(), ErrorKind::LockLost);
    // The other members were released all the same.
    assert!(b.try_lock().await.expect("store").is_some());
    assert_eq!(sem.available_permits().await.expect("store"), 1);
    assert_eq!(
        MultiLock::new()
            .with(a.clone())
            .with(a.clone())
            .build()
            .map(|_| ())
            .map_err(|e| e.kind()),
        Err(ErrorKind::InvalidArgument)
    );
    assert_eq!(
        MultiLock::new().build().map(|_| ()).map_err(|e| e.kind()),
        Err(ErrorKind::InvalidArgument)
    );
}

/// Two multi-locks over the same members, listed in opposite orders, in a loop: the
/// global order means they never deadlock.
pub async fn multi_locks_on_overlapping_sets_do_not_deadlock<T: Target>(target: &T) {
    let name = unique("multi-dl");
    let mut tasks = Vec::new();
    let inside = Arc::new(Inside::default());
    for reverse in [false, true, false, true] {
        let client = target.client().await;
        let mut names = vec![
            format!("{name}-x"),
            format!("{name}-y"),
            format!("{name}-z"),
        ];
        if reverse {
            names.reverse();
        }
        let mut builder = MultiLock::new();
        for n in names {
            builder = builder.with(
                Lock::builder(client.clone(), n)
                    .ttl(Duration::from_secs(10))
                    .build()
                    .expect("valid"),
            );
        }
        let multi = builder.build().expect("valid");
        let inside = Arc::clone(&inside);
        tasks.push(tokio::spawn(async move {
            for _ in 0..8 {
                let g = multi.lock().await.expect("lock");
                inside.enter();
                sleep(Duration::from_millis(2)).await;
                inside.leave();
                g.release().await.expect("release");
            }
        }));
    }
    for t in tasks {
        timeout(Duration::from_secs(30), t)
            .await
            .expect("multi-locks deadlocked")
            .expect("task");
    }
    assert_eq!(inside.most(), 1);
    assert_eq!(inside.entries.load(Ordering::SeqCst), 32);
}
