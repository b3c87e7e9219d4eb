//! Leader election: one leader at a time among many candidates, with a term that fences.
//!
//! An [`Election`] is a plain [`Lock`] (its queue of candidates, its lease and watchdog,
//! its fence as the **term**) plus one record in the store, the leader's advertised value,
//! written only while the leader holds the lock ([`RawElection`]). Everything else — waiting
//! without polling, handing over at release, a crashed leader's lease running out,
//! cancel safety — is the lock's, on every store that implements the trait.

use std::future::poll_fn;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::lock::{Lock, LockGuard};
use crate::multi::BoxFuture;
use crate::observe::woken_by;
use crate::options::{Options, builder_options};
use crate::raw::{RawElection, ReleaseWatch};
use crate::token::{FencingToken, Token};

/// Default key prefix of elections.
pub const DEFAULT_ELECTION_PREFIX: &str = "dlock-election:";

/// Longest value a candidate may advertise, in bytes.
pub const MAX_VALUE_LEN: usize = 4096;

/// How many times an announcement whose outcome is unknown is sent again.
const PUBLISH_RETRIES: u32 = 2;

/// A named election in a store: at most one leader at a time across every process that
/// campaigns under the same name (and prefix) on the same store.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> dlock::Result<()> {
/// use dlock::{Election, backend::Memory};
///
/// let store = Memory::new();
/// let election = Election::new(store.clone(), "scheduler")?;
/// let leadership = election.campaign("host-a:8080").await?; // waits until we lead
/// let term = leadership.term();                             // fence every write with it
///
/// let leader = election.leader().await?.expect("someone leads");
/// assert_eq!(leader.term, term);
/// assert_eq!(leader.value.as_deref(), Some("host-a:8080"));
///
/// leadership.resign().await?; // the next candidate leads at once
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Election<B: RawElection> {
    lock: Lock<B>,
}

impl<B: RawElection> std::fmt::Debug for Election<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Election")
            .field("key", &self.lock.keys().lock())
            .field("ttl", &self.lock.ttl())
            .finish()
    }
}

/// Options for an [`Election`]; made by [`Election::builder`].
#[must_use = "a builder does nothing until .build()"]
#[derive(Debug)]
pub struct ElectionBuilder<B: RawElection> {
    backend: B,
    options: Options,
}

builder_options!(ElectionBuilder<B: RawElection>, DEFAULT_ELECTION_PREFIX);

impl<B: RawElection> ElectionBuilder<B> {
    /// Checks the options and makes the election.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) for an empty or
    /// over-long name or prefix, a ttl out of range, or a bad retry policy.
    pub fn build(self) -> Result<Election<B>> {
        Ok(Election {
            lock: Lock::from_options(self.backend, &self.options)?
                .with_primitive(crate::observe::primitive::ELECTION),
        })
    }
}

/// Who leads an election, as the store says.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Leader {
    /// The leader's term: the fence of its grant, strictly greater than every earlier
    /// leader's of this election.
    pub term: FencingToken,
    /// What the leader advertises ([`Election::campaign`], [`Leadership::proclaim`]).
    /// `None` only in the moment between its grant and its first announcement (one round
    /// trip), or if it crashed in that moment; [`Election::observe`] never reports that
    /// state.
    pub value: Option<String>,
}

impl<B: RawElection> Election<B> {
    /// An election named `name` with default options (30 s lease, watchdog on, prefix
    /// [`DEFAULT_ELECTION_PREFIX`]).
    ///
    /// # Errors
    /// [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) for an empty or
    /// over-long name.
    pub fn new(backend: B, name: impl Into<String>) -> Result<Election<B>> {
        Election::builder(backend, name).build()
    }

    /// Options for an election named `name`.
    pub fn builder(backend: B, name: impl Into<String>) -> ElectionBuilder<B> {
        ElectionBuilder {
            backend,
            options: Options::new(name.into(), DEFAULT_ELECTION_PREFIX),
        }
    }

    /// The election's name.
    pub fn name(&self) -> &str {
        self.lock.name()
    }

    /// The leader's lease length.
    pub fn ttl(&self) -> Duration {
        self.lock.ttl()
    }

    /// The lock that candidates queue for (its keys, its state).
    pub fn lock(&self) -> &Lock<B> {
        &self.lock
    }

