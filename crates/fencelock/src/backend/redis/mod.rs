//! Redis: the `SET NX PX` lock of the well-known articles, done right, plus fencing and release notification.
//!
//! * Acquire is ONE round trip when the lock is free: `SET key token NX PX ttl` and `INCR`
//!   of the fence counter in one `MULTI`/`EXEC` transaction, no script (the fence is
//!   minted atomically with the grant; a `SET` that fails leaves an unused number, and
//!   fences only have to increase). When the lock is held, the acquire script follows
//!   (it reports the holder's `PTTL`, or queues the caller). A client waiting on the name
//!   already, a Redis Cluster, a client with `min_replicas` and a name with a hash tag of
//!   its own use the script alone: `SET NX PX`, the queue check and `INCR` in one step.
//! * Release is ONE round trip when nobody waits: compare-and-delete plus one `EXISTS`
//!   of the waiter queue. When waiters are queued, a script hands the lock over to the
//!   head of the queue: the key set to the head's token with the head's ttl, the next
//!   fence minted, and a message on the head's client's channel (`<channel>:<waiter
//!   id>`, payload `!<fence>:<token>`) that tells the head it holds the lock (one round
//!   trip for a holder that waited on the name itself, as every holder of a contended
//!   name did; a second one after the compare-and-delete for one that did not). Nobody
//!   waiting, nothing published.
//! * Waiting: a waiter first subscribes to its client's channel, then attempts again in
//!   `wait` mode, which puts it in the lock's waiter queue (FIFO by server time, with a
//!   claim that lapses by itself if the waiter crashes). Every release made while anyone
//!   is queued hands the lock to the head, so one release costs one script across every
//!   client and process, and the new holder sends nothing. The grant without a script
//!   does not look at the queue: a lock that is free while waiters queue (a holder's
//!   lease ran out with waiters queued, or a woken waiter of a `min_replicas` client is
//!   on its way) may go to another client's first attempt ahead of them, as Redisson's
//!   non-fair lock allows; the queue keeps its order, and that holder's release hands
//!   the lock to its head. [`FairLock`](crate::FairLock) never lets anyone ahead. Its lease counts from
//!   its latest attempt that found the lock held (the reply carried the fence counter; a
//!   hand-over counts only with a higher fence, i.e. made after it). A head whose client
//!   no longer listens (`PUBLISH` reaches nobody) is skipped; a waiter that leaves
//!   (cancelled, timed out) withdraws and gives back a lock handed over to it meanwhile.
//!   Clients with `min_replicas` queue to be woken instead (a hand-over is not followed by
//!   `WAIT`): the head then has one second (`WAKE_GRACE`) to come and take the lock with
//!   its own acquire. A release that announces nothing (a foreign client's
//!   compare-and-delete) or a lost message is covered by each waiter's fallback timer: the
//!   holder's remaining ttl (after which the waiter's own attempt finds the lock its own,
//!   if it was handed over).
//! * Extend is compare-and-`PEXPIRE`; the client's engine pipelines every renewal due
//!   (locks, permits, reentrant and read-write holds alike) in one round trip.
//! * Leader election is the plain lock plus the leader's record (a hash, `term` and
//!   `data`, no expiry) under the lock's hash tag: one script writes it unless a greater
//!   term is stored and announces the write on the record's channel; one `HMGET` reads it.
//! * Scripts are sent by SHA (`EVALSHA`), loaded once at connect and again on `NOSCRIPT`.
//! * One multiplexed, self-reconnecting connection carries every command of a client;
//!   a second one, opened on first need, carries the client's pub/sub subscriptions.
//!
//! # Guarantees of this backend
//!
//! Fences strictly increase per name while the fence counter survives: a restart without
//! persistence (or a failover to a replica that had not received the last `INCR`) resets
//! it, and fences may then repeat. Run Redis with `appendonly yes` and `appendfsync always`
//! if fencing must survive restarts. A single Redis master loses locks on failover
//! (replication is asynchronous); see the crate docs' safety section.
//!
//! A server with `maxmemory` and an eviction policy other than `noeviction` can evict a
//! held lock's key (`volatile-*`: lock keys have a TTL) and, under `allkeys-*`, a fence
//! counter too (fence counters never get a TTL, so `volatile-*` keeps them). The client
//! reads `INFO` on connect and reports what it found ([`Redis::config_hazards`]; the
//! `dlock` tool refuses such a server unless `--allow-unsafe-store`).

mod conn;
mod decode;
mod election;
mod fair;
mod pubsub;
mod reentrant;
mod rwlock;
mod scripts;
mod semaphore;
mod sentinel;

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{RedisError, Script, ServerErrorKind};

use crate::backend::hazard::{self, ConfigHazard};
use crate::engine::{Engine, LeaseKind};
use crate::error::{Error, ErrorKind, Result};
use crate::keys::LockKeys;
use crate::raw::{Acquire, LockState, RawFencing, RawInspect, RawLock, ReleaseWatch, Renewal};
use crate::token::Token;

use pubsub::PubSub;
use semaphore::holders;

/// Default bound on establishing a connection.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Default bound on waiting for one reply.
pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(2);

/// A Redis client for locks. Cheap to clone; clones share one connection, one pub/sub
/// connection and one watchdog.
///
/// ```no_run
/// # async fn demo() -> fencelock::Result<()> {
/// let redis = fencelock::backend::Redis::connect("redis://127.0.0.1:6379/0").await?;
/// let lock = fencelock::Lock::new(redis, "orders")?;
/// let guard = lock.lock().await?;
/// println!("fence {}", guard.fencing_token());
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Redis {
    inner: Arc<Inner>,
}

struct Inner {
    /// Replaced when a sentinel reports a new master.
    conn: std::sync::RwLock<conn::Conn>,
    /// A Redis Cluster: shard channels (`SPUBLISH` / `SSUBSCRIBE`) for announcements.
    cluster: bool,
    config: ConnectionManagerConfig,
    scripts: scripts::Scripts,
    engine: Engine,
    replication: Option<Replication>,
    /// Connections of their own for requests followed by `WAIT` (single server only).
    wait_pool: Option<conn::WaitPool>,
    pubsub: PubSub,
    /// Names this client's waiters in the stores' waiter queues (`<id>:<token>`): a
    /// release wakes a waiter on `<channel>:<id>`, one subscription per client and lock.
    waiter_id: String,
    addr: String,
    /// What the servers' configuration can do to locks, read on connect (and again on
    /// a sentinel failover).
    hazards: std::sync::RwLock<Vec<ConfigHazard>>,
}

impl std::fmt::Debug for Redis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Redis")
            .field("addr", &self.inner.addr)
            .finish_non_exhaustive()
    }
}

/// Connection options for [`Redis`]; made by [`Redis::builder`].
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until .connect()"]
pub struct RedisBuilder {
    source: Source,
    connect_timeout: Duration,
    response_timeout: Duration,
    min_replicas: u32,
    replica_timeout: Duration,
    refuse_hazards: bool,
}

/// Where a builder's connection comes from.
#[derive(Clone)]
enum Source {
    /// A URL (every topology).
    Url(String),
    /// The application's own client, and maybe its own connection to share.
    Client(Box<redis::Client>, Option<ConnectionManager>),
}

impl std::fmt::Debug for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            // Never the URL itself: it may carry a password.
            Source::Url(url) => write!(f, "Url({:?})", crate::backend::redact_url(url)),
            Source::Client(client, conn) => f
                .debug_struct("Client")
                .field("addr", &client.get_connection_info().addr().to_string())
                .field("shared_connection", &conn.is_some())
                .finish(),
        }
    }
}

/// How many replicas must acknowledge a grant or renewal, and how long to wait for them.
#[derive(Debug, Clone, Copy)]
struct Replication {
    replicas: u32,
    timeout_ms: u64,
}

impl RedisBuilder {
    /// Bound on establishing the connection (default 2 s). A server that cannot be
    /// reached within it fails [`connect`](RedisBuilder::connect) with `Unavailable`.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Bound on waiting for one reply (default 2 s). A reply that takes longer fails the
    /// call with `TimedOut` (its effect is then unknown; every dlock call is safe to retry).
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// Require `n` replicas to acknowledge every grant and renewal (default 0: don't ask).
    /// After each acquire or extend the backend sends `WAIT n timeout` in the same round
    /// trip; with fewer acknowledgements the acquire fails with
    /// [`ErrorKind::NotReplicated`] (its grant given back) and the renewal counts as
    /// failed.
    ///
    /// `WAIT` narrows the window in which a failover to a replica loses a lock; it does
    /// not close it: the replica may still be behind on other writes, a failover can pick
    /// a replica that did not acknowledge, and a write acknowledged by a replica's memory
    /// is not durable on it. Each `WAIT` runs on a connection of its own (a pool of at
    /// most 64 per client), so the client's other requests never wait behind it (on a
    /// Redis Cluster it shares the cluster connection).
    pub fn min_replicas(mut self, n: u32) -> Self {
        self.min_replicas = n;
        self
    }

