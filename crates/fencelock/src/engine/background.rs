//! The engine's background half: what is finished after its caller has left — a release
//! whose guard was dropped or whose acquire was cancelled, a waiter's withdrawal, a
//! store's release that must be tried again until the store answers — and the one retry
//! policy ([`Repeat`]) that every repeat of a call with an unknown outcome follows.
//!
//! Every such task runs on the current tokio runtime and is bounded: by
//! [`BACKGROUND_TIMEOUT`] for one call, by its [`Repeat`] for a series. Without a runtime
//! nothing is sent: the lease (or the waiter's entry) then runs out by itself. Nothing
//! here keeps a process alive: a runtime that shuts down (a `dlock` process at its exit)
//! drops what is still pending at its next pause, a repeat included, without waiting for
//! it; what it would have deleted then goes with its lease (on ZooKeeper, with the
//! session, which ends when the process's connection does and the session times out).

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument;

use crate::error::{Error, ErrorKind, Result};
use crate::keys::LockKeys;
use crate::observe::{self, Call, Obs, call_span, op, outcome, span};

/// How long a call sent in the background (a dropped guard's release, a cancelled
/// waiter's withdrawal) may take before it is abandoned (the lease, or the entry, then
/// simply expires).
pub(crate) const BACKGROUND_TIMEOUT: Duration = Duration::from_secs(5);

/// When a call whose outcome is unknown (no reply in time, connection lost) is repeated,
/// and for how long: the one policy behind every repeat, in the foreground (an acquire's
/// or a release's reply lost) and in the background (a store's release tried again until
/// it answers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Repeat {
    /// The pause before the first repeat.
    pause: Duration,
    /// Whether the n-th pause is `pause` times n (else always `pause`).
    growing: bool,
    /// How many repeats at most.
    most: u32,
    /// How long after the first call repeats may still start.
    within: Option<Duration>,
}

impl Repeat {
    /// A call whose reply was lost (acquire, release, extend): repeated twice, after
    /// 50 ms and then 100 ms. Repeats are safe: acquire is idempotent per token, release
    /// and extend are owner-checked.
    pub(crate) const UNKNOWN_OUTCOME: Repeat = Repeat {
        pause: Duration::from_millis(50),
        growing: true,
        most: 2,
        within: None,
    };

    /// Every `pause`, for as long as `within` lasts (a store's release tried again until
    /// the store answers).
    #[cfg_attr(not(feature = "zookeeper"), allow(dead_code))]
    pub(crate) fn every(pause: Duration, within: Duration) -> Repeat {
        Repeat {
            pause,
            growing: false,
            most: u32::MAX,
            within: Some(within),
        }
    }

    /// The repeats of one call, counted from now.
    pub(crate) fn start(self) -> Repeats {
        Repeats {
            policy: self,
            made: 0,
            since: Instant::now(),
        }
    }
}

/// The repeats of one call under a [`Repeat`] policy.
#[derive(Debug)]
pub(crate) struct Repeats {
    policy: Repeat,
    made: u32,
    since: Instant,
}

impl Repeats {
    /// Whether the policy allows another repeat.
    pub(crate) fn more(&self) -> bool {
        self.made < self.policy.most && self.policy.within.is_none_or(|w| self.since.elapsed() < w)
    }

    /// Counts a repeat and waits the pause before it.
    pub(crate) async fn pause(&mut self) {
        self.made = self.made.saturating_add(1);
        let pause = if self.policy.growing {
            self.policy.pause.saturating_mul(self.made)
        } else {
            self.policy.pause
        };
        tokio::time::sleep(pause).await;
    }

    /// How many repeats were made.
    pub(crate) fn made(&self) -> u32 {
        self.made
    }
}

/// Runs `task` in the background on the current runtime (nothing without one).
pub(crate) fn spawn(task: impl Future<Output = ()> + Send + 'static) {
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(task);
    }
}

/// Repeats `attempt` in the background under `policy`, a pause before each try, until one
/// succeeds: a store's release that must not be left undone (a node that would hold the
/// lock for as long as the client's session lives).
#[cfg_attr(not(feature = "zookeeper"), allow(dead_code))]
pub(crate) fn retry<F, Fut, T>(policy: Repeat, attempt: F)
where
    F: Fn() -> Fut + Send + 'static,
    Fut: Future<Output = Result<T>> + Send,
{
    spawn(async move {
        let mut repeats = policy.start();
        while repeats.more() {
            repeats.pause().await;
            if attempt().await.is_ok() {
                return;
            }
        }
    });
}

