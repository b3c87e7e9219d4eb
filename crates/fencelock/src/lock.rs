//! The mutual-exclusion lock, written once for every backend.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument;

use crate::engine::acquire::{self, Hooks, NoGuard};
use crate::engine::background::{self, Repeat, released_outcome};
use crate::engine::wait::Retry;
use crate::engine::{End, Lease, Renew, Renewal};
use crate::error::{Error, ErrorKind, Result};
use crate::keys::{DEFAULT_PREFIX, LockKeys};
use crate::observe::{Call, Extra, Obs, call_span, metric, op, outcome, span};
use crate::options::{Options, builder_options};
use crate::raw::{Acquire, LockState, RawFencing, RawInspect, RawLock, ReleaseWatch};
use crate::token::{FencingToken, Token};

/// Shortest lease accepted: the watchdog must be able to renew it (at a third of it) over
/// a real network.
pub const MIN_TTL: Duration = Duration::from_millis(100);
/// Longest lease accepted. A longer one is indistinguishable from a lock that never
/// expires if its holder dies; hold locks longer than this with the watchdog instead.
pub const MAX_TTL: Duration = Duration::from_secs(24 * 3600);

fn validate_ttl(ttl: Duration) -> Result<Duration> {
    if ttl.is_zero() {
        return Err(Error::invalid("ttl must not be zero"));
    }
    if ttl < MIN_TTL {
        return Err(Error::invalid(format!(
            "ttl {ttl:?} is below the minimum of {MIN_TTL:?} that the watchdog can renew"
        )));
    }
    if ttl > MAX_TTL {
        return Err(Error::invalid(format!(
            "ttl {ttl:?} is above the cap of {MAX_TTL:?}; use the watchdog to hold a lock longer"
        )));
    }
    Ok(ttl)
}

/// A named lock in a store: at most one holder at a time across every process that uses
/// the same name (and prefix) on the same store.
///
/// `Lock` itself holds nothing; [`lock`](Lock::lock) and friends return a [`LockGuard`]
/// that does. Cloning is cheap; clones name the same lock.
#[derive(Clone)]
pub struct Lock<B: RawLock> {
    backend: B,
    keys: LockKeys,
    ttl: Duration,
    watchdog: bool,
    retry: Retry,
    holder: Option<std::sync::Arc<crate::HolderInfo>>,
    /// What its spans and metrics are labelled with (store kind, primitive).
    obs: Obs,
}

impl<B: RawLock> std::fmt::Debug for Lock<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lock")
            .field("key", &self.keys.lock())
            .field("ttl", &self.ttl)
            .field("watchdog", &self.watchdog)
            .finish()
    }
}

/// Options for a [`Lock`]; made by [`Lock::builder`].
#[must_use = "a builder does nothing until .build()"]
#[derive(Debug)]
pub struct LockBuilder<B: RawLock> {
    backend: B,
    options: Options,
}

builder_options!(LockBuilder<B: RawLock>, crate::keys::DEFAULT_PREFIX);

impl<B: RawLock> LockBuilder<B> {
    /// Checks the options and makes the lock.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidArgument`] for an empty or over-long name or prefix, a lock key
    /// the key layout refuses ([`LockKeys::new`]: a stray `}`, or — under an empty prefix
    /// or one that starts with `{` — another lock's companion key), a ttl out of range, or
    /// a bad retry policy.
    pub fn build(self) -> Result<Lock<B>> {
        Lock::from_options(self.backend, &self.options)
    }
}

impl<B: RawLock> Lock<B> {
    /// A lock named `name` with default options (30 s ttl, watchdog on, prefix `dlock:`).
    ///
    /// # Errors
    /// [`ErrorKind::InvalidArgument`] for an empty name or one over
    /// [`MAX_NAME_LEN`](crate::keys::MAX_NAME_LEN) bytes.
    pub fn new(backend: B, name: impl Into<String>) -> Result<Lock<B>> {
        Lock::builder(backend, name).build()
    }

    /// Options for a lock named `name`.
    pub fn builder(backend: B, name: impl Into<String>) -> LockBuilder<B> {
        LockBuilder {
            backend,
            options: Options::new(name.into(), DEFAULT_PREFIX),
        }
    }