    /// Waits until this candidate leads, then advertises `value` and returns the
    /// leadership. Candidates are served in arrival order where the store queues waiters
    /// (Redis, etcd, PostgreSQL, ZooKeeper); a leader that crashes is replaced within the
    /// ttl — on ZooKeeper within its session timeout instead, when that is longer (see the
    /// builder's `ttl`).
    ///
    /// # Errors
    /// `InvalidArgument` for a value over [`MAX_VALUE_LEN`] bytes; `LockLost` if the
    /// leadership was lost before it could be announced; store failures.
    ///
    /// # Cancel safety
    /// Cancel-safe: a cancelled campaign leaves no place in the queue and no leadership
    /// behind (as [`Lock::lock`]).
    pub async fn campaign(&self, value: impl Into<String>) -> Result<Leadership<B>> {
        let value = check_value(value.into())?;
        let guard = self.lock.lock().await?;
        self.lead(guard, value).await
    }

    /// One attempt: `Ok(None)` if another candidate leads now.
    ///
    /// # Errors
    /// As [`campaign`](Election::campaign).
    pub async fn try_campaign(&self, value: impl Into<String>) -> Result<Option<Leadership<B>>> {
        let value = check_value(value.into())?;
        match self.lock.try_lock().await? {
            Some(guard) => self.lead(guard, value).await.map(Some),
            None => Ok(None),
        }
    }

    /// Campaigns for at most `timeout`: `Ok(None)` if another candidate led all along
    /// (this candidate then leaves the queue).
    ///
    /// # Errors
    /// As [`campaign`](Election::campaign).
    pub async fn campaign_for(
        &self,
        timeout: Duration,
        value: impl Into<String>,
    ) -> Result<Option<Leadership<B>>> {
        let value = check_value(value.into())?;
        match self.lock.try_lock_for(timeout).await? {
            Some(guard) => self.lead(guard, value).await.map(Some),
            None => Ok(None),
        }
    }

    /// Announces a fresh grant's value under its term.
    async fn lead(&self, guard: LockGuard<B>, value: String) -> Result<Leadership<B>> {
        let mut leadership = Leadership {
            guard,
            election: self.clone(),
            value: String::new(),
        };
        leadership.announce(value).await?;
        Ok(leadership)
    }

    /// The current leader's term and value, or `None` if nobody leads.
    ///
    /// # Errors
    /// Store failures.
    pub async fn leader(&self) -> Result<Option<Leader>> {
        let state = self.lock.state().await?;
        let Some(holder) = state.holder else {
            return Ok(None);
        };
        let record = crate::observe::observed!(
            self.lock.obs(),
            self.lock.name(),
            crate::observe::span::RECORD,
            crate::observe::op::RECORD,
            self.lock.backend().record(self.lock.keys())
        )?;
        if let Some((term, data)) = record
            && let Some((token, value)) = data.split_once('\n')
            && token == holder
        {
            return Ok(Some(Leader {
                term: FencingToken::new(term),
                value: Some(value.to_owned()),
            }));
        }
        // Granted, not announced yet: the term is the lock's latest fence.
        Ok(Some(Leader {
            term: FencingToken::new(state.last_fence.unwrap_or(0)),
            value: None,
        }))
    }

    /// Follows the leader: a [`Stream`](futures_core::Stream) (and
    /// [`Observer::next`]) of every change of leader or advertised value, each reported
    /// once and in order (terms increase, unless the store's fence counter was reset). It sleeps until the store announces a
    /// change where the store can (every store but memcached, which is read again at a
    /// short interval), and reads again at the lease's length in case an announcement was
    /// lost. A leader that led and left between two reads of a slow observer may be
    /// passed over: an observer always catches up with the latest leader.
    ///
    /// Each sleep between two reads is a `dlock.wait` span (`primitive` `election`) whose
    /// `woken_by` says what ended it: `change`, `fallback`, `backoff` or `outage` (see
    /// [`observe`](crate::observe#an-observers-waits)).
    pub fn observe(&self) -> Observer<B> {
        Observer {
            state: Some(Observing {
                election: self.clone(),
                last: None,
                watch: None,
                failed: false,
            }),
            pending: None,
        }
    }
}

/// Refuses a value over [`MAX_VALUE_LEN`] bytes.
fn check_value(value: String) -> Result<String> {
    if value.len() > MAX_VALUE_LEN {
        return Err(Error::invalid(format!(
            "an election value is at most {MAX_VALUE_LEN} bytes; this one is {}",
            value.len()
        )));
    }
    Ok(value)
}

/// Proof that this candidate leads; resigns in the background when dropped.
///
/// Watch [`lost`](Leadership::lost) and stop acting as the leader when it fires; send
/// [`term`](Leadership::term) with every write to a resource that keeps the highest term
/// it has seen, so that a deposed leader's late writes are refused.
#[must_use = "leadership ends (in the background) as soon as it is dropped"]
pub struct Leadership<B: RawElection> {
    guard: LockGuard<B>,
    election: Election<B>,
    value: String,
}

