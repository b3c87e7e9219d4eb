//! Each plant changes what the library does, and only while it is set: the same scenario
//! is run without and with it, on the in-process store behind a network whose delays and
//! losses the test sets.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::sleep;

use super::{Plant, set_plant};
use crate::Lock;
use crate::backend::Memory;
use crate::engine::{Engine, Renewal};
use crate::error::{Error, ErrorKind, Result};
use crate::keys::LockKeys;
use crate::raw::{Acquire, Kind, LockState, RawFair, RawInspect, RawLock, ReleaseWatch};
use crate::token::Token;

/// A client of an in-process store over a network: requests and replies take as long
/// as the knobs say, and replies or renewals can be lost.
#[derive(Clone)]
struct Net {
    store: Memory,
    knobs: Arc<Knobs>,
}

#[derive(Default)]
struct Knobs {
    /// (how long a request travels to the store, how long its reply travels back)
    delays: Mutex<(Duration, Duration)>,
    /// Acquire replies are lost after the store applied the request.
    lose_replies: AtomicBool,
    /// A renewal batch's last renewal is neither applied nor answered.
    short_batches: AtomicBool,
}

impl Net {
    fn new(store: &Memory) -> Net {
        Net {
            store: store.clone(),
            knobs: Arc::default(),
        }
    }

    fn delays(&self, there_ms: u64, back_ms: u64) {
        *self
            .knobs
            .delays
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = (
            Duration::from_millis(there_ms),
            Duration::from_millis(back_ms),
        );
    }

    fn delay(&self, back: bool) -> Duration {
        let d = *self
            .knobs
            .delays
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if back { d.1 } else { d.0 }
    }

    /// `call` on the store, after the request's trip and before the reply's (a trip
    /// that takes no time yields to no other task).
    async fn call<T>(&self, call: impl Future<Output = T>) -> T {
        let there = self.delay(false);
        if !there.is_zero() {
            sleep(there).await;
        }
        let out = call.await;
        let back = self.delay(true);
        if !back.is_zero() {
            sleep(back).await;
        }
        out
    }
}

impl RawLock for Net {
    async fn acquire(&self, keys: &LockKeys, token: &Token, ttl: Duration) -> Result<Acquire> {
        let acquired = self.call(self.store.acquire(keys, token, ttl)).await;
        if self.knobs.lose_replies.load(Ordering::Relaxed) {
            return Err(Error::new(ErrorKind::Unavailable, "reply lost"));
        }
        acquired
    }

    async fn release(&self, keys: &LockKeys, token: &Token) -> Result<bool> {
        self.call(self.store.release(keys, token)).await
    }

    async fn extend(&self, keys: &LockKeys, token: &Token, ttl: Duration) -> Result<bool> {
        self.call(self.store.extend(keys, token, ttl)).await
    }

    async fn watch(&self, keys: &LockKeys) -> Result<ReleaseWatch> {
        self.store.watch(keys).await
    }

    async fn extend_many(&self, renewals: &[Renewal]) -> Vec<Result<bool>> {
        let n = if self.knobs.short_batches.load(Ordering::Relaxed) {
            renewals.len().saturating_sub(1)
        } else {
            renewals.len()
        };
        self.call(self.store.extend_many(&renewals[..n])).await
    }

    fn store_id(&self) -> String {
        self.store.store_id()
    }

    fn store_label(&self) -> &'static str {
        self.store.store_label()
    }

    fn engine(&self) -> &Engine {
        self.store.engine()
    }
}

impl RawInspect for Net {
    async fn inspect(&self, kind: Kind, keys: &LockKeys) -> Result<LockState> {
        self.call(self.store.inspect(kind, keys)).await
    }

    async fn force_unlock(&self, kind: Kind, keys: &LockKeys) -> Result<bool> {
        self.call(self.store.force_unlock(kind, keys)).await
    }

    async fn list(&self, prefix: &str, pattern: &str, limit: usize) -> Result<Vec<String>> {
        self.store.list(prefix, pattern, limit).await
    }
}

impl RawFair for Net {
    async fn acquire_fair(
        &self,
        keys: &LockKeys,
        token: &Token,
        ttl: Duration,
        grace: Duration,
    ) -> Result<Acquire> {
        self.call(self.store.acquire_fair(keys, token, ttl, grace))
            .await
    }

    async fn release_fair(&self, keys: &LockKeys, token: &Token) -> Result<bool> {
        self.call(self.store.release_fair(keys, token)).await
    }