/// Sends `release` (the release of a hold of the lock `keys`, labelled by `obs`) in the
/// background, bounded by [`BACKGROUND_TIMEOUT`]: a dropped guard's release, or the
/// give-back of what a cancelled or failed acquire may have been granted. `release` is
/// made only if there is a runtime to run it.
pub(crate) fn release<Fut>(obs: &Obs, keys: &LockKeys, release: impl FnOnce() -> Fut)
where
    Fut: Future<Output = Result<bool>> + Send + 'static,
{
    if tokio::runtime::Handle::try_current().is_err() {
        return; // no runtime: the lease simply expires
    }
    let (obs, name, release) = (obs.clone(), keys.name().to_owned(), release());
    spawn(async move {
        // Made in the task: the call's span stands on its own, not under the caller's.
        let call = Call::new(call_span!(
            span::RELEASE,
            op::RELEASE,
            obs,
            name.as_str(),
            1u32
        ));
        let release = release.instrument(call.span());
        match tokio::time::timeout(BACKGROUND_TIMEOUT, release).await {
            Ok(released) => {
                call.done(&released, |&r| released_outcome(r));
                if let Err(err) = released {
                    tracing::debug!(lock = name.as_str(), error = %err, "background release failed; the lease will expire");
                }
            }
            Err(_) => {
                observe::failed(
                    &call.span(),
                    &Error::new(ErrorKind::TimedOut, "background release timed out"),
                );
                tracing::debug!(
                    lock = name.as_str(),
                    "background release timed out; the lease will expire"
                );
            }
        }
    });
}

/// Withdraws a waiter's queue entry in the background (`abandon`, for the lock `keys`
/// labelled by `obs`), bounded by [`BACKGROUND_TIMEOUT`]: a wait that ended without a
/// grant (cancelled, failed). `abandon` is made only if there is a runtime to run it.
pub(crate) fn abandon<Fut>(obs: &Obs, keys: &LockKeys, abandon: impl FnOnce() -> Fut)
where
    Fut: Future<Output = Result<()>> + Send + 'static,
{
    if tokio::runtime::Handle::try_current().is_err() {
        return; // the entry times out by itself
    }
    let (obs, name, abandon) = (obs.clone(), keys.name().to_owned(), abandon());
    spawn(async move {
        let call = Call::new(call_span!(
            span::ABANDON,
            op::ABANDON,
            obs,
            name.as_str(),
            1u32
        ));
        let abandon = abandon.instrument(call.span());
        let abandoned = tokio::time::timeout(BACKGROUND_TIMEOUT, abandon)
            .await
            .unwrap_or_else(|_| {
                Err(Error::new(
                    ErrorKind::TimedOut,
                    "withdrawing a waiter timed out",
                ))
            });
        call.done(&abandoned, |()| outcome::OK);
        if abandoned.is_err() {
            tracing::debug!(
                lock = name.as_str(),
                "withdrawing a waiter failed; its entry times out"
            );
        }
    });
}

/// The `outcome` of a release call that answered `released`.
pub(crate) fn released_outcome(released: bool) -> &'static str {
    if released {
        outcome::RELEASED
    } else {
        outcome::NOT_HELD
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn an_unknown_outcome_is_repeated_twice_after_growing_pauses() {
        let start = Instant::now();
        let mut repeats = Repeat::UNKNOWN_OUTCOME.start();
        let mut at = Vec::new();
        while repeats.more() {
            repeats.pause().await;
            at.push(start.elapsed());
        }
        assert_eq!(repeats.made(), 2);
        assert_eq!(
            at,
            [Duration::from_millis(50), Duration::from_millis(150)],
            "50 ms, then 100 ms"
        );
    }

    /// Runs a background retry of an attempt that succeeds on try `ok_at` (never if 0)
    /// and returns how many tries it made.
    async fn tries(ok_at: u32) -> u32 {
        let tries = Arc::new(AtomicU32::new(0));
        let counted = Arc::clone(&tries);
        let policy = Repeat::every(Duration::from_millis(200), Duration::from_secs(1));
        retry(policy, move || {
            let n = counted.fetch_add(1, Ordering::SeqCst) + 1;
            async move {
                if n == ok_at {
                    Ok(true)
                } else {
                    Err(Error::new(ErrorKind::Unavailable, "down"))
                }
            }
        });
        tokio::time::sleep(Duration::from_secs(5)).await;
        tries.load(Ordering::SeqCst)
    }

    /// A process at its exit (its runtime shut down) does not wait for a retry that is
    /// still pending: the retry is dropped at its next pause.
    #[test]
    fn a_pending_retry_does_not_hold_up_the_runtimes_shutdown() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime");
        let tries = Arc::new(AtomicU32::new(0));
        let counted = Arc::clone(&tries);
        runtime.block_on(async move {
            let policy = Repeat::every(Duration::from_millis(10), Duration::from_secs(3600));
            retry(policy, move || {
                counted.fetch_add(1, Ordering::SeqCst);
                async { Err::<(), _>(Error::new(ErrorKind::Unavailable, "down")) }
            });
            tokio::time::sleep(Duration::from_millis(100)).await;
        });
        assert!(tries.load(Ordering::SeqCst) > 0, "the retry ran");
        let (done, shut) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            drop(runtime);
            let _ = done.send(());
        });
        // A liveness bound, far below the retry's hour.
        assert!(
            shut.recv_timeout(Duration::from_secs(60)).is_ok(),
            "the runtime's shutdown waited for the retry"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_background_retry_ends_at_its_first_success_or_when_its_time_is_up() {
        assert_eq!(tries(2).await, 2, "no try after a success");
        // Tries at 200, 400, 600, 800 and 1000 ms: none starts after its second.
        assert_eq!(tries(0).await, 5);
    }
}
