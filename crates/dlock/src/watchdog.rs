//! Lease state and the watchdog: ONE renewal task per backend client for all its leases.
//!
//! Each held lease is renewed when a third of its ttl has passed since the last successful
//! renewal. Renewals that fall due within [`BATCH_WINDOW`] of each other go to the store
//! in one [`RawLock::extend_many`] call (one pipelined round trip on Redis). The task
//! exists only while there are leases to renew: it exits when the registry is empty, so it
//! never keeps a backend client alive on its own.
//!
//! A lease is *lost* when the store says the key no longer holds our token, or when
//! renewals kept failing until its validity (monotonic clock, minus drift) ran out.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tokio::time::Instant;

use crate::error::{Error, ErrorKind, Result};
use crate::keys::LockKeys;
use crate::raw::{RawLock, Renewal};
use crate::token::Token;
use crate::validity;

/// Renewals due within this window of the earliest one are sent together.
pub const BATCH_WINDOW: Duration = Duration::from_millis(10);

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

/// A backend client's registry of leases under renewal. Cheap to clone; clones share.
///
/// The renewal task runs on the tokio runtime that registered the first lease while none
/// was running. Keep that runtime alive (and not blocked) while locks are held; if it
/// shuts down, the task dies with it and the next registration starts a new one.
#[derive(Clone, Default)]
pub struct Leases {
    inner: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    registry: Mutex<Registry>,
    wake: Notify,
}

#[derive(Default)]
struct Registry {
    next_id: u64,
    entries: HashMap<u64, Entry>,
    /// `(next_due, id)` of every entry not currently being renewed.
    due: BTreeSet<(Instant, u64)>,
    /// The renewal task, if one was started. It may have died with its runtime (a holder
    /// process's runtime shut down): then the next registration starts a new one.
    task: Option<tokio::task::JoinHandle<()>>,
    /// When the task will next wake by itself, while it sleeps: a new lease due later
    /// needs no wake-up.
    wake_at: Option<Instant>,
}

/// How long the renewal task stays after the last lease is gone, so that a client that
/// acquires and releases in a loop does not respawn it every time.
const LINGER: Duration = Duration::from_secs(1);

struct Entry {
    lease: Arc<Lease>,
    /// `None` while a renewal is in flight.
    next_due: Option<Instant>,
}

impl std::fmt::Debug for Leases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leases").field("held", &self.len()).finish()
    }
}

impl Leases {
    /// An empty registry.
    pub fn new() -> Leases {
        Leases::default()
    }

    /// How many leases are under renewal now.
    pub fn len(&self) -> usize {
        self.lock().entries.len()
    }

    /// Whether no lease is under renewal.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> MutexGuard<'_, Registry> {
        self.inner
            .registry
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Puts `lease` under renewal; starts the watchdog task if none runs.
    pub(crate) fn register<B: RawLock>(&self, backend: &B, lease: Arc<Lease>) -> Result<u64> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
            Error::new(
                ErrorKind::InvalidArgument,
                "the lease watchdog needs a tokio runtime",
            )
        })?;
        let ttl = lease.snapshot().ttl;
        let mut reg = self.lock();
        let id = reg.next_id;
        reg.next_id += 1;
        let due = Instant::now() + ttl / 3;
        reg.entries.insert(
            id,
            Entry {
                lease,
                next_due: Some(due),
            },
        );
        reg.due.insert((due, id));
        if reg
            .task
            .as_ref()
            .is_none_or(tokio::task::JoinHandle::is_finished)
        {
            let backend = backend.clone();
            let shared = Arc::clone(&self.inner);
            reg.task = Some(runtime.spawn(run(backend, shared)));
        } else if reg.wake_at.is_none_or(|wake| due < wake) {
            self.inner.wake.notify_one();
        }
        Ok(id)
    }

    /// Renews lease `id` no later than `due` (after an extension to a shorter ttl).
    pub(crate) fn reschedule(&self, id: u64, due: Instant) {
        let mut reg = self.lock();
        let Some(entry) = reg.entries.get_mut(&id) else {
            return;
        };
        // In flight: its result reschedules from the lease's current ttl.
        let Some(old) = entry.next_due else {
            return;
        };
        if due < old {
            entry.next_due = Some(due);
            reg.due.remove(&(old, id));
            reg.due.insert((due, id));
            self.inner.wake.notify_one();
        }
    }

    /// Takes a lease out of renewal at once (released, forgotten or dropped).
    pub(crate) fn deregister(&self, id: u64) {
        // With nothing left, the task exits at its next wake-up (plus a linger).
        let mut reg = self.lock();
        if let Some(entry) = reg.entries.remove(&id)
            && let Some(due) = entry.next_due
        {
            reg.due.remove(&(due, id));
        }
    }
}

