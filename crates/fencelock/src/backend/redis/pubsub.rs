//! One shared pub/sub connection per client, demultiplexed per channel.
//!
//! Each channel is subscribed once, however many local waiters it has, and unsubscribed
//! when it has had no waiter for [`LINGER`] (a client that waits on a lock again and again
//! keeps its subscription, so a wait costs no `SUBSCRIBE`). A message naming a waiter
//! (the stores' waiter queues name the token they wake) wakes that waiter; a hand-over
//! (`!<fence>:<token>`: the release granted the lock to that waiter) also leaves the fence
//! in the waiter's grant slot; any other message wakes ONE local waiter of the channel.
//! When the connection drops, every waiter is woken to retry (messages may have been
//! missed while it was down) and hand-overs not yet taken are forgotten (the server may
//! have lost them), and every waiter is woken again once the connection is back with its
//! subscriptions.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, Weak};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{ProtocolVersion, PushKind, Value};
use tokio::sync::Notify;

use super::map_err;
use crate::engine::wake::{Registration, Wakes};
use crate::error::Result;
use crate::raw::ReleaseWatch;

pub(super) struct PubSub {
    shared: Arc<Shared>,
}

struct Shared {
    /// The RESP3 client of the current master (replaced when a failover moves it).
    client: Mutex<Option<redis::Client>>,
    config: Option<ConnectionManagerConfig>,
    /// On a Redis Cluster: the RESP3 cluster client (sharded pub/sub) instead.
    cluster: Option<redis::cluster::ClusterClient>,
    conn: Mutex<Option<PubConn>>,
    /// Serialises opening the connection.
    opening: tokio::sync::Mutex<()>,
    channels: Arc<Mutex<HashMap<String, Channel>>>,
    /// The waiters that messages name, by channel and name (the engine's registry: it
    /// reads the messages).
    wakes: Wakes<Named>,
    /// Serialise SUBSCRIBE / UNSUBSCRIBE of one channel (sharded by its name), so that a
    /// late UNSUBSCRIBE never undoes a newer SUBSCRIBE of the same channel, while
    /// different channels subscribe in parallel.
    serial: Vec<tokio::sync::Mutex<()>>,
    /// When opening the pub/sub connection last failed: waiters poll for a while instead
    /// of each trying again.
    failed_at: Mutex<Option<Instant>>,
}

/// Shards of [`Shared::serial`].
const SERIAL_SHARDS: usize = 64;
/// How long a failed pub/sub connection is not retried.
const RETRY_CONNECT_AFTER: Duration = Duration::from_secs(5);

/// The pub/sub connection: plain channels on one Redis, shard channels on a cluster
/// (`SSUBSCRIBE`: the subscription lives on the shard that owns the channel's slot, where
/// the release scripts `SPUBLISH`).
#[derive(Clone)]
enum PubConn {
    Single(ConnectionManager),
    Cluster(redis::cluster_async::ClusterConnection),
}

impl PubConn {
    async fn subscribe(&mut self, channel: &str) -> redis::RedisResult<()> {
        match self {
            PubConn::Single(c) => c.subscribe(channel).await,
            PubConn::Cluster(c) => c.ssubscribe(channel).await,
        }
    }

    async fn unsubscribe(&mut self, channel: &str) -> redis::RedisResult<()> {
        match self {
            PubConn::Single(c) => c.unsubscribe(channel).await,
            PubConn::Cluster(c) => c.sunsubscribe(channel).await,
        }
    }
}

/// A waiter that messages name: its channel and its name (token).
type Named = (String, String);

struct Channel {
    /// Wakes one of the channel's waiters that no message names.
    notify: Arc<Notify>,
    /// Every waiter of the channel, named or not.
    watchers: usize,
    subscribed: bool,
    /// Since when nobody watches (the subscription lingers).
    idle_since: Option<Instant>,
    /// Whether a task will unsubscribe it once idle for [`LINGER`].
    reaper: bool,
}