    /// Sends the lock traffic over `conn`, a connection the application already has
    /// (made from the same client), instead of opening one: one connection for the
    /// application's commands and its locks. Only for a builder made by
    /// [`Redis::builder_from_client`]; the connection keeps its own response timeout and
    /// reconnection settings (this builder's `response_timeout` then bounds only the
    /// pub/sub and `WAIT` connections). Release announcements still arrive on a pub/sub
    /// connection of dlock's own, opened from the client.
    pub fn connection(mut self, conn: ConnectionManager) -> Self {
        if let Source::Client(_, shared) = &mut self.source {
            *shared = Some(conn);
        }
        self
    }

    /// Fail [`connect`](RedisBuilder::connect) with [`ErrorKind::UnsafeConfig`] if a
    /// server is configured so that it can drop a held lock (`maxmemory` with an
    /// `allkeys-*` or `volatile-*` eviction policy: see
    /// [`Redis::config_hazards`]). Default: connect, and warn (once, with `tracing`).
    pub fn refuse_config_hazards(mut self, refuse: bool) -> Self {
        self.refuse_hazards = refuse;
        self
    }

    /// How long `WAIT` waits for the replicas (default 100 ms).
    pub fn replica_timeout(mut self, timeout: Duration) -> Self {
        self.replica_timeout = timeout;
        self
    }

    /// Connects, loads the scripts and reads the servers' configuration hazards
    /// ([`Redis::config_hazards`]).
    ///
    /// # Errors
    /// * `InvalidArgument`: malformed URL, unsupported scheme, a query parameter dlock
    ///   does not know (it would do nothing), `rediss://` without the `redis-tls`
    ///   feature, zero timeouts;
    /// * `Unavailable`: the server could not be reached within the connect timeout;
    /// * `Backend`: authentication failed, or the user may not run scripts;
    /// * `UnsafeConfig`: with [`refuse_config_hazards`](RedisBuilder::refuse_config_hazards),
    ///   a server can evict held locks.
    pub async fn connect(mut self) -> Result<Redis> {
        if self.connect_timeout.is_zero() || self.response_timeout.is_zero() {
            return Err(Error::invalid("redis timeouts must not be zero"));
        }
        let (target, shared) = match &self.source {
            Source::Url(url) => {
                let (target, options) = parse_url(url)?;
                if self.min_replicas == 0 {
                    self.min_replicas = options.min_replicas.unwrap_or(0);
                }
                (target, None)
            }
            Source::Client(client, shared) => {
                (Target::Node(Node::Single(client.clone())), shared.clone())
            }
        };
        if self.min_replicas > 0
            && (self.replica_timeout.is_zero() || self.replica_timeout >= self.response_timeout)
        {
            return Err(Error::invalid(
                "the replica timeout must be above zero and below the response timeout",
            ));
        }
        let replication = (self.min_replicas > 0).then(|| Replication {
            replicas: self.min_replicas,
            timeout_ms: ttl_ms(self.replica_timeout),
        });
        #[cfg(feature = "redis-tls")]
        if match &self.source {
            Source::Url(url) => url.starts_with("rediss://"),
            Source::Client(client, _) => matches!(
                client.get_connection_info().addr(),
                redis::ConnectionAddr::TcpTls { .. }
            ),
        } {
            // rustls needs a process-wide crypto provider; install ours unless the
            // application already chose one (then this is a no-op).
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(Some(self.response_timeout))
            .set_number_of_retries(2)
            .set_max_delay(Duration::from_millis(500));
        let unavailable = |addr: &str| {
            Error::new(
                ErrorKind::Unavailable,
                format!(
                    "could not connect to redis at {addr} within {:?}",
                    self.connect_timeout
                ),
            )
        };
        let mut sentinel = None;
        let mut master_addr = String::new();
        let (conn, pubsub, addr, wait_pool) = match target {
            Target::Cluster(nodes) => {
                // The seed nodes without their credentials.
                let addr = format!("cluster:{}", conn::cluster_hosts(&nodes).join(","));
                let client = redis::cluster::ClusterClient::builder(nodes.clone())
                    .connection_timeout(self.connect_timeout)
                    .response_timeout(self.response_timeout)
                    .build()
                    .map_err(|e| map_err(e, "configuring the cluster client"))?;
                let conn =
                    tokio::time::timeout(self.connect_timeout, client.get_async_connection())
                        .await
                        .map_err(|_| unavailable(&addr))?
                        .map_err(|e| map_err(e, &format!("connecting to redis at {addr}")))?;
                let pubsub =
                    PubSub::new_cluster(&nodes, self.connect_timeout, self.response_timeout)?;
                // On a cluster, WAIT goes to the key's master on the shared connection.
                (conn::Conn::Cluster(conn), pubsub, addr, None)
            }
            Target::Node(node) => {
                let client = match node {
                    Node::Sentinel(s) => {
                        let client = s.resolve(self.connect_timeout).await?;
                        sentinel = Some(s);
                        client
                    }
                    Node::Single(client) => *client,
                };
                master_addr = client.get_connection_info().addr().to_string();
                let addr = match &sentinel {
                    Some(s) => format!("sentinel:{}", s.master()),
                    None => master_addr.clone(),
                };
                let conn = match shared {
                    Some(conn) => conn,
                    None => tokio::time::timeout(
                        self.connect_timeout,
                        ConnectionManager::new_with_config(client.clone(), config.clone()),
                    )
                    .await
                    .map_err(|_| unavailable(&master_addr))?
                    .map_err(|e| map_err(e, &format!("connecting to redis at {master_addr}")))?,
                };
                let pubsub = PubSub::new(&client, self.connect_timeout, self.response_timeout);
                let wait_pool = replication.map(|_| {
                    conn::WaitPool::new(
                        client.clone(),
                        redis::AsyncConnectionConfig::new()
                            .set_connection_timeout(Some(self.connect_timeout))
                            .set_response_timeout(Some(self.response_timeout)),
                    )
                });
                (conn::Conn::Single(conn), pubsub, addr, wait_pool)
            }
        };
        let cluster = matches!(conn, conn::Conn::Cluster(_));

        let redis = Redis {
            inner: Arc::new(Inner {
                conn: std::sync::RwLock::new(conn),
                cluster,
                config,
                scripts: scripts::Scripts::new(),
                engine: Engine::new(),
                replication,
                pubsub,
                wait_pool,
                waiter_id: Token::random()?.as_str()[..16].to_owned(),
                addr,
                hazards: std::sync::RwLock::new(Vec::new()),
            }),
        };
        redis.load_scripts().await?;
        let hazards = redis.read_hazards(&master_addr).await;
        if self.refuse_hazards {
            hazard::refuse_config_hazards(&hazards)?;
        }
        redis.set_hazards(hazard::found(hazards));
        if let Some(url) = sentinel {
            sentinel::follow(
                Arc::downgrade(&redis.inner),
                url,
                master_addr,
                self.connect_timeout,
            );
        }
        Ok(redis)
    }
}

impl Redis {
    /// Connects with default options. URLs: `redis://[user[:password]@]host[:port][/db]`,
    /// `rediss://…` (TLS, with the `redis-tls` feature), `redis+unix:///path/to.sock`,
    /// `redis+sentinel://…`, `redis+cluster://…`.
    ///
    /// Query parameters: dlock's `min_replicas=N` (as [`RedisBuilder::min_replicas`],
    /// which wins if set; every scheme), and redis-rs's own: `protocol=resp2|resp3`
    /// (`redis://`, `rediss://`, `redis+unix://`) and `db`, `user`, `pass`
    /// (`redis+unix://`). Any other parameter is refused (`InvalidArgument`, naming it),
    /// rather than ignored.
    ///
    /// # Errors
    /// As [`RedisBuilder::connect`].
    pub async fn connect(url: impl Into<String>) -> Result<Redis> {
        Redis::builder(url).connect().await
    }

    /// Connection options for `url`.
    pub fn builder(url: impl Into<String>) -> RedisBuilder {
        RedisBuilder::new(Source::Url(url.into()))
    }

    /// Locks on the server of a `redis::Client` the application already has (its address,
    /// database, credentials and TLS settings), with default options: dlock opens its own
    /// connections from it. To share the application's connection too, use
    /// [`builder_from_client`](Redis::builder_from_client) and
    /// [`connection`](RedisBuilder::connection).
    ///
    /// ```no_run
    /// # async fn demo() -> fencelock::Result<()> {
    /// let client = redis::Client::open("redis://127.0.0.1:6379/0").expect("url");
    /// // … the application uses `client` for its own commands …
    /// let redis = fencelock::backend::Redis::from_client(client.clone()).await?;
    /// let lock = fencelock::Lock::new(redis, "orders")?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`RedisBuilder::connect`].
    pub async fn from_client(client: redis::Client) -> Result<Redis> {
        Redis::builder_from_client(client).connect().await
    }