fn retry_delay(ttl: Duration) -> Duration {
    (ttl / 10).clamp(Duration::from_millis(10), Duration::from_secs(1))
}

async fn run<B: RawLock>(backend: B, shared: Arc<Shared>) {
    let leases = Leases {
        inner: Arc::clone(&shared),
    };
    let mut idle_since: Option<Instant> = None;
    loop {
        let now = Instant::now();
        let mut batch: Vec<(u64, Arc<Lease>)> = Vec::new();
        let next_wake;
        {
            let mut reg = leases.lock();
            if reg.entries.is_empty() {
                let since = *idle_since.get_or_insert(now);
                if now >= since + LINGER {
                    reg.task = None;
                    reg.wake_at = None;
                    return;
                }
            } else {
                idle_since = None;
            }
            while let Some(&(due, id)) = reg.due.first() {
                if due > now + BATCH_WINDOW {
                    break;
                }
                reg.due.pop_first();
                let Some(entry) = reg.entries.get_mut(&id) else {
                    continue;
                };
                if entry.lease.is_lost_at(now) {
                    entry.lease.end(End::Expired);
                    reg.entries.remove(&id);
                    continue;
                }
                entry.next_due = None;
                batch.push((id, Arc::clone(&entry.lease)));
            }
            next_wake = reg.due.first().map(|&(due, _)| due);
        }

        if batch.is_empty() {
            let sleep_until = match (next_wake, idle_since) {
                (Some(due), _) => due,
                (None, Some(since)) => since + LINGER,
                (None, None) => now + Duration::from_secs(3600),
            };
            leases.lock().wake_at = Some(sleep_until);
            tokio::select! {
                () = tokio::time::sleep_until(sleep_until) => {}
                () = shared.wake.notified() => {}
            }
            leases.lock().wake_at = None;
            continue;
        }

        let renewals: Vec<Renewal> = batch
            .iter()
            .map(|(_, lease)| Renewal {
                keys: lease.keys.clone(),
                token: lease.token.clone(),
                ttl: lease.snapshot().ttl,
            })
            .collect();
        // No reply is worth waiting for once every lease in the batch has lapsed; leases
        // that lapse earlier are ended when the results come in.
        let limit = batch
            .iter()
            .map(|(_, l)| l.snapshot().valid_until.saturating_duration_since(now))
            .max()
            .unwrap_or_default()
            .max(Duration::from_millis(10));
        let sent = Instant::now();
        let results = match tokio::time::timeout(limit, backend.extend_many(&renewals)).await {
            Ok(results) if results.len() == renewals.len() => results,
            Ok(_) => renewals
                .iter()
                .map(|_| {
                    Err(Error::new(
                        ErrorKind::Backend,
                        "renewal batch reply mismatch",
                    ))
                })
                .collect(),
            Err(_) => renewals
                .iter()
                .map(|_| Err(Error::new(ErrorKind::TimedOut, "lease renewal timed out")))
                .collect(),
        };

        let done = Instant::now();
        let mut reg = leases.lock();
        for (((id, lease), renewal), result) in batch.into_iter().zip(&renewals).zip(results) {
            if !reg.entries.contains_key(&id) {
                continue; // released while the renewal was in flight
            }
            let next = match result {
                Ok(true) => {
                    if lease.renewed(sent, renewal.ttl) {
                        // The lease's ttl now, which an extend may have changed meanwhile.
                        Some(sent + lease.snapshot().ttl.min(renewal.ttl) / 3)
                    } else {
                        tracing::warn!(
                            lock = lease.keys.name(),
                            "lease lost: renewal confirmed after validity ran out"
                        );
                        None
                    }
                }
                Ok(false) => {
                    tracing::warn!(
                        lock = lease.keys.name(),
                        "lease lost: key deleted or taken over"
                    );
                    lease.end(End::Taken);
                    None
                }
                Err(err) if lease.is_lost_at(done) => {
                    tracing::warn!(lock = lease.keys.name(), error = %err, "lease lost: renewals failed until validity ran out");
                    lease.end(End::Expired);
                    None
                }
                Err(err) => {
                    tracing::debug!(lock = lease.keys.name(), error = %err, "lease renewal failed; retrying");
                    let valid_until = lease.snapshot().valid_until;
                    Some((done + retry_delay(renewal.ttl)).min(valid_until))
                }
            };
            match next {
                Some(due) => {
                    if let Some(entry) = reg.entries.get_mut(&id) {
                        entry.next_due = Some(due);
                    }
                    reg.due.insert((due, id));
                }
                None => {
                    reg.entries.remove(&id);
                }
            }
        }
    }
}
