//! Bugs the simulation found, each kept as a scripted scenario (a seed's trace changes
//! whenever the workload generator does; the scenario does not).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use fencelock::backend::Memory;
use fencelock::engine::Engine;
use fencelock::keys::LockKeys;
use fencelock::raw::{Acquire, RawLock, ReleaseWatch};
use fencelock::{Lock, Result, Token};

/// Memory with a slow network where the scenario needs one: the next acquire's reply
/// can be held back, and every release arrives late.
#[derive(Clone)]
struct Slow {
    inner: Memory,
    late_reply: Arc<Mutex<Option<Duration>>>,
    release_delay: Duration,
    /// The next this many subscriptions fail (their reply lost).
    failing_watches: Arc<Mutex<u32>>,
}

impl RawLock for Slow {
    async fn acquire(&self, keys: &LockKeys, token: &Token, ttl: Duration) -> Result<Acquire> {
        let r = self.inner.acquire(keys, token, ttl).await;
        let late = self.late_reply.lock().map(|mut l| l.take()).unwrap_or(None);
        if let Some(d) = late {
            tokio::time::sleep(d).await;
        }
        r
    }

    async fn release(&self, keys: &LockKeys, token: &Token) -> Result<bool> {
        tokio::time::sleep(self.release_delay).await;
        self.inner.release(keys, token).await
    }

    async fn extend(&self, keys: &LockKeys, token: &Token, ttl: Duration) -> Result<bool> {
        self.inner.extend(keys, token, ttl).await
    }

    async fn watch(&self, keys: &LockKeys) -> Result<ReleaseWatch> {
        let fail = self
            .failing_watches
            .lock()
            .map(|mut n| {
                let fail = *n > 0;
                *n = n.saturating_sub(1);
                fail
            })
            .unwrap_or(false);
        if fail {
            return Err(fencelock::Error::new(
                fencelock::ErrorKind::Unavailable,
                "subscription's reply lost",
            ));
        }
        self.inner.watch(keys).await
    }

    fn engine(&self) -> &Engine {
        self.inner.engine()
    }
}

/// Seed 24 of the first simulation: a waiter's grant whose reply came past the lease's
/// validity was given back in the background, the wait repeated the attempt under the
/// same token (the store renewed the grant), and the give-back, landing after the
/// repeat, deleted it — the waiter held a guard the store no longer had (two holders
/// once the next client was granted).
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_late_grant_s_give_back_does_not_take_the_repeated_grant_away() -> Result<()> {
    let store = Memory::new();
    let slow = Slow {
        inner: store.client(),
        late_reply: Arc::new(Mutex::new(None)),
        release_delay: Duration::from_millis(200),
        failing_watches: Arc::default(),
    };
    let holder = Lock::builder(store.client(), "job")
        .ttl(Duration::from_secs(10))
        .build()?;
    let waiter = Lock::builder(slow.clone(), "job")
        .ttl(Duration::from_millis(300))
        .build()?;
    let first = holder.lock().await?;
    let waiting = tokio::spawn(async move { waiter.lock().await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    // The waiter's next attempt is granted, but its reply takes longer than the lease.
    *slow
        .late_reply
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Duration::from_millis(350));
    first.release().await?;
    let guard = waiting
        .await
        .map_err(|e| fencelock::Error::new(fencelock::ErrorKind::Backend, e.to_string()))??;
    let token = guard.token().as_str().to_owned();
    // Long after any give-back could have landed, the waiter still holds.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(!guard.is_lost(), "the waiter's guard was lost");
    assert_eq!(
        store.holders("dlock:job"),
        vec![(token, 1)],
        "the store must hold the waiter's grant"
    );
    guard.release().await?;
    Ok(())
}

/// Seed 1260: a waiter whose subscription's reply was lost polled for the rest of its
/// wait (its back-off grows to half a second), never subscribing again: a release
/// seconds later left the lock free while it slept.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_waiter_whose_subscription_failed_subscribes_again() -> Result<()> {
    let store = Memory::new();
    let slow = Slow {
        inner: store.client(),
        late_reply: Arc::new(Mutex::new(None)),
        release_delay: Duration::ZERO,
        failing_watches: Arc::new(Mutex::new(1)),
    };
    let holder = Lock::builder(store.client(), "job")
        .ttl(Duration::from_secs(30))
        .build()?;
    let waiter = Lock::builder(slow, "job").build()?;
    let first = holder.lock().await?;
    let waiting = tokio::spawn(async move {
        let guard = waiter.lock().await;
        (guard, tokio::time::Instant::now())
    });
    // Long enough for the waiter's back-off to reach its ceiling.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let released = tokio::time::Instant::now();
    first.release().await?;
    let (guard, granted) = waiting
        .await
        .map_err(|e| fencelock::Error::new(fencelock::ErrorKind::Backend, e.to_string()))?;
    let guard = guard?;
    // Woken by the release (the simulated clock stands still while nothing sleeps), not
    // by a poll up to half a second later.
    assert!(
        granted - released < Duration::from_millis(5),
        "granted {:?} after the release",
        granted - released
    );
    guard.release().await?;
    Ok(())
}