    /// The lock over `backend` (a primitive's adapter) on the options' name: the checked
    /// end of every builder.
    pub(crate) fn from_options(backend: B, options: &Options) -> Result<Lock<B>> {
        Lock::from_options_on(backend, options.keys()?, options)
    }

    /// The same, on keys already laid out (primitives that share them between locks).
    pub(crate) fn from_options_on(
        backend: B,
        keys: LockKeys,
        options: &Options,
    ) -> Result<Lock<B>> {
        let obs = Obs::new(
            backend.store_label(),
            B::PRIMITIVE,
            keys.name(),
            options.name_label,
        );
        Ok(Lock {
            backend,
            keys,
            ttl: validate_ttl(options.ttl)?,
            watchdog: options.watchdog,
            retry: options.retry.validate()?,
            holder: options.holder.clone(),
            obs,
        })
    }

    /// The same lock, named `primitive` in spans and metrics (a primitive built on a plain
    /// lock, such as an election).
    /// What its spans and metrics are labelled with.
    pub(crate) fn obs(&self) -> &Obs {
        &self.obs
    }

    pub(crate) fn with_primitive(mut self, primitive: &'static str) -> Lock<B> {
        self.obs = self.obs.with_primitive(primitive);
        self
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        self.keys.name()
    }

    /// The lock's keys in the store.
    pub fn keys(&self) -> &LockKeys {
        &self.keys
    }

    /// The lease length.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The backend this lock lives in.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// The same lock (name, options) on another value of the backend type.
    pub(crate) fn with_backend(&self, backend: B) -> Lock<B> {
        Lock {
            backend,
            ..self.clone()
        }
    }

    /// Waits until the lock is ours.
    ///
    /// Sleeps between attempts: until a release is announced (stores that notify), or the
    /// holder's remaining ttl runs out, or a jittered backoff passes (stores that don't).
    ///
    /// # Errors
    /// Store failures (`Unavailable`, `TimedOut`, `Backend`); contention is waited out.
    ///
    /// # Cancel safety
    /// Cancel-safe: dropping the future leaves no hold and no renewal behind. If an
    /// acquire request was in flight, a release of its token is sent in the background.
    pub async fn lock(&self) -> Result<LockGuard<B>> {
        match self.acquire_until(None).await? {
            Some(guard) => Ok(guard),
            None => Err(Error::new(
                ErrorKind::TimedOut,
                "lock wait ended without a deadline",
            )),
        }
    }

    /// One attempt: `Ok(Some(guard))` if the lock is now ours, `Ok(None)` if someone else
    /// holds it.
    ///
    /// # Errors
    /// Store failures (`Unavailable`, `TimedOut`, `Backend`). `TimedOut` also when the
    /// store granted the lock but its reply came after the lease's validity had run out
    /// (the grant is then given back): the ttl is too short for this store's latency.
    ///
    /// # Cancel safety
    /// Cancel-safe, as [`lock`](Lock::lock).
    pub async fn try_lock(&self) -> Result<Option<LockGuard<B>>> {
        // A deadline already reached: one attempt, and a queue entry it may have made is
        // withdrawn.
        self.acquire_until(Some(Instant::now())).await
    }

    /// Waits at most `timeout` for the lock: `Ok(None)` if it stayed held that long.
    ///
    /// At least one attempt is made, and an attempt in flight when the time is up is let
    /// finish (it is bounded by the store's response timeout), so a slow store is not
    /// mistaken for contention.
    ///
    /// # Errors
    /// Store failures (`Unavailable`, `TimedOut`, `Backend`).
    ///
    /// # Cancel safety
    /// Cancel-safe, as [`lock`](Lock::lock).
    pub async fn try_lock_for(&self, timeout: Duration) -> Result<Option<LockGuard<B>>> {
        // A timeout too large to add to now is as good as none.
        let deadline = Instant::now().checked_add(timeout);
        self.acquire_until(deadline).await
    }