impl Channel {
    fn new() -> Channel {
        Channel {
            notify: Arc::new(Notify::new()),
            watchers: 0,
            subscribed: false,
            idle_since: None,
            reaper: false,
        }
    }
}

/// Every waiter retries (messages may have been lost): the channels' unnamed waiters
/// now, the named ones keep the wake-up if they are between two waits. With `forget`,
/// hand-overs not taken yet are forgotten too: the connection that carried them dropped,
/// and the store may have lost the grants with it (a restart); the waiters' next attempts
/// find out whether the lock is theirs.
fn wake_everyone(channels: &Mutex<HashMap<String, Channel>>, wakes: &Wakes<Named>, forget: bool) {
    for channel in lock(channels).values() {
        channel.notify.notify_waiters();
    }
    if forget {
        wakes.disconnected();
    } else {
        wakes.wake_all();
    }
}

/// How long a channel stays subscribed without a waiter.
const LINGER: Duration = Duration::from_secs(2);

fn lock(channels: &Mutex<HashMap<String, Channel>>) -> MutexGuard<'_, HashMap<String, Channel>> {
    channels.lock().unwrap_or_else(PoisonError::into_inner)
}

impl PubSub {
    pub(super) fn new(
        client: &redis::Client,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> PubSub {
        let channels: Arc<Mutex<HashMap<String, Channel>>> = Arc::default();
        let wakes: Wakes<Named> = Wakes::default();
        let resp3 = resp3_client(client);
        let sink = (Arc::clone(&channels), wakes.clone());
        let back: Arc<OnceLock<Weak<Shared>>> = Arc::default();
        let back_in_sink = Arc::clone(&back);
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(connect_timeout))
            .set_response_timeout(Some(response_timeout))
            .set_number_of_retries(2)
            .set_max_delay(Duration::from_millis(500))
            .set_automatic_resubscription()
            .set_push_sender(move |push: redis::PushInfo| {
                deliver(&sink.0, &sink.1, &back_in_sink, push);
                Ok::<(), redis::aio::SendError>(())
            });
        let pubsub = PubSub {
            shared: Arc::new(Shared {
                client: Mutex::new(resp3),
                cluster: None,
                config: Some(config),
                conn: Mutex::new(None),
                opening: tokio::sync::Mutex::new(()),
                channels,
                wakes,
                serial: (0..SERIAL_SHARDS)
                    .map(|_| tokio::sync::Mutex::new(()))
                    .collect(),
                failed_at: Mutex::new(None),
            }),
        };
        let _ = back.set(Arc::downgrade(&pubsub.shared));
        pubsub
    }