    /// Connection options for a `redis::Client` the application already has (a single
    /// server; Sentinel and Cluster deployments are reached by URL).
    ///
    /// ```no_run
    /// # async fn demo() -> fencelock::Result<()> {
    /// let client = redis::Client::open("redis://127.0.0.1:6379/0").expect("url");
    /// let shared = client.get_connection_manager().await.expect("connect");
    /// // One connection for the application's commands and its locks:
    /// let redis = fencelock::backend::Redis::builder_from_client(client)
    ///     .connection(shared.clone())
    ///     .connect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn builder_from_client(client: redis::Client) -> RedisBuilder {
        RedisBuilder::new(Source::Client(Box::new(client), None))
    }
}

impl RedisBuilder {
    fn new(source: Source) -> RedisBuilder {
        RedisBuilder {
            source,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            response_timeout: DEFAULT_RESPONSE_TIMEOUT,
            min_replicas: 0,
            replica_timeout: Duration::from_millis(100),
            refuse_hazards: false,
        }
    }
}

impl Redis {
    /// The server's address, as connected.
    pub fn addr(&self) -> &str {
        &self.inner.addr
    }

    /// What the servers' configuration can do to locks and fences, as read on connect
    /// (`INFO`: `maxmemory`, `maxmemory_policy`, `aof_enabled`) on the server, the
    /// master a sentinel names (read again after each failover it follows) or every
    /// master of a cluster (`CLUSTER SLOTS`). Each was logged once as a `tracing`
    /// warning. A user that may not run `INFO` gets a warning that nothing was checked,
    /// and an empty list.
    ///
    /// * `maxmemory` > 0 with an `allkeys-*` policy: held locks and fence counters can be
    ///   evicted ([`HazardKind::EvictsLocksAndFences`](crate::backend::HazardKind));
    /// * `maxmemory` > 0 with a `volatile-*` policy: held locks can be evicted (their keys
    ///   have a TTL); fence counters never get one, so they are kept
    ///   ([`HazardKind::EvictsLocks`](crate::backend::HazardKind));
    /// * no AOF: fences start again after a restart
    ///   ([`HazardKind::FencesNotDurable`](crate::backend::HazardKind)).
    ///
    /// [`refuse_config_hazards`](crate::backend::refuse_config_hazards) turns the first
    /// two into an error. The configuration can change after connect (`CONFIG SET`); it
    /// is not read again.
    pub fn config_hazards(&self) -> Vec<ConfigHazard> {
        self.inner
            .hazards
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn set_hazards(&self, hazards: Vec<ConfigHazard>) {
        *self
            .inner
            .hazards
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = hazards;
    }

    /// Reads `INFO` on the server (`addr`: its address, for a single server or a
    /// sentinel's master) or on every master of a cluster (at once), and returns the
    /// hazards found.
    async fn read_hazards(&self, addr: &str) -> Vec<ConfigHazard> {
        let replies = match self.conn().info_everywhere(addr).await {
            Ok(replies) => replies,
            Err(e) => vec![(addr.to_owned(), Err(e))],
        };
        let mut out = Vec::new();
        for (node, info) in replies {
            match info {
                Ok(text) => out.extend(hazard::redis_info(&node, &text)),
                Err(e) => tracing::warn!(
                    "could not read a server's configuration (INFO: {e}): its eviction \
                     policy and persistence were not checked"
                ),
            }
        }
        out
    }

    /// The nodes whose keys `list` scans: the one server, or every master of a cluster
    /// (by `CLUSTER SLOTS`).
    async fn scan_nodes(&self) -> Result<Vec<Option<(String, u16)>>> {
        if !self.inner.cluster {
            return Ok(vec![None]);
        }
        let slots: redis::Value = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query_async(&mut self.conn())
            .await
            .map_err(|e| map_err(e, "listing the cluster's masters"))?;
        Ok(decode::cluster_masters(&slots)?
            .into_iter()
            .map(Some)
            .collect())
    }

    /// This client's waiter id (see `Inner::waiter_id`).
    pub(super) fn waiter_id(&self) -> &str {
        &self.inner.waiter_id
    }

    /// The channel on which this client's waiters of `keys` are woken.
    fn waiter_channel(&self, keys: &LockKeys) -> String {
        format!("{}:{}", keys.channel(), self.inner.waiter_id)
    }

    /// `'1'` if a release may hand the lock (or permits) over to this client's queued
    /// waiters in its own step; `'0'` if they must be woken and take it themselves: the
    /// client waits for replicas after every grant, and a hand-over is not followed by
    /// `WAIT`.
    fn hand_over(&self) -> &'static str {
        if self.inner.replication.is_none() {
            "1"
        } else {
            "0"
        }
    }

    /// Waiter `token` of `keys` was told the lock is held when the name's counter stood at
    /// `counter`: hand-overs it hears of from then on must carry a higher one.
    fn raise_floor(&self, keys: &LockKeys, token: &Token, counter: i64) {
        self.inner.pubsub.raise_floor(
            &self.waiter_channel(keys),
            token.as_str(),
            u64::try_from(counter).unwrap_or(0),
        );
    }

    /// The command that announces a release: sharded on a cluster.
    fn publish_cmd(&self) -> &'static str {
        if self.inner.cluster {
            "SPUBLISH"
        } else {
            "PUBLISH"
        }
    }

    fn conn(&self) -> conn::Conn {
        self.inner
            .conn
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Runs a script that grants or renews (`EVALSHA` with `keys` and `args`), followed
    /// in the same round trip by `WAIT` when replicas must acknowledge. Returns the
    /// script's reply and whether enough replicas acknowledged (always true without
    /// `min_replicas`).
    pub(super) async fn write<T: redis::FromRedisValue>(
        &self,
        script: &Script,
        keys: &[&str],
        args: &[&dyn ToArg],
        doing: &str,
    ) -> Result<(T, bool)> {
        self.run(script, keys, args, doing, true).await
    }

    /// Runs a script that grants nothing (a release, a withdrawal): `EVALSHA`, never
    /// followed by `WAIT`.
    pub(super) async fn eval<T: redis::FromRedisValue>(
        &self,
        script: &Script,
        keys: &[&str],
        args: &[&dyn ToArg],
        doing: &str,
    ) -> Result<T> {
        Ok(self.run(script, keys, args, doing, false).await?.0)
    }

    /// `EVALSHA` built in one buffer (no per-argument copies), loaded again on
    /// `NOSCRIPT`; followed by `WAIT` if `replicate` and replicas must acknowledge.
    async fn run<T: redis::FromRedisValue>(
        &self,
        script: &Script,
        keys: &[&str],
        args: &[&dyn ToArg],
        doing: &str,
        replicate: bool,
    ) -> Result<(T, bool)> {
        // Sized once: growing the buffer argument by argument cost about a dozen
        // reallocations per call.
        let bytes = 7
            + 40
            + 2
            + keys.iter().map(|k| k.len()).sum::<usize>()
            + args.iter().map(|a| a.len_hint()).sum::<usize>();
        let mut cmd = redis::Cmd::with_capacity(3 + keys.len() + args.len(), bytes);
        cmd.arg("EVALSHA")
            .arg(script.get_hash())
            .arg(keys.len())
            .arg(keys);
        for a in args {
            a.push_to(&mut cmd);
        }
        let replication = self.inner.replication.filter(|_| replicate);
        let mut conn = self.conn();
        for round in 0..2 {
            let reply = match replication {
                None => cmd.query_async::<T>(&mut conn).await.map(|t| (t, true)),
                Some(r) => {
                    let mut pipe = redis::pipe();
                    pipe.add_command(cmd.clone())
                        .cmd("WAIT")
                        .arg(r.replicas)
                        .arg(r.timeout_ms);
                    // Boxed: only with `min_replicas` (see `acquire_lock`).
                    Box::pin(self.query_waiting::<(T, i64)>(&pipe, &mut conn))
                        .await
                        .map(|(t, acks)| (t, acks >= i64::from(r.replicas)))
                }
            };
            match reply {
                Err(e)
                    if round == 0
                        && e.kind() == redis::ErrorKind::Server(ServerErrorKind::NoScript) =>
                {
                    // Boxed: rare, and inline it would make every script call's future
                    // larger.
                    Box::pin(script.prepare_invoke().load_async(&mut conn))
                        .await
                        .map_err(|e| map_err(e, "reloading a script"))?;
                }
                other => return other.map_err(|e| map_err(e, doing)),
            }
        }
        Err(Error::new(
            ErrorKind::Backend,
            "script missing after reload",
        ))
    }

    /// Runs a pipeline that ends in `WAIT` on a pooled connection of its own, so that the
    /// shared connection never waits behind it (on a cluster: on `conn`).
    async fn query_waiting<T: redis::FromRedisValue>(
        &self,
        pipe: &redis::Pipeline,
        conn: &mut conn::Conn,
    ) -> redis::RedisResult<T> {
        match &self.inner.wait_pool {
            Some(pool) => {
                let mut pooled = pool.take().await?;
                let out = pipe.query_async(&mut pooled.conn).await;
                if out.is_ok() {
                    pool.put_back(pooled);
                }
                out
            }
            None => pipe.query_async(conn).await,
        }
    }

    async fn load_scripts(&self) -> Result<()> {
        let mut conn = self.conn();
        for script in self.inner.scripts.all() {
            script
                .prepare_invoke()
                .load_async(&mut conn)
                .await
                .map_err(|e| map_err(e, "loading dlock's Lua scripts (SCRIPT LOAD)"))?;
        }
        Ok(())
    }
}

