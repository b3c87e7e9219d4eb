//! One held lease: its keys, token, kind and validity, shared by a guard and the watchdog.
//!
//! A lease is *lost* when the store says the key no longer holds our token, or when
//! renewals kept failing until its validity (monotonic clock, minus drift) ran out.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::LeaseKind;
use crate::keys::LockKeys;
use crate::observe::{Extra, Obs, metric};
use crate::token::Token;
use crate::validity;

/// Why a lease ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum End {
    /// Still ours as far as we know.
    Held,
    /// The store reported the key gone or holding another token.
    Taken,
    /// Renewal did not succeed before the validity ran out.
    Expired,
    /// Released or forgotten by its guard.
    Released,
}

/// What a lease's holder and the watchdog read of it ([`Lease::snapshot`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct LeaseState {
    pub(crate) valid_until: Instant,
    /// The ttl future renewals ask for.
    pub(crate) ttl: Duration,
    pub(crate) end: End,
}

/// A lease's state as stored (the ttl in nanoseconds: 8 bytes fewer per lease).
#[derive(Debug, Clone, Copy)]
struct Current {
    valid_until: Instant,
    /// When the request behind `valid_until` was sent. Replies on one connection come in
    /// the order the store applied them, so the latest-sent success describes the store.
    sent: Instant,
    ttl_nanos: u64,
    end: End,
}