    /// Waits until `deadline` at most for the lock: `Ok(None)` if it stayed held.
    ///
    /// # Errors
    /// Store failures (`Unavailable`, `TimedOut`, `Backend`).
    ///
    /// # Cancel safety
    /// Cancel-safe, as [`lock`](Lock::lock).
    pub async fn try_lock_until(&self, deadline: Instant) -> Result<Option<LockGuard<B>>> {
        self.acquire_until(Some(deadline)).await
    }

    // A plain function (not `async`): each async layer deepens every caller's future type,
    // and a deep one overflows the compiler's layout queries in the callers' crates.
    fn acquire_until(
        &self,
        deadline: Option<Instant>,
    ) -> impl Future<Output = Result<Option<LockGuard<B>>>> + '_ {
        acquire::acquire(self, deadline)
    }

    /// Wraps a grant made under `token` (request sent at `sent`) in a guard, registering
    /// its lease with the watchdog.
    pub(crate) fn guard(&self, token: Token, sent: Instant, fence: u64) -> Result<LockGuard<B>> {
        self.make_guard(token, sent, fence, true)
            .map_err(NoGuard::into_error)
    }

    /// [`guard`](Lock::guard); a grant already past its validity is given back in the
    /// background only if `give_back_late` (else the caller settles it).
    fn make_guard(
        &self,
        token: Token,
        sent: Instant,
        fence: u64,
        give_back_late: bool,
    ) -> std::result::Result<LockGuard<B>, NoGuard> {
        let lease = Arc::new(Lease::new(
            self.keys.clone(),
            token,
            sent,
            self.backend.lease_validity(self.ttl),
            self.backend.drift(),
            B::LEASE_KIND,
            self.obs.clone(),
        ));
        if lease.is_lost_at(Instant::now()) {
            if give_back_late {
                spawn_release_observed(&self.backend, &lease.keys, &lease.token, &self.obs);
            }
            return Err(NoGuard::Late(Error::new(
                ErrorKind::TimedOut,
                format!(
                    "the store granted lock {:?} but its reply took {:?}, past the lease's \
                     validity (ttl {:?}); the grant was given back — use a longer ttl",
                    self.name(),
                    sent.elapsed(),
                    self.ttl
                ),
            )));
        }
        let registration = if self.watchdog {
            match self
                .backend
                .engine()
                .register(&Renewer(self.backend.clone()), Arc::clone(&lease))
            {
                // The engine never hands out id 0.
                Ok(id) => std::num::NonZeroU64::new(id),
                Err(err) => {
                    spawn_release_observed(&self.backend, &lease.keys, &lease.token, &self.obs);
                    return Err(NoGuard::Refused(err));
                }
            }
        } else {
            None
        };
        // Counted down when the guard is dropped, however it ends.
        self.obs.gauge(metric::HOLDS, 1.0);
        Ok(LockGuard {
            backend: self.backend.clone(),
            lease,
            fence,
            registration,
            armed: true,
            before_release: None,
        })
    }
}

/// The acquire loop's steps on a store: a [`RawLock`]'s calls under this lock's keys and
/// ttl, and its guard.
impl<B: RawLock> Hooks for Lock<B> {
    type Held = LockGuard<B>;

    const QUEUES_WAITERS: bool = B::QUEUES_WAITERS;
    const QUEUES_ONLY_LISTENERS: bool = B::QUEUES_ONLY_LISTENERS;
    const WAITS_IN_STORE: bool = B::WAITS_IN_STORE;

    fn obs(&self) -> &Obs {
        &self.obs
    }

    fn keys(&self) -> &LockKeys {
        &self.keys
    }

    fn ttl(&self) -> Duration {
        self.ttl
    }

    fn retry(&self) -> Retry {
        self.retry
    }

    fn lease_validity(&self) -> Duration {
        self.backend.lease_validity(self.ttl)
    }

    fn shares_grants(&self) -> bool {
        self.backend.shares_grants()
    }

    fn token(&self) -> Result<Token> {
        match &self.holder {
            Some(info) => info.token(),
            None => Token::random(),
        }
    }

