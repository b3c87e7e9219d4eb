//! The engine's lease half: ONE registry and ONE renewal task per client, for every
//! primitive on it.
//!
//! Each held lease is renewed when a third of its ttl has passed since the last successful
//! renewal. Renewals that fall due within [`BATCH_WINDOW`] of each other go to the store
//! in one batch ([`Renew::renew`]: one pipelined round trip on Redis), whatever primitives
//! they belong to: each [`Renewal`] says its [`LeaseKind`]. The task exists only while
//! there are leases to renew (plus a short linger): it never keeps a client alive on its
//! own.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::lease::{End, Lease};
use super::{EngineStats, Renewal};
use crate::error::{Error, ErrorKind, Result};

/// Renewals due within this window of the earliest one are sent together.
pub const BATCH_WINDOW: Duration = Duration::from_millis(10);

/// How long the renewal task stays after the last lease is gone, so that a client that
/// acquires and releases in a loop does not respawn it every time.
const LINGER: Duration = Duration::from_secs(1);

/// Sends one batch of renewals to the store: the only thing the engine needs from a
/// client. Returns one result per renewal, in order.
pub(crate) trait Renew: Clone + Send + Sync + 'static {
    fn renew(&self, batch: &[Renewal]) -> impl Future<Output = Vec<Result<bool>>> + Send;
}

/// The registry shared by every clone of one client.
#[derive(Default)]
pub(super) struct Registry {
    state: Mutex<State>,
    wake: Notify,
    tasks_started: AtomicU64,
    batches: AtomicU64,
    renewals: AtomicU64,
}

#[derive(Default)]
struct State {
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

struct Entry {
    lease: Arc<Lease>,
    /// `None` while a renewal is in flight.
    next_due: Option<Instant>,
}

impl Registry {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn stats(&self) -> EngineStats {
        let state = self.lock();
        EngineStats {
            leases: state.entries.len(),
            renewal_task_running: state.task.as_ref().is_some_and(|t| !t.is_finished()),
            renewal_tasks_started: self.tasks_started.load(Ordering::Relaxed),
            renewal_batches: self.batches.load(Ordering::Relaxed),
            renewals: self.renewals.load(Ordering::Relaxed),
        }
    }

    /// Puts `lease` under renewal through `renewer`; starts the renewal task if none runs.
    pub(super) fn register<R: Renew>(
        self: &Arc<Self>,
        renewer: &R,
        lease: Arc<Lease>,
    ) -> Result<u64> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
            Error::new(
                ErrorKind::InvalidArgument,
                "the lease watchdog needs a tokio runtime",
            )
        })?;
        let ttl = lease.snapshot().ttl;
        let mut state = self.lock();
        let id = state.next_id;
        state.next_id += 1;
        let due = Instant::now() + ttl / 3;
        state.entries.insert(
            id,
            Entry {
                lease,
                next_due: Some(due),
            },
        );
        state.due.insert((due, id));
        if state
            .task
            .as_ref()
            .is_none_or(tokio::task::JoinHandle::is_finished)
        {
            self.tasks_started.fetch_add(1, Ordering::Relaxed);
            state.task = Some(runtime.spawn(run(renewer.clone(), Arc::clone(self))));
        } else if state.wake_at.is_none_or(|wake| due < wake) {
            self.wake.notify_one();
        }
        Ok(id)
    }

    /// Renews lease `id` no later than `due` (after an extension to a shorter ttl).
    pub(super) fn reschedule(&self, id: u64, due: Instant) {
        let mut state = self.lock();
        let Some(entry) = state.entries.get_mut(&id) else {
            return;
        };
        // In flight: its result reschedules from the lease's current ttl.
        let Some(old) = entry.next_due else {
            return;
        };
        if due < old {
            entry.next_due = Some(due);
            state.due.remove(&(old, id));
            state.due.insert((due, id));
            self.wake.notify_one();
        }
    }

    /// Takes a lease out of renewal at once (released, forgotten or dropped).
    pub(super) fn deregister(&self, id: u64) {
        // With nothing left, the task exits at its next wake-up (plus a linger).
        let mut state = self.lock();
        if let Some(entry) = state.entries.remove(&id)
            && let Some(due) = entry.next_due
        {
            state.due.remove(&(due, id));
        }
    }
}

fn retry_delay(ttl: Duration) -> Duration {
    (ttl / 10).clamp(Duration::from_millis(10), Duration::from_secs(1))
}

async fn run<R: Renew>(renewer: R, registry: Arc<Registry>) {
    let mut idle_since: Option<Instant> = None;
    loop {
        let now = Instant::now();
        let mut batch: Vec<(u64, Arc<Lease>)> = Vec::new();
        let next_wake;
        {
            let mut state = registry.lock();
            if state.entries.is_empty() {
                let since = *idle_since.get_or_insert(now);
                if now >= since + LINGER {
                    state.task = None;
                    state.wake_at = None;
                    return;
                }
            } else {
                idle_since = None;
            }
            while let Some(&(due, id)) = state.due.first() {
                if due > now + BATCH_WINDOW {
                    break;
                }
                state.due.pop_first();
                let Some(entry) = state.entries.get_mut(&id) else {
                    continue;
                };
                if entry.lease.is_lost_at(now) {
                    entry.lease.end(End::Expired);
                    state.entries.remove(&id);
                    continue;
                }
                entry.next_due = None;
                batch.push((id, Arc::clone(&entry.lease)));
            }
            next_wake = state.due.first().map(|&(due, _)| due);
        }

        if batch.is_empty() {
            let sleep_until = match (next_wake, idle_since) {
                (Some(due), _) => due,
                (None, Some(since)) => since + LINGER,
                (None, None) => now + Duration::from_secs(3600),
            };
            registry.lock().wake_at = Some(sleep_until);
            tokio::select! {
                () = tokio::time::sleep_until(sleep_until) => {}
                () = registry.wake.notified() => {}
            }
            registry.lock().wake_at = None;
            continue;
        }

        let renewals: Vec<Renewal> = batch
            .iter()
            .map(|(_, lease)| Renewal {
                keys: lease.keys.clone(),
                token: lease.token.clone(),
                ttl: lease.snapshot().ttl,
                kind: lease.kind,
            })
            .collect();
        registry.batches.fetch_add(1, Ordering::Relaxed);
        registry
            .renewals
            .fetch_add(renewals.len() as u64, Ordering::Relaxed);
        // No reply is worth waiting for once every lease in the batch has lapsed; leases
        // that lapse earlier are ended when the results come in.
        let limit = batch
            .iter()
            .map(|(_, l)| l.snapshot().valid_until.saturating_duration_since(now))
            .max()
            .unwrap_or_default()
            .max(Duration::from_millis(10));
        let sent = Instant::now();
        let results = match tokio::time::timeout(limit, renewer.renew(&renewals)).await {
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
        let mut state = registry.lock();
        for (((id, lease), renewal), result) in batch.into_iter().zip(&renewals).zip(results) {
            if !state.entries.contains_key(&id) {
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
                    if let Some(entry) = state.entries.get_mut(&id) {
                        entry.next_due = Some(due);
                    }
                    state.due.insert((due, id));
                }
                None => {
                    state.entries.remove(&id);
                }
            }
        }
    }
}
