//! The engine's acquiring half: the wait loop every acquire runs, its attempts, and the
//! guards that keep it cancel-safe — written once for every primitive on every store.
//!
//! A primitive hands the loop its [`Hooks`]: one attempt (plain or queueing), the
//! store's wake-up for this waiter, a waiter's withdrawal, a release, and how a grant
//! becomes a hold. The loop owns the rest: one token for the whole wait, the repeat of
//! an attempt whose reply was lost ([`Repeat::UNKNOWN_OUTCOME`]), riding out a store
//! outage, the fallback timer and the backoff, a hand-over taken from the wake-up, and
//! what is settled when the caller leaves:
//!
//! * an attempt cancelled mid-flight ([`CancelGuard`]) and a wait that ends with an
//!   attempt whose outcome is still unknown give back, in the background, whatever may
//!   have been granted under the wait's token (a grant that arrives after the caller was
//!   cancelled or timed out is not kept);
//! * a wait that ends without a grant withdraws its place in the store's waiter queue.
//!
//! The engine knows nothing of the raw traits: the contract's adapter (`Lock`) implements
//! [`Hooks`] over a store's `RawLock`.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument;

use super::background::{self, Repeat};
use super::wait::{Backoff, PassOn, ReleaseWatch, Retry};
use crate::error::{Error, ErrorKind, Result};
use crate::keys::LockKeys;
use crate::observe::{self, Call, Extra, Obs, call_span, field, metric, op, outcome, span};
use crate::simulation::Plant;
use crate::token::Token;

/// The outcome of one acquire attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Acquire {
    /// The lock key now holds our token with the requested expiry.
    Acquired {
        /// The fence minted with this grant (0 from stores that do not implement
        /// [`RawFencing`](crate::raw::RawFencing); it is then never shown to users).
        fence: u64,
    },
    /// Someone else holds the lock.
    Held {
        /// The holder's remaining time to live, if the store knows it. `None` means the
        /// key has no expiry (set by a foreign client) or the store cannot tell.
        remaining: Option<Duration>,
    },
}

/// What the acquire loop needs from a primitive on a store: its calls, and how a grant
/// becomes a hold. The loop is the engine's; these are the store's single steps.
pub(crate) trait Hooks: Send + Sync {
    /// What a grant becomes (a guard).
    type Held;

    /// Whether an attempt that finds the lock held leaves a waiter entry in the store
    /// that [`abandon`](Hooks::abandon) must withdraw.
    const QUEUES_WAITERS: bool;
    /// Whether only a queueing attempt leaves such an entry.
    const QUEUES_ONLY_LISTENERS: bool;
    /// Whether a queueing attempt may wait inside the store until the lock is free.
    const WAITS_IN_STORE: bool;

    /// The lock's spans and metrics labels.
    fn obs(&self) -> &Obs;
    /// The lock's keys.
    fn keys(&self) -> &LockKeys;
    /// The lease each attempt asks for.
    fn ttl(&self) -> Duration;
    /// The backoff between attempts where the store cannot notify.
    fn retry(&self) -> Retry;
    /// How long a grant or renewal of [`ttl`](Hooks::ttl) may count on.
    fn lease_validity(&self) -> Duration;
    /// Whether one grant leaves room for more: a woken waiter that was granted passes
    /// the wake-up on.
    fn shares_grants(&self) -> bool;

    /// The token of one wait (every attempt of it repeats it).
    fn token(&self) -> Result<Token>;
    /// Whether a grant could be kept now (an error refuses the attempt before it is made).
    fn ready(&self) -> Result<()>;
    /// One attempt under `token`.
    fn acquire(&self, token: &Token) -> impl Future<Output = Result<Acquire>> + Send;
    /// One attempt under `token` by a waiter that already listens for its wake-up: it may
    /// be taken into the store's waiter queue.
    fn acquire_or_queue(&self, token: &Token) -> impl Future<Output = Result<Acquire>> + Send;
    /// Starts listening for the moment `token`'s holder-to-be may try again.
    fn watch_for(&self, token: &Token) -> impl Future<Output = Result<ReleaseWatch>> + Send;
    /// A watch for `token` already in effect, without a round trip.
    fn watch_ready(&self, token: &Token) -> Option<ReleaseWatch>;
    /// Withdraws `token`'s waiter entry (owned: it may run after the wait is gone).
    fn abandon(&self, token: &Token) -> impl Future<Output = Result<()>> + Send + 'static;
    /// Releases whatever `token` holds (owned: it may run after the wait is gone).
    fn release(&self, token: &Token) -> impl Future<Output = Result<bool>> + Send + 'static;
    /// Makes a grant under `token` (request sent at `sent`, fence `fence`) a hold. A
    /// grant already past its validity is given back in the background only if
    /// `give_back_late` (else the caller settles it).
    fn hold(
        &self,
        token: Token,
        sent: Instant,
        fence: u64,
        give_back_late: bool,
    ) -> std::result::Result<Self::Held, NoGuard>;
}