/// A script argument (object-safe stand-in for `ToRedisArgs`).
pub(super) trait ToArg: Sync {
    fn push_to(&self, cmd: &mut redis::Cmd);

    /// About how many bytes it takes (for sizing the command once).
    fn len_hint(&self) -> usize {
        20
    }
}

impl ToArg for &str {
    fn push_to(&self, cmd: &mut redis::Cmd) {
        cmd.arg(*self);
    }

    fn len_hint(&self) -> usize {
        self.len()
    }
}

impl ToArg for u64 {
    fn push_to(&self, cmd: &mut redis::Cmd) {
        cmd.arg(*self);
    }
}

impl ToArg for u32 {
    fn push_to(&self, cmd: &mut redis::Cmd) {
        cmd.arg(*self);
    }
}

/// The error of a grant or renewal that too few replicas acknowledged.
pub(super) fn not_replicated(keys: &LockKeys, what: &str) -> Error {
    Error::new(
        ErrorKind::NotReplicated,
        format!(
            "{what} of {:?} was not acknowledged by enough replicas in time (WAIT)",
            keys.name()
        ),
    )
    .retryable(true)
}

/// `url` for messages, its password (user info, or redis+unix's `pass=`) hidden.
fn redact(url: &str) -> String {
    super::redact_url(url)
}

/// What a URL names, parsed without any network access.
enum Target {
    /// A single server, or the master the sentinels name.
    Node(Node),
    /// The seed nodes of a Redis Cluster (`redis://` URLs carrying the credentials).
    Cluster(Vec<String>),
}

enum Node {
    Single(Box<redis::Client>),
    Sentinel(sentinel::SentinelUrl),
}

/// Parses a `redis://`, `rediss://`, `redis+unix://`, `redis+sentinel://` or
/// `redis+cluster://` URL. Every malformed URL is `InvalidArgument`, its message without
/// the password.
fn parse_url(url: &str) -> Result<(Target, UrlOptions)> {
    let scheme = url.split_once("://").map(|(scheme, _)| scheme);
    // The parameters redis-rs takes itself, by scheme; dlock's own are taken off.
    let passed: &[&str] = match scheme {
        Some("redis" | "rediss") => &["protocol"],
        Some("redis+unix" | "unix") => &["db", "user", "pass", "protocol"],
        _ => &[],
    };
    let (url, options) = take_params(url, passed)?;
    let url = url.as_str();
    let target = match scheme {
        Some("redis+cluster") => {
            let nodes = conn::cluster_nodes(url)?;
            // Checks every node's URL (no connection is made).
            redis::cluster::ClusterClient::new(nodes.clone()).map_err(|e| {
                Error::invalid(format!("bad cluster URL {:?}: {e}", redact(url))).with_source(e)
            })?;
            Ok::<_, Error>(Target::Cluster(nodes))
        }
        Some("redis+sentinel") => {
            let sentinel = sentinel::SentinelUrl::parse(url)?;
            sentinel.check()?;
            Ok(Target::Node(Node::Sentinel(sentinel)))
        }
        Some("redis" | "rediss" | "redis+unix" | "unix") => redis::Client::open(url)
            .map(|client| Target::Node(Node::Single(Box::new(client))))
            .map_err(|e| {
                Error::invalid(format!("bad redis URL {:?}: {e}", redact(url))).with_source(e)
            }),
        _ => Err(Error::invalid(format!(
            "unsupported redis URL {:?}: expected redis://, rediss://, redis+unix://, \
             redis+sentinel:// or redis+cluster://",
            redact(url)
        ))),
    }?;
    Ok((target, options))
}

/// dlock's own query parameters of a Redis URL.
#[derive(Debug, Default, PartialEq, Eq)]
struct UrlOptions {
    /// `min_replicas=N`: as [`RedisBuilder::min_replicas`].
    min_replicas: Option<u32>,
}

/// Takes dlock's own query parameters (`min_replicas`) off `url`, keeps those in
/// `passed` (redis-rs's own for the scheme), and refuses any other: redis-rs would
/// ignore it, so an option the user meant would silently do nothing. The error names
/// the parameter, never its value (it could be a secret) nor the URL's password.
fn take_params(url: &str, passed: &[&str]) -> Result<(String, UrlOptions)> {
    // The query starts at the first '?' after the user info (a password may hold one)
    // and ends at the fragment (`rediss://…#insecure`).
    let after_auth = url.rfind('@').map_or(0, |at| at + 1);
    let fragment = url[after_auth..].find('#').map(|i| after_auth + i);
    let Some(q) = url[after_auth..fragment.unwrap_or(url.len())]
        .find('?')
        .map(|i| after_auth + i)
    else {
        return Ok((url.to_owned(), UrlOptions::default()));
    };
    let end = fragment.unwrap_or(url.len());
    let mut options = UrlOptions::default();
    let mut kept = Vec::new();
    for pair in url[q + 1..end].split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        // The URL up to its query: the values are not shown (one could be a secret).
        let bad =
            |why: String| Error::invalid(format!("bad redis URL {:?}: {why}", redact(&url[..q])));
        match name {
            "min_replicas" => {
                let n = value.parse::<u32>().map_err(|_| {
                    bad(format!(
                        "min_replicas must be a whole number of replicas, not {value:?}"
                    ))
                })?;
                options.min_replicas = Some(n);
            }
            _ if passed.contains(&name) => kept.push(pair),
            _ => {
                let mut known = vec!["min_replicas"];
                known.extend_from_slice(passed);
                return Err(bad(format!(
                    "unknown parameter {name:?} (this scheme takes: {})",
                    known.join(", ")
                )));
            }
        }
    }
    let mut out = url[..q].to_owned();
    if !kept.is_empty() {
        out.push('?');
        out.push_str(&kept.join("&"));
    }
    out.push_str(&url[end..]);
    Ok((out, options))
}

fn ttl_ms(ttl: Duration) -> u64 {
    u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// Turns a redis-rs error into a dlock error, keeping it as the source.
fn map_err(err: RedisError, doing: &str) -> Error {
    let detail = err.to_string();
    let (kind, message, retryable) = if err.is_timeout() {
        (
            ErrorKind::TimedOut,
            format!("{doing}: no reply in time"),
            true,
        )
    } else if err.is_io_error() || err.is_connection_refusal() || err.is_connection_dropped() {
        (ErrorKind::Unavailable, format!("{doing}: {detail}"), true)
    } else if err.kind() == redis::ErrorKind::Server(ServerErrorKind::NoPerm)
        || detail.contains("NOPERM")
    {
        (
            ErrorKind::Backend,
            format!(
                "{doing}: the redis user may not run a command dlock needs, or touch its keys or channels (scripting: EVALSHA, SCRIPT LOAD and what the scripts run; docs/redis-acl.md lists it all): {detail}"
            ),
            false,
        )
    } else if detail.contains("WRONGTYPE") {
        (
            ErrorKind::Backend,
            format!(
                "{doing}: a key of the lock holds a value of the wrong type (not a dlock lock): {detail}"
            ),
            false,
        )
    } else if err.kind() == redis::ErrorKind::AuthenticationFailed {
        (
            ErrorKind::Backend,
            format!("{doing}: authentication failed: {detail}"),
            false,
        )
    } else {
        let retryable = matches!(
            err.kind(),
            redis::ErrorKind::Server(
                ServerErrorKind::TryAgain
                    | ServerErrorKind::BusyLoading
                    | ServerErrorKind::MasterDown
                    | ServerErrorKind::ClusterDown
            )
        );
        (ErrorKind::Backend, format!("{doing}: {detail}"), retryable)
    };
    Error::new(kind, message)
        .retryable(retryable)
        .with_source(err)
}

/// What an acquire script does when the lock is taken (its `mode` argument).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Attempt {
    /// Reports the lock held.
    Try,
    /// Queues the caller (or keeps its place) among the waiters.
    Wait,
}

impl Attempt {
    /// `Wait` if the caller queues.
    pub(super) fn queue(queue: bool) -> Attempt {
        if queue { Attempt::Wait } else { Attempt::Try }
    }

    /// The scripts' word for it.
    pub(super) fn as_arg(self) -> &'static str {
        match self {
            Attempt::Try => "try",
            Attempt::Wait => "wait",
        }
    }
}

/// Whose hold a release script ends (its `mode` argument).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ending {
    /// The caller's own hold (compared on its token).
    Own,
    /// A waiter leaves the queue (and passes on a turn it was given).
    Leave,
    /// Whoever holds it (an operator's force-unlock).
    Force,
}

impl Ending {
    /// The scripts' word for it.
    pub(super) fn as_arg(self) -> &'static str {
        match self {
            Ending::Own => "own",
            Ending::Leave => "leave",
            Ending::Force => "force",
        }
    }
}

