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
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

use crate::engine::background::Repeat;
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

/// A named election in a store: at most one leader at a time across every process that
/// campaigns under the same name (and prefix) on the same store.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> fencelock::Result<()> {
/// use fencelock::{Election, backend::Memory};
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

/// What an [`Observer`] reports: who leads now, or that nobody does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaderChange {
    /// A leader leads: a new one, or the same one (same term) advertising a new value.
    /// Its [`value`](Leader::value) is always `Some`.
    Leader(Leader),
    /// Nobody leads: nobody ever did, or the last leader resigned, or its lease ran out
    /// (it crashed, or lost the store) and no candidate has been elected since.
    Vacant(Vacancy),
}

impl LeaderChange {
    /// The leader, if somebody leads.
    pub fn leader(&self) -> Option<&Leader> {
        match self {
            LeaderChange::Leader(leader) => Some(leader),
            LeaderChange::Vacant(_) => None,
        }
    }

    /// The vacancy, if nobody leads.
    pub fn vacancy(&self) -> Option<&Vacancy> {
        match self {
            LeaderChange::Leader(_) => None,
            LeaderChange::Vacant(vacancy) => Some(vacancy),
        }
    }
}

/// An empty seat, as an [`Observer`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Vacancy {
    /// The term of the last leader that announced itself (the term that ended), or `None`
    /// if nobody ever led this election (or its record was deleted).
    pub last_term: Option<FencingToken>,
    /// Since when nobody leads, where known: the moment the last leader resigned, by its
    /// own clock ([`Leadership::resign`], or the release of the guard from
    /// [`Leadership::into_guard`], record it). `None` when the seat emptied without a
    /// resignation (a dropped leadership, a crash, a lapsed lease), or was never taken:
    /// the observer then only knows that it is empty now.
    pub since: Option<SystemTime>,
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
    async fn lead(&self, mut guard: LockGuard<B>, value: String) -> Result<Leadership<B>> {
        // Leaving the seat is announced before the release, under this term, so that
        // observers report the vacancy at once (a release alone wakes no observer).
        let backend = self.lock.backend().clone();
        let keys = self.lock.keys().clone();
        let token = guard.token().clone();
        let term = guard.fencing_token().get();
        guard.before_release(Box::new(move || {
            Box::pin(async move {
                let record = vacated_record(&token, SystemTime::now());
                // Best effort: an observer that misses it finds the seat empty at its
                // next read (at the latest a lease's length later).
                let _ = backend.publish(&keys, &token, term, &record).await;
            })
        }));
        let mut leadership = Leadership {
            guard,
            election: self.clone(),
            value: String::new(),
        };
        leadership.announce(value).await?;
        Ok(leadership)
    }

    /// The current leader's term and value, or `None` if nobody leads (also from the moment
    /// a leader announces its resignation until its release).
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
        Ok(match read_seat(&holder, record.as_ref()) {
            Seat::Led(term, value) => Some(Leader {
                term: FencingToken::new(term),
                value: Some(value.to_owned()),
            }),
            // Its holder resigned: the seat is empty, the release on its way.
            Seat::Vacated(_) => None,
            // Granted, not announced yet: the term is the lock's latest fence.
            Seat::Unannounced => Some(Leader {
                term: FencingToken::new(state.last_fence.unwrap_or(0)),
                value: None,
            }),
        })
    }

    /// What an observer reports now: the leader, the vacancy, or `None` while a fresh
    /// leader has not announced itself yet (its announcement follows in one round trip).
    async fn change_now(&self) -> Result<Option<LeaderChange>> {
        let state = self.lock.state().await?;
        let record = crate::observe::observed!(
            self.lock.obs(),
            self.lock.name(),
            crate::observe::span::RECORD,
            crate::observe::op::RECORD,
            self.lock.backend().record(self.lock.keys())
        )?;
        let last_term = record.as_ref().map(|(term, _)| FencingToken::new(*term));
        let vacated = |since| Some(LeaderChange::Vacant(Vacancy { last_term, since }));
        let Some(holder) = state.holder else {
            let since = record
                .as_ref()
                .and_then(|(_, data)| parse_vacated(data))
                .map(|(_, since)| since);
            return Ok(vacated(since));
        };
        Ok(match read_seat(&holder, record.as_ref()) {
            Seat::Led(term, value) => Some(LeaderChange::Leader(Leader {
                term: FencingToken::new(term),
                value: Some(value.to_owned()),
            })),
            Seat::Vacated(since) => vacated(Some(since)),
            Seat::Unannounced => None,
        })
    }

    /// Follows the leader: a [`Stream`](futures_core::Stream) (and
    /// [`Observer::next`]) of [`LeaderChange`]s — every change of leader or advertised
    /// value, and every time the seat empties — each reported once and in order (terms
    /// increase, unless the store's fence counter was reset). The first item is the state
    /// when it is first polled: the leader, or [`LeaderChange::Vacant`] if nobody leads.
    ///
    /// It sleeps until the store announces a change where the store can (every store but
    /// memcached, which is read again at a short interval), and reads again at the lease's
    /// length in case an announcement was lost. A resigning leader announces that it
    /// leaves ([`Leadership::resign`], or releasing the guard of
    /// [`Leadership::into_guard`]), so the vacancy is reported at once, with the moment it
    /// resigned; a seat that empties otherwise (a dropped leadership, a crashed leader, a
    /// lapsed lease) is reported at the next read, at the latest a lease's length after its
    /// lease ended (on ZooKeeper a crashed leader's hold ends with its session, so within
    /// the session timeout and a lease's length). A resignation handed straight on to a queued candidate may be
    /// reported as a vacancy just before the next leader. A leader that led and left
    /// between two reads of a slow observer may be passed over: an observer always catches
    /// up with the latest state.
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