    /// Pub/sub over a Redis Cluster: shard channels on a RESP3 cluster connection.
    pub(super) fn new_cluster(
        nodes: &[String],
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> Result<PubSub> {
        let channels: Arc<Mutex<HashMap<String, Channel>>> = Arc::default();
        let wakes: Wakes<Named> = Wakes::default();
        let sink = (Arc::clone(&channels), wakes.clone());
        let back: Arc<OnceLock<Weak<Shared>>> = Arc::default();
        let back_in_sink = Arc::clone(&back);
        let cluster = redis::cluster::ClusterClient::builder(nodes.to_vec())
            .use_protocol(ProtocolVersion::RESP3)
            .connection_timeout(connect_timeout)
            .response_timeout(response_timeout)
            .push_sender(move |push: redis::PushInfo| {
                deliver(&sink.0, &sink.1, &back_in_sink, push);
                Ok::<(), redis::aio::SendError>(())
            })
            .build()
            .map_err(|e| map_err(e, "configuring the cluster pub/sub client"))?;
        let pubsub = PubSub {
            shared: Arc::new(Shared {
                client: Mutex::new(None),
                config: None,
                cluster: Some(cluster),
                conn: Mutex::new(None),
                opening: tokio::sync::Mutex::new(()),
                channels,
                wakes,
                serial: (0..SERIAL_SHARDS)
                    .map(|_| tokio::sync::Mutex::new(()))
                    .collect(),
                failed_at: Mutex::new(None),
            }),
        };
        let _ = back.set(Arc::downgrade(&pubsub.shared));
        Ok(pubsub)
    }

    /// A watch of `channel`: a message on it wakes one local waiter.
    pub(super) async fn watch(&self, channel: &str) -> Result<ReleaseWatch> {
        self.watch_as(channel, None).await
    }

    /// A watch of `channel` for the waiter `name`: woken by messages that name it.
    pub(super) async fn watch_named(&self, channel: &str, name: &str) -> Result<ReleaseWatch> {
        self.watch_as(channel, Some(name)).await
    }

    /// Whether any channel is subscribed (or lingering) at all.
    pub(super) fn listens(&self) -> bool {
        !lock(&self.shared.channels).is_empty()
    }

    /// Whether `channel` is subscribed now (watched, or lingering after a wait).
    pub(super) fn subscribed(&self, channel: &str) -> bool {
        lock(&self.shared.channels)
            .get(channel)
            .is_some_and(|c| c.subscribed)
    }

    /// A watch for `name` if `channel` is subscribed already (no round trip), else `None`.
    pub(super) fn ready(&self, channel: &str, name: &str) -> Option<ReleaseWatch> {
        let registered = {
            let mut channels = lock(&self.shared.channels);
            let entry = channels.get_mut(channel).filter(|c| c.subscribed)?;
            entry.register(&self.shared.wakes, channel, Some(name))
        };
        Some(self.watch_of(channel, registered))
    }

    /// The watch of a registration on `channel`; dropping it ends the registration.
    fn watch_of(&self, channel: &str, registered: Registered) -> ReleaseWatch {
        let subscription = Box::new(Subscription {
            shared: Arc::clone(&self.shared),
            channel: channel.to_owned(),
        });
        match registered {
            Registered::Named(registration) => registration.into_watch(Some(subscription)),
            Registered::Unnamed(notify) => ReleaseWatch::new(notify, Some(subscription)),
        }
    }

    /// Waiter `name` of `channel` was told the lock is held while the fence counter stood
    /// at `counter`: hand-overs up to it are void ([`GrantSlot::raise_floor`]).
    pub(super) fn raise_floor(&self, channel: &str, name: &str, counter: u64) {
        self.shared
            .wakes
            .raise_floor(&(channel.to_owned(), name.to_owned()), counter);
    }

    async fn watch_as(&self, channel: &str, name: Option<&str>) -> Result<ReleaseWatch> {
        let (registered, subscribed) = {
            let mut channels = lock(&self.shared.channels);
            let entry = channels
                .entry(channel.to_owned())
                .or_insert_with(Channel::new);
            (
                entry.register(&self.shared.wakes, channel, name),
                entry.subscribed,
            )
        };
        // From here on, dropping `watch` undoes the registration.
        let watch = self.watch_of(channel, registered);
        if !subscribed {
            if self.shared.recently_failed() {
                // Down for now: the waiter polls and asks again after its next pause.
                return Ok(ReleaseWatch::unavailable());
            }
            let _serial = self.shared.serial(channel).lock().await;
            let still_needed = lock(&self.shared.channels)
                .get(channel)
                .is_some_and(|c| !c.subscribed);
            if still_needed {
                let mut conn = self.shared.connection().await?;
                conn.subscribe(channel)
                    .await
                    .map_err(|e| map_err(e, "subscribing to release announcements"))?;
                if let Some(c) = lock(&self.shared.channels).get_mut(channel) {
                    c.subscribed = true;
                }
            }
        }
        Ok(watch)
    }
}

/// A watcher's registration: a named one in the wake registry, or an unnamed one sharing
/// its channel's notifier.
enum Registered {
    Named(Registration<Named>),
    Unnamed(Arc<Notify>),
}

impl Channel {
    /// One more watcher of `channel`: `name`d (in the wake registry) or sharing the
    /// channel's notifier.
    fn register(&mut self, wakes: &Wakes<Named>, channel: &str, name: Option<&str>) -> Registered {
        self.watchers += 1;
        self.idle_since = None;
        match name {
            Some(name) => Registered::Named(wakes.register((channel.to_owned(), name.to_owned()))),
            None => Registered::Unnamed(Arc::clone(&self.notify)),
        }
    }
}

impl Shared {
    fn serial(&self, channel: &str) -> &tokio::sync::Mutex<()> {
        let shard = crate::keys::cluster_slot(channel.as_bytes()) as usize % SERIAL_SHARDS;
        &self.serial[shard]
    }