    fn ready(&self) -> Result<()> {
        if self.watchdog && tokio::runtime::Handle::try_current().is_err() {
            return Err(Error::invalid(
                "dlock's lease watchdog needs a tokio runtime",
            ));
        }
        Ok(())
    }

    fn acquire(&self, token: &Token) -> impl Future<Output = Result<Acquire>> + Send {
        self.backend.acquire(&self.keys, token, self.ttl)
    }

    fn acquire_or_queue(&self, token: &Token) -> impl Future<Output = Result<Acquire>> + Send {
        self.backend.acquire_or_queue(&self.keys, token, self.ttl)
    }

    fn watch_for(&self, token: &Token) -> impl Future<Output = Result<ReleaseWatch>> + Send {
        self.backend.watch_for(&self.keys, token)
    }

    fn watch_ready(&self, token: &Token) -> Option<ReleaseWatch> {
        self.backend.watch_ready(&self.keys, token)
    }

    fn abandon(&self, token: &Token) -> impl Future<Output = Result<()>> + Send + 'static {
        let (backend, keys, token, ttl) = (
            self.backend.clone(),
            self.keys.clone(),
            token.clone(),
            self.ttl,
        );
        async move { backend.abandon(&keys, &token, ttl).await }
    }

    fn release(&self, token: &Token) -> impl Future<Output = Result<bool>> + Send + 'static {
        let (backend, keys, token) = (self.backend.clone(), self.keys.clone(), token.clone());
        async move { backend.release(&keys, &token).await }
    }

    fn hold(
        &self,
        token: Token,
        sent: Instant,
        fence: u64,
        give_back_late: bool,
    ) -> std::result::Result<LockGuard<B>, NoGuard> {
        self.make_guard(token, sent, fence, give_back_late)
    }
}

impl<B: RawLock> Lock<B> {
    /// Releases the lock held under `token` — for a holder in another process that handed
    /// its token over (as `dlock acquire` / `dlock release` do).
    ///
    /// # Errors
    /// [`ErrorKind::LockLost`] if the lock is not held under `token` any more; store
    /// failures otherwise.
    pub async fn release_token(&self, token: &Token) -> Result<()> {
        let call = Call::new(call_span!(
            span::RELEASE,
            op::RELEASE,
            self.obs,
            self.name(),
            1u32
        ));
        let released = self
            .backend
            .release(&self.keys, token)
            .instrument(call.span())
            .await;
        call.done(&released, |&r| released_outcome(r));
        if released? {
            Ok(())
        } else {
            Err(Error::lost(format!(
                "lock {:?} is not held under that token",
                self.name()
            )))
        }
    }

    /// Resets the lease of the lock held under `token` to `ttl` from now.
    ///
    /// # Errors
    /// `InvalidArgument` for a ttl out of range; [`ErrorKind::LockLost`] if the lock is not
    /// held under `token`; store failures otherwise.
    pub async fn extend_token(&self, token: &Token, ttl: Duration) -> Result<()> {
        let ttl = validate_ttl(ttl)?;
        let call = Call::new(call_span!(
            span::EXTEND,
            op::EXTEND,
            self.obs,
            self.name(),
            1u32
        ));
        let extended = self
            .backend
            .extend(&self.keys, token, ttl)
            .instrument(call.span())
            .await;
        call.done(&extended, |&e| extended_outcome(e));
        if extended? {
            Ok(())
        } else {
            Err(Error::lost(format!(
                "lock {:?} is not held under that token",
                self.name()
            )))
        }
    }
}

impl<B: RawInspect> Lock<B> {
    /// What the store says about this lock now: holder token, remaining ttl, last fence.
    ///
    /// # Errors
    /// Store failures.
    pub async fn state(&self) -> Result<LockState> {
        crate::observe::observed!(
            self.obs,
            self.name(),
            span::INSPECT,
            op::INSPECT,
            self.backend.inspect(crate::raw::Kind::Lock, &self.keys)
        )
    }

    /// Whether anyone holds the lock now (a snapshot; it may change at once).
    ///
    /// # Errors
    /// Store failures.
    pub async fn is_locked(&self) -> Result<bool> {
        Ok(self.state().await?.holder.is_some())
    }