/// Gives back, in the background, what `token` may hold of the lock behind `h`.
pub(crate) fn give_back<H: Hooks>(h: &H, token: &Token) {
    background::release(h.obs(), h.keys(), || h.release(token));
}

/// Why [`Hooks::hold`] made no hold.
pub(crate) enum NoGuard {
    /// The grant's reply came past its validity (given back or left unsettled).
    Late(Error),
    /// The grant could not be registered (given back).
    Refused(Error),
}

impl NoGuard {
    /// The error behind it.
    pub(crate) fn into_error(self) -> Error {
        match self {
            NoGuard::Late(err) | NoGuard::Refused(err) => err,
        }
    }
}

/// Records the end of a wait that no hand-over ended: `wait` is its span and start.
fn end_wait(obs: &Obs, wait: (tracing::Span, Instant), woken_by: Extra) {
    obs.waited(&wait.0, woken_by, wait.1.elapsed());
    wait.0.record(field::HANDOFF, false);
}

/// The result of one attempt.
enum Attempt<G> {
    Got(G),
    Held(Option<Duration>),
}

/// An attempt that failed; `unsettled` if its request may have reached the store (and
/// granted something under the wait's token).
struct Failed {
    err: Error,
    unsettled: bool,
}

/// Waits until the lock behind `h` is granted, or `deadline` (if any) passes: one
/// acquisition, in its `dlock.acquisition` span.
///
/// # Cancel safety
/// Cancel-safe: dropping the future leaves no hold, no renewal and no queue entry
/// behind; whatever an attempt in flight may have been granted is given back in the
/// background.
pub(crate) async fn acquire<H: Hooks>(h: &H, deadline: Option<Instant>) -> Result<Option<H::Held>> {
    let mut acquisition = observe::Acquisition::start(h.obs(), h.keys().name(), deadline);
    let result = run(h, deadline, &acquisition)
        .instrument(acquisition.span())
        .await;
    acquisition.finish(&result);
    result
}