impl Redis {
    /// Whether the plain lock of `keys` may be granted without a script
    /// ([`acquire_fast`](Redis::acquire_fast)): one server (not a cluster), no
    /// `min_replicas` (a grant is followed by `WAIT` in the script's round trip), and a
    /// name whose fence counter never moved (no hash tag: a moved counter is started from
    /// its old place by the script's `fence.lua`, once).
    fn grants_fast(&self, keys: &LockKeys) -> bool {
        !self.inner.cluster
            && self.inner.replication.is_none()
            && matches!(keys.legacy_fence(), std::borrow::Cow::Borrowed(_))
    }

    /// Whether this client waited on the plain lock of `keys` lately (it still listens on
    /// the lock's waiter channel): the name is contended, so its release goes straight to
    /// the script that hands it over.
    fn waits_on(&self, keys: &LockKeys) -> bool {
        self.inner.pubsub.listens() && self.inner.pubsub.subscribed(&self.waiter_channel(keys))
    }

    /// The uncontended grant without a script: `SET key token NX PX ttl` and `INCR` of
    /// the fence counter in one `MULTI`/`EXEC` transaction (one round trip, atomic: no
    /// other command runs between them, so the fence of a grant is minted before any later
    /// grant of the name can be made, and it is above every fence minted before). A
    /// failed `SET` still increments the counter: the number is unused, and fences only
    /// have to increase. `None` when the lock was not granted (held, or the counter is
    /// not a positive integer: the grant is then given back): the caller runs the
    /// acquire script, which tells how long the lock is held, recognises the repeat of a
    /// grant whose reply was lost, and reports a broken counter.
    ///
    /// No queue check: a free lock goes to whoever asks, even while waiters queue. That
    /// only happens after a holder's lease ran out with waiters queued (it crashed, or
    /// lost its lease), or while a woken waiter (of a client with `min_replicas`) comes to
    /// take it; every release with waiters queued hands the lock over in its own script.
    async fn acquire_fast(
        &self,
        keys: &LockKeys,
        token: &Token,
        ttl: Duration,
    ) -> Result<Option<Acquire>> {
        use redis::Value;
        // Each sized once, as in `run`.
        let mut set = redis::Cmd::with_capacity(6, 32 + keys.lock().len() + token.as_str().len());
        set.arg("SET")
            .arg(keys.lock())
            .arg(token.as_str())
            .arg("NX")
            .arg("PX")
            .arg(ttl_ms(ttl));
        let mut incr = redis::Cmd::with_capacity(2, 4 + keys.fence().len());
        incr.arg("INCR").arg(keys.fence());
        let mut pipe = redis::Pipeline::with_capacity(2);
        pipe.atomic()
            .add_command(set)
            .add_command(incr)
            .ignore_errors();
        let reply: Vec<Value> = pipe
            .query_async(&mut self.conn())
            .await
            .map_err(|e| map_err(e, "acquiring"))?;
        match reply.as_slice() {
            [Value::Okay, Value::Int(fence)] if *fence > 0 => Ok(Some(Acquire::Acquired {
                fence: u64::try_from(*fence).unwrap_or(0),
            })),
            [Value::Okay, _] => {
                // Granted, but the counter is broken: give the grant back; the script's
                // attempt reports why. (Boxed: off the uncontended path, it would make
                // every grant's future larger.)
                Box::pin(self.release_lock(keys, token.as_str(), Ending::Own, Duration::ZERO))
                    .await?;
                Ok(None)
            }
            _ => Ok(None),
        }
    }

    /// One attempt at the plain lock (queueing the caller if it must wait, with `Wait`).
    async fn acquire_lock(
        &self,
        keys: &LockKeys,
        token: &Token,
        ttl: Duration,
        mode: Attempt,
    ) -> Result<Acquire> {
        // An attempt that does not queue (every first attempt of a client that is not
        // waiting on the name already) tries the grant without a script first.
        if mode == Attempt::Try
            && self.grants_fast(keys)
            && let Some(granted) = self.acquire_fast(keys, token, ttl).await?
        {
            return Ok(granted);
        }
        // Boxed: the script's attempt (a waiter's, or one that found the lock held) is off
        // the uncontended path, and inline it would double the size of every grant's
        // future (moved, whole, wherever it is awaited).
        Box::pin(self.acquire_script(keys, token, ttl, mode)).await
    }

    /// [`acquire_lock`](Redis::acquire_lock)'s attempt through the acquire script.
    async fn acquire_script(
        &self,
        keys: &LockKeys,
        token: &Token,
        ttl: Duration,
        mode: Attempt,
    ) -> Result<Acquire> {
        let (q, c) = (waiters(keys), claims(keys));
        // A release hands the lock over to a queued waiter in its own step, unless the
        // waiter's client waits for replicas (the hand-over is not followed by WAIT): it
        // is woken and takes the lock with its own acquire.
        let (reply, replicated): (Vec<i64>, bool) = self
            .write(
                &self.inner.scripts.acquire,
                &[keys.lock(), keys.fence(), &q, &c, &keys.legacy_fence()],
                &[
                    &token.as_str(),
                    &ttl_ms(ttl),
                    &mode.as_arg(),
                    &ttl_ms(waiter_grace(ttl)),
                    &self.waiter_id(),
                    &self.hand_over(),
                ],
                "acquiring",
            )
            .await?;
        if let [0, _, counter] = reply.as_slice()
            && mode == Attempt::Wait
        {
            self.raise_floor(keys, token, *counter);
        }
        if !replicated && reply.first() == Some(&1) {
            let _ = self.release(keys, token).await;
            return Err(not_replicated(keys, "the grant"));
        }
        if let Some(fence) = tampered_fence(&reply) {
            // A fence counter someone set to zero or below: fences would repeat.
            let _ = self.release(keys, token).await;
            return Err(Error::new(
                ErrorKind::Backend,
                format!(
                    "fence counter {} is {fence}, not positive: it was tampered with, and \
                     fences from it would not be unique",
                    keys.fence()
                ),
            ));
        }
        parse_acquire(&reply, "acquire")
    }

    /// The plain lock's release script ending `mode` (`ttl` is the leaving waiter's).
    async fn release_lock(
        &self,
        keys: &LockKeys,
        token: &str,
        mode: Ending,
        ttl: Duration,
    ) -> Result<bool> {
        let (q, c) = (waiters(keys), claims(keys));
        let done: i64 = self
            .eval(
                &self.inner.scripts.release,
                &[keys.lock(), &q, &c, keys.fence(), &keys.legacy_fence()],
                &[
                    &token,
                    &keys.channel(),
                    &mode.as_arg(),
                    &ttl_ms(WAKE_GRACE),
                    &self.waiter_id(),
                    &ttl_ms(ttl),
                    &self.publish_cmd(),
                ],
                "releasing",
            )
            .await?;
        Ok(done == 1)
    }
}

/// The plain lock's waiter queue (token -> arrival).
pub(super) fn waiters(keys: &LockKeys) -> String {
    keys.companion("waiters")
}

/// The plain lock's waiter claims (token -> claim expiry).
pub(super) fn claims(keys: &LockKeys) -> String {
    keys.companion("claims")
}

/// Every key (`key <key>`) and channel (`channel <channel>`) that `primitive`'s lock
/// `keys` uses, named by the helpers the backend itself calls; the channels a waiter's
/// client or a fair lock's waiter listens on, for a sample waiter id and token. Not in
/// it: [`LockKeys::legacy_fence`], read (never written) once to start a missing fence
/// counter above an older version's.
#[cfg(test)]
pub(crate) fn key_set(primitive: &str, keys: &LockKeys) -> Vec<String> {
    const ID: &str = "0123456789abcdef";
    let waiter = |k: &LockKeys| format!("{}:{ID}", k.channel());
    let mut all = vec![keys.lock().to_owned(), keys.fence().to_owned()];
    let mut channels = vec![keys.channel().to_owned()];
    match primitive {
        "semaphore" => {
            all.extend([
                holders(keys),
                semaphore::permit_count(keys),
                semaphore::permits_used(keys),
                waiters(keys),
                claims(keys),
            ]);
            channels.push(waiter(keys));
        }
        "rwlock" => {
            all.extend([rwlock::readers(keys), rwlock::writers(keys)]);
            channels.extend([keys.side("r").channel().to_owned(), waiter(&keys.side("w"))]);
        }
        "fair" => {
            all.extend([fair::queue(keys), fair::claims(keys)]);
            channels.push(keys.side(ID).channel().to_owned());
        }
        "election" => {
            all.extend([waiters(keys), claims(keys), election::record(keys)]);
            channels.extend([
                waiter(keys),
                keys.side(crate::raw::RECORD).channel().to_owned(),
            ]);
        }
        _ => {
            all.extend([waiters(keys), claims(keys)]);
            channels.push(waiter(keys));
        }
    }
    all.into_iter()
        .map(|k| format!("key {k}"))
        .chain(channels.into_iter().map(|c| format!("channel {c}")))
        .collect()
}

pub(super) use crate::engine::wake::{WAKE_GRACE, waiter_grace};