    async fn abandon_fair(&self, keys: &LockKeys, token: &Token) -> Result<()> {
        self.call(self.store.abandon_fair(keys, token)).await
    }
}

/// Plants `plant` for the life of the value (and none after).
struct Planted;

impl Planted {
    fn new(plant: Option<Plant>) -> Planted {
        set_plant(plant);
        Planted
    }
}

impl Drop for Planted {
    fn drop(&mut self) {
        set_plant(None);
    }
}

fn lock<B: RawLock>(backend: B, name: &str, ttl_ms: u64, watchdog: bool) -> Lock<B> {
    Lock::builder(backend, name)
        .ttl(Duration::from_millis(ttl_ms))
        .watchdog(watchdog)
        .build()
        .expect("lock")
}

/// The validity a grant and an extension leave when each reply takes 500 ms.
async fn validity_after_slow_replies(plant: Option<Plant>) -> (Duration, Duration) {
    let _plant = Planted::new(plant);
    let net = Net::new(&Memory::new());
    let lock = lock(net.clone(), "slow-replies", 2_000, false);
    net.delays(0, 500);
    let guard = lock.lock().await.expect("granted");
    let granted = guard.remaining();
    guard
        .extend(Duration::from_millis(2_000))
        .await
        .expect("extended");
    let extended = guard.remaining();
    guard.release().await.expect("released");
    (granted, extended)
}

#[tokio::test(start_paused = true)]
async fn validity_from_reply_counts_a_slow_reply_as_lease() {
    let ttl = Duration::from_millis(2_000);
    let full = ttl - crate::validity::drift(ttl);
    let trip = Duration::from_millis(500);
    let (granted, extended) = validity_after_slow_replies(None).await;
    assert!(granted <= full - trip, "{granted:?}");
    assert!(extended <= full - trip, "{extended:?}");
    let (granted, extended) = validity_after_slow_replies(Some(Plant::ValidityFromReply)).await;
    let close = full - Duration::from_millis(5);
    assert!(granted >= close && granted <= full, "{granted:?}");
    assert!(extended >= close && extended <= full, "{extended:?}");
}

/// The validity of a fresh grant of a 10 s lease.
async fn validity_of_a_grant(plant: Option<Plant>) -> Duration {
    let _plant = Planted::new(plant);
    let lock = lock(Memory::new(), "drift", 10_000, false);
    let guard = lock.lock().await.expect("granted");
    let left = guard.remaining();
    guard.release().await.expect("released");
    left
}

#[tokio::test(start_paused = true)]
async fn no_drift_allowance_relies_on_the_whole_ttl() {
    let ttl = Duration::from_secs(10);
    assert_eq!(
        validity_of_a_grant(None).await,
        ttl - crate::validity::drift(ttl)
    );
    assert_eq!(
        validity_of_a_grant(Some(Plant::NoDriftAllowance)).await,
        ttl
    );
}

/// Whether the store still holds the lock after an acquire granted by the store was
/// cancelled before its reply came (`lost == false`), or failed because its replies
/// were lost (`lost == true`).
async fn grant_left_behind(plant: Option<Plant>, lost: bool) -> bool {
    let _plant = Planted::new(plant);
    let store = Memory::new();
    let net = Net::new(&store);
    let lock = lock(net.clone(), "cancelled", 10_000, false);
    if lost {
        net.knobs.lose_replies.store(true, Ordering::Relaxed);
        let err = lock.try_lock().await.expect_err("no reply");
        assert_eq!(err.kind(), ErrorKind::Unavailable);
        net.knobs.lose_replies.store(false, Ordering::Relaxed);
    } else {
        net.delays(0, 1_000);
        let acquire = {
            let lock = lock.clone();
            tokio::spawn(async move { lock.lock().await.map(LockGuard::forget) })
        };
        sleep(Duration::from_millis(100)).await;
        assert!(store.remaining(lock.keys().lock()).is_some(), "granted");
        acquire.abort();
        assert!(acquire.await.is_err_and(|e| e.is_cancelled()));
    }
    // The give-back, if any, runs in the background.
    sleep(Duration::from_millis(50)).await;
    store.remaining(lock.keys().lock()).is_some()
}

#[tokio::test(start_paused = true)]
async fn cancelled_grant_kept_leaves_the_lock_held() {
    for lost in [false, true] {
        assert!(!grant_left_behind(None, lost).await, "lost replies: {lost}");
        assert!(
            grant_left_behind(Some(Plant::CancelledGrantKept), lost).await,
            "lost replies: {lost}"
        );
    }
}

