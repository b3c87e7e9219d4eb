//! Hooks for the deterministic simulator (the workspace's `dlock-sim`): a seeded source
//! of the randomness the library draws (tokens, back-off jitter) and planted bugs that
//! the simulator must catch.
//!
//! Public only with the `simulation` feature, which is for the test kit: **never enable
//! it in a program that protects anything**. Without the feature nothing here is
//! reachable and every check below compiles to `false`.
//!
//! Both settings are per thread: the simulator runs each seed on a current-thread tokio
//! runtime (paused clock), so the thread that runs it is the only one that draws.

#[cfg(feature = "simulation")]
use std::cell::Cell;

#[cfg(feature = "simulation")]
thread_local! {
    /// The seeded generator's state, when the thread draws from one.
    static RNG: Cell<Option<u64>> = const { Cell::new(None) };
    /// The bug planted on this thread, if any.
    static PLANT: Cell<Option<Plant>> = const { Cell::new(None) };
}

/// Makes this thread's tokens and jitter come from a generator seeded with `seed`
/// (`None`: back to the OS generator). One seed gives one sequence of tokens.
#[cfg(feature = "simulation")]
pub fn seed_thread_rng(seed: Option<u64>) {
    RNG.with(|r| r.set(seed));
}

/// SplitMix64: the next value of the seeded sequence.
#[cfg(feature = "simulation")]
fn next(state: &Cell<Option<u64>>) -> Option<u64> {
    let s = state.get()?.wrapping_add(0x9e37_79b9_7f4a_7c15);
    state.set(Some(s));
    let mut z = s;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    Some(z ^ (z >> 31))
}

/// Fills `bytes` from the thread's seeded generator; `false` (untouched) when the thread
/// has none, and always without the `simulation` feature.
pub(crate) fn fill(bytes: &mut [u8]) -> bool {
    #[cfg(feature = "simulation")]
    {
        RNG.with(|r| {
            if r.get().is_none() {
                return false;
            }
            for chunk in bytes.chunks_mut(8) {
                let v = next(r).unwrap_or_default().to_le_bytes();
                chunk.copy_from_slice(&v[..chunk.len()]);
            }
            true
        })
    }
    #[cfg(not(feature = "simulation"))]
    {
        let _ = bytes;
        false
    }
}

/// A bug the simulator plants in the library to show that its checkers catch it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
// Without the feature only the library's checks name it, and they are always false.
#[cfg_attr(not(feature = "simulation"), allow(unreachable_pub))]
pub enum Plant {
    /// A lease's validity is counted from the reply's arrival instead of the request's
    /// sending: every grant (an attempt's, a hand-over's, a read-write downgrade's),
    /// every `extend` and every watchdog renewal, of every primitive.
    ValidityFromReply,
    /// No clock-drift allowance: a lease is relied on for its whole ttl (the allowance
    /// is zero wherever it is applied, renewal periods included).
    NoDriftAllowance,
    /// An acquire whose request may have been granted does not give the grant back when
    /// it is cancelled mid-flight, nor when it fails with its outcome unknown (its reply
    /// lost), nor when its wait ends with such an attempt unsettled.
    CancelledGrantKept,
    /// A waiter that consumed a release's wake-up and then left does not pass it on to
    /// the next local waiter; and the in-process store does not give a fair lock's turn
    /// on to the next in line when the head of its queue leaves.
    WakeNotPassedOn,
    /// A renewal batch whose reply is shorter than the batch counts the missing
    /// renewals as done (their leases extended from the batch's sending), where the
    /// library otherwise counts every renewal of the batch as failed.
    ShortBatchAllRenewed,
}

#[cfg(feature = "simulation")]
impl Plant {
    /// Every plant, in the order of their names' documentation.
    pub const ALL: [Plant; 5] = [
        Plant::ValidityFromReply,
        Plant::NoDriftAllowance,
        Plant::CancelledGrantKept,
        Plant::WakeNotPassedOn,
        Plant::ShortBatchAllRenewed,
    ];
}

/// Plants `plant` on this thread (`None`: the library as written).
#[cfg(feature = "simulation")]
pub fn set_plant(plant: Option<Plant>) {
    PLANT.with(|p| p.set(plant));
}

/// The bug planted on this thread, if any.
#[cfg(feature = "simulation")]
pub fn plant() -> Option<Plant> {
    PLANT.with(Cell::get)
}

/// Whether `plant` is planted on this thread (always `false` without the feature).
#[inline]
pub(crate) fn planted(plant: Plant) -> bool {
    #[cfg(feature = "simulation")]
    {
        PLANT.with(|p| p.get() == Some(plant))
    }
    #[cfg(not(feature = "simulation"))]
    {
        let _ = plant;
        false
    }
}

#[cfg(all(test, feature = "simulation"))]
mod tests {
    use super::*;

    #[test]
    fn one_seed_gives_one_sequence_of_tokens() {
        let draw = |seed| {
            seed_thread_rng(Some(seed));
            let t: Vec<String> = (0..3)
                .map(|_| crate::Token::random().map(|t| t.as_str().to_owned()))
                .collect::<crate::Result<_>>()
                .unwrap_or_default();
            seed_thread_rng(None);
            t
        };
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
        assert_eq!(draw(7).len(), 3);
        // Without a seed, the OS generator: two draws differ.
        let a = crate::Token::random().map(|t| t.as_str().to_owned()).ok();
        let b = crate::Token::random().map(|t| t.as_str().to_owned()).ok();
        assert_ne!(a, b);
    }
}

/// Each plant changes what the library does, and only while it is set: the same scenario
/// is run without and with it, on the in-process store behind a network whose delays and
/// losses the test sets.
#[cfg(all(test, feature = "simulation"))]
mod plants {
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
    use crate::raw::{Acquire, LockState, RawFair, RawLock, ReleaseWatch};
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

        async fn inspect_fair(&self, keys: &LockKeys) -> Result<LockState> {
            self.call(self.store.inspect_fair(keys)).await
        }

        async fn force_unlock_fair(&self, keys: &LockKeys) -> Result<bool> {
            self.call(self.store.force_unlock_fair(keys)).await
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
}