    /// Deletes the lock whoever holds it and wakes a waiter. **Dangerous**: the holder
    /// keeps working until its next renewal tells it (its `lost()` then fires), so two
    /// processes may act at once meanwhile; fenced resources still reject the old holder's
    /// writes once the new holder has written. Returns whether a held lock was deleted.
    ///
    /// # Errors
    /// Store failures.
    pub async fn force_unlock(&self) -> Result<bool> {
        crate::observe::observed!(
            self.obs,
            self.name(),
            span::FORCE_UNLOCK,
            op::FORCE_UNLOCK,
            self.backend
                .force_unlock(crate::raw::Kind::Lock, &self.keys)
        )
    }
}

/// Releases `token` in the background on the current runtime, bounded in time.
pub(crate) fn spawn_release<B: RawLock>(backend: &B, keys: &LockKeys, token: &Token) {
    let obs = Obs::new(backend.store_label(), B::PRIMITIVE, keys.name(), false);
    spawn_release_observed(backend, keys, token, &obs);
}

/// [`spawn_release`] with the lock's labels at hand.
fn spawn_release_observed<B: RawLock>(backend: &B, keys: &LockKeys, token: &Token, obs: &Obs) {
    background::release(obs, keys, || {
        let (backend, keys, token) = (backend.clone(), keys.clone(), token.clone());
        async move { backend.release(&keys, &token).await }
    });
}

/// Proof that this process holds a lock; released by [`release`](LockGuard::release) (or,
/// in the background, when dropped).
///
/// The guard is `'static` and `Send`: move it into tasks freely. It carries the lease's
/// validity: watch [`lost`](LockGuard::lost) to stop work when the lock can no longer be
/// guaranteed.
#[must_use = "the lock is released in the background as soon as the guard is dropped"]
pub struct LockGuard<B: RawLock> {
    backend: B,
    lease: Arc<Lease>,
    fence: u64,
    /// The engine's id of the lease while it renews it (never 0, so the option costs
    /// nothing).
    registration: Option<std::num::NonZeroU64>,
    armed: bool,
    /// Sent (while the lease is valid) just before [`release`](LockGuard::release): an
    /// election's leader announces there that it leaves the seat.
    before_release: Option<BeforeRelease>,
}

/// A step a guard takes just before its release (see `LockGuard::before_release`).
pub(crate) type BeforeRelease =
    Box<dyn FnOnce() -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

impl<B: RawLock> std::fmt::Debug for LockGuard<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockGuard")
            .field("key", &self.lease.keys.lock())
            .field("token", &self.lease.token)
            .field("lost", &self.is_lost())
            .finish()
    }
}

impl<B: RawFencing> LockGuard<B> {
    /// The fence minted with this grant: strictly greater than every earlier grant's of the
    /// same name. Send it with every write to the protected resource, which must reject
    /// writes whose fence is below the highest it has accepted.
    pub fn fencing_token(&self) -> FencingToken {
        FencingToken::new(self.fence)
    }
}

impl<B: RawLock> LockGuard<B> {
    /// The lock's name.
    pub fn name(&self) -> &str {
        self.lease.keys.name()
    }

    /// The owner token stored at the lock key.
    pub fn token(&self) -> &Token {
        &self.lease.token
    }

    /// Whether the lease can no longer be guaranteed: the store reported it gone, or its
    /// validity ran out without a successful renewal.
    pub fn is_lost(&self) -> bool {
        self.lease.is_lost_at(Instant::now())
    }

    /// The lease each renewal buys: the ttl, or less where the store's holds end sooner
    /// (on ZooKeeper, the session timeout caps it; see
    /// [`RawLock::lease_validity`](crate::raw::RawLock::lease_validity)).
    pub fn lease(&self) -> Duration {
        self.lease.snapshot().ttl
    }

    /// How much validity is left (zero once lost). Counted on the monotonic clock from
    /// the last successful acquire or renewal request, minus drift.
    pub fn remaining(&self) -> Duration {
        let s = self.lease.snapshot();
        if s.end == End::Held {
            s.valid_until.saturating_duration_since(Instant::now())
        } else {
            Duration::ZERO
        }
    }