/// Decodes the reply every acquire script returns: `{1, fence}` granted (fence 0 where
/// the primitive has none), `{0, wait}` not granted, wait = ms until it may be (-1: no
/// telling); the plain lock and the semaphore add their hand-over counter (the fence
/// counter): `{0, wait, counter}`.
pub(super) fn parse_acquire(reply: &[i64], script: &str) -> Result<Acquire> {
    match reply {
        [1, fence] if *fence >= 0 => Ok(Acquire::Acquired {
            fence: u64::try_from(*fence).unwrap_or(0),
        }),
        [0, wait] | [0, wait, _] => Ok(Acquire::Held {
            remaining: u64::try_from(*wait).ok().map(Duration::from_millis),
        }),
        other => Err(Error::new(
            ErrorKind::Backend,
            format!("unexpected reply from the {script} script: {other:?}"),
        )),
    }
}

/// The fence of a grant (`{1, fence}`) that is not positive, from a primitive that mints a
/// fence for every grant (the plain and reentrant locks): its counter was tampered with
/// (set to zero or below), and fences from it would repeat.
pub(super) fn tampered_fence(reply: &[i64]) -> Option<i64> {
    match reply {
        [1, fence] if *fence < 1 => Some(*fence),
        _ => None,
    }
}

/// Milliseconds of a `TIME` reply (saturating: a garbled reply must not overflow).
pub(super) fn server_ms(secs: i64, micros: i64) -> i64 {
    secs.saturating_mul(1000).saturating_add(micros / 1000)
}

/// The plain lock on Redis: `SET NX PX` + fence (one transaction) while nobody waits,
/// compare-and-delete to release; waiters queue in the
/// store (FIFO, each with a claim that lapses if it crashes) and each release hands the
/// lock over to the head in its own step (key, fence and a message on the head's client's
/// channel that tells it the fence): one waiter per release across every client, and no
/// round trip of the waiter's between the release and its hold.
impl RawLock for Redis {
    const QUEUES_WAITERS: bool = true;
    const QUEUES_ONLY_LISTENERS: bool = true;

    async fn acquire(&self, keys: &LockKeys, token: &Token, ttl: Duration) -> Result<Acquire> {
        self.acquire_lock(keys, token, ttl, Attempt::Try).await
    }

    async fn acquire_or_queue(
        &self,
        keys: &LockKeys,
        token: &Token,
        ttl: Duration,
    ) -> Result<Acquire> {
        self.acquire_lock(keys, token, ttl, Attempt::Wait).await
    }

    /// Compare-and-delete with one `EXISTS` of the waiter queue (`release_fast.lua`); only
    /// if waiters queue, a second script hands the lock over (`release.lua`). A client that
    /// waited on the name lately (the name is contended) runs the hand-over script at once.
    async fn release(&self, keys: &LockKeys, token: &Token) -> Result<bool> {
        if !self.waits_on(keys) {
            let released: i64 = self
                .eval(
                    &self.inner.scripts.release_fast,
                    &[keys.lock(), &waiters(keys)],
                    &[&token.as_str()],
                    "releasing",
                )
                .await?;
            if released >= 0 {
                return Ok(released == 1);
            }
        }
        // Boxed: the hand-over is off the uncontended path (see `acquire_lock`).
        Box::pin(self.release_lock(keys, token.as_str(), Ending::Own, Duration::ZERO)).await
    }

    /// RedLock's own request: a bare `SET NX PX` (no script, no fence, no queue). A
    /// refusal does not tell the holder's remaining ttl (the quorum backs off anyway).
    async fn acquire_member(
        &self,
        keys: &LockKeys,
        token: &Token,
        ttl: Duration,
    ) -> Result<Acquire> {
        let mut set = redis::cmd("SET");
        set.arg(keys.lock())
            .arg(token.as_str())
            .arg("NX")
            .arg("PX")
            .arg(ttl_ms(ttl));
        let ok: Option<String> = set
            .query_async(&mut self.conn())
            .await
            .map_err(|e| map_err(e, "acquiring (quorum member)"))?;
        Ok(match ok {
            Some(_) => Acquire::Acquired { fence: 0 },
            None => Acquire::Held { remaining: None },
        })
    }

    /// RedLock's release: compare-and-delete, nothing announced.
    async fn release_member(&self, keys: &LockKeys, token: &Token) -> Result<bool> {
        let released: i64 = self
            .eval(
                &self.inner.scripts.release_member,
                &[keys.lock()],
                &[&token.as_str()],
                "releasing (quorum member)",
            )
            .await?;
        Ok(released == 1)
    }

    async fn abandon(&self, keys: &LockKeys, token: &Token, ttl: Duration) -> Result<()> {
        self.release_lock(keys, token.as_str(), Ending::Leave, ttl)
            .await
            .map(|_| ())
    }

    async fn extend(&self, keys: &LockKeys, token: &Token, ttl: Duration) -> Result<bool> {
        let (extended, replicated): (i64, bool) = self
            .write(
                &self.inner.scripts.extend,
                &[keys.lock()],
                &[&token.as_str(), &ttl_ms(ttl)],
                "extending",
            )
            .await?;
        if extended == 1 && !replicated {
            return Err(not_replicated(keys, "the renewal"));
        }
        Ok(extended == 1)
    }

    /// All renewals in one pipelined round trip of `EVALSHA`s, each of its primitive's
    /// renewal script: locks, permits, reentrant holds and read-write holds together.
    async fn extend_many(&self, renewals: &[Renewal]) -> Vec<Result<bool>> {
        let scripts = &self.inner.scripts;
        let mut pipe = redis::pipe();
        for r in renewals {
            let (script, keys) = match r.kind {
                LeaseKind::Permits => (
                    &scripts.sem_extend,
                    vec![r.keys.lock().to_owned(), holders(&r.keys)],
                ),
                LeaseKind::Reentrant => (&scripts.re_extend, vec![r.keys.lock().to_owned()]),
                LeaseKind::ReadWrite => (
                    &scripts.rw_extend,
                    vec![r.keys.lock().to_owned(), rwlock::readers(&r.keys)],
                ),
                _ => (&scripts.extend, vec![r.keys.lock().to_owned()]),
            };
            pipe.cmd("EVALSHA")
                .arg(script.get_hash())
                .arg(keys.len())
                .arg(keys)
                .arg(r.token.as_str())
                .arg(ttl_ms(r.ttl));
        }
        if let Some(r) = self.inner.replication {
            pipe.cmd("WAIT").arg(r.replicas).arg(r.timeout_ms);
        }
        pipe.ignore_errors();
        let mut conn = self.conn();
        for round in 0..2 {
            let sent = if self.inner.replication.is_some() {
                self.query_waiting(&pipe, &mut conn).await
            } else {
                pipe.query_async(&mut conn).await
            };
            let replies: Vec<redis::Value> = match sent {
                Ok(replies) => replies,
                Err(e) => {
                    let err = map_err(e, "renewing leases");
                    return renewals
                        .iter()
                        .map(|_| Err(Error::new(err.kind(), err.message().to_owned())))
                        .collect();
                }
            };
            if round == 0 && decode::lacks_a_script(&replies) {
                // The script cache was flushed: load it again and resend. Renewal is
                // idempotent, so the ones that did go through are unharmed by a repeat.
                if let Err(err) = self.load_scripts().await {
                    return renewals
                        .iter()
                        .map(|_| Err(Error::new(err.kind(), err.message().to_owned())))
                        .collect();
                }
                continue;
            }
            return decode::renewal_results(
                replies,
                renewals,
                self.inner.replication.map(|r| r.replicas),
            );
        }
        renewals
            .iter()
            .map(|_| {
                Err(Error::new(
                    ErrorKind::Backend,
                    "renewal script missing after reload",
                ))
            })
            .collect()
    }

    async fn watch(&self, keys: &LockKeys) -> Result<ReleaseWatch> {
        self.inner.pubsub.watch(keys.channel()).await
    }

    /// A queued waiter listens on its client's channel of the lock (one subscription per
    /// client and lock, kept a while between waits); a release names the waiter it wakes.
    async fn watch_for(&self, keys: &LockKeys, token: &Token) -> Result<ReleaseWatch> {
        self.inner
            .pubsub
            .watch_named(&self.waiter_channel(keys), token.as_str())
            .await
    }

    fn watch_ready(&self, keys: &LockKeys, token: &Token) -> Option<ReleaseWatch> {
        // Called before every wait's first attempt, uncontended ones too: a client that
        // listens on nothing pays no channel name and no lookup.
        if !self.inner.pubsub.listens() {
            return None;
        }
        self.inner
            .pubsub
            .ready(&self.waiter_channel(keys), token.as_str())
    }

    fn store_id(&self) -> String {
        format!("redis:{}", self.inner.addr)
    }

    fn store_label(&self) -> &'static str {
        "redis"
    }

    fn engine(&self) -> &Engine {
        &self.inner.engine
    }
}

/// Fences come from `INCR` in the same `MULTI`/`EXEC` transaction or script as the
/// `SET NX`; see the module docs for what resets the counter.
impl RawFencing for Redis {}