/// The wait loop of one acquisition (`acquisition` counts its attempts and waits).
async fn run<H: Hooks>(
    h: &H,
    deadline: Option<Instant>,
    acquisition: &observe::Acquisition<'_>,
) -> Result<Option<H::Held>> {
    // One token for the whole wait: a queued waiter keeps its place under it, and an
    // attempt repeated after a lost reply is recognised by the store as the same one.
    let token = h.token()?;
    // A client that still listens from an earlier wait can queue from the first
    // attempt (not when one attempt is all there is).
    let mut watch: Option<ReleaseWatch> = match deadline {
        Some(d) if d <= Instant::now() => None,
        _ => h.watch_ready(&token),
    };
    let mut backoff = Backoff::new(h.retry());
    // Withdraws our place in the store's waiter queue (if the primitive keeps one)
    // unless the wait ends with a grant.
    let mut waiting = Waiting {
        hooks: h,
        token: &token,
        queued: false,
        unsettled: false,
    };
    // A release announcement this waiter consumed; passed on to another local waiter
    // unless our next attempt settles who holds the lock.
    let mut woken: Option<PassOn> = None;
    // When the store became unreachable while we were waiting.
    let mut outage: Option<Instant> = None;
    // When our latest attempt that found the lock held was sent: a hand-over the store
    // makes after it (see `ReleaseWatch::take_grant`) counts its lease from here.
    let mut held_sent;
    // Whether an attempt of this acquisition found the lock held.
    let mut found_held = false;
    // A wait inside the store (`H::WAITS_IN_STORE`) and when it began: a queueing
    // attempt made after the lock was found held is where such a waiter waits, so its
    // `dlock.wait` span opens before that attempt (whose `dlock.acquire` is its child)
    // and, if the store answers without the lock, goes on through the sleep after it.
    let mut store_wait: Option<(tracing::Span, Instant)> = None;
    // The latest subscription failed (a lost reply, a reconnect) or the store's channel
    // is down for now: the wait polls, and subscribes again after its next pause
    // rather than polling to its end.
    let mut watch_failed = false;
    let mut subscribe_again = false;
    loop {
        let queue = watch.as_ref().is_some_and(ReleaseWatch::is_active);
        // From its sending on, the attempt may leave an entry in the store's queue: a
        // wait that ends without a grant withdraws it, even if no reply came back.
        waiting.queued |= queue || !H::QUEUES_ONLY_LISTENERS;
        let in_store = queue && H::WAITS_IN_STORE;
        let sent = Instant::now();
        if in_store && found_held && store_wait.is_none() {
            acquisition.waiting();
            let left = deadline.map(|d| d.saturating_duration_since(sent));
            store_wait = Some((h.obs().wait_span(h.keys().name(), left), sent));
        }
        // Whether the store waited before answering: a queueing attempt made before
        // the lock was found held (a client that still listens queues from its first
        // attempt) learns it only from the store, once the reply is in.
        // (Made only for such an attempt: it is an allocation.)
        let probe = in_store.then(observe::StoreWait::default);
        let (attempt, cut) = if in_store || store_wait.is_some() {
            // Boxed, as every step off the uncontended path: the acquisition's future
            // stays small (it is moved, whole, wherever it is awaited).
            Box::pin(async {
                let request = attempt(h, &token, queue, acquisition);
                let request = async {
                    match (&store_wait, &probe) {
                        (Some((span, _)), _) => request.instrument(span.clone()).await,
                        (None, Some(probe)) => probe.scope(request).await,
                        (None, None) => request.await,
                    }
                };
                match deadline.filter(|_| in_store) {
                    // A wait inside the store ends at the caller's deadline: the lock
                    // was held all along.
                    Some(d) => match tokio::time::timeout_at(d, request).await {
                        Ok(attempt) => (attempt, false),
                        Err(_) => (Ok(Attempt::Held(None)), true),
                    },
                    None => (request.await, false),
                }
            })
            .await
        } else {
            (attempt(h, &token, queue, acquisition).await, false)
        };
        let attempt = match attempt {
            Ok(attempt) => {
                outage = None;
                waiting.unsettled = false;
                if in_store
                    && store_wait.is_none()
                    && (cut || probe.as_ref().is_some_and(observe::StoreWait::waited))
                {
                    // A wait the store told of in its reply: recorded now.
                    let woken_by = match (&attempt, cut) {
                        (_, true) => Extra::WokenDeadline,
                        (Attempt::Got(_), false) => Extra::WokenRelease,
                        // The store's own bound on its wait ran out.
                        (Attempt::Held(_), false) => Extra::WokenFallback,
                    };
                    acquisition.waiting();
                    let left = deadline.map(|d| d.saturating_duration_since(sent));
                    end_wait(
                        h.obs(),
                        (h.obs().wait_span(h.keys().name(), left), sent),
                        woken_by,
                    );
                }
                attempt
            }
            // A waiter rides out a store outage (a restart, a failover) for up to one
            // ttl; the first attempt, and longer outages, report the error.
            // The next attempt, under the same token, settles whatever an unsettled one
            // may have granted (the store recognises the token); giving it back now
            // could land after that attempt and take a later grant away.
            Err(Failed { err, unsettled })
                if err.is_retryable()
                    && watch.is_some()
                    && outage.get_or_insert_with(Instant::now).elapsed() < h.ttl()
                    && deadline.is_none_or(|d| Instant::now() < d) =>
            {
                if let Some(wait) = store_wait.take() {
                    end_wait(h.obs(), wait, Extra::WokenOutage);
                }
                waiting.unsettled |= unsettled;
                tracing::debug!(lock = h.keys().name(), error = %err, "store unavailable while waiting; retrying");
                h.obs().count(metric::RETRIES, Some(Extra::RetryAcquire), 1);
                acquisition.waiting();
                // Boxed, as every step off the uncontended path: the acquisition's
                // future stays small (it is moved, whole, wherever it is awaited).
                Box::pin(ride_out(h, backoff.next(), deadline)).await;
                continue;
            }
            Err(Failed { err, unsettled }) => {
                if let Some(wait) = store_wait.take() {
                    end_wait(h.obs(), wait, Extra::WokenOutage);
                }
                // Whatever may have been granted under our token goes back (`waiting`).
                waiting.unsettled |= unsettled;
                return Err(err);
            }
        };
        let remaining = match attempt {
            Attempt::Got(guard) => {
                if let Some(wait) = store_wait.take() {
                    // The store let the waiter through at a release.
                    end_wait(h.obs(), wait, Extra::WokenRelease);
                }
                waiting.queued = false;
                if let Some(mut w) = woken.take()
                    && !h.shares_grants()
                {
                    w.consumed();
                }
                return Ok(Some(guard));
            }
            Attempt::Held(remaining) => {
                held_sent = sent;
                found_held = true;
                remaining
            }
        };
        if let Some(mut w) = woken.take() {
            w.consumed();
        }
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            if let Some(wait) = store_wait.take() {
                end_wait(h.obs(), wait, Extra::WokenDeadline);
            }
            if H::QUEUES_WAITERS && waiting.queued {
                // Withdraw before returning, so that our entry is gone when the caller
                // looks (the background withdrawal is for cancellation only).
                waiting.queued = false;
                Box::pin(withdraw(h, &token)).await;
            }
            return Ok(None);
        }
        if watch.is_none() || subscribe_again {
            // Subscribe, then try again at once: a release between our attempt and the
            // subscription would otherwise go unheard.
            subscribe_again = false;
            acquisition.waiting();
            let (subscribed, failed) = Box::pin(subscribe(h, &token, deadline)).await;
            (watch, watch_failed) = (Some(subscribed), failed);
            continue;
        }
        let Some(watch) = &watch else {
            continue;
        };
        let mut sleep = if watch.is_active() {
            // The release announcement normally wakes us; the holder's ttl is the
            // fallback if the message is lost.
            remaining
                .map(|r| r + Duration::from_millis(1))
                .unwrap_or(h.retry().max)
        } else {
            let b = backoff.next();
            remaining.map_or(b, |r| b.min(r + Duration::from_millis(1)))
        };
        let mut woken_by = if watch.is_active() {
            Extra::WokenFallback
        } else {
            Extra::WokenBackoff
        };
        if let Some(d) = deadline {
            let left = d.saturating_duration_since(now);
            if left <= sleep {
                (sleep, woken_by) = (left, Extra::WokenDeadline);
            }
        }
        acquisition.waiting();
        let (wait, slept) = match store_wait.take() {
            // The wait inside the store goes on here: one wait, one span.
            Some((span, since)) => {
                span.record(field::TIMER_MS, observe::millis(since.elapsed() + sleep));
                (span, since)
            }
            None => (
                h.obs().wait_span(h.keys().name(), Some(sleep)),
                Instant::now(),
            ),
        };
        // In order (no draw from the runtime's generator, so a seed replays): a
        // release announced by the time the timer fires is taken, not left for the
        // timer's attempt to find by chance.
        let released = Box::pin(async {
            tokio::select! {
                biased;
                () = watch.released() => true,
                () = tokio::time::sleep(sleep) => false,
            }
        })
        .await;
        if released {
            woken = Some(PassOn::new(watch.notifier(), h.obs()));
            woken_by = Extra::WokenRelease;
        }
        h.obs().waited(&wait, woken_by, slept.elapsed());
        if std::mem::take(&mut watch_failed) {
            subscribe_again = true;
        }
        // The store handed the lock over to us at a release, after our latest attempt
        // was processed: we hold it from no earlier than that attempt's sending. (If
        // that was long ago, the next attempt finds our token and renews it instead.)
        let grant = watch
            .take_grant()
            .filter(|_| held_sent.elapsed() < h.lease_validity() / 2);
        wait.record(field::HANDOFF, grant.is_some());
        drop(wait);
        if let Some(fence) = grant {
            h.obs()
                .count(metric::HANDOFFS, Some(Extra::HandoffGrant), 1);
            if let Some(mut w) = woken.take() {
                w.consumed();
            }
            let guard = h
                .hold(token.clone(), held_sent, fence, true)
                .map_err(NoGuard::into_error)?;
            waiting.queued = false;
            return Ok(Some(guard));
        }
    }
}

