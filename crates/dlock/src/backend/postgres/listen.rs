//! One `LISTEN` connection per client, on one channel of its own.
//!
//! A release wakes the head of the lock's waiter queue with `pg_notify(<its client's
//! channel>, <its token>)`; this connection receives it and wakes that waiter only. The
//! connection opens on the first wait and stays open. When it drops, every waiter is woken
//! to try again (a notification may have been missed while it was down); the next queueing
//! attempt opens it again before it queues, so no waiter queues on a channel nobody hears.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use tokio::sync::Notify;
use tokio_postgres::{AsyncMessage, NoTls};

use super::map_err;
use crate::error::Result;
use crate::raw::ReleaseWatch;

pub(super) struct Listener {
    shared: Arc<Shared>,
}

struct Shared {
    config: tokio_postgres::Config,
    /// This client's channel (`dlk_` and 16 random hex digits).
    channel: String,
    state: Mutex<State>,
    /// Serialises opening the connection.
    opening: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct State {
    /// The open connection's client (dropping it closes the connection), if any.
    up: Option<tokio_postgres::Client>,
    /// What this client's waiters wait for (a waiter's token, or a name several local
    /// waiters share: a read-write lock's readers), how to wake one of them, and how many
    /// registrations share it.
    waiters: HashMap<String, (Arc<Notify>, usize)>,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The connection ended: wake every waiter to try again.
    fn down(&self) {
        let mut state = self.state();
        state.up = None;
        for (notify, _) in state.waiters.values() {
            notify.notify_one();
        }
    }
}

/// Keeps a waiter registered; dropping it (with its [`ReleaseWatch`]) removes it.
struct Registration {
    shared: Weak<Shared>,
    token: String,
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Some(shared) = self.shared.upgrade() {
            let mut state = shared.state();
            if let Some((_, n)) = state.waiters.get_mut(&self.token) {
                *n -= 1;
                if *n == 0 {
                    state.waiters.remove(&self.token);
                }
            }
        }
    }
}

impl Listener {
    pub(super) fn new(config: tokio_postgres::Config) -> Result<Listener> {
        let token = crate::token::Token::random()?;
        let channel = format!("dlk_{}", &token.as_str()[..16]);
        Ok(Listener {
            shared: Arc::new(Shared {
                config,
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

    /// Whether the connection is open and listening.
    pub(super) fn is_up(&self) -> bool {
        self.shared.state().up.is_some()
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
        let (client, mut connection) = self
            .shared
            .config
            .connect(NoTls)
            .await
            .map_err(|e| map_err(&e, doing))?;
        let weak = Arc::downgrade(&self.shared);
        tokio::spawn(async move {
            loop {
                let message = std::future::poll_fn(|cx| connection.poll_message(cx)).await;
                let Some(shared) = weak.upgrade() else { return };
                match message {
                    Some(Ok(AsyncMessage::Notification(n))) => {
                        if let Some((notify, _)) = shared.state().waiters.get(n.payload()) {
                            notify.notify_one();
                        }
                    }
                    Some(Ok(_)) => {}
                    Some(Err(_)) | None => {
                        shared.down();
                        return;
                    }
                }
            }
        });
        client
            .batch_execute(&format!("LISTEN \"{}\"", self.shared.channel))
            .await
            .map_err(|e| map_err(&e, doing))?;
        self.shared.state().up = Some(client);
        Ok(())
    }

    /// Registers a waiter for `token`: a notification naming it wakes one of the local
    /// waiters registered for it (the others are passed the wake-up by the one woken).
    pub(super) fn register(&self, token: &str) -> ReleaseWatch {
        let notify = {
            let mut state = self.shared.state();
            let (notify, n) = state
                .waiters
                .entry(token.to_owned())
                .or_insert_with(|| (Arc::new(Notify::new()), 0));
            *n += 1;
            Arc::clone(notify)
        };
        ReleaseWatch::new(
            notify,
            Some(Box::new(Registration {
                shared: Arc::downgrade(&self.shared),
                token: token.to_owned(),
            })),
        )
    }

    /// Opens the connection if needed, then registers `token`'s waiter.
    pub(super) async fn watch(&self, token: &str) -> Result<ReleaseWatch> {
        self.ensure_up().await?;
        Ok(self.register(token))
    }
}
