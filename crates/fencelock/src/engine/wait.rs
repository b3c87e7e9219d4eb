//! The engine's waiting half: a waiter's subscription to its wake-up ([`ReleaseWatch`]),
//! backoff for stores that cannot notify, and the hand-on of a wake-up that a waiter
//! consumed but could not use. The wait loop itself is `acquire`'s, written once for
//! every primitive; which waiter a release wakes is the store's side
//! (`RawLock::watch_for`).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use crate::error::{Error, Result};
use crate::observe::{Extra, Obs, metric};

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
    if !crate::simulation::fill(&mut b) && getrandom::fill(&mut b).is_err() {
        return 0.5;
    }
    f64::from(u32::from_le_bytes(b)) / (f64::from(u32::MAX) + 1.0)
}

/// Passes a consumed release announcement on to another local waiter if this waiter
/// leaves (error, cancellation) before its attempt settled anything.
pub(crate) struct PassOn {
    notify: Option<Arc<tokio::sync::Notify>>,
    /// Where a wake-up passed on is counted (`dlock_handoffs_total{kind="wakeup"}`).
    obs: Obs,
}

impl PassOn {
    pub(crate) fn new(notify: Option<Arc<tokio::sync::Notify>>, obs: &Obs) -> PassOn {
        PassOn {
            notify,
            obs: obs.clone(),
        }
    }

    pub(crate) fn consumed(&mut self) {
        self.notify = None;
    }
}

impl Drop for PassOn {
    fn drop(&mut self) {
        if crate::simulation::planted(crate::simulation::Plant::WakeNotPassedOn) {
            return; // planted for the simulator: the wake-up is lost
        }
        if let Some(notify) = self.notify.take() {
            notify.notify_one();
            self.obs
                .count(metric::HANDOFFS, Some(Extra::HandoffWakeup), 1);
        }
    }
}

/// Where a store that grants a queued waiter without its asking (a Redis release's
/// hand-over of the lock or permits; an etcd waiter's task seeing its turn come) leaves
/// the grant's fence (or counter), until the waiter's wait loop takes it.
///
/// A hand-over counts only if it was made after the waiter's latest attempt that reported
/// the lock held was processed: that attempt's send time is then a safe start for the
/// lease. The store tells them apart by the fence counter: each such reply carries the
/// counter's value ([`GrantSlot::raise_floor`]) and a later grant mints a higher fence.
#[derive(Debug, Default)]
pub(crate) struct GrantSlot {
    /// (the counter in the latest held reply, a grant's fence above it)
    state: std::sync::Mutex<(u64, Option<u64>)>,
}

// Hand-overs come only from the stores that grant on a release.
#[cfg_attr(
    not(any(
        feature = "redis",
        feature = "etcd",
        feature = "postgres",
        feature = "zookeeper"
    )),
    allow(dead_code)
)]
impl GrantSlot {
    fn state(&self) -> std::sync::MutexGuard<'_, (u64, Option<u64>)> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A hand-over with `fence` arrived; kept if it is newer than the latest held reply.
    pub(crate) fn offer(&self, fence: u64) {
        let mut s = self.state();
        if fence > s.0 {
            s.1 = Some(fence);
        }
    }

    /// An attempt reported the lock held when the fence counter stood at `counter`: a
    /// hand-over with a fence up to it was made before that attempt and is void (the
    /// attempt would have found the lock ours otherwise).
    pub(crate) fn raise_floor(&self, counter: u64) {
        let mut s = self.state();
        s.0 = s.0.max(counter);
        if s.1.is_some_and(|f| f <= s.0) {
            s.1 = None;
        }
    }

    /// Forgets any hand-over (the connection that carried it dropped: the store may have
    /// restarted and lost it).
    #[cfg_attr(not(any(feature = "redis", feature = "postgres")), allow(dead_code))]
    pub(crate) fn clear(&self) {
        self.state().1 = None;
    }

    /// Takes the hand-over's fence, if one arrived.
    pub(crate) fn take(&self) -> Option<u64> {
        self.state().1.take()
    }
}