/// Sleeps `pause` (cut at `deadline`) while the store is unreachable, in a wait span.
async fn ride_out<H: Hooks>(h: &H, mut pause: Duration, deadline: Option<Instant>) {
    let mut woken_by = Extra::WokenOutage;
    if let Some(d) = deadline {
        let left = d.saturating_duration_since(Instant::now());
        if left <= pause {
            (pause, woken_by) = (left, Extra::WokenDeadline);
        }
    }
    let wait = h.obs().wait_span(h.keys().name(), Some(pause));
    let slept = Instant::now();
    tokio::time::sleep(pause).await;
    h.obs().waited(&wait, woken_by, slept.elapsed());
}

/// Withdraws `token`'s waiter entry now, at the end of a wait that timed out.
async fn withdraw<H: Hooks>(h: &H, token: &Token) {
    let abandoned = observe::observed!(
        h.obs(),
        h.keys().name(),
        span::ABANDON,
        op::ABANDON,
        h.abandon(token)
    );
    if let Err(err) = abandoned {
        tracing::debug!(lock = h.keys().name(), error = %err, "withdrawing a waiter failed; its entry times out");
    }
}

/// Starts listening for `token`'s wake-up (given up at `deadline`): the watch, and
/// whether it failed or stands in for one the store cannot set up now (the wait then
/// polls, and subscribes again after its next pause). A failed subscription is a watch
/// that never fires.
async fn subscribe<H: Hooks>(
    h: &H,
    token: &Token,
    deadline: Option<Instant>,
) -> (ReleaseWatch, bool) {
    let call = Call::new(call_span!(
        span::WATCH,
        op::WATCH,
        h.obs(),
        h.keys().name(),
        1u32
    ));
    let subscribe = h.watch_for(token).instrument(call.span());
    let subscribed = match deadline {
        Some(d) => tokio::time::timeout_at(d, subscribe)
            .await
            .unwrap_or_else(|_| Ok(ReleaseWatch::none())),
        None => subscribe.await,
    };
    call.done(&subscribed, |_| outcome::OK);
    let failed = subscribed
        .as_ref()
        .map_or(true, ReleaseWatch::is_unavailable);
    let watch = subscribed.unwrap_or_else(|err| {
        tracing::debug!(lock = h.keys().name(), error = %err, "cannot watch releases; polling, and subscribing again after the next pause");
        ReleaseWatch::none()
    });
    (watch, failed)
}