    /// A future that resolves when the lease can no longer be guaranteed (see
    /// [`is_lost`](LockGuard::is_lost)), or when the guard is released or dropped. It is
    /// `'static`: race it against the work done under the lock.
    ///
    /// ```
    /// # async fn demo() -> fencelock::Result<()> {
    /// # let lock = fencelock::Lock::new(fencelock::backend::Memory::new(), "jobs")?;
    /// let guard = lock.lock().await?;
    /// tokio::select! {
    ///     () = guard.lost() => eprintln!("lock lost; abandoning the job"),
    ///     () = async { /* the work */ } => {}
    /// }
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        self.lease.lost_future()
    }

    /// Resets the lease to expire `ttl` from now (the watchdog, if on, keeps renewing with
    /// this new ttl).
    ///
    /// # Errors
    /// [`ErrorKind::LockLost`] if the lock was no longer ours (the guard is then lost);
    /// `InvalidArgument` for a ttl out of range; store failures otherwise.
    ///
    /// # Cancel safety
    /// Cancelling may leave the lease extended or not; either way the guard stays valid
    /// for at least what [`remaining`](LockGuard::remaining) said before.
    pub async fn extend(&self, ttl: Duration) -> Result<()> {
        let ttl = validate_ttl(ttl)?;
        let ttl = self.backend.lease_validity(ttl);
        if self.is_lost() {
            // A lapsed lease cannot be revived: someone may have held the lock meanwhile.
            return Err(Error::lost(format!(
                "lock {:?} was already lost; a lapsed lease cannot be extended",
                self.name()
            )));
        }
        let call = Call::new(call_span!(
            span::EXTEND,
            op::EXTEND,
            self.lease.obs,
            self.name(),
            1u32
        ));
        let sent = Instant::now();
        let extended = self
            .backend
            .extend(&self.lease.keys, &self.lease.token, ttl)
            .instrument(call.span())
            .await;
        call.done(&extended, |&e| extended_outcome(e));
        if !extended? {
            self.lease.end(End::Taken);
            return Err(Error::lost(format!(
                "lock {:?} was no longer ours when extending",
                self.name()
            )));
        }
        self.lease.set_ttl(ttl);
        if !self.lease.renewed(sent, ttl) {
            return Err(Error::lost(format!(
                "lock {:?}: the extension was confirmed only after the lease had lapsed",
                self.name()
            )));
        }
        if let Some(id) = self.registration {
            // A shorter ttl must be renewed sooner than the old schedule says.
            self.backend
                .engine()
                .reschedule(id.get(), sent + self.lease.renewal_period(ttl));
        }
        Ok(())
    }

    /// Releases the lock and reports whether it was still ours all along.
    ///
    /// # Errors
    /// [`ErrorKind::LockLost`] if the lock key no longer held our token (expired, deleted
    /// or taken over), or if the lease had already lapsed (its validity ran out without a
    /// renewal: another holder may have been granted it meanwhile, even if the key is
    /// still ours now). Work done under it may have overlapped with another holder. Never
    /// silent success. Store failures otherwise (the lease then expires by itself).
    ///
    /// # Retries
    /// A release whose reply is lost (no reply in time, connection dropped) is repeated a
    /// few times while the lease is valid. The store's release is owner-checked, so a
    /// repeat never releases anything twice, and a repeat that finds the hold already
    /// gone while the lease was still valid reports success: the first attempt did it.
    ///
    /// # Cancel safety
    /// If cancelled before the store answered, the release is sent again in the
    /// background; the lease is out of renewal either way.
    pub async fn release(mut self) -> Result<()> {
        // Still renewed while the step before the release runs (cancelled, `Drop`
        // releases as for any cancelled release).
        if let Some(before) = self.before_release.take()
            && !self.is_lost()
        {
            before().await;
        }
        // Out of renewal now; `armed` stays set until the reply, so that a cancelled
        // release still gives the lock back from `Drop`.
        if let Some(id) = self.registration.take() {
            self.backend.engine().deregister(id.get());
        }
        let lapsed = self.is_lost();
        let lost_before = self.lease.snapshot().end;
        let mut repeats = Repeat::UNKNOWN_OUTCOME.start();
        let released = loop {
            let call = Call::new(call_span!(
                span::RELEASE,
                op::RELEASE,
                self.lease.obs,
                self.name(),
                repeats.made() + 1
            ));
            let released = self
                .backend
                .release(&self.lease.keys, &self.lease.token)
                .instrument(call.span())
                .await;
            call.done(&released, |&r| released_outcome(r));
            match released {
                // A repeat that finds the hold gone, answered while the lease was still
                // valid: the hold cannot have expired, so our earlier attempt (whose reply
                // was lost) released it. Only an operator's force-unlock or data loss in
                // the store could have removed it instead.
                Ok(false) if repeats.made() > 0 && !lapsed && !self.is_lost() => break Ok(true),
                Err(err) if err.is_retryable() && repeats.more() && !self.is_lost() => {
                    tracing::debug!(lock = self.name(), error = %err, "release outcome unknown; repeating it");
                    self.lease
                        .obs
                        .count(metric::RETRIES, Some(Extra::RetryRelease), 1);
                    repeats.pause().await;
                }
                other => break other,
            }
        };
        self.armed = false;
        // A lease found lost here ends as such (counted once, if nothing ended it before).
        self.lease.end(match (&released, lapsed) {
            (Ok(true), false) | (Err(_), _) => End::Released,
            (Ok(_), true) => End::Expired,
            (Ok(false), false) => End::Taken,
        });
        let reason = match (released?, lapsed) {
            (true, false) => return Ok(()),
            (true, true) => "its lease had lapsed before the release (the key was deleted now)",
            (false, _) => match lost_before {
                End::Taken => "the store reported it deleted or taken over",
                End::Expired => "its lease ran out",
                _ => "its key had expired or been replaced",
            },
        };
        Err(Error::lost(format!(
            "lock {:?} was no longer ours when releasing: {reason}",
            self.name()
        )))
    }

    /// Takes the lease out of this guard without releasing it (for turning a hold into
    /// another kind of hold): renewal stops, the guard is disarmed, its `lost()` futures
    /// resolve.
    pub(crate) fn into_held(mut self) -> (B, Token) {
        self.disarm();
        self.lease.end(End::Released);
        (self.backend.clone(), self.lease.token.clone())
    }

    /// Stops renewing and keeps the lock until its ttl runs out, without releasing it.
    /// Futures from [`lost`](LockGuard::lost) still resolve when the lease runs out.
    pub fn forget(mut self) {
        self.disarm();
    }

    /// Sets the step [`release`](LockGuard::release) takes first, while the lease is
    /// still valid (not on a drop, which releases in the background).
    pub(crate) fn before_release(&mut self, step: BeforeRelease) {
        self.before_release = Some(step);
    }

    fn disarm(&mut self) {
        self.armed = false;
        if let Some(id) = self.registration.take() {
            self.backend.engine().deregister(id.get());
        }
    }
}

impl<B: RawLock> Drop for LockGuard<B> {
    fn drop(&mut self) {
        // Every guard ends here (released, forgotten, turned into another hold, dropped).
        self.lease.obs.gauge(metric::HOLDS, -1.0);
        if self.armed {
            self.disarm();
            self.lease.end(End::Released);
            spawn_release_observed(
                &self.backend,
                &self.lease.keys,
                &self.lease.token,
                &self.lease.obs,
            );
        }
    }
}

/// The `outcome` of an extend call that answered `extended`.
fn extended_outcome(extended: bool) -> &'static str {
    if extended {
        outcome::EXTENDED
    } else {
        outcome::NOT_HELD
    }
}

/// Sends the engine's renewal batches through a backend's [`RawLock::extend_many`].
#[derive(Clone)]
struct Renewer<B>(B);

impl<B: RawLock> Renew for Renewer<B> {
    fn renew(&self, batch: &[Renewal]) -> impl Future<Output = Vec<Result<bool>>> + Send {
        self.0.extend_many(batch)
    }
}
