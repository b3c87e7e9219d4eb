//! The engine's queue-follower: the one task that follows a waiter's entry in a
//! server-side queue (etcd's revision-ordered keys, ZooKeeper's sequential nodes).
//!
//! While a call waits, its task looks at what stands in front of its entry and watches
//! it, keeps the entry alive, and tells the waiting call when its turn came — handing
//! it the grant (the fence) when the store granted it by the queue's order alone, so
//! that the call holds without another round trip. A lost watch or a failed look is
//! tried again after a pause; an entry that went (its lease or session ended, an
//! operator deleted it) wakes the call, whose next attempt queues anew and tells the
//! task through [`Recipe::moved`].
//!
//! What a queue is, how to read it and what to watch is the store's [`Recipe`]; the
//! loop, the bookkeeping of which turn was told, and the retry policy are here, once.

// Each queueing store uses its part of the follower.
#![cfg_attr(not(all(feature = "etcd", feature = "zookeeper")), allow(dead_code))]

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Notify, oneshot};
use tokio::time::{Instant, MissedTickBehavior};

/// One waiter's queue entry as a store follows it.
pub(crate) trait Recipe: Send + 'static {
    /// What the client knows of the waiter's entry (replaced when an attempt re-creates
    /// it at the back).
    type Place: Send + Sync;
    /// What tells two entries apart (a told turn belongs to one entry).
    type Id: PartialEq + Send;

    /// The waiter's entry now, if it has one.
    fn place(&self) -> Option<Self::Place>;

    /// The entry's identity.
    fn id(place: &Self::Place) -> Self::Id;

    /// Told when an attempt records another entry for the waiter (or withdraws it).
    fn moved(place: &Self::Place) -> Arc<Notify>;

    /// How often the entry is kept alive while it waits.
    fn keep_period(&self) -> Duration;

    /// Reads what stands in front of `place` and watches it.
    fn look(&mut self, place: &Self::Place) -> impl Future<Output = Look> + Send;

    /// After the last entry in front went: whether `place` is still the waiter's and in
    /// the store (then the turn is handed over without another read).
    fn confirm(&self, place: &Self::Place) -> impl Future<Output = bool> + Send;

    /// Leaves the grant for the waiting call: its turn came.
    fn grant(&self, place: &Self::Place);

    /// Keeps the waiting entry alive (`told`: its turn was told already, the hold's own
    /// renewals keep it from now on). Returns `false` if the entry is gone.
    fn keep(&self, place: &Self::Place, told: bool) -> impl Future<Output = bool> + Send;
}

/// A watch of what stands in front of an entry, resolving with what happened to it.
pub(crate) type Watching = Pin<Box<dyn Future<Output = Fired> + Send>>;

/// What a look in front of the entry found.
pub(crate) enum Look {
    /// Nothing in front: the turn came (`ours`: the entry is still there, so the grant is
    /// handed over; else the waiter's attempt finds out).
    Turn {
        /// Whether the entry was seen in the store.
        ours: bool,
    },
    /// An entry in front, watched.
    Ahead {
        /// The watch.
        watch: Watching,
        /// Whether it is the only one in front (its going is our turn).
        only: bool,
        /// Whether the waiter should attempt now anyway (the store changed since its
        /// last attempt in a way the watch would not report).
        wake: bool,
    },
    /// The entry is gone (its session ended, an operator deleted it): the waiter queues
    /// again, which moves the entry.
    Gone,
    /// What was in front went while the watch was set up: look again at once.
    Again,
    /// The store failed the look: try again after a pause.
    Failed,
}

/// What a watch reported.
pub(crate) enum Fired {
    /// The entry in front was deleted.
    Deleted,
    /// Something changed that may let the waiter in: it attempts.
    Wake,
    /// The watch was lost (its connection or session ended): look again after a pause,
    /// waking the waiter first if `wake`.
    Lost {
        /// Whether the waiter attempts at once.
        wake: bool,
    },
    /// Nothing that concerns the waiter.
    Other,
}

/// Follows the waiter's entry until the task is aborted (with its watch): wakes `wake`
/// when the waiter should attempt, after leaving the grant where the turn came. Signals
/// `ready` after its first look (with a watch in effect unless the store failed it).
/// `retry`: the pause before looking again after a failure.
pub(crate) async fn follow<R: Recipe>(
    mut recipe: R,
    wake: Arc<Notify>,
    ready: oneshot::Sender<()>,
    retry: Duration,
) {
    let mut ready = Some(ready);
    let mut signal = move || {
        if let Some(r) = ready.take() {
            let _ = r.send(());
        }
    };
    let period = recipe.keep_period().max(Duration::from_millis(10));
    let mut keep = tokio::time::interval_at(Instant::now() + period, period);
    keep.set_missed_tick_behavior(MissedTickBehavior::Delay);
    // The entry whose turn the waiter was told already.
    let mut told: Option<R::Id> = None;
    loop {
        let Some(place) = recipe.place() else {
            // No entry yet, or not any more (withdrawn, or it went): the waiter's next
            // attempt makes one. Look again soon; the task ends with the wait.
            signal();
            wake.notify_one();
            tokio::time::sleep(retry).await;
            continue;
        };
        let id = R::id(&place);
        let moved = R::moved(&place);
        let mut watch = None;
        let mut only = false;
        let mut failed = false;
        match recipe.look(&place).await {
            Look::Turn { ours } => {
                if told.as_ref() != Some(&id) {
                    if ours {
                        recipe.grant(&place);
                    }
                    told = Some(R::id(&place));
                    wake.notify_one();
                }
            }
            Look::Ahead {
                watch: w,
                only: alone,
                wake: now,
            } => {
                watch = Some(w);
                only = alone;
                if now {
                    wake.notify_one();
                }
            }
            Look::Gone => wake.notify_one(),
            Look::Again => continue,
            Look::Failed => failed = true,
        }
        signal();
        loop {
            tokio::select! {
                biased;
                fired = async {
                    match watch.as_mut() {
                        Some(w) => w.await,
                        None => std::future::pending().await,
                    }
                } => {
                    match fired {
                        Fired::Deleted => {
                            if only && told.as_ref() != Some(&id) && recipe.confirm(&place).await {
                                // The last entry in front is gone: our turn, told at once
                                // (the look that follows confirms it for the record).
                                recipe.grant(&place);
                                told = Some(R::id(&place));
                                wake.notify_one();
                            }
                        }
                        Fired::Wake => wake.notify_one(),
                        Fired::Lost { wake: now } => {
                            if now {
                                wake.notify_one();
                            }
                            tokio::time::sleep(retry).await;
                        }
                        Fired::Other => {}
                    }
                    break;
                }
                () = moved.notified() => {
                    if recipe.place().is_none_or(|p| R::id(&p) != id) {
                        break;
                    }
                }
                _ = keep.tick() => {
                    let was_told = told.as_ref() == Some(&id);
                    if !recipe.keep(&place, was_told).await {
                        // The entry went (with its lease): the next attempt queues anew.
                        told = None;
                        wake.notify_one();
                    }
                }
                () = async {
                    if failed {
                        tokio::time::sleep(retry).await;
                    } else {
                        std::future::pending::<()>().await;
                    }
                } => break,
            }
        }
    }
}