/// What an election's record says of the lock's holder `holder`.
enum Seat<'a> {
    /// It leads under this term, advertising this value.
    Led(u64, &'a str),
    /// It resigned at this time; its release is on its way.
    Vacated(SystemTime),
    /// It has not announced itself (yet): the record is an earlier leader's.
    Unannounced,
}

fn read_seat<'a>(holder: &str, record: Option<&'a (u64, String)>) -> Seat<'a> {
    let Some((term, data)) = record else {
        return Seat::Unannounced;
    };
    if let Some((token, value)) = data.split_once('\n') {
        if token == holder {
            return Seat::Led(*term, value);
        }
    } else if let Some((token, since)) = parse_vacated(data)
        && token == holder
    {
        return Seat::Vacated(since);
    }
    Seat::Unannounced
}

/// The word between a resigning leader's token and the time in its last record.
const VACATED: &str = " vacated ";

/// The record a resigning leader leaves under its term: `<token> vacated <unix ms>`. It
/// has no line break, so that a reader takes it for no announced value (never for one).
fn vacated_record(token: &Token, at: SystemTime) -> String {
    let ms = at
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    format!("{}{VACATED}{ms}", token.as_str())
}

/// The token and time of a record left by [`vacated_record`].
fn parse_vacated(data: &str) -> Option<(&str, SystemTime)> {
    if data.contains('\n') {
        return None;
    }
    let (token, ms) = data.rsplit_once(VACATED)?;
    let ms: u64 = ms.parse().ok()?;
    Some((token, UNIX_EPOCH.checked_add(Duration::from_millis(ms))?))
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
        let mut repeats = Repeat::UNKNOWN_OUTCOME.start();
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
                Err(err) if err.is_retryable() && repeats.more() => repeats.pause().await,
                Err(err) => return Err(err),
            }
        }
        self.value = value;
        Ok(())
    }

    /// Steps down: announces that the seat is empty (observers report
    /// [`LeaderChange::Vacant`] at once), then releases the lease, and the next candidate
    /// in line is woken (no wait for the lease to run out).
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
    /// resigns as [`resign`](Leadership::resign) does, announcing the vacancy first;
    /// dropping it resigns in the background, without announcing: observers find the seat
    /// empty at their next read). The advertised value stays recorded under this term
    /// until the release or a successor's announcement.
    pub fn into_guard(self) -> LockGuard<B> {
        self.guard
    }
}

/// A stream of leader changes; made by [`Election::observe`].
///
/// It is a [`futures_core::Stream`] of `Result<LeaderChange>` that never ends (an error is one
/// item; the next poll reads again), and has an inherent [`next`](Observer::next) for
/// code without a stream combinator crate.
#[must_use = "an observer does nothing unless polled"]
pub struct Observer<B: RawElection> {
    state: Option<Observing<B>>,
    pending: Option<BoxFuture<'static, (Observing<B>, Result<LeaderChange>)>>,
}

impl<B: RawElection> std::fmt::Debug for Observer<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Observer").finish_non_exhaustive()
    }
}

/// An observer's state between changes.
struct Observing<B: RawElection> {
    election: Election<B>,
    /// The last change reported.
    last: Option<LeaderChange>,
    watch: Option<ReleaseWatch>,
    /// Whether the last call failed: the next one pauses before reading again.
    failed: bool,
}

/// Whether two reports are of the same state: the same leader (term) advertising the same
/// value, or a vacancy after the same term.
fn same_seat(a: &LeaderChange, b: &LeaderChange) -> bool {
    match (a, b) {
        (LeaderChange::Leader(a), LeaderChange::Leader(b)) => {
            a.term == b.term && a.value == b.value
        }
        (LeaderChange::Vacant(a), LeaderChange::Vacant(b)) => a.last_term == b.last_term,
        _ => false,
    }
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
    async fn change(&mut self) -> Result<LeaderChange> {
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

    async fn next_change(&mut self) -> Result<LeaderChange> {
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
            if let Some(now) = self.election.change_now().await? {
                // Any difference is a change: reads are in order, so this is the latest
                // state (a term lower than the last one reported means the store's fence
                // counter was reset, and the new leader must still be reported).
                let changed = self.last.as_ref().is_none_or(|last| !same_seat(last, &now));
                if changed {
                    self.last = Some(now.clone());
                    return Ok(now);
                }
            }
            let watch = self.watch.as_ref().expect("set above");
            let announced = watch.is_active();
            let timer = self.fallback(announced);
            self.wait(timer, async {
                // In order (no draw from the runtime's generator, so a seed replays): an
                // announcement in by the time the timer fires is taken and passed on to
                // the other observers, and reported as a change.
                tokio::select! {
                    biased;
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
    /// The next change: of leader or advertised value, or the seat emptied.
    ///
    /// # Errors
    /// Store failures (the observer stays usable: the next call reads again).
    ///
    /// # Cancel safety
    /// Cancel-safe: a change found by a cancelled call is returned by the next one.
    pub async fn next(&mut self) -> Result<LeaderChange> {
        poll_fn(|cx| self.poll_change(cx)).await
    }

    fn poll_change(&mut self, cx: &mut Context<'_>) -> Poll<Result<LeaderChange>> {
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
    type Item = Result<LeaderChange>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<LeaderChange>>> {
        self.get_mut().poll_change(cx).map(Some)
    }
}
