//! A `MultiLock` asks for every member at once (pipelined on a shared connection) and
//! releases them all at once, yet never waits while holding a member out of its global
//! order, and stays all or nothing.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use dlock_test::conformance::{Target, unique};
use dlock_test::targets::RedisTarget;
use fencelock::backend::Redis;
use fencelock::{BoxFuture, Held, Lock, Lockable, MultiLock, Result};
use tokio::time::{Instant, sleep, timeout};

/// How many calls are in flight now, and the most at once.
#[derive(Default)]
struct InFlight {
    now: AtomicUsize,
    most: AtomicUsize,
}

impl InFlight {
    fn enter(&self) {
        let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(n, Ordering::SeqCst);
    }

    fn leave(&self) {
        self.now.fetch_sub(1, Ordering::SeqCst);
    }

    fn most(&self) -> usize {
        self.most.load(Ordering::SeqCst)
    }
}

/// A member that counts its acquisitions and releases in flight.
struct Counted {
    lock: Lock<Redis>,
    acquiring: Arc<InFlight>,
    releasing: Arc<InFlight>,
}

struct CountedHeld {
    held: Box<dyn Held>,
    releasing: Arc<InFlight>,
}

impl Lockable for Counted {
    fn order_key(&self) -> (String, String) {
        Lockable::order_key(&self.lock)
    }

    fn acquire_until(
        &self,
        deadline: Option<Instant>,
    ) -> BoxFuture<'_, Result<Option<Box<dyn Held>>>> {
        Box::pin(async move {
            self.acquiring.enter();
            let got = Lockable::acquire_until(&self.lock, deadline).await;
            self.acquiring.leave();
            let releasing = Arc::clone(&self.releasing);
            got.map(|held| {
                held.map(|held| Box::new(CountedHeld { held, releasing }) as Box<dyn Held>)
            })
        })
    }
}

impl Held for CountedHeld {
    fn name(&self) -> &str {
        self.held.name()
    }

    fn is_lost(&self) -> bool {
        self.held.is_lost()
    }

    fn lost(&self) -> BoxFuture<'static, ()> {
        self.held.lost()
    }

    fn release(self: Box<Self>) -> BoxFuture<'static, Result<()>> {
        Box::pin(async move {
            self.releasing.enter();
            let released = self.held.release().await;
            self.releasing.leave();
            released
        })
    }
}

async fn holder(lock: &Lock<Redis>) -> Option<String> {
    lock.state().await.expect("store").holder
}

/// Pauses the server's command processing for 300 ms: no reply comes back meanwhile, so
/// what a client sends in that time is in flight together.
async fn pause(t: &RedisTarget) {
    let mut admin = t.admin().await;
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(300)
        .arg("ALL")
        .query_async(&mut admin)
        .await
        .expect("CLIENT PAUSE");
}

/// Ten free members on one client: all ten attempts are in flight together (one round
/// trip's worth, pipelined on the client's connection), and so are the ten releases.
/// (While the server is paused, so that no reply can end one before the next is sent.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_lock_asks_for_and_releases_every_member_at_once() {
    let t = RedisTarget::start();
    let client = t.client().await;
    let base = unique("multi-at-once");
    let (acquiring, releasing) = (Arc::new(InFlight::default()), Arc::new(InFlight::default()));
    let locks: Vec<Lock<Redis>> = (0..10)
        .map(|i| Lock::new(client.clone(), format!("{base}-{i}")).expect("valid"))
        .collect();
    let mut builder = MultiLock::new();
    for lock in &locks {
        builder = builder.with(Counted {
            lock: lock.clone(),
            acquiring: Arc::clone(&acquiring),
            releasing: Arc::clone(&releasing),
        });
    }
    let multi = builder.build().expect("valid");
    pause(&t).await;
    let held = timeout(Duration::from_secs(10), multi.lock())
        .await
        .expect("free names are granted")
        .expect("store");
    assert_eq!(
        acquiring.most(),
        10,
        "every member's attempt was in flight at once"
    );
    for lock in &locks {
        assert!(holder(lock).await.is_some(), "every member is held");
    }
    pause(&t).await;
    held.release().await.expect("released");
    assert_eq!(
        releasing.most(),
        10,
        "every member's release was in flight at once"
    );
    for lock in &locks {
        assert!(holder(lock).await.is_none(), "every member is free again");
    }
}

/// With a member in the middle held elsewhere: `try_lock` gets nothing and leaves
/// nothing held; `lock` keeps the members before it, gives back the ones after it before
/// it waits (never holding a member out of order while waiting), and gets them all once
/// the middle one is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_lock_waits_only_in_order_and_stays_all_or_nothing() {
    let t = RedisTarget::start();
    let client = t.client().await;
    let base = unique("multi-order");
    let locks: Vec<Lock<Redis>> = (0..5)
        .map(|i| Lock::new(client.clone(), format!("{base}-{i}")).expect("valid"))
        .collect();
    let build = || {
        let mut builder = MultiLock::new();
        for lock in &locks {
            builder = builder.with(lock.clone());
        }
        builder.build().expect("valid")
    };
    let other = Lock::new(t.client().await, format!("{base}-2")).expect("valid");
    let middle = other.try_lock().await.expect("store").expect("free");

    let multi = build();
    assert!(
        multi.try_lock().await.expect("store").is_none(),
        "a member is held"
    );
    for (i, lock) in locks.iter().enumerate() {
        if i != 2 {
            assert!(holder(lock).await.is_none(), "member {i} left free");
        }
    }

    let waiter = tokio::spawn(async move { multi.lock().await });
    // The members after the held one are given back before the wait (bounded poll).
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (before, after) = (
            holder(&locks[0]).await.is_some() && holder(&locks[1]).await.is_some(),
            holder(&locks[3]).await.is_none() && holder(&locks[4]).await.is_none(),
        );
        if before && after {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the multi-lock never settled in order"
        );
        sleep(Duration::from_millis(10)).await;
    }
    sleep(Duration::from_millis(100)).await;
    assert!(!waiter.is_finished(), "it waits for the held member");
    assert!(
        holder(&locks[3]).await.is_none() && holder(&locks[4]).await.is_none(),
        "nothing after the held member is held while waiting for it"
    );

    middle.release().await.expect("released");
    let held = timeout(Duration::from_secs(10), waiter)
        .await
        .expect("granted once the middle member is free")
        .expect("task")
        .expect("store");
    for lock in &locks {
        assert!(holder(lock).await.is_some(), "every member is held");
    }
    held.release().await.expect("released");
}
