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
//!
//! Elections' records are announced differently: every observer of an election, on any
//! client, wants to hear a write of its record, so a write is broadcast on one channel that
//! every client shares ([`RECORDS_CHANNEL`], the payload the lock key). This connection
//! `LISTEN`s on it too once an observer registers (and again after it reopens, while one
//! is registered); such a notification only ever wakes (it never hands anything over).

use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use tokio_postgres::AsyncMessage;

use super::{Connector, map_err};
use crate::engine::wake::Wakes;
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
    /// This client's waiters and observers of records (the engine's registry: it reads
    /// the notifications).
    wakes: Wakes<Heard>,
    /// Serialises opening the connection.
    opening: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct State {
    /// The open connection's client (dropping the last handle closes the connection) and
    /// its backend pid, if any.
    up: Option<(Arc<tokio_postgres::Client>, i32)>,
    /// Whether the open connection listens on [`RECORDS_CHANNEL`].
    records_heard: bool,
}

/// The channel every client's writes of an election's record are announced on, with the
/// election's lock key as the payload (see the module docs).
pub(super) const RECORDS_CHANNEL: &str = "dlk_records";

/// Who a notification is for: the waiters registered under a name, or the observers of
/// the record of the election whose lock key it is.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Heard {
    Waiter(String),
    Record(String),
}

impl Heard {
    fn is_record(&self) -> bool {
        matches!(self, Heard::Record(_))
    }
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The connection ended: forget hand-overs, wake every waiter to try again.
    fn down(&self) {
        {
            let mut state = self.state();
            state.up = None;
            state.records_heard = false;
        }
        self.wakes.disconnected();
    }

    /// Whether an observer of a record is registered.
    fn records_observed(&self) -> bool {
        self.wakes.any(Heard::is_record)
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
                wakes: Wakes::default(),
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
        self.shared.wakes.contains(&Heard::Waiter(name.to_owned()))
    }

    /// An attempt by the waiter(s) under `name` found the lock held when its fence counter
    /// stood at `counter`: hand-overs up to it are void ([`GrantSlot::raise_floor`]).
    pub(super) fn raise_floor(&self, name: &str, counter: u64) {
        self.shared
            .wakes
            .raise_floor(&Heard::Waiter(name.to_owned()), counter);
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
        self.open().await
    }

    /// Opens the connection and `LISTEN`s on this client's channel, and on
    /// [`RECORDS_CHANNEL`] if a record's observer is registered. The caller holds
    /// `opening`.
    async fn open(&self) -> Result<()> {
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
                        if n.channel() == RECORDS_CHANNEL {
                            // A write of a record: wakes one of its local observers (who
                            // passes it on).
                            shared.wakes.wake(&Heard::Record(n.payload().to_owned()));
                        } else {
                            // `!<fence>:<name>` hands the lock over, `<name>` wakes.
                            shared.wakes.deliver_message(n.payload(), |name| {
                                Heard::Waiter(name.to_owned())
                            });
                        }
                    }
                },
                move || {
                    if let Some(shared) = on_end.upgrade() {
                        shared.down();
                        if shared.records_observed() {
                            // Observers do not subscribe again by themselves.
                            spawn_relisten(on_end);
                        }
                    }
                },
            )
            .await
            .map_err(|e| map_err(&e, doing))?;
        client
            .batch_execute(&format!("LISTEN \"{}\"", self.shared.channel))
            .await
            .map_err(|e| map_err(&e, doing))?;
        // Observers registered before the connection opened (or while it was down) are
        // heard from now on; one registered later LISTENs itself (`watch_record`, which
        // waits for `opening`).
        let records = self.shared.records_observed();
        if records {
            client
                .batch_execute(&format!("LISTEN {RECORDS_CHANNEL}"))
                .await
                .map_err(|e| map_err(&e, doing))?;
        }
        let row = client
            .query_one("SELECT pg_backend_pid()", &[])
            .await
            .map_err(|e| map_err(&e, doing))?;
        {
            let mut state = self.shared.state();
            state.up = Some((Arc::new(client), row.get(0)));
            state.records_heard = records;
        }
        if records {
            // Opened again while observers were registered: a write announced while it
            // was down went unheard, so they read again.
            self.shared.wakes.wake_where(Heard::is_record);
        }
        Ok(())
    }

    /// Whether an observer of a record is registered while the connection does not
    /// listen for records (it dropped since).
    fn records_unheard(&self) -> bool {
        self.shared.records_observed() && !self.shared.state().records_heard
    }

    /// Makes sure the connection is open and `LISTEN`s on [`RECORDS_CHANNEL`] (for the
    /// registered observers of records).
    async fn listen_records(&self) -> Result<()> {
        let _opening = self.shared.opening.lock().await;
        let client = {
            let state = self.shared.state();
            if state.records_heard && state.up.is_some() {
                return Ok(());
            }
            state.up.as_ref().map(|(client, _)| Arc::clone(client))
        };
        let Some(client) = client else {
            return self.open().await;
        };
        client
            .batch_execute(&format!("LISTEN {RECORDS_CHANNEL}"))
            .await
            .map_err(|e| map_err(&e, "listening for elections' records"))?;
        let mut state = self.shared.state();
        // Unless the connection dropped meanwhile (then `down` cleared it).
        if state
            .up
            .as_ref()
            .is_some_and(|(up, _)| Arc::ptr_eq(up, &client))
        {
            state.records_heard = true;
        }
        Ok(())
    }

    /// Registers a waiter for `name`: a notification naming it wakes one of the local
    /// waiters registered for it (the others are passed the wake-up by the one woken),
    /// and a hand-over naming it leaves its fence in their grant slot.
    pub(super) fn register(&self, name: &str) -> ReleaseWatch {
        self.shared
            .wakes
            .register(Heard::Waiter(name.to_owned()))
            .into_watch(None)
    }

    /// Opens the connection if needed, then registers a waiter for `name`.
    pub(super) async fn watch(&self, name: &str) -> Result<ReleaseWatch> {
        self.ensure_up().await?;
        Ok(self.register(name))
    }

    /// Registers an observer of the record of the election whose lock key is `key`, then
    /// makes sure the connection listens for records: a write announced after this
    /// returns wakes it.
    pub(super) async fn watch_record(&self, key: &str) -> Result<ReleaseWatch> {
        // Nothing is ever handed over to an observer.
        let watch = self
            .shared
            .wakes
            .register(Heard::Record(key.to_owned()))
            .into_wake_only_watch(None);
        self.listen_records().await?;
        Ok(watch)
    }
}

/// How often a dropped connection is opened again for observers of records.
const RELISTEN_PAUSE: std::time::Duration = std::time::Duration::from_secs(1);

/// Starts [`relisten`] (a function of its own: spawned from inside `open`, whose future
/// it awaits, the compiler could not tell that it is `Send`).
fn spawn_relisten(shared: Weak<Shared>) {
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(relisten(shared));
    }
}

/// After the connection dropped while observers of records were registered: opens it
/// again (every [`RELISTEN_PAUSE`], while any is registered and nobody else has), which
/// wakes them to read again.
async fn relisten(shared: Weak<Shared>) {
    loop {
        tokio::time::sleep(RELISTEN_PAUSE).await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let listener = Listener { shared };
        if !listener.records_unheard() {
            return;
        }
        match tokio::time::timeout(RELISTEN_PAUSE * 5, listener.listen_records()).await {
            Ok(Ok(())) => return,
            Ok(Err(e)) => tracing::debug!(error = %e, "listening for records again failed"),
            Err(_) => tracing::debug!("listening for records again: no answer in time"),
        }
    }
}
