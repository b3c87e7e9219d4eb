//! The simulated clients' tasks: random acquire / try / timed wait / cancel / extend /
//! release / drop-without-release / forget on the plain fenced [`Lock`], writing a fenced
//! resource while they believe they hold.

use std::time::Duration;

use fencelock::{Lock, LockGuard};
use tokio::time::Instant;

use crate::rng::Rng;
use crate::store::SimStore;
use crate::world::{Belief, Shared, Slot};

/// A plain lock's hold, as the checkers see it.
pub struct Held {
    pub(crate) guard: LockGuard<SimStore>,
    pub(crate) key: String,
}

impl Belief for Held {
    fn key(&self) -> String {
        self.key.clone()
    }

    fn token(&self) -> String {
        self.guard.token().as_str().to_owned()
    }

    fn believes(&self) -> bool {
        !self.guard.is_lost() && !self.guard.remaining().is_zero()
    }
}

/// Runs `f`, cancelled after `after` if given (`None` when cancelled).
pub(crate) async fn maybe_cancel<T>(
    after: Option<Duration>,
    f: impl std::future::Future<Output = T>,
) -> Option<T> {
    match after {
        Some(d) => {
            tokio::select! {
                biased;
                r = f => Some(r),
                () = tokio::time::sleep(d) => None,
            }
        }
        None => Some(f.await),
    }
}

/// One task of one client on plain locks, until `until`.
pub(crate) async fn lock_task(
    who: String,
    locks: Vec<Lock<SimStore>>,
    world: Shared,
    mut rng: Rng,
    until: Instant,
) {
    let slot: Slot<Held> = Slot::default();
    world.watch_slot(&slot);
    let ttl = locks[0].ttl();
    while Instant::now() < until {
        let Some(lock) = rng.pick(&locks) else { return };
        let key = lock.keys().lock().to_owned();
        let op = rng.below(100);
        let cancel = rng.chance(0.2).then(|| rng.duration(Duration::ZERO, ttl));
        // Or cancelled just after the next release of the lock: where a waiter was
        // woken and has not made its next attempt yet.
        let on_release = (cancel.is_none() && rng.chance(0.35)).then(|| {
            (
                world.release_signal(&key),
                rng.duration(Duration::ZERO, Duration::from_millis(4)),
            )
        });
        let wait = rng.duration(Duration::ZERO, ttl * 2);
        let (what, acquire) = match op {
            0..35 => ("lock", None),
            35..55 => ("try_lock", Some(Duration::ZERO)),
            _ => ("try_lock_for", Some(wait)),
        };
        let attempt = async {
            match acquire {
                None => lock.lock().await.map(Some),
                Some(d) if d.is_zero() => lock.try_lock().await,
                Some(d) => lock.try_lock_for(d).await,
            }
        };
        world.event(&who, format_args!("{what} {key} starts"));
        if acquire.is_none() {
            world.waiting(&who, Some(&key));
        }
        let began = Instant::now();
        let outcome = match on_release {
            Some((signal, delay)) => {
                let cancel = async {
                    signal.notified().await;
                    tokio::time::sleep(delay).await;
                };
                tokio::select! {
                    biased;
                    r = attempt => Some(r),
                    () = cancel => None,
                }
            }
            None => maybe_cancel(cancel, attempt).await,
        };
        world.waiting(&who, None);
        match outcome {
            None => {
                world.event(&who, format_args!("{what} {key}: cancelled"));
                world.ghost_check(&key, began);
            }
            Some(Err(e)) => {
                world.event(&who, format_args!("{what} {key}: error {e}"));
                world.ghost_check(&key, began);
            }
            Some(Ok(None)) => world.event(&who, format_args!("{what} {key}: not granted")),
            Some(Ok(Some(guard))) => {
                let client = lock.backend().client;
                hold(&who, &world, &mut rng, &slot, Held { guard, key }, client).await;
            }
        }
        let think = rng.duration(Duration::ZERO, ttl / 5);
        tokio::time::sleep(think).await;
    }
}