impl RawInspect for Redis {
    const KINDS_TOLD_APART_UNDER_ONE_PREFIX: bool = true;

    crate::raw::inspect_each_kind!();

    async fn list(&self, prefix: &str, pattern: &str, limit: usize) -> Result<Vec<String>> {
        crate::observe::listed(self.store_label(), pattern, async move {
            if limit == 0 {
                return Ok(Vec::new());
            }
            // Lock keys (`<prefix><name>`) and companion keys (`{<lock key>}:<suffix>`,
            // `{<tag>}<length>:<lock key>:<suffix>`) alike: the lock key somewhere in the
            // key; each found key is then read back to its lock's name (`listed_name`).
            let mut escaped = String::with_capacity(prefix.len() + pattern.len() + 2);
            escaped.push('*');
            for c in prefix.chars() {
                if matches!(c, '*' | '?' | '[' | ']' | '\\') {
                    escaped.push('\\');
                }
                escaped.push(c);
            }
            escaped.push_str(pattern);
            escaped.push('*');
            let mut conn = self.conn();
            let mut names = Vec::new();
            let mut seen = std::collections::HashSet::new();
            for node in self.scan_nodes().await? {
                let mut cursor: u64 = 0;
                loop {
                    let mut scan = redis::cmd("SCAN");
                    scan.arg(cursor)
                        .arg("MATCH")
                        .arg(&escaped)
                        .arg("COUNT")
                        .arg(1000);
                    let page: redis::Value = conn
                        .query_on(node.as_ref(), scan)
                        .await
                        .map_err(|e| map_err(e, "listing locks (SCAN)"))?;
                    let (next, keys) = decode::scan_page(&page)?;
                    let keys: Vec<String> = keys
                        .into_iter()
                        .filter(|k| listed_name(prefix, pattern, k).is_some())
                        .collect();
                    if !keys.is_empty() {
                        // Lock keys always carry an expiry; a key without one under the
                        // prefix is not a lock.
                        let mut pipe = redis::pipe();
                        for k in &keys {
                            pipe.pttl(k);
                        }
                        let ttls: Vec<redis::Value> = conn
                            .pipe_on(node.as_ref(), pipe, keys.len())
                            .await
                            .map_err(|e| map_err(e, "listing locks (PTTL)"))?;
                        for key in decode::expiring_keys(keys, &ttls)? {
                            if let Some(name) = listed_name(prefix, pattern, &key)
                                && seen.insert(name.to_owned())
                            {
                                names.push(name.to_owned());
                                if names.len() >= limit {
                                    return Ok(names);
                                }
                            }
                        }
                    }
                    if next == 0 {
                        break;
                    }
                    cursor = next;
                }
            }
            Ok(names)
        })
        .await
    }
}

/// The plain lock's inspection, for [`RawInspect`].
impl Redis {
    pub(crate) async fn inspect_plain(&self, keys: &LockKeys) -> Result<LockState> {
        let reply: Vec<redis::Value> = redis::pipe()
            .atomic()
            .get(keys.lock())
            .pttl(keys.lock())
            .get(keys.fence())
            .zcard(waiters(keys))
            .query_async(&mut self.conn())
            .await
            .map_err(|e| map_err(e, "inspecting"))?;
        decode::lock_state(reply)
    }

    /// Deletes the holder (a plain lock's string or a reentrant lock's hash) and hands the
    /// lock over to the head of the queue (or wakes it), in one script.
    pub(crate) async fn force_unlock_plain(&self, keys: &LockKeys) -> Result<bool> {
        self.release_lock(keys, "", Ending::Force, Duration::ZERO)
            .await
    }
}

/// The name under `prefix` matching `pattern` that `key` stands for in a listing, if any: a
/// lock key's name, or the name of the lock whose readers `key` holds (a read-write lock
/// held by readers alone has no lock key). Other companion keys (fence counters, queues,
/// holders…) stand for nothing: their locks have lock keys.
fn listed_name<'a>(prefix: &str, pattern: &str, key: &'a str) -> Option<&'a str> {
    let lock = match crate::keys::companion_parts(key) {
        None => key,
        Some((lock, "readers")) => lock,
        Some(_) => return None,
    };
    lock.strip_prefix(prefix)
        .filter(|name| redis_glob(pattern.as_bytes(), name.as_bytes()))
}

/// Whether `text` matches Redis' glob `pattern` (as `SCAN MATCH` and `KEYS` do): `*` any
/// run, `?` one byte, `[…]` one byte of a set (`^` negates, `a-z` a range, `\\` escapes),
/// `\\` escapes the next byte, anything else itself. Linear in each: the positions of
/// `text` reachable after each part of the pattern.
fn redis_glob(pattern: &[u8], text: &[u8]) -> bool {
    // reach[i]: the first i bytes of `text` are matched by the pattern so far.
    let mut reach = vec![false; text.len() + 1];
    reach[0] = true;
    let mut p = pattern;
    while let Some((&c, rest)) = p.split_first() {
        p = rest;
        // One byte matched by `one`, or (for `*`) any run.
        let one: Box<dyn Fn(u8) -> bool> = match c {
            b'*' => {
                if let Some(first) = reach.iter().position(|&r| r) {
                    reach[first..].fill(true);
                }
                continue;
            }
            b'?' => Box::new(|_| true),
            b'[' => {
                let (negate, mut set) = match p.split_first() {
                    Some((b'^', set)) => (true, set),
                    _ => (false, p),
                };
                let mut ranges = Vec::new();
                loop {
                    match set {
                        [] => break,
                        [b']', tail @ ..] => {
                            set = tail;
                            break;
                        }
                        [b'\\', e, tail @ ..] => {
                            ranges.push((*e, *e));
                            set = tail;
                        }
                        [a, b'-', z, tail @ ..] if *z != b']' => {
                            ranges.push(if a <= z { (*a, *z) } else { (*z, *a) });
                            set = tail;
                        }
                        [a, tail @ ..] => {
                            ranges.push((*a, *a));
                            set = tail;
                        }
                    }
                }
                p = set;
                Box::new(move |b| ranges.iter().any(|&(lo, hi)| (lo..=hi).contains(&b)) != negate)
            }
            b'\\' if !p.is_empty() => {
                let lit = p[0];
                p = &p[1..];
                Box::new(move |b| b == lit)
            }
            lit => Box::new(move |b| b == lit),
        };
        for i in (0..text.len()).rev() {
            reach[i + 1] = reach[i] && one(text[i]);
        }
        reach[0] = false;
    }
    reach[text.len()]
}

/// Hostile input: URLs of every Redis scheme, and the replies the backend decodes.
#[cfg(test)]
mod props {
    use std::time::Duration;

    use proptest::prelude::*;

    use super::decode::permit_state;
    use super::{Target, parse_acquire, parse_url, server_ms};
    use crate::backend::hostile::{any_url, check, url_with_password};
    use crate::raw::Acquire;

    const SCHEMES: &[&str] = &[
        "redis",
        "rediss",
        "redis+unix",
        "unix",
        "redis+sentinel",
        "redis+cluster",
    ];

    #[test]
    fn known_urls() {
        for url in [
            "redis://127.0.0.1:6379/0",
            "redis://u:p@h",
            "redis+unix:///tmp/r.sock?db=1&pass=x",
            "redis+sentinel://u:p@a:1,b:2/m/3",
            "redis+cluster://u:p@a:1,b:2",
        ] {
            assert!(parse_url(url).is_ok(), "{url}");
        }
        for url in [
            "",
            "redis:/h",
            "http://h",
            "redis://h:x",
            "redis://h/x",
            "redis+cluster://",
            "redis+cluster://h:x",
            "redis+sentinel://h",
            "redis+sentinel://h h/m",
            "redis://0.0.0.0",
        ] {
            let err = parse_url(url).map(|_| ()).expect_err(url);
            assert_eq!(err.kind(), crate::ErrorKind::InvalidArgument, "{url}");
        }
        // The cluster's address names its nodes, never their credentials.
        let Ok((Target::Cluster(nodes), _)) = parse_url("redis+cluster://u:s3cret@a:1,b:2/") else {
            panic!("a cluster URL");
        };
        assert_eq!(super::conn::cluster_hosts(&nodes), ["a:1", "b:2"]);
    }

