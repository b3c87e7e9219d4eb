//! The engine's waiting half: backoff for stores that cannot notify, and the hand-on of
//! a wake-up that a waiter consumed but could not use. The wait loop itself is
//! `Lock::acquire_until`, written once for every primitive; which waiter a release wakes
//! is the store's side (`RawLock::watch_for`).

use std::sync::Arc;
use std::time::Duration;

use crate::error::{Error, Result};

/// Backoff between attempts on stores that cannot announce releases (and the fallback
/// timer when a holder's remaining ttl is unknown): exponential from `min` to `max`, with
/// full jitter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Retry {
    /// First delay.
    pub min: Duration,
    /// Largest delay.
    pub max: Duration,
}

impl Retry {
    /// Exponential backoff from `min` to `max`.
    pub fn exponential(min: Duration, max: Duration) -> Retry {
        Retry { min, max }
    }

    pub(crate) fn validate(self) -> Result<Retry> {
        if self.min.is_zero() || self.min > self.max || self.max > Duration::from_secs(60) {
            return Err(Error::invalid("retry backoff needs 0 < min <= max <= 60 s"));
        }
        Ok(self)
    }
}

impl Default for Retry {
    fn default() -> Self {
        Retry::exponential(Duration::from_millis(10), Duration::from_millis(500))
    }
}

pub(crate) struct Backoff {
    retry: Retry,
    attempt: u32,
}

impl Backoff {
    pub(crate) fn new(retry: Retry) -> Backoff {
        Backoff { retry, attempt: 0 }
    }
}

impl Backoff {
    pub(crate) fn next(&mut self) -> Duration {
        let ceiling = self
            .retry
            .min
            .saturating_mul(1u32 << self.attempt.min(16))
            .min(self.retry.max);
        self.attempt = self.attempt.saturating_add(1);
        // Full jitter between min and the ceiling, so waiters that lost together spread out.
        let span = ceiling.saturating_sub(self.retry.min);
        self.retry.min + span.mul_f64(jitter())
    }
}

/// A uniform number in [0, 1) for jitter. Not for secrets.
pub(crate) fn jitter() -> f64 {
    let mut b = [0u8; 4];
    if getrandom::fill(&mut b).is_err() {
        return 0.5;
    }
    f64::from(u32::from_le_bytes(b)) / (f64::from(u32::MAX) + 1.0)
}

/// Passes a consumed release announcement on to another local waiter if this waiter
/// leaves (error, cancellation) before its attempt settled anything.
pub(crate) struct PassOn(pub(crate) Option<Arc<tokio::sync::Notify>>);

impl PassOn {
    pub(crate) fn consumed(&mut self) {
        self.0 = None;
    }
}

impl Drop for PassOn {
    fn drop(&mut self) {
        if let Some(notify) = self.0.take() {
            notify.notify_one();
        }
    }
}