/// Holds `held` for a few steps, writing the fenced resource while it believes it
/// holds, then releases, drops or forgets it.
async fn hold(
    who: &str,
    world: &Shared,
    rng: &mut Rng,
    slot: &Slot<Held>,
    held: Held,
    client: usize,
) {
    let fence = held.guard.fencing_token().get();
    let token = held.guard.token().as_str().to_owned();
    let ttl = held.guard.lease();
    let key = held.key.clone();
    world.event(who, format_args!("holds {key} fence {fence} token {token}"));
    world.known(&token);
    // Checker 4: when the guard can no longer vouch for the lease, `lost()` has fired.
    let fired = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let lost = held.guard.lost();
    let flag = std::sync::Arc::clone(&fired);
    tokio::spawn(async move {
        lost.await;
        flag.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    *slot
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(held);
    let remaining = || {
        slot.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_ref()
            .map(|h| (h.believes(), h.guard.remaining()))
    };
    for _ in 0..rng.range(1, 6) {
        if rng.chance(0.03) {
            // A client pause longer than the lease (the whole client: its renewals
            // stop too), then a write that does not check.
            world.event(who, format_args!("stalls past its lease"));
            world.pause_client(client, ttl * 3 / 2);
            tokio::time::sleep(ttl * 3 / 2).await;
            let ok = world.write(&key, &token, fence);
            world.event(
                who,
                format_args!("stale write fence {fence}: accepted {ok}"),
            );
            continue;
        }
        let mut step = rng.duration(Duration::ZERO, ttl / 2);
        if let Some((_, left)) = remaining()
            && left > Duration::from_millis(2)
        {
            // Act just before the belief ends, where a wrong validity shows.
            step = step.min(left - Duration::from_millis(1));
        }
        tokio::time::sleep(step).await;
        match remaining() {
            Some((true, _)) => {
                let ok = world.write(&key, &token, fence);
                if !ok {
                    world.event(
                        who,
                        format_args!("write fence {fence} refused while believing"),
                    );
                }
            }
            Some((false, _)) => {
                world.event(who, format_args!("lease of {key} lost"));
                tokio::time::sleep(Duration::from_millis(1)).await;
                if !fired.load(std::sync::atomic::Ordering::Relaxed) {
                    world.violation(
                        "lost",
                        format!("{who}'s hold of {key} is lost but lost() never fired"),
                    );
                }
                break;
            }
            None => break,
        }
        if rng.chance(0.1) {
            let cancel = rng
                .chance(0.3)
                .then(|| rng.duration(Duration::ZERO, ttl / 4));
            let extend = async {
                let guard = slot
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .take();
                match guard {
                    Some(h) => {
                        let r = h.guard.extend(ttl).await;
                        (Some(h), r)
                    }
                    None => (None, Ok(())),
                }
            };
            // The guard goes back into the slot whatever happens (a cancelled extend
            // drops its future, guard included: then the hold ends by drop).
            match maybe_cancel(cancel, extend).await {
                Some((h, r)) => {
                    world.event(
                        who,
                        format_args!(
                            "extend {key}: {:?}",
                            r.as_ref().map_err(ToString::to_string)
                        ),
                    );
                    *slot
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner) = h;
                }
                None => {
                    world.event(who, format_args!("extend {key}: cancelled (guard dropped)"));
                    return;
                }
            }
        }
    }
    let Some(held) = slot
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .take()
    else {
        return;
    };
    match rng.below(100) {
        0..65 => {
            let cancel = rng
                .chance(0.1)
                .then(|| rng.duration(Duration::ZERO, ttl / 4));
            match maybe_cancel(cancel, held.guard.release()).await {
                None => world.event(who, format_args!("release {key}: cancelled")),
                Some(r) => world.event(
                    who,
                    format_args!("release {key}: {:?}", r.map_err(|e| e.to_string())),
                ),
            }
        }
        65..92 => {
            world.event(who, format_args!("drops {key} without releasing"));
            drop(held);
        }
        _ => {
            world.event(who, format_args!("forgets {key}"));
            held.guard.forget();
        }
    }
}