impl<B: RawElection> std::fmt::Debug for Leadership<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leadership")
            .field("election", &self.guard.name())
            .field("term", &self.term())
            .field("lost", &self.is_lost())
            .finish()
    }
}

impl<B: RawElection> Leadership<B> {
    /// The election's name.
    pub fn name(&self) -> &str {
        self.guard.name()
    }

    /// This leadership's term: strictly greater than every earlier leader's of this
    /// election, never reused. A fencing token: send it with every write.
    pub fn term(&self) -> FencingToken {
        self.guard.fencing_token()
    }

    /// The value advertised now.
    pub fn value(&self) -> &str {
        &self.value
    }

    /// The lease's owner token.
    pub fn token(&self) -> &Token {
        self.guard.token()
    }

    /// Whether the leadership can no longer be guaranteed (see [`LockGuard::is_lost`]).
    pub fn is_lost(&self) -> bool {
        self.guard.is_lost()
    }

    /// How much of the lease's validity is left.
    pub fn remaining(&self) -> Duration {
        self.guard.remaining()
    }

    /// The lease each renewal buys (see [`LockGuard::lease`]).
    pub fn lease(&self) -> Duration {
        self.guard.lease()
    }

    /// Resolves when the leadership can no longer be guaranteed, or ends (see
    /// [`LockGuard::lost`]). It is `'static`: race it against the leader's work.
    pub fn lost(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        self.guard.lost()
    }

    /// Changes the advertised value without a new election: observers see the same term
    /// with the new value.
    ///
    /// # Errors
    /// `InvalidArgument` for a value over [`MAX_VALUE_LEN`] bytes; `LockLost` if this
    /// candidate no longer leads (the lock is not ours any more, or the lease lapsed); store
    /// failures.
    pub async fn proclaim(&mut self, value: impl Into<String>) -> Result<()> {
        let value = check_value(value.into())?;
        self.announce(value).await
    }

    /// Writes the record under this term, repeating a write whose outcome is unknown
    /// (it is idempotent) while the lease is valid.
    async fn announce(&mut self, value: String) -> Result<()> {
        let keys = self.election.lock.keys();
        let data = format!("{}\n{value}", self.guard.token().as_str());
        let term = self.term().get();
        let mut tries = 0;
        loop {
            if self.is_lost() {
                return Err(Error::lost(format!(
                    "election {:?}: leadership of term {term} was lost",
                    self.name()
                )));
            }
            let lock = &self.election.lock;
            let published = crate::observe::observed!(
                lock.obs(),
                lock.name(),
                crate::observe::span::PUBLISH,
                crate::observe::op::PUBLISH,
                lock.backend()
                    .publish(keys, self.guard.token(), term, &data)
            );
            match published {
                Ok(true) => break,
                Ok(false) => {
                    return Err(Error::lost(format!(
                        "election {:?}: the lock of term {term} is no longer ours (deposed)",
                        self.name()
                    )));
                }
                Err(err) if err.is_retryable() && tries < PUBLISH_RETRIES => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(50) * tries).await;
                }
                Err(err) => return Err(err),
            }
        }
        self.value = value;
        Ok(())
    }

    /// Steps down: the lease is released at once and the next candidate in line is woken
    /// (no wait for the lease to run out).
    ///
    /// # Errors
    /// `LockLost` if the leadership had already been lost (the work done as leader may
    /// have overlapped with a successor's; a term-checking resource refused its stale
    /// writes); store failures (the lease then runs out by itself).
    pub async fn resign(self) -> Result<()> {
        self.guard.release().await
    }

    /// The lock guard underneath (for code that takes one, such as a fenced resource).
    pub fn guard(&self) -> &LockGuard<B> {
        &self.guard
    }

    /// The lock guard underneath, for code that supervises any guard (releasing it
    /// resigns; dropping it resigns in the background). The advertised value stays
    /// recorded under this term until a successor announces its own.
    pub fn into_guard(self) -> LockGuard<B> {
        self.guard
    }
}

/// A stream of leader changes; made by [`Election::observe`].
///
/// It is a [`futures_core::Stream`] of `Result<Leader>` that never ends (an error is one
/// item; the next poll reads again), and has an inherent [`next`](Observer::next) for
/// code without a stream combinator crate.
#[must_use = "an observer does nothing unless polled"]
pub struct Observer<B: RawElection> {
    state: Option<Observing<B>>,
    pending: Option<BoxFuture<'static, (Observing<B>, Result<Leader>)>>,
}

impl<B: RawElection> std::fmt::Debug for Observer<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Observer").finish_non_exhaustive()
    }
}

