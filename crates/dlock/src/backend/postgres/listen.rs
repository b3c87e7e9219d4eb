//! One `LISTEN` connection per client, on one channel of its own.
//!
//! A release tells the head of the lock's waiter queue on its client's channel: either
//! that it holds the lock now (`!<fence>:<name>`, a hand-over: the fence goes to the
//! waiter's [`GrantSlot`]) or that it may try (`<name>`, a wake-up). The name is the
//! waiter's token, or a name several local waiters share (a read-write lock's readers'
//! side, a fair lock waiter's side key). This connection receives it and wakes that waiter
//! only. It opens on the first wait and stays open. When it drops, hand-overs not yet
//! taken are forgotten (the server may have lost them), and every waiter is woken to try
//! again (a notification may have been missed while it was down); the next queueing
//! attempt opens it again before it queues, so no waiter queues on a channel nobody hears.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use tokio::sync::Notify;
use tokio_postgres::AsyncMessage;

use super::{Connector, map_err};
use crate::engine::wait::GrantSlot;
use crate::error::Result;
use crate::raw::ReleaseWatch;

pub(super) struct Listener {
    shared: Arc<Shared>,
}

struct Shared {
    config: tokio_postgres::Config,
    connector: Connector,
    /// This client's channel (`dlk_` and 16 random hex digits).
    channel: String,
    state: Mutex<State>,
    /// Serialises opening the connection.
    opening: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct State {
    /// The open connection's client (dropping it closes the connection) and its backend
    /// pid, if any.
    up: Option<(tokio_postgres::Client, i32)>,
    /// What this client's waiters wait for, by name.
    waiters: HashMap<String, Waiting>,
}

/// The local waiters registered under one name.
struct Waiting {
    /// Wakes one of them.
    notify: Arc<Notify>,
    /// Where a hand-over to the name is left.
    grants: Arc<GrantSlot>,
    /// How many registrations share the name.
    count: usize,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The connection ended: forget hand-overs, wake every waiter to try again.
    fn down(&self) {
        let mut state = self.state();
        state.up = None;
        for w in state.waiters.values() {
            w.grants.clear();
            w.notify.notify_one();
        }
    }

    /// A notification's payload: `!<fence>:<name>` hands the lock over, `<name>` wakes.
    fn deliver(&self, payload: &str) {
        let state = self.state();
        let (fence, name) = match payload
            .strip_prefix('!')
            .and_then(|rest| rest.split_once(':'))
            .and_then(|(fence, name)| Some((fence.parse::<u64>().ok()?, name)))
        {
            Some((fence, name)) => (Some(fence), name),
            None => (None, payload),
        };
        if let Some(w) = state.waiters.get(name) {
            if let Some(fence) = fence {
                w.grants.offer(fence);
            }
            w.notify.notify_one();
        }
    }
}

/// Keeps a waiter registered; dropping it (with its [`ReleaseWatch`]) removes it.
struct Registration {
    shared: Weak<Shared>,
    name: String,
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Some(shared) = self.shared.upgrade() {
            let mut state = shared.state();
            if let Some(w) = state.waiters.get_mut(&self.name) {
                w.count -= 1;
                if w.count == 0 {
                    state.waiters.remove(&self.name);
                }
            }
        }
    }
}

impl Listener {
    pub(super) fn new(config: tokio_postgres::Config, connector: Connector) -> Result<Listener> {
        let token = crate::token::Token::random()?;
        let channel = format!("dlk_{}", &token.as_str()[..16]);
        Ok(Listener {
            shared: Arc::new(Shared {
                config,
                connector,
                channel,
                state: Mutex::new(State::default()),
                opening: tokio::sync::Mutex::new(()),
            }),
        })
    }

    /// The channel releases notify this client's waiters on.
    pub(super) fn channel(&self) -> &str {
        &self.shared.channel
    }

    /// The backend pid of the open connection, if it is open.
    pub(super) fn pid(&self) -> Option<i32> {
        self.shared.state().up.as_ref().map(|(_, pid)| *pid)
    }

    /// Whether the connection is open and listening.
    pub(super) fn is_up(&self) -> bool {
        self.shared.state().up.is_some()
    }

    /// Whether a waiter is registered under `name`.
    pub(super) fn is_registered(&self, name: &str) -> bool {
        self.shared.state().waiters.contains_key(name)
    }

    /// An attempt by the waiter(s) under `name` found the lock held when its fence counter
    /// stood at `counter`: hand-overs up to it are void ([`GrantSlot::raise_floor`]).
    pub(super) fn raise_floor(&self, name: &str, counter: u64) {
        if let Some(w) = self.shared.state().waiters.get(name) {
            w.grants.raise_floor(counter);
        }
    }

    /// Opens the connection and `LISTEN`s, unless it is open already.
    pub(super) async fn ensure_up(&self) -> Result<()> {
        if self.is_up() {
            return Ok(());
        }
        let _opening = self.shared.opening.lock().await;
        if self.is_up() {
            return Ok(());
        }
        let doing = "opening the LISTEN connection";
        let (on_message, on_end) = (Arc::downgrade(&self.shared), Arc::downgrade(&self.shared));
        let client = self
            .shared
            .connector
            .connect(
                &self.shared.config,
                move |message| {
                    if let (AsyncMessage::Notification(n), Some(shared)) =
                        (message, on_message.upgrade())
                    {
                        shared.deliver(n.payload());
                    }
                },
                move || {
                    if let Some(shared) = on_end.upgrade() {
                        shared.down();
                    }
                },
            )
            .await
            .map_err(|e| map_err(&e, doing))?;
        client
            .batch_execute(&format!("LISTEN \"{}\"", self.shared.channel))
            .await
            .map_err(|e| map_err(&e, doing))?;
        let row = client
            .query_one("SELECT pg_backend_pid()", &[])
            .await
            .map_err(|e| map_err(&e, doing))?;
        self.shared.state().up = Some((client, row.get(0)));
        Ok(())
    }

    /// Registers a waiter for `name`: a notification naming it wakes one of the local
    /// waiters registered for it (the others are passed the wake-up by the one woken),
    /// and a hand-over naming it leaves its fence in their grant slot.
    pub(super) fn register(&self, name: &str) -> ReleaseWatch {
        let (notify, grants) = {
            let mut state = self.shared.state();
            let w = state
                .waiters
                .entry(name.to_owned())
                .or_insert_with(|| Waiting {
                    notify: Arc::new(Notify::new()),
                    grants: Arc::new(GrantSlot::default()),
                    count: 0,
                });
            w.count += 1;
            (Arc::clone(&w.notify), Arc::clone(&w.grants))
        };
        ReleaseWatch::new(
            notify,
            Some(Box::new(Registration {
                shared: Arc::downgrade(&self.shared),
                name: name.to_owned(),
            })),
        )
        .with_grants(grants)
    }

    /// Opens the connection if needed, then registers a waiter for `name`.
    pub(super) async fn watch(&self, name: &str) -> Result<ReleaseWatch> {
        self.ensure_up().await?;
        Ok(self.register(name))
    }
}