/// One attempt under `token`. An attempt whose outcome is unknown (no reply in time,
/// connection lost) is repeated with the same token a few times: the store treats the
/// repeat as the same request, so a grant is never applied twice.
///
/// An attempt cancelled mid-flight gives back in the background whatever it may have
/// been granted; one that fails with its outcome unknown leaves that to the caller
/// (`Failed::unsettled`).
async fn attempt<H: Hooks>(
    h: &H,
    token: &Token,
    queue: bool,
    acquisition: &observe::Acquisition<'_>,
) -> std::result::Result<Attempt<H::Held>, Failed> {
    let settled = |err| Failed {
        err,
        unsettled: false,
    };
    // Checked before acquiring: a grant we could not renew nor give back would block
    // everyone for a whole ttl.
    h.ready().map_err(settled)?;
    let mut pending = CancelGuard {
        hooks: h,
        token: Some(token),
    };
    let mut repeats = Repeat::UNKNOWN_OUTCOME.start();
    let (fence, sent) = loop {
        let call = Call::new(call_span!(
            span::ACQUIRE,
            op::ACQUIRE,
            h.obs(),
            h.keys().name(),
            acquisition.next_attempt(),
            queue = queue
        ));
        let sent = Instant::now();
        let acquire = if queue {
            // Boxed: only a waiter queues, and the uncontended attempt's future stays
            // half the size.
            Box::pin(h.acquire_or_queue(token).instrument(call.span())).await
        } else {
            h.acquire(token).instrument(call.span()).await
        };
        call.done(&acquire, |a| match a {
            Acquire::Acquired { .. } => outcome::ACQUIRED,
            Acquire::Held { .. } => outcome::BUSY,
        });
        match acquire {
            Ok(Acquire::Acquired { fence }) => break (fence, sent),
            Ok(Acquire::Held { remaining }) => {
                pending.token = None;
                return Ok(Attempt::Held(remaining));
            }
            Err(err) if err.is_retryable() && repeats.more() => {
                tracing::debug!(lock = h.keys().name(), error = %err, "acquire outcome unknown; repeating it");
                h.obs().count(metric::RETRIES, Some(Extra::RetryAcquire), 1);
                repeats.pause().await;
            }
            // A refusal (bad argument, limit): nothing was granted.
            Err(err)
                if matches!(
                    err.kind(),
                    ErrorKind::InvalidArgument | ErrorKind::LimitReached
                ) =>
            {
                pending.token = None;
                return Err(settled(err));
            }
            // The outcome is unknown (the request may have reached the store): the
            // caller settles it (a repeat under the same token, or a release).
            Err(err) => {
                pending.token = None;
                return Err(Failed {
                    err,
                    unsettled: true,
                });
            }
        }
    };
    pending.token = None;
    drop(pending);
    // A grant whose reply came too late to rely on is not given back here: the wait
    // may repeat the attempt under the same token (which the store then renews), and
    // a give-back sent now could land after that repeat and take its grant away. It
    // is unsettled: the next attempt settles it, or the wait's end gives it back.
    match h.hold(token.clone(), sent, fence, false) {
        Ok(guard) => Ok(Attempt::Got(guard)),
        Err(NoGuard::Late(err)) => Err(Failed {
            err,
            unsettled: true,
        }),
        Err(NoGuard::Refused(err)) => Err(settled(err)),
    }
}