/// Where the validity of a grant or renewal whose request was sent at `sent` starts: at
/// `sent` (a bug planted for the simulator counts it from now, when the reply is in).
fn from_sent(sent: Instant) -> Instant {
    if crate::simulation::planted(crate::simulation::Plant::ValidityFromReply) {
        return Instant::now(); // planted: from the reply
    }
    sent
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// One held lease, shared by its guard and the watchdog.
#[derive(Debug)]
pub(crate) struct Lease {
    pub(crate) keys: LockKeys,
    pub(crate) token: Token,
    /// Which renewal the store must apply (the primitive that holds it).
    pub(crate) kind: LeaseKind,
    /// What its spans and metrics are labelled with.
    pub(crate) obs: Obs,
    state: Mutex<Current>,
    /// Woken when `state.end` leaves [`End::Held`]. Renewals wake nobody: a
    /// [`lost_future`](Lease::lost_future) sleeps until the validity it saw, then looks
    /// again.
    ended: Notify,
    drift: validity::Drift,
}

impl Lease {
    pub(crate) fn new(
        keys: LockKeys,
        token: Token,
        sent: Instant,
        ttl: Duration,
        drift: validity::Drift,
        kind: LeaseKind,
        obs: Obs,
    ) -> Lease {
        let from = from_sent(sent);
        Lease {
            keys,
            token,
            kind,
            obs,
            state: Mutex::new(Current {
                valid_until: drift.valid_until(from.into_std(), ttl).into(),
                sent,
                ttl_nanos: nanos(ttl),
                end: End::Held,
            }),
            ended: Notify::new(),
            drift,
        }
    }

    fn state(&self) -> MutexGuard<'_, Current> {
        // The state is plain data, updated in one go: a panic elsewhere cannot leave it
        // half-written.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How long after a renewal of `ttl` is sent the next one falls due: a third of the
    /// validity it buys (the ttl less the store's drift allowance), so that two renewals
    /// can fail or run late before the lease lapses — also where the allowance is a large
    /// part of the ttl (memcached's whole second).
    pub(crate) fn renewal_period(&self, ttl: Duration) -> Duration {
        ttl.saturating_sub(self.drift.of(ttl)) / 3
    }

    pub(crate) fn snapshot(&self) -> LeaseState {
        let s = *self.state();
        LeaseState {
            valid_until: s.valid_until,
            ttl: Duration::from_nanos(s.ttl_nanos),
            end: s.end,
        }
    }

    /// Lost (or ended) at `now`: the store said so, or validity ran out.
    pub(crate) fn is_lost_at(&self, now: Instant) -> bool {
        let s = self.state();
        s.end != End::Held || now >= s.valid_until
    }

    /// A renewal or extension sent at `sent` for `ttl` succeeded. Returns whether the
    /// lease is still held: a confirmation that arrives after the validity ran out cannot
    /// revive it (someone may have held the lock in between), and ends it instead.
    pub(crate) fn renewed(&self, sent: Instant, ttl: Duration) -> bool {
        let now = Instant::now();
        let mut s = self.state();
        if s.end != End::Held {
            return false;
        }
        if now >= s.valid_until {
            s.end = End::Expired;
            drop(s);
            self.ended.notify_waiters();
            self.count_loss(End::Expired);
            return false;
        }
        // An older request's late reply says nothing new: only a later-sent confirmation
        // moves the validity.
        if sent >= s.sent {
            s.sent = sent;
            s.valid_until = self
                .drift
                .valid_until(from_sent(sent).into_std(), ttl)
                .into();
        }
        true
    }

    /// From now on, renewals ask for `ttl`.
    pub(crate) fn set_ttl(&self, ttl: Duration) {
        self.state().ttl_nanos = nanos(ttl);
    }

    pub(crate) fn end(&self, end: End) {
        let mut s = self.state();
        if s.end == End::Held {
            s.end = end;
            drop(s);
            self.ended.notify_waiters();
            self.count_loss(end);
        }
    }

    /// Counts a lease that ended lost (once: only the first end counts).
    fn count_loss(&self, end: End) {
        let reason = match end {
            End::Taken => Extra::LostTaken,
            End::Expired => Extra::LostExpired,
            End::Held | End::Released => return,
        };
        self.obs.count(metric::LEASES_LOST, Some(reason), 1);
    }

    /// Resolves when the lease can no longer be guaranteed: once it ends, or once its
    /// validity runs out without a renewal (also after every guard and the watchdog let
    /// go of it: the future keeps the lease alive).
    pub(crate) fn lost_future(self: &Arc<Self>) -> impl Future<Output = ()> + Send + 'static {
        let lease = Arc::clone(self);
        async move {
            loop {
                let ended = lease.ended.notified();
                tokio::pin!(ended);
                // Registered before looking, so an end in between still wakes us.
                ended.as_mut().enable();
                let s = lease.snapshot();
                if s.end != End::Held || Instant::now() >= s.valid_until {
                    return;
                }
                // In order (no draw from the runtime's generator, so a seed replays):
                // an end returns at once, without another look.
                tokio::select! {
                    biased;
                    () = ended => return,
                    // Renewed meanwhile? The next round sleeps until the new validity.
                    () = tokio::time::sleep_until(s.valid_until) => {}
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(sent: Instant, ttl: Duration) -> Arc<Lease> {
        Arc::new(Lease::new(
            LockKeys::new("t:", "lease").expect("keys"),
            Token::random().expect("rng"),
            sent,
            ttl,
            validity::Drift::DEFAULT,
            LeaseKind::Lock,
            Obs::new("memory", crate::observe::primitive::LOCK, "lease", false),
        ))
    }

    fn assert_static_send<F: Future<Output = ()> + Send + 'static>(f: F) -> F {
        f
    }

    #[tokio::test]
    async fn lost_future_resolves_when_the_validity_runs_out_and_not_before() {
        let start = Instant::now();
        let ttl = Duration::from_millis(200);
        let lease = lease(start, ttl);
        let valid_until = lease.snapshot().valid_until;
        assert_eq!(valid_until, start + ttl - validity::drift(ttl));
        let lost = assert_static_send(lease.lost_future());
        // Renewals are not announced: the future finds them when it wakes.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let renewed_at = Instant::now();
        assert!(lease.renewed(renewed_at, ttl));
        let renewed_until = lease.snapshot().valid_until;
        assert!(renewed_until > valid_until);
        lost.await;
        let now = Instant::now();
        assert!(now >= renewed_until, "resolved before the renewed validity");
        assert!(
            now < renewed_until + Duration::from_millis(150),
            "resolved late"
        );
        assert!(lease.is_lost_at(now));
        assert_eq!(lease.snapshot().end, End::Held, "lapsed, not ended");
        // A confirmation after the validity ran out does not revive it.
        assert!(!lease.renewed(renewed_at, ttl));
        assert_eq!(lease.snapshot().end, End::Expired);
    }

    #[tokio::test]
    async fn lost_future_resolves_at_once_when_the_lease_ends() {
        let lease = lease(Instant::now(), Duration::from_secs(30));
        let lost = lease.lost_future();
        let later = lease.lost_future();
        let ender = Arc::clone(&lease);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            ender.end(End::Taken);
        });
        let started = Instant::now();
        tokio::time::timeout(Duration::from_secs(5), async {
            lost.await;
            later.await;
        })
        .await
        .expect("both futures resolve on the end");
        assert!(started.elapsed() < Duration::from_secs(5));
        assert_eq!(lease.snapshot().end, End::Taken);
        // Ended once: a later end keeps the first reason, and new futures resolve at once.
        lease.end(End::Released);
        assert_eq!(lease.snapshot().end, End::Taken);
        lease.lost_future().await;
    }

    #[tokio::test]
    async fn lost_future_outlives_the_lease_holders() {
        let lease = lease(Instant::now(), Duration::from_millis(100));
        let valid_until = lease.snapshot().valid_until;
        let lost = lease.lost_future();
        drop(lease); // the guard and the watchdog let go, nobody ends it
        lost.await;
        assert!(Instant::now() >= valid_until);
    }

    #[test]
    fn late_replies_of_older_requests_do_not_move_the_validity() {
        let start = Instant::now();
        let ttl = Duration::from_secs(30);
        let lease = lease(start, ttl);
        let newer = start + Duration::from_millis(10);
        assert!(lease.renewed(newer, ttl));
        let until = lease.snapshot().valid_until;
        assert!(
            lease.renewed(start + Duration::from_millis(5), ttl),
            "still held"
        );
        assert_eq!(lease.snapshot().valid_until, until);
        lease.set_ttl(Duration::from_secs(5));
        assert_eq!(lease.snapshot().ttl, Duration::from_secs(5));
    }
}