/// A subscription to release announcements of one lock, held by one waiter.
///
/// Each announcement wakes one waiter of this client (not all of them); a waiter that is
/// woken but gives up passes the wake-up on.
pub struct ReleaseWatch {
    inner: Option<(Arc<Notify>, Option<Subscription>)>,
    /// Where the store leaves a hand-over to this waiter (stores that grant at release).
    grants: Option<Arc<GrantSlot>>,
    /// The store can notify, but not now (its notification channel is down).
    unavailable: bool,
}

/// Whatever keeps a store-side subscription alive; dropping it may end the subscription.
pub type Subscription = Box<dyn Send + Sync>;

impl ReleaseWatch {
    /// A watch that never fires: the store cannot notify.
    pub fn none() -> Self {
        ReleaseWatch {
            inner: None,
            grants: None,
            unavailable: false,
        }
    }

    /// A watch that cannot fire because the store's notification channel is down for
    /// now (a failed connection it will open again later): waiters poll, and subscribe
    /// again after their next pause.
    pub fn unavailable() -> Self {
        ReleaseWatch {
            unavailable: true,
            ..ReleaseWatch::none()
        }
    }

    /// Whether this watch stands in for one the store could not set up now
    /// ([`unavailable`](ReleaseWatch::unavailable)).
    pub fn is_unavailable(&self) -> bool {
        self.unavailable
    }

    /// A watch woken through `notify` (with `notify_one`). `subscription` is dropped with
    /// the watch; its `Drop` can end the store-side subscription.
    pub fn new(notify: Arc<Notify>, subscription: Option<Subscription>) -> Self {
        ReleaseWatch {
            inner: Some((notify, subscription)),
            grants: None,
            unavailable: false,
        }
    }

    /// This watch with the slot where its store leaves a hand-over.
    #[cfg_attr(
        not(any(
            feature = "redis",
            feature = "etcd",
            feature = "postgres",
            feature = "zookeeper"
        )),
        allow(dead_code)
    )]
    pub(crate) fn with_grants(mut self, grants: Arc<GrantSlot>) -> Self {
        self.grants = Some(grants);
        self
    }

    /// The fence of a hand-over: the store granted the lock to this waiter's token after
    /// the waiter's latest attempt that found it held was processed (a Redis release's
    /// hand-over, or an etcd waiter's turn).
    pub(crate) fn take_grant(&self) -> Option<u64> {
        self.grants.as_ref().and_then(|g| g.take())
    }

    /// Whether this watch can fire at all.
    pub fn is_active(&self) -> bool {
        self.inner.is_some()
    }

    /// The notifier behind this watch, for handing a consumed wake-up on to another
    /// local waiter (`notify_one`).
    pub(crate) fn notifier(&self) -> Option<Arc<Notify>> {
        self.inner.as_ref().map(|(notify, _)| Arc::clone(notify))
    }

    /// Waits for the next release announcement (forever, for [`ReleaseWatch::none`]).
    ///
    /// # Cancel safety
    /// Cancel-safe: a wake-up delivered to a cancelled wait is passed to another waiter.
    pub async fn released(&self) {
        match &self.inner {
            Some((notify, _)) => notify.notified().await,
            None => std::future::pending().await,
        }
    }
}

impl std::fmt::Debug for ReleaseWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReleaseWatch")
            .field("active", &self.is_active())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::GrantSlot;

    #[test]
    fn a_hand_over_counts_only_above_the_latest_held_reply() {
        let slot = GrantSlot::default();
        slot.raise_floor(10);
        slot.offer(10); // made before the held reply: void
        assert_eq!(slot.take(), None);
        slot.offer(11);
        assert_eq!(slot.take(), Some(11));
        assert_eq!(slot.take(), None, "taken once");
        slot.offer(12);
        slot.raise_floor(12); // a later attempt found the lock held after that grant
        assert_eq!(slot.take(), None);
        slot.offer(13);
        slot.clear();
        assert_eq!(slot.take(), None);
    }
}