/// Withdraws a waiter's queue entry in the background when its wait ends without a grant,
/// and gives back what an attempt whose outcome is still unknown may have been granted.
struct Waiting<'a, H: Hooks> {
    hooks: &'a H,
    token: &'a Token,
    queued: bool,
    /// An attempt failed with its outcome unknown and no later attempt settled it.
    unsettled: bool,
}

impl<H: Hooks> Drop for Waiting<'_, H> {
    fn drop(&mut self) {
        // (A bug planted for the simulator keeps the grant.)
        if self.unsettled && !crate::simulation::planted(Plant::CancelledGrantKept) {
            give_back(self.hooks, self.token);
        }
        if !self.queued || !H::QUEUES_WAITERS {
            return;
        }
        let (h, token) = (self.hooks, self.token);
        background::abandon(h.obs(), h.keys(), || h.abandon(token));
    }
}

/// Gives back the token of an attempt whose future was dropped mid-flight: the store may
/// have granted it without us ever seeing the reply.
struct CancelGuard<'a, H: Hooks> {
    hooks: &'a H,
    token: Option<&'a Token>,
}

impl<H: Hooks> Drop for CancelGuard<'_, H> {
    fn drop(&mut self) {
        if crate::simulation::planted(Plant::CancelledGrantKept) {
            return; // planted for the simulator: the grant is kept
        }
        if let Some(token) = self.token {
            give_back(self.hooks, token);
        }
    }
}

/// Ends (with an error) when the caller of a [`Detached`] attempt stops waiting for it.
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
pub(crate) type Gone = tokio::sync::oneshot::Receiver<()>;

/// A gate per token.
type Gates = HashMap<String, Arc<tokio::sync::Mutex<()>>>;

/// Attempts that run to completion whatever their caller does, for a store whose attempt
/// cannot be cut short safely (PostgreSQL's waits in its lock manager, its statements on
/// a pooled connection): a hook of the attempt's, below the loop's [`CancelGuard`].
///
/// A grant that comes back after the caller left is given back in the attempt's own task,
/// and so after the grant. Until it is done, the token's release and withdrawal wait
/// ([`settled`](Detached::settled)): sent on another connection at the moment of
/// cancellation, they could otherwise run before the grant or the queueing and miss it —
/// leaving the lock held, or a queue place that a release would hand the lock to, for a
/// whole ttl.
#[derive(Debug, Default)]
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
pub(crate) struct Detached {
    /// A gate per token with an attempt in flight.
    gates: Arc<std::sync::Mutex<Gates>>,
}