/// Two local waiters, of `waiters` (over `net`); a release by `holder` wakes the
/// first, which is cancelled in its next attempt. Returns whether the second got the
/// lock within a second (long before its fallback timer, the holder's remaining 10 s),
/// and checks that it does in the end.
async fn second_waiter_served_promptly<H: RawLock, W: RawLock>(
    plant: Option<Plant>,
    net: &Net,
    holder: Lock<H>,
    waiters: Lock<W>,
) -> bool {
    let _plant = Planted::new(plant);
    let held = holder.lock().await.expect("held");
    let wait = |waiters: &Lock<W>| {
        let lock = waiters.clone();
        tokio::spawn(async move { lock.lock().await.map(LockGuard::forget) })
    };
    let first = wait(&waiters);
    sleep(Duration::from_millis(10)).await;
    let second = wait(&waiters);
    sleep(Duration::from_millis(10)).await;
    // The woken waiter's attempt is slow: it is cancelled before the store sees it.
    net.delays(200, 0);
    held.release().await.expect("released");
    sleep(Duration::from_millis(50)).await;
    assert!(!first.is_finished() && !second.is_finished());
    first.abort();
    assert!(first.await.is_err_and(|e| e.is_cancelled()));
    sleep(Duration::from_secs(1)).await;
    let prompt = second.is_finished();
    tokio::time::timeout(Duration::from_secs(15), second)
        .await
        .expect("served by its fallback at the latest")
        .expect("task")
        .expect("granted");
    prompt
}

fn fair<B: RawFair>(backend: B) -> Lock<crate::fair::Queued<B>> {
    crate::FairLock::builder(backend, "wake")
        .ttl(Duration::from_secs(10))
        .watchdog(false)
        .build()
        .expect("fair lock")
        .as_lock()
        .clone()
}

#[tokio::test(start_paused = true)]
async fn wake_not_passed_on_leaves_the_next_waiter_asleep() {
    for plant in [None, Some(Plant::WakeNotPassedOn)] {
        let store = Memory::new();
        let net = Net::new(&store);
        let holder = lock(store.clone(), "wake", 10_000, false);
        let waiters = lock(net.clone(), "wake", 10_000, false);
        let prompt = second_waiter_served_promptly(plant, &net, holder, waiters).await;
        assert_eq!(prompt, plant.is_none(), "plain lock, {plant:?}");
        // A fair lock wakes the head of its queue on the head's own channel: the store
        // passes the turn of a head that left on to the next in line.
        let store = Memory::new();
        let net = Net::new(&store);
        let (holder, waiters) = (fair(store.clone()), fair(net.clone()));
        let prompt = second_waiter_served_promptly(plant, &net, holder, waiters).await;
        assert_eq!(prompt, plant.is_none(), "fair lock, {plant:?}");
    }
}

/// Two leases renewed in one batch whose reply leaves the last renewal out (and the
/// store never applied it). Returns (how many guards still believe they hold, how
/// many of the two keys the store holds) after 3 leases.
async fn after_short_batches(plant: Option<Plant>) -> (usize, usize) {
    let _plant = Planted::new(plant);
    let store = Memory::new();
    let net = Net::new(&store);
    net.knobs.short_batches.store(true, Ordering::Relaxed);
    let locks = [
        lock(net.clone(), "short-a", 1_000, true),
        lock(net.clone(), "short-b", 1_000, true),
    ];
    let mut guards = Vec::new();
    for lock in &locks {
        guards.push(lock.lock().await.expect("granted"));
    }
    sleep(Duration::from_secs(3)).await;
    let believed = guards.iter().filter(|g| !g.is_lost()).count();
    let stored = locks
        .iter()
        .filter(|l| store.remaining(l.keys().lock()).is_some())
        .count();
    for guard in guards {
        guard.forget();
    }
    (believed, stored)
}

#[tokio::test(start_paused = true)]
async fn short_batch_all_renewed_keeps_a_lease_the_store_dropped() {
    // Today a short reply fails the whole batch: both leases run out (the store renewed
    // the first all along), and the guards say so.
    assert_eq!(after_short_batches(None).await.0, 0);
    assert_eq!(
        after_short_batches(Some(Plant::ShortBatchAllRenewed)).await,
        (2, 1)
    );
}

use crate::LockGuard;