/// An observer's state between changes.
struct Observing<B: RawElection> {
    election: Election<B>,
    /// The last change reported: its term and value.
    last: Option<(FencingToken, String)>,
    watch: Option<ReleaseWatch>,
    /// Whether the last call failed: the next one pauses before reading again.
    failed: bool,
}

impl<B: RawElection> Observing<B> {
    /// How long an observer sleeps between reads when nothing wakes it: the lease's
    /// length where the store announces writes, a tenth of it (50 ms to 1 s) where not.
    fn fallback(&self, announced: bool) -> Duration {
        let ttl = self.election.ttl();
        if announced {
            ttl
        } else {
            (ttl / 10).clamp(Duration::from_millis(50), Duration::from_secs(1))
        }
    }

    /// Sleeps until `woken` ends, in a `dlock.wait` span whose timer is `timer`;
    /// `woken` says what ended it (a [`woken_by`](crate::observe::woken_by) value).
    async fn wait(&self, timer: Duration, woken: impl Future<Output = &'static str>) {
        let lock = &self.election.lock;
        let span = lock.obs().wait_span(lock.name(), Some(timer));
        let slept = Instant::now();
        let woken_by = woken.await;
        crate::observe::observer_waited(&span, woken_by, slept.elapsed());
    }

    /// Waits for the next change after the last one reported.
    async fn change(&mut self) -> Result<Leader> {
        if std::mem::take(&mut self.failed) {
            let pause = self.fallback(false);
            self.wait(pause, async {
                tokio::time::sleep(pause).await;
                woken_by::OUTAGE
            })
            .await;
        }
        let change = self.next_change().await;
        if change.is_err() {
            // Subscribe again after a failure.
            self.failed = true;
            self.watch = None;
        }
        change
    }

    async fn next_change(&mut self) -> Result<Leader> {
        loop {
            // Listen before reading, so that a change after the read is heard.
            if self.watch.is_none() {
                let keys = self.election.lock.keys();
                let lock = &self.election.lock;
                self.watch = Some(crate::observe::observed!(
                    lock.obs(),
                    lock.name(),
                    crate::observe::span::WATCH,
                    crate::observe::op::WATCH_RECORD,
                    lock.backend().watch_record(keys)
                )?);
            }
            if let Some(leader) = self.election.leader().await?
                && let Some(value) = &leader.value
            {
                // Any difference is a change: reads are in order, so this is the latest
                // state (a term lower than the last one reported means the store's fence
                // counter was reset, and the new leader must still be reported).
                let changed = self
                    .last
                    .as_ref()
                    .is_none_or(|(term, last)| leader.term != *term || value != last);
                if changed {
                    self.last = Some((leader.term, value.clone()));
                    return Ok(leader);
                }
            }
            let watch = self.watch.as_ref().expect("set above");
            let announced = watch.is_active();
            let timer = self.fallback(announced);
            self.wait(timer, async {
                tokio::select! {
                    () = watch.released() => {
                        // One announcement wakes one listener of this client: pass it on
                        // to the other observers of the election that are waiting now.
                        if let Some(n) = watch.notifier() {
                            n.notify_waiters();
                        }
                        woken_by::CHANGE
                    }
                    () = tokio::time::sleep(timer) => {
                        if announced { woken_by::FALLBACK } else { woken_by::BACKOFF }
                    }
                }
            })
            .await;
        }
    }
}

impl<B: RawElection> Observer<B> {
    /// The next change of leader or advertised value.
    ///
    /// # Errors
    /// Store failures (the observer stays usable: the next call reads again).
    ///
    /// # Cancel safety
    /// Cancel-safe: a change found by a cancelled call is returned by the next one.
    pub async fn next(&mut self) -> Result<Leader> {
        poll_fn(|cx| self.poll_change(cx)).await
    }

    fn poll_change(&mut self, cx: &mut Context<'_>) -> Poll<Result<Leader>> {
        if self.pending.is_none() {
            let mut state = self
                .state
                .take()
                .expect("an observer's state is home between polls");
            self.pending = Some(Box::pin(async move {
                let change = state.change().await;
                (state, change)
            }));
        }
        let pending = self.pending.as_mut().expect("set above");
        match pending.as_mut().poll(cx) {
            Poll::Ready((state, change)) => {
                self.pending = None;
                self.state = Some(state);
                Poll::Ready(change)
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

// The state is never pinned in place (the pending future is boxed), so moving the
// observer is fine whatever the backend type.
impl<B: RawElection> Unpin for Observer<B> {}

impl<B: RawElection> futures_core::Stream for Observer<B> {
    type Item = Result<Leader>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Leader>>> {
        self.get_mut().poll_change(cx).map(Some)
    }
}