    fn recently_failed(&self) -> bool {
        let failed_at = self
            .failed_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        failed_at.is_some_and(|at| at.elapsed() < RETRY_CONNECT_AFTER)
    }

    fn current(&self) -> Option<PubConn> {
        self.conn
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    async fn connection(&self) -> Result<PubConn> {
        if let Some(conn) = self.current() {
            return Ok(conn);
        }
        let _opening = self.opening.lock().await;
        if let Some(conn) = self.current() {
            return Ok(conn);
        }
        if let Some(cluster) = &self.cluster {
            return match cluster.get_async_connection().await {
                Ok(conn) => {
                    let conn = PubConn::Cluster(conn);
                    *self.conn.lock().unwrap_or_else(PoisonError::into_inner) = Some(conn.clone());
                    Ok(conn)
                }
                Err(e) => {
                    *self
                        .failed_at
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
                    Err(map_err(e, "opening the cluster pub/sub connection"))
                }
            };
        }
        let client = self
            .client
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let (Some(client), Some(config)) = (client, &self.config) else {
            return Err(crate::Error::new(
                crate::ErrorKind::Backend,
                "no RESP3 client for pub/sub",
            ));
        };
        match ConnectionManager::new_with_config(client, config.clone()).await {
            Ok(conn) => {
                let conn = PubConn::Single(conn);
                *self.conn.lock().unwrap_or_else(PoisonError::into_inner) = Some(conn.clone());
                Ok(conn)
            }
            Err(e) => {
                *self
                    .failed_at
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
                Err(map_err(e, "opening the pub/sub connection"))
            }
        }
    }
}

/// The RESP3 version of `client`: RESP3 carries pushes on a multiplexed connection;
/// without it (Redis < 6) waiters fall back to the holder's ttl and backoff.
fn resp3_client(client: &redis::Client) -> Option<redis::Client> {
    let info = client.get_connection_info().clone();
    let settings = info
        .redis_settings()
        .clone()
        .set_protocol(ProtocolVersion::RESP3);
    redis::Client::open(info.set_redis_settings(settings)).ok()
}

impl PubSub {
    /// Moves every subscription to `client` (the new master after a failover): the old
    /// connection is dropped, channels with waiters are subscribed on the new one, and
    /// every waiter retries at once (releases during the move went unheard).
    pub(super) async fn switch(&self, client: &redis::Client) {
        let shared = &self.shared;
        {
            let _opening = shared.opening.lock().await;
            *shared.client.lock().unwrap_or_else(PoisonError::into_inner) = resp3_client(client);
            *shared.conn.lock().unwrap_or_else(PoisonError::into_inner) = None;
            *shared
                .failed_at
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = None;
        }
        let active: Vec<String> = {
            let mut channels = lock(&shared.channels);
            for c in channels.values_mut() {
                c.subscribed = false;
            }
            channels
                .iter()
                .filter(|(_, c)| c.watchers > 0)
                .map(|(name, _)| name.clone())
                .collect()
        };
        for channel in active {
            let _serial = shared.serial(&channel).lock().await;
            let still = lock(&shared.channels)
                .get(&channel)
                .is_some_and(|c| c.watchers > 0 && !c.subscribed);
            if !still {
                continue;
            }
            let subscribed = match shared.connection().await {
                Ok(mut conn) => conn.subscribe(&channel).await.is_ok(),
                Err(_) => false,
            };
            if let Some(c) = lock(&shared.channels).get_mut(&channel) {
                c.subscribed = subscribed;
            }
        }
        wake_everyone(&shared.channels, &shared.wakes, true);
    }
}

fn deliver(
    channels: &Mutex<HashMap<String, Channel>>,
    wakes: &Wakes<Named>,
    shared: &OnceLock<Weak<Shared>>,
    push: redis::PushInfo,
) {
    match push.kind {
        PushKind::Message | PushKind::SMessage => {
            let Some(Value::BulkString(name)) = push.data.first() else {
                return;
            };
            let Ok(name) = std::str::from_utf8(name) else {
                return;
            };
            let Some(notify) = lock(channels).get(name).map(|c| Arc::clone(&c.notify)) else {
                return;
            };
            let payload = match push.data.get(1) {
                Some(Value::BulkString(payload)) => std::str::from_utf8(payload).ok(),
                _ => None,
            };
            // A message naming a waiter of ours wakes (or hands over to) it alone; any
            // other wakes one unnamed waiter of the channel.
            let named = payload.is_some_and(|payload| {
                wakes.deliver_message(payload, |waiter| (name.to_owned(), waiter.to_owned()))
            });
            if !named {
                notify.notify_one();
            }
        }
        PushKind::Disconnection => {
            // Releases announced while we were away are lost: let every waiter retry now,
            // and once more when the subscriptions are back (a release between this retry
            // and the resubscription would be lost for good otherwise).
            wake_everyone(channels, wakes, true);
            if let (Some(shared), Ok(runtime)) = (
                shared.get().and_then(Weak::upgrade),
                tokio::runtime::Handle::try_current(),
            ) {
                runtime.spawn(wake_when_resubscribed(shared));
            }
        }
        _ => {}
    }
}

/// After a dropped pub/sub connection: waits until the connection is back (a `PING` on it
/// is answered only after the connection manager has reconnected and sent its
/// resubscriptions), then lets every waiter retry.
async fn wake_when_resubscribed(shared: Arc<Shared>) {
    let deadline = Instant::now() + RETRY_CONNECT_AFTER * 4;
    while Instant::now() < deadline {
        let Some(mut conn) = shared.current() else {
            break; // replaced (a failover moved it): `switch` wakes everyone
        };
        let pong = match &mut conn {
            PubConn::Single(c) => redis::cmd("PING").query_async::<()>(c).await,
            PubConn::Cluster(c) => redis::cmd("PING").query_async::<()>(c).await,
        };
        if pong.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    wake_everyone(&shared.channels, &shared.wakes, false);
}

/// One waiter's hold on a channel subscription.
struct Subscription {
    shared: Arc<Shared>,
    channel: String,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        {
            let mut channels = lock(&self.shared.channels);
            let Some(entry) = channels.get_mut(&self.channel) else {
                return;
            };
            entry.watchers -= 1;
            if entry.watchers > 0 {
                return;
            }
            entry.idle_since = Some(Instant::now());
            if entry.reaper {
                return; // the channel's reaper will look again
            }
            entry.reaper = true;
        }
        // The last waiter left: the subscription lingers, then goes unless someone waits
        // again. A SUBSCRIBE may have been sent even if it was never confirmed (its waiter
        // was cancelled mid-call), so UNSUBSCRIBE in any case — in order with the
        // channel's other (un)subscriptions.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // The subscription lingers until the connection closes; harmless.
            lock(&self.shared.channels).remove(&self.channel);
            return;
        };
        let shared = Arc::clone(&self.shared);
        let channel = std::mem::take(&mut self.channel);
        runtime.spawn(reap(shared, channel));
    }
}

/// Unsubscribes `channel` once it has had no waiter for [`LINGER`].
async fn reap(shared: Arc<Shared>, channel: String) {
    loop {
        let due = {
            let mut channels = lock(&shared.channels);
            let Some(entry) = channels.get_mut(&channel) else {
                return;
            };
            match entry.idle_since {
                None => {
                    entry.reaper = false; // in use again
                    return;
                }
                Some(since) => since + LINGER,
            }
        };
        if Instant::now() < due {
            tokio::time::sleep_until(due.into()).await;
            continue;
        }
        let _serial = shared.serial(&channel).lock().await;
        let idle = {
            let mut channels = lock(&shared.channels);
            let idle = channels.get(&channel).is_some_and(|c| {
                c.watchers == 0 && c.idle_since.is_some_and(|s| s + LINGER <= Instant::now())
            });
            if idle {
                channels.remove(&channel);
            }
            idle
        };
        if !idle {
            continue;
        }
        // Only an existing connection can hold the subscription.
        if let Some(mut conn) = shared.current()
            && let Err(err) = conn.unsubscribe(&channel).await
        {
            tracing::debug!(%channel, error = %err, "unsubscribe failed");
        }
        return;
    }
}

/// Hostile input: any push the connection delivers (what a payload means is the wake
/// registry's, tested there).
#[cfg(test)]
mod props {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};

