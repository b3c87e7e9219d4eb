//! One held lease: its keys, token, kind and validity, shared by a guard and the watchdog.
//!
//! A lease is *lost* when the store says the key no longer holds our token, or when
//! renewals kept failing until its validity (monotonic clock, minus drift) ran out.

use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::LeaseKind;
use crate::keys::LockKeys;
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

#[derive(Debug, Clone, Copy)]
pub(crate) struct LeaseState {
    pub(crate) valid_until: Instant,
    /// When the request behind `valid_until` was sent. Replies on one connection come in
    /// the order the store applied them, so the latest-sent success describes the store.
    pub(crate) sent: Instant,
    /// The ttl future renewals ask for.
    pub(crate) ttl: Duration,
    pub(crate) end: End,
}

/// One held lease, shared by its guard and the watchdog.
#[derive(Debug)]
pub(crate) struct Lease {
    pub(crate) keys: LockKeys,
    pub(crate) token: Token,
    /// Which renewal the store must apply (the primitive that holds it).
    pub(crate) kind: LeaseKind,
    pub(crate) state: watch::Sender<LeaseState>,
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
    ) -> Lease {
        let (state, _) = watch::channel(LeaseState {
            valid_until: drift.valid_until(sent.into_std(), ttl).into(),
            sent,
            ttl,
            end: End::Held,
        });
        Lease {
            keys,
            token,
            kind,
            state,
            drift,
        }
    }

    pub(crate) fn snapshot(&self) -> LeaseState {
        *self.state.borrow()
    }

    /// Lost (or ended) at `now`: the store said so, or validity ran out.
    pub(crate) fn is_lost_at(&self, now: Instant) -> bool {
        let s = self.snapshot();
        s.end != End::Held || now >= s.valid_until
    }

    /// A renewal or extension sent at `sent` for `ttl` succeeded. Returns whether the
    /// lease is still held: a confirmation that arrives after the validity ran out cannot
    /// revive it (someone may have held the lock in between), and ends it instead.
    pub(crate) fn renewed(&self, sent: Instant, ttl: Duration) -> bool {
        let now = Instant::now();
        let mut held = false;
        self.state.send_if_modified(|s| {
            if s.end != End::Held {
                return false;
            }
            if now >= s.valid_until {
                s.end = End::Expired;
                return true;
            }
            held = true;
            if sent < s.sent {
                return false; // an older request's late reply says nothing new
            }
            s.sent = sent;
            s.valid_until = self.drift.valid_until(sent.into_std(), ttl).into();
            true
        });
        held
    }

    /// From now on, renewals ask for `ttl`.
    pub(crate) fn set_ttl(&self, ttl: Duration) {
        self.state.send_modify(|s| s.ttl = ttl);
    }

    pub(crate) fn end(&self, end: End) {
        self.state.send_if_modified(|s| {
            if s.end == End::Held {
                s.end = end;
                true
            } else {
                false
            }
        });
    }

    /// Resolves when the lease can no longer be guaranteed.
    pub(crate) fn lost_future(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut rx = self.state.subscribe();
        async move {
            loop {
                let s = *rx.borrow_and_update();
                if s.end != End::Held {
                    return;
                }
                tokio::select! {
                    changed = rx.changed() => {
                        if changed.is_err() {
                            // Every sender is gone: nobody renews any more.
                            tokio::time::sleep_until(s.valid_until).await;
                            return;
                        }
                    }
                    () = tokio::time::sleep_until(s.valid_until) => return,
                }
            }
        }
    }
}