    /// dlock's `min_replicas` is taken off every scheme's URL; redis-rs's own parameters
    /// go through; anything else is refused by name (it would do nothing).
    #[test]
    fn query_parameters_are_known_or_refused() {
        use super::{UrlOptions, take_params};
        let some = |n| UrlOptions {
            min_replicas: Some(n),
        };
        for (url, passed, out, options) in [
            (
                "redis://h/0",
                &["protocol"][..],
                "redis://h/0",
                UrlOptions::default(),
            ),
            (
                "redis://h/?min_replicas=2",
                &["protocol"],
                "redis://h/",
                some(2),
            ),
            (
                "redis://h/?protocol=resp3&min_replicas=1",
                &["protocol"],
                "redis://h/?protocol=resp3",
                some(1),
            ),
            (
                "rediss://h/?min_replicas=1#insecure",
                &["protocol"],
                "rediss://h/#insecure",
                some(1),
            ),
            (
                "redis://u:p?w@h/?min_replicas=0",
                &["protocol"],
                "redis://u:p?w@h/",
                some(0),
            ),
            (
                "redis+unix:///s?db=1&min_replicas=1&pass=x",
                &["db", "pass"],
                "redis+unix:///s?db=1&pass=x",
                some(1),
            ),
            (
                "redis+sentinel://h/m/1?min_replicas=3",
                &[],
                "redis+sentinel://h/m/1",
                some(3),
            ),
        ] {
            let (rest, got) = take_params(url, passed).expect(url);
            assert_eq!((rest.as_str(), got), (out, options), "{url}");
        }
        for (url, name) in [
            ("redis://h/?minreplicas=1", "minreplicas"),
            ("redis://h/?protocol=3&x", "x"),
            ("redis+cluster://a:1,b:2/?protocol=resp3", "protocol"),
            ("redis+sentinel://h/m?db=1", "db"),
        ] {
            let err = parse_url(url).map(|_| ()).expect_err(url);
            assert_eq!(err.kind(), crate::ErrorKind::InvalidArgument, "{url}");
            assert!(
                err.to_string()
                    .contains(&format!("unknown parameter {name:?}")),
                "{err}"
            );
        }
        for bad in [
            "redis://h/?min_replicas=",
            "redis://h/?min_replicas=-1",
            "redis://h/?min_replicas=x",
        ] {
            assert!(parse_url(bad).is_err(), "{bad}");
        }
        // The sentinel's master and db are parsed without the query.
        let (target, options) =
            parse_url("redis+sentinel://h:1/m/2?min_replicas=1").expect("valid");
        assert!(matches!(target, Target::Node(super::Node::Sentinel(_))));
        assert_eq!(options.min_replicas, Some(1));
    }

    #[test]
    fn secrets_in_query_and_odd_places_stay_hidden() {
        for (url, secret) in [
            ("redis+unix:///tmp/s?db=x&pass=s3cret!", "s3cret!"),
            ("redis+unix:///tmp/s?pass=s3cret!&protocol=9", "s3cret!"),
            ("redis://u:pa/ss!word@h:x", "pa/ss!word"),
            ("redis://u:pa?ss!word@h", "pa?ss!word"),
            ("redis:/u:s3cret!@h", "s3cret!"),
            ("redis+cluster://u:s3cret!@h:1/0", "s3cret!"),
            ("redis+sentinel://u:s3cret!@h:1", "s3cret!"),
            ("redis+sentinel://u:s3cret!@h:1/m/x", "s3cret!"),
        ] {
            let err = parse_url(url).map(|_| ()).expect_err(url);
            assert!(!err.to_string().contains(secret), "{err}");
            assert!(!format!("{err:?}").contains(secret), "{err:?}");
        }
    }

    proptest! {
        #![proptest_config(crate::backend::hostile::cases(256))]

        #[test]
        fn any_string_parses_or_is_invalid(url in any_url(SCHEMES)) {
            check(&parse_url(&url), "")?;
        }

        #[test]
        fn passwords_never_reach_errors((url, secret) in url_with_password(SCHEMES)) {
            check(&parse_url(&url), &secret)?;
        }

        #[test]
        fn acquire_replies_decode_or_are_a_backend_error(
            reply in prop::collection::vec(any::<i64>(), 0..5),
            fence in 0..i64::MAX,
            wait in any::<i64>(),
        ) {
            match parse_acquire(&reply, "test") {
                Ok(_) => prop_assert!(matches!(reply.as_slice(), [1, _] | [0, _] | [0, _, _])),
                Err(e) => prop_assert_eq!(e.kind(), crate::ErrorKind::Backend),
            }
            let granted = matches!(
                parse_acquire(&[1, fence], "t"),
                Ok(Acquire::Acquired { fence: f }) if i64::try_from(f).ok() == Some(fence)
            );
            prop_assert!(granted);
            let remaining = u64::try_from(wait).ok().map(Duration::from_millis);
            let held = matches!(
                parse_acquire(&[0, wait, fence], "t"),
                Ok(Acquire::Held { remaining: r }) if r == remaining
            );
            prop_assert!(held);
        }

        #[test]
        fn permit_snapshots_of_any_content_decode(
            secs in any::<i64>(),
            micros in any::<i64>(),
            leases in prop::collection::vec(("[a-c]", any::<f64>()), 0..6),
            counts in prop::collection::vec(("[a-c]", any::<u32>()), 0..6),
        ) {
            let now = server_ms(secs, micros);
            let state = permit_state(now, &leases, &counts);
            let live = leases.iter().filter(|(_, e)| (*e as i64) > now).count();
            prop_assert_eq!(state.holders, u32::try_from(live).ok());
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::keys::{LockKeys, cluster_slot};

    /// Every key one primitive's scripts touch, as the backend names them.
    fn keys_of(primitive: &str, keys: &LockKeys) -> Vec<String> {
        let mut all = vec![keys.lock().to_owned(), keys.fence().to_owned()];
        match primitive {
            "semaphore" => all.extend([
                super::holders(keys),
                super::semaphore::permit_count(keys),
                super::semaphore::permits_used(keys),
            ]),
            "rwlock" => all.extend([super::rwlock::readers(keys), super::rwlock::writers(keys)]),
            "fair" => all.extend([super::fair::queue(keys), super::fair::claims(keys)]),
            "election" => all.push(super::election::record(keys)),
            _ => {}
        }
        all
    }

    proptest::proptest! {
        #![proptest_config(crate::backend::hostile::cases(48))]
        /// No name reaches another lock's keys or channels (DESIGN.md principle 9).
        #[test]
        fn distinct_locks_share_no_key_or_channel(
            names in proptest::collection::vec(crate::keys::namespace::hostile_name(), 1..3)
        ) {
            let primitives = crate::keys::namespace::PRIMITIVES;
            crate::keys::namespace::check_disjoint(primitives, &names, super::key_set)?;
        }
    }

    #[test]
    fn the_issue_names_reach_no_other_lock() {
        let names = [
            "{o}",
            "{o}:fence",
            "{u}:fence",
            "{o}:released",
            "{o}:waiters",
            "{o}:leader",
        ];
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let primitives = crate::keys::namespace::PRIMITIVES;
        crate::keys::namespace::check_disjoint(primitives, &names, super::key_set)
            .expect("disjoint");
    }

    #[test]
    fn redis_globs_match_as_the_server_does() {
        for (pattern, text, want) in [
            ("*", "", true),
            ("a*", "abc", true),
            ("a?c", "abc", true),
            ("a?c", "ac", false),
            ("[ab]x", "bx", true),
            ("[^ab]x", "cx", true),
            ("[^ab]x", "ax", false),
            ("[a-c]", "b", true),
            ("[c-a]", "b", true),
            ("[a\\]]", "]", true),
            ("\\*", "*", true),
            ("\\*", "a", false),
            ("h*llo", "heeeello", true),
            ("h*llo", "hello!", false),
            ("{tag}*", "{tag}job", true),
            ("job", "jobs", false),
            ("", "", true),
        ] {
            assert_eq!(
                super::redis_glob(pattern.as_bytes(), text.as_bytes()),
                want,
                "{pattern} {text}"
            );
        }
        let long = "a".repeat(1024);
        assert!(!super::redis_glob(
            b"*a*a*a*a*a*a*a*a*a*a*b",
            long.as_bytes()
        ));
    }

    #[test]
    fn every_primitive_keeps_its_keys_in_one_cluster_slot() {
        for (primitive, prefix) in [
            ("lock", crate::keys::DEFAULT_PREFIX),
            ("semaphore", crate::DEFAULT_SEMAPHORE_PREFIX),
            ("reentrant", crate::DEFAULT_REENTRANT_PREFIX),
            ("rwlock", crate::DEFAULT_RWLOCK_PREFIX),
            ("fair", crate::DEFAULT_FAIR_PREFIX),
            ("election", crate::DEFAULT_ELECTION_PREFIX),
        ] {
            for name in [
                "orders",
                "{tenant-7}:orders",
                "a:b:c",
                "x{y",
                "\u{e9}t\u{e9}",
            ] {
                let keys = LockKeys::new(prefix, name).expect("valid");
                let all = keys_of(primitive, &keys);
                let slot = cluster_slot(all[0].as_bytes());
                for key in &all {
                    assert_eq!(
                        cluster_slot(key.as_bytes()),
                        slot,
                        "{primitive} {name:?}: {key} is not in the slot of {}",
                        all[0]
                    );
                }
                // The scripts announce on shard channels, which must share the slot too.
                for channel in [keys.channel(), keys.side(crate::raw::RECORD).channel()] {
                    assert_eq!(
                        cluster_slot(channel.as_bytes()),
                        slot,
                        "{primitive} {name:?}: channel {channel} is not in the slot"
                    );
                }
                assert_eq!(
                    all.len(),
                    all.iter().collect::<std::collections::HashSet<_>>().len()
                );
            }
        }
    }
}