    use proptest::prelude::*;
    use redis::{PushInfo, PushKind, Value};

    use super::{Channel, Wakes, deliver};

    fn value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Nil),
            any::<i64>().prop_map(Value::Int),
            prop::collection::vec(any::<u8>(), 0..24).prop_map(Value::BulkString),
            "![0-9]{1,5}:tok|tok|!x:tok|[ -~]{0,12}"
                .prop_map(|s| Value::BulkString(s.into_bytes())),
            "[ -~]{0,12}".prop_map(Value::SimpleString),
        ];
        leaf.prop_recursive(2, 8, 4, |inner| {
            prop::collection::vec(inner, 0..4).prop_map(Value::Array)
        })
    }

    fn kind() -> impl Strategy<Value = PushKind> {
        prop::sample::select(vec![
            PushKind::Message,
            PushKind::SMessage,
            PushKind::PMessage,
            PushKind::Subscribe,
            PushKind::Disconnection,
            PushKind::Other("x".to_owned()),
        ])
    }

    proptest! {
        #![proptest_config(crate::backend::hostile::cases(256))]

        #[test]
        fn any_push_is_delivered_without_panicking(kind in kind(), data in prop::collection::vec(value(), 0..4)) {
            let channels = Mutex::new(HashMap::from([("ch".to_owned(), Channel::new())]));
            let wakes = Wakes::default();
            let _named = wakes.register(("ch".to_owned(), "tok".to_owned()));
            let to_channel = matches!(kind, PushKind::Message | PushKind::SMessage);
            let mut data = data;
            if to_channel && !data.is_empty() {
                data[0] = Value::BulkString(b"ch".to_vec());
            }
            deliver(&channels, &wakes, &OnceLock::new(), PushInfo { kind, data });
        }
    }

    /// A message for the named waiter reaches it alone; any other wakes an unnamed one.
    #[tokio::test]
    async fn a_named_message_wakes_its_waiter_and_others_the_channel() {
        let channels = Mutex::new(HashMap::from([("ch".to_owned(), Channel::new())]));
        let unnamed = channels.lock().expect("lock")["ch"].notify.clone();
        let wakes = Wakes::default();
        let named = wakes.register(("ch".to_owned(), "tok".to_owned()));
        let push = |payload: &str| PushInfo {
            kind: PushKind::Message,
            data: vec![
                Value::BulkString(b"ch".to_vec()),
                Value::BulkString(payload.as_bytes().to_vec()),
            ],
        };
        deliver(&channels, &wakes, &OnceLock::new(), push("!9:tok"));
        named.notify().notified().await;
        assert_eq!(named.grants().take(), Some(9));
        deliver(&channels, &wakes, &OnceLock::new(), push("someone-else"));
        unnamed.notified().await;
    }
}