#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
impl Detached {
    fn gates(&self) -> std::sync::MutexGuard<'_, Gates> {
        self.gates
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Runs `call` (one attempt under `token`) on a task of its own, to completion even if
    /// the caller is cancelled; `give_back` gives back a grant whose caller had left.
    /// `call` gets a receiver that ends when the caller stops waiting (to cancel a wait in
    /// the store).
    pub(crate) async fn run<F, Fut, G, GFut>(
        &self,
        token: &Token,
        call: F,
        give_back: G,
    ) -> Result<Acquire>
    where
        F: FnOnce(Gone) -> Fut + Send + 'static,
        Fut: Future<Output = Result<Acquire>> + Send + 'static,
        G: FnOnce() -> GFut + Send + 'static,
        GFut: Future<Output = ()> + Send + 'static,
    {
        let name = token.as_str().to_owned();
        let gate = Arc::clone(self.gates().entry(name.clone()).or_default());
        // Taken before the task starts, so that a release spawned when this call is
        // cancelled queues behind it.
        let turn = Arc::clone(&gate).lock_owned().await;
        let (tx, rx) = tokio::sync::oneshot::channel();
        let (present, gone) = tokio::sync::oneshot::channel();
        let gates = Arc::clone(&self.gates);
        tokio::spawn(async move {
            let result = call(gone).await;
            if let Err(Ok(Acquire::Acquired { .. })) = tx.send(result) {
                give_back().await;
            }
            drop(turn);
            let mut gates = gates
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            // Ours and the map's: nobody else waits on it.
            if gates.get(&name).is_some_and(|g| Arc::strong_count(g) <= 2) {
                gates.remove(&name);
            }
            drop(gates);
            drop(gate);
        });
        let result = rx.await.unwrap_or_else(|_| {
            Err(Error::new(
                ErrorKind::Unavailable,
                "acquiring: the task running the call ended",
            ))
        });
        drop(present);
        result
    }

    /// Waits until no attempt under `token` is in flight.
    pub(crate) async fn settled(&self, token: &Token) {
        let gate = self.gates().get(token.as_str()).cloned();
        if let Some(gate) = gate {
            let _turn = gate.lock().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    /// A `Detached` attempt that grants `fence` after `delay`; `given_back` is set if
    /// the grant is given back.
    async fn grant(
        detached: &Detached,
        token: &Token,
        delay: Duration,
        fence: u64,
        given_back: &Arc<AtomicBool>,
    ) -> Result<Acquire> {
        let given_back = Arc::clone(given_back);
        detached
            .run(
                token,
                move |_gone| async move {
                    tokio::time::sleep(delay).await;
                    Ok(Acquire::Acquired { fence })
                },
                move || async move { given_back.store(true, Ordering::SeqCst) },
            )
            .await
    }

    #[tokio::test(start_paused = true)]
    async fn a_detached_grant_whose_caller_left_is_given_back_before_the_token_settles() {
        let detached = Detached::default();
        let token = Token::random().expect("a token");
        let given_back = Arc::new(AtomicBool::new(false));
        let cancelled = tokio::time::timeout(
            Duration::from_millis(10),
            grant(
                &detached,
                &token,
                Duration::from_millis(100),
                1,
                &given_back,
            ),
        )
        .await;
        assert!(cancelled.is_err(), "the caller left before the grant");
        assert!(!given_back.load(Ordering::SeqCst), "not granted yet");
        // A release sent now would wait for the attempt, and so for its give-back.
        detached.settled(&token).await;
        assert!(
            given_back.load(Ordering::SeqCst),
            "the late grant was given back"
        );

        // A caller that waits keeps its grant.
        let kept = Arc::new(AtomicBool::new(false));
        let granted = grant(&detached, &token, Duration::from_millis(5), 2, &kept).await;
        assert_eq!(granted.ok(), Some(Acquire::Acquired { fence: 2 }));
        detached.settled(&token).await;
        assert!(
            !kept.load(Ordering::SeqCst),
            "a grant its caller took stays"
        );
        assert!(detached.gates().is_empty(), "no gate outlives its attempt");
    }
}
