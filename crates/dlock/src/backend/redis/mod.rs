//! Redis: the lock of seed 000, done right, plus fencing and release notification.
//!
//! * Acquire is ONE round trip: a script does `SET key token NX PX ttl` and, only on
//!   success, `INCR` of the fence counter, returning the fence (or the holder's `PTTL`).
//! * Release is ONE round trip: compare-and-delete, then `PUBLISH` on the lock's channel.
//! * Extend is compare-and-`PEXPIRE`; the watchdog pipelines many of them in one round trip.
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

mod conn;
mod fair;
mod pubsub;
mod reentrant;
mod rwlock;
mod sentinel;

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{RedisError, Script, ServerErrorKind};

use crate::error::{Error, ErrorKind, Result};
use crate::keys::LockKeys;
use crate::raw::{
    Acquire, LockState, RawFencing, RawInspect, RawLock, RawSemaphore, ReleaseWatch, Renewal,
};
use crate::token::Token;
use crate::watchdog::Leases;

use pubsub::PubSub;

/// Default bound on establishing a connection.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Default bound on waiting for one reply.
pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(2);

/// A Redis client for locks. Cheap to clone; clones share one connection, one pub/sub
/// connection and one watchdog.
///
/// ```no_run
/// # async fn demo() -> dlock::Result<()> {
/// let redis = dlock::backend::Redis::connect("redis://127.0.0.1:6379/0").await?;
/// let lock = dlock::Lock::new(redis, "orders")?;
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
    acquire: Script,
    release: Script,
    extend: Script,
    sem_acquire: Script,
    sem_release: Script,
    sem_extend: Script,
    sem_count: Script,
    sem_add: Script,
    re_acquire: Script,
    re_release: Script,
    re_extend: Script,
    rw_acquire: Script,
    rw_release: Script,
    rw_extend: Script,
    rw_downgrade: Script,
    rw_abandon: Script,
    fair_acquire: Script,
    fair_release: Script,
    leases: Leases,
    replication: Option<Replication>,
    pubsub: PubSub,
    addr: String,
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
    url: String,
    connect_timeout: Duration,
    response_timeout: Duration,
    min_replicas: u32,
    replica_timeout: Duration,
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
    /// is not durable on it. While a `WAIT` blocks, this client's other commands wait
    /// behind it (one connection).
    pub fn min_replicas(mut self, n: u32) -> Self {
        self.min_replicas = n;
        self
    }

    /// How long `WAIT` waits for the replicas (default 100 ms).
    pub fn replica_timeout(mut self, timeout: Duration) -> Self {
        self.replica_timeout = timeout;
        self
    }

    /// Connects and loads the scripts.
    ///
    /// # Errors
    /// * `InvalidArgument`: malformed URL, unsupported scheme, `rediss://` without the
    ///   `redis-tls` feature, zero timeouts;
    /// * `Unavailable`: the server could not be reached within the connect timeout;
    /// * `Backend`: authentication failed, or the user may not run scripts.
    pub async fn connect(self) -> Result<Redis> {
        if self.connect_timeout.is_zero() || self.response_timeout.is_zero() {
            return Err(Error::invalid("redis timeouts must not be zero"));
        }
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
        let scheme = self.url.split("://").next().unwrap_or_default();
        if !matches!(
            scheme,
            "redis" | "rediss" | "redis+unix" | "unix" | "redis+sentinel" | "redis+cluster"
        ) || !self.url.contains("://")
        {
            return Err(Error::invalid(format!(
                "unsupported redis URL {:?}: expected redis://, rediss://, redis+unix://, \
                 redis+sentinel:// or redis+cluster://",
                redact(&self.url)
            )));
        }
        #[cfg(feature = "redis-tls")]
        if scheme == "rediss" {
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
        let (conn, pubsub, addr) = if scheme == "redis+cluster" {
            let nodes = conn::cluster_nodes(&self.url)?;
            let addr = format!("cluster:{}", nodes.join(","));
            let client = redis::cluster::ClusterClient::builder(nodes.clone())
                .connection_timeout(self.connect_timeout)
                .response_timeout(self.response_timeout)
                .build()
                .map_err(|e| map_err(e, "configuring the cluster client"))?;
            let conn = tokio::time::timeout(self.connect_timeout, client.get_async_connection())
                .await
                .map_err(|_| unavailable(&addr))?
                .map_err(|e| map_err(e, &format!("connecting to redis at {addr}")))?;
            let pubsub = PubSub::new_cluster(&nodes, self.connect_timeout, self.response_timeout)?;
            (conn::Conn::Cluster(conn), pubsub, addr)
        } else {
            if scheme == "redis+sentinel" {
                sentinel = Some(sentinel::SentinelUrl::parse(&self.url)?);
            }
            let client = match &sentinel {
                Some(s) => s.resolve(self.connect_timeout).await?,
                None => redis::Client::open(self.url.as_str()).map_err(|e| {
                    Error::invalid(format!("bad redis URL {:?}: {e}", redact(&self.url)))
                        .with_source(e)
                })?,
            };
            master_addr = client.get_connection_info().addr().to_string();
            let addr = match &sentinel {
                Some(s) => format!("sentinel:{}", s.master()),
                None => master_addr.clone(),
            };
            let conn = tokio::time::timeout(
                self.connect_timeout,
                ConnectionManager::new_with_config(client.clone(), config.clone()),
            )
            .await
            .map_err(|_| unavailable(&master_addr))?
            .map_err(|e| map_err(e, &format!("connecting to redis at {master_addr}")))?;
            let pubsub = PubSub::new(&client, self.connect_timeout, self.response_timeout);
            (conn::Conn::Single(conn), pubsub, addr)
        };
        let cluster = matches!(conn, conn::Conn::Cluster(_));

        let redis = Redis {
            inner: Arc::new(Inner {
                conn: std::sync::RwLock::new(conn),
                cluster,
                config,
                acquire: Script::new(include_str!("lua/acquire.lua")),
                release: Script::new(include_str!("lua/release.lua")),
                extend: Script::new(include_str!("lua/extend.lua")),
                sem_acquire: Script::new(include_str!("lua/sem_acquire.lua")),
                sem_release: Script::new(include_str!("lua/sem_release.lua")),
                sem_extend: Script::new(include_str!("lua/sem_extend.lua")),
                sem_count: Script::new(include_str!("lua/sem_count.lua")),
                sem_add: Script::new(include_str!("lua/sem_add.lua")),
                re_acquire: Script::new(include_str!("lua/re_acquire.lua")),
                re_release: Script::new(include_str!("lua/re_release.lua")),
                re_extend: Script::new(include_str!("lua/re_extend.lua")),
                rw_acquire: Script::new(include_str!("lua/rw_acquire.lua")),
                rw_release: Script::new(include_str!("lua/rw_release.lua")),
                rw_extend: Script::new(include_str!("lua/rw_extend.lua")),
                rw_downgrade: Script::new(include_str!("lua/rw_downgrade.lua")),
                rw_abandon: Script::new(include_str!("lua/rw_abandon.lua")),
                fair_acquire: Script::new(include_str!("lua/fair_acquire.lua")),
                fair_release: Script::new(include_str!("lua/fair_release.lua")),
                leases: Leases::new(),
                replication,
                pubsub,
                addr,
            }),
        };
        redis.load_scripts().await?;
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
    /// `rediss://…` (TLS, with the `redis-tls` feature), `redis+unix:///path/to.sock`.
    ///
    /// # Errors
    /// As [`RedisBuilder::connect`].
    pub async fn connect(url: impl Into<String>) -> Result<Redis> {
        Redis::builder(url).connect().await
    }

    /// Connection options for `url`.
    pub fn builder(url: impl Into<String>) -> RedisBuilder {
        RedisBuilder {
            url: url.into(),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            response_timeout: DEFAULT_RESPONSE_TIMEOUT,
            min_replicas: 0,
            replica_timeout: Duration::from_millis(100),
        }
    }

    /// The server's address, as connected.
    pub fn addr(&self) -> &str {
        &self.inner.addr
    }

    /// The nodes whose keys `list` scans: the one server, or every master of a cluster
    /// (by `CLUSTER SLOTS`).
    async fn scan_nodes(&self) -> Result<Vec<Option<(String, u16)>>> {
        if !self.inner.cluster {
            return Ok(vec![None]);
        }
        let slots: Vec<redis::Value> = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query_async(&mut self.conn())
            .await
            .map_err(|e| map_err(e, "listing the cluster's masters"))?;
        // Each range: [first slot, last slot, [master host, master port, id], replicas…].
        let mut masters: Vec<Option<(String, u16)>> = Vec::new();
        for range in slots {
            let redis::Value::Array(parts) = range else {
                continue;
            };
            let Some(redis::Value::Array(master)) = parts.get(2) else {
                continue;
            };
            let (Some(host), Some(port)) = (master.first(), master.get(1)) else {
                continue;
            };
            let (Ok(host), Ok(port)) = (
                redis::from_redis_value_ref::<String>(host),
                redis::from_redis_value_ref::<u16>(port),
            ) else {
                continue;
            };
            let node = Some((host, port));
            if !masters.contains(&node) {
                masters.push(node);
            }
        }
        Ok(masters)
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
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(script.get_hash()).arg(keys.len()).arg(keys);
        for a in args {
            a.push_to(&mut cmd);
        }
        let mut conn = self.conn();
        for round in 0..2 {
            let reply = match self.inner.replication {
                None => cmd.query_async::<T>(&mut conn).await.map(|t| (t, true)),
                Some(r) => {
                    let mut pipe = redis::pipe();
                    pipe.add_command(cmd.clone())
                        .cmd("WAIT")
                        .arg(r.replicas)
                        .arg(r.timeout_ms);
                    pipe.query_async::<(T, i64)>(&mut conn)
                        .await
                        .map(|(t, acks)| (t, acks >= i64::from(r.replicas)))
                }
            };
            match reply {
                Err(e)
                    if round == 0
                        && e.kind() == redis::ErrorKind::Server(ServerErrorKind::NoScript) =>
                {
                    script
                        .prepare_invoke()
                        .load_async(&mut conn)
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

    async fn load_scripts(&self) -> Result<()> {
        let mut conn = self.conn();
        let i = &self.inner;
        for script in [
            &i.acquire,
            &i.release,
            &i.extend,
            &i.sem_acquire,
            &i.sem_release,
            &i.sem_extend,
            &i.sem_count,
            &i.sem_add,
            &i.re_acquire,
            &i.re_release,
            &i.re_extend,
            &i.rw_acquire,
            &i.rw_release,
            &i.rw_extend,
            &i.rw_downgrade,
            &i.rw_abandon,
            &i.fair_acquire,
            &i.fair_release,
        ] {
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
}

impl ToArg for &str {
    fn push_to(&self, cmd: &mut redis::Cmd) {
        cmd.arg(*self);
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

fn redact(url: &str) -> String {
    // Drop credentials from messages: everything between "://" and the last '@'.
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => format!("{}://***@{}", &url[..s], &url[at + 1..]),
        _ => url.to_owned(),
    }
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
                "{doing}: the redis user is not permitted to run dlock's commands (dlock needs EVALSHA/EVAL/SCRIPT LOAD, i.e. scripting): {detail}"
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

impl RawLock for Redis {
    async fn acquire(&self, keys: &LockKeys, token: &Token, ttl: Duration) -> Result<Acquire> {
        let (reply, replicated): (Vec<i64>, bool) = self
            .write(
                &self.inner.acquire,
                &[keys.lock(), keys.fence()],
                &[&token.as_str(), &ttl_ms(ttl)],
                "acquiring",
            )
            .await?;
        if !replicated && reply.first() == Some(&1) {
            let _ = self.release(keys, token).await;
            return Err(not_replicated(keys, "the grant"));
        }
        match reply.as_slice() {
            [1, fence] if *fence >= 1 => Ok(Acquire::Acquired {
                fence: u64::try_from(*fence).unwrap_or(0),
            }),
            [1, fence] => {
                // A fence counter someone set to zero or below: fences would repeat.
                let _ = self.release(keys, token).await;
                Err(Error::new(
                    ErrorKind::Backend,
                    format!(
                        "fence counter {} is {fence}, not positive: it was tampered with, and \
                         fences from it would not be unique",
                        keys.fence()
                    ),
                ))
            }
            [0, pttl] => Ok(Acquire::Held {
                remaining: u64::try_from(*pttl).ok().map(Duration::from_millis),
            }),
            other => Err(Error::new(
                ErrorKind::Backend,
                format!("unexpected reply from the acquire script: {other:?}"),
            )),
        }
    }

    async fn release(&self, keys: &LockKeys, token: &Token) -> Result<bool> {
        let released: i64 = self
            .inner
            .release
            .key(keys.lock())
            .arg(token.as_str())
            .arg(keys.channel())
            .arg(self.publish_cmd())
            .invoke_async(&mut self.conn())
            .await
            .map_err(|e| map_err(e, "releasing"))?;
        Ok(released == 1)
    }

    async fn extend(&self, keys: &LockKeys, token: &Token, ttl: Duration) -> Result<bool> {
        let (extended, replicated): (i64, bool) = self
            .write(
                &self.inner.extend,
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

    /// All renewals in one pipelined round trip of `EVALSHA`s.
    async fn extend_many(&self, renewals: &[Renewal]) -> Vec<Result<bool>> {
        let sha = self.inner.extend.get_hash();
        let mut pipe = redis::pipe();
        for r in renewals {
            pipe.cmd("EVALSHA")
                .arg(sha)
                .arg(1)
                .arg(r.keys.lock())
                .arg(r.token.as_str())
                .arg(ttl_ms(r.ttl));
        }
        if let Some(r) = self.inner.replication {
            pipe.cmd("WAIT").arg(r.replicas).arg(r.timeout_ms);
        }
        pipe.ignore_errors();
        let mut conn = self.conn();
        for round in 0..2 {
            let replies: Vec<redis::RedisResult<i64>> = match pipe.query_async(&mut conn).await {
                Ok(replies) => replies,
                Err(e) => {
                    let err = map_err(e, "renewing leases");
                    return renewals
                        .iter()
                        .map(|_| Err(Error::new(err.kind(), err.message().to_owned())))
                        .collect();
                }
            };
            let noscript = replies.iter().any(|r| {
                r.as_ref()
                    .is_err_and(|e| e.kind() == redis::ErrorKind::Server(ServerErrorKind::NoScript))
            });
            if noscript && round == 0 {
                // The script cache was flushed: load it again and resend. Renewal is
                // idempotent, so the ones that did go through are unharmed by a repeat.
                if let Err(e) = self
                    .inner
                    .extend
                    .prepare_invoke()
                    .load_async(&mut conn)
                    .await
                {
                    let err = map_err(e, "reloading the extend script");
                    return renewals
                        .iter()
                        .map(|_| Err(Error::new(err.kind(), err.message().to_owned())))
                        .collect();
                }
                continue;
            }
            let mut replies = replies;
            let replicated = match self.inner.replication {
                // The last reply is WAIT's count of acknowledging replicas.
                Some(r) => replies
                    .pop()
                    .is_some_and(|acks| acks.is_ok_and(|n| n >= i64::from(r.replicas))),
                None => true,
            };
            return replies
                .into_iter()
                .zip(renewals)
                .map(|(r, renewal)| match r {
                    Ok(1) if !replicated => Err(not_replicated(&renewal.keys, "the renewal")),
                    Ok(n) => Ok(n == 1),
                    Err(e) => Err(map_err(e, "renewing a lease")),
                })
                .collect();
        }
        renewals
            .iter()
            .map(|_| {
                Err(Error::new(
                    ErrorKind::Backend,
                    "extend script missing after reload",
                ))
            })
            .collect()
    }

    async fn watch(&self, keys: &LockKeys) -> Result<ReleaseWatch> {
        self.inner.pubsub.watch(keys.channel()).await
    }

    fn store_id(&self) -> String {
        format!("redis:{}", self.inner.addr)
    }

    fn leases(&self) -> &Leases {
        &self.inner.leases
    }
}

/// Fences come from `INCR` in the same script as the `SET NX`; see the module docs for
/// what resets the counter.
impl RawFencing for Redis {}

impl RawInspect for Redis {
    async fn inspect(&self, keys: &LockKeys) -> Result<LockState> {
        type Snapshot = (Option<String>, i64, Option<u64>, (String, u64));
        let (holder, pttl, fence, (_, subscribers)): Snapshot = redis::pipe()
            .atomic()
            .get(keys.lock())
            .pttl(keys.lock())
            .get(keys.fence())
            .cmd("PUBSUB")
            .arg(if self.inner.cluster {
                "SHARDNUMSUB"
            } else {
                "NUMSUB"
            })
            .arg(keys.channel())
            .query_async(&mut self.conn())
            .await
            .map_err(|e| map_err(e, "inspecting"))?;
        let remaining = u64::try_from(pttl).ok().map(Duration::from_millis);
        Ok(LockState::new(holder, remaining, fence).with_waiting_clients(subscribers))
    }

    async fn force_unlock(&self, keys: &LockKeys) -> Result<bool> {
        let (deleted, _): (i64, i64) = redis::pipe()
            .atomic()
            .del(keys.lock())
            .cmd(self.publish_cmd())
            .arg(keys.channel())
            .arg(keys.lock())
            .query_async(&mut self.conn())
            .await
            .map_err(|e| map_err(e, "force-unlocking"))?;
        Ok(deleted == 1)
    }

    async fn list(&self, prefix: &str, pattern: &str, limit: usize) -> Result<Vec<String>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let mut escaped = String::with_capacity(prefix.len() + pattern.len());
        for c in prefix.chars() {
            if matches!(c, '*' | '?' | '[' | ']' | '\\') {
                escaped.push('\\');
            }
            escaped.push(c);
        }
        escaped.push_str(pattern);
        let mut conn = self.conn();
        let mut names = Vec::new();
        for node in self.scan_nodes().await? {
            let mut cursor: u64 = 0;
            loop {
                let mut scan = redis::cmd("SCAN");
                scan.arg(cursor)
                    .arg("MATCH")
                    .arg(&escaped)
                    .arg("COUNT")
                    .arg(1000);
                let (next, keys): (u64, Vec<String>) = conn
                    .query_on(node.as_ref(), scan)
                    .await
                    .map_err(|e| map_err(e, "listing locks (SCAN)"))?;
                if !keys.is_empty() {
                    // Lock keys always carry an expiry; fence counters never do.
                    let mut pipe = redis::pipe();
                    for k in &keys {
                        pipe.pttl(k);
                    }
                    let ttls: Vec<i64> = conn
                        .pipe_on(node.as_ref(), pipe, keys.len())
                        .await
                        .map_err(|e| map_err(e, "listing locks (PTTL)"))?;
                    for (key, ttl) in keys.into_iter().zip(ttls) {
                        if ttl >= 0
                            && let Some(name) = key.strip_prefix(prefix)
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
    }
}

impl RawSemaphore for Redis {
    async fn acquire_permits(
        &self,
        keys: &LockKeys,
        token: &Token,
        n: u32,
        permits: u32,
        ttl: Duration,
    ) -> Result<Acquire> {
        let (holders, count) = (keys.companion("holders"), keys.companion("permits"));
        let (reply, replicated): (Vec<i64>, bool) = self
            .write(
                &self.inner.sem_acquire,
                &[keys.lock(), &holders, &count],
                &[&token.as_str(), &n, &permits, &ttl_ms(ttl)],
                "acquiring permits",
            )
            .await?;
        if !replicated && reply.first() == Some(&1) {
            let _ = self.release_permits(keys, token).await;
            return Err(not_replicated(keys, "the permit grant"));
        }
        match reply.as_slice() {
            [1, _] => Ok(Acquire::Acquired { fence: 0 }),
            [0, wait] => Ok(Acquire::Held {
                remaining: u64::try_from(*wait).ok().map(Duration::from_millis),
            }),
            other => Err(Error::new(
                ErrorKind::Backend,
                format!("unexpected reply from the permit script: {other:?}"),
            )),
        }
    }

    async fn release_permits(&self, keys: &LockKeys, token: &Token) -> Result<bool> {
        let released: i64 = self
            .inner
            .sem_release
            .key(keys.lock())
            .key(keys.companion("holders"))
            .arg(token.as_str())
            .arg(keys.channel())
            .arg(self.publish_cmd())
            .invoke_async(&mut self.conn())
            .await
            .map_err(|e| map_err(e, "releasing permits"))?;
        Ok(released == 1)
    }

    async fn extend_permits(&self, keys: &LockKeys, token: &Token, ttl: Duration) -> Result<bool> {
        let holders = keys.companion("holders");
        let (extended, replicated): (i64, bool) = self
            .write(
                &self.inner.sem_extend,
                &[keys.lock(), &holders],
                &[&token.as_str(), &ttl_ms(ttl)],
                "renewing permits",
            )
            .await?;
        if extended == 1 && !replicated {
            return Err(not_replicated(keys, "the permit renewal"));
        }
        Ok(extended == 1)
    }

    async fn permits_in_use(&self, keys: &LockKeys, permits: u32) -> Result<(u32, u32)> {
        // Live leases only: those whose expiry is still ahead by the server's clock.
        let (used, count): (i64, i64) = self
            .inner
            .sem_count
            .key(keys.lock())
            .key(keys.companion("holders"))
            .key(keys.companion("permits"))
            .invoke_async(&mut self.conn())
            .await
            .map_err(|e| map_err(e, "counting permits"))?;
        let count = u32::try_from(count).unwrap_or(permits);
        Ok((u32::try_from(used).unwrap_or(0), count))
    }

    async fn inspect_permits(&self, keys: &LockKeys) -> Result<LockState> {
        type Snapshot = ((i64, i64), Vec<(String, f64)>, Vec<(String, u32)>);
        let ((secs, micros), leases, counts): Snapshot = redis::pipe()
            .atomic()
            .cmd("TIME")
            .cmd("ZRANGE")
            .arg(keys.lock())
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .hgetall(keys.companion("holders"))
            .query_async(&mut self.conn())
            .await
            .map_err(|e| map_err(e, "inspecting a semaphore"))?;
        let now = secs.saturating_mul(1000).saturating_add(micros / 1000);
        let live: Vec<(String, i64)> = leases
            .into_iter()
            .map(|(token, expiry)| (token, expiry as i64))
            .filter(|(_, expiry)| *expiry > now)
            .collect();
        let used: u32 = live
            .iter()
            .filter_map(|(token, _)| counts.iter().find(|(t, _)| t == token))
            .map(|(_, n)| *n)
            .sum();
        let last = live
            .iter()
            .map(|(_, expiry)| expiry - now)
            .max()
            .and_then(|ms| u64::try_from(ms).ok())
            .map(Duration::from_millis);
        Ok(LockState::new(None, last, None)
            .with_hold_count(used)
            .with_holders(u32::try_from(live.len()).unwrap_or(u32::MAX)))
    }

    async fn force_unlock_permits(&self, keys: &LockKeys) -> Result<bool> {
        let (deleted, _): (i64, i64) = redis::pipe()
            .atomic()
            .del(&[keys.lock().to_owned(), keys.companion("holders")])
            .cmd(self.publish_cmd())
            .arg(keys.channel())
            .arg(keys.lock())
            .query_async(&mut self.conn())
            .await
            .map_err(|e| map_err(e, "force-unlocking a semaphore"))?;
        Ok(deleted > 0)
    }

    async fn add_permits(
        &self,
        keys: &LockKeys,
        delta: i64,
        permits: u32,
        max: u32,
    ) -> Result<Option<u32>> {
        let count: i64 = self
            .inner
            .sem_add
            .key(keys.companion("permits"))
            .arg(delta)
            .arg(permits)
            .arg(max)
            .arg(keys.channel())
            .arg(self.publish_cmd())
            .invoke_async(&mut self.conn())
            .await
            .map_err(|e| map_err(e, "adding permits"))?;
        Ok(u32::try_from(count).ok())
    }

    async fn set_permits(&self, keys: &LockKeys, permits: u32) -> Result<()> {
        let _: () = redis::pipe()
            .set(keys.companion("permits"), permits)
            .ignore()
            .cmd(self.publish_cmd())
            .arg(keys.channel())
            .arg(keys.lock())
            .ignore()
            .query_async(&mut self.conn())
            .await
            .map_err(|e| map_err(e, "setting permits"))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::keys::{LockKeys, cluster_slot};

    /// Every key one primitive's scripts touch, as the backend names them.
    fn keys_of(primitive: &str, keys: &LockKeys) -> Vec<String> {
        let mut all = vec![keys.lock().to_owned(), keys.fence().to_owned()];
        match primitive {
            "semaphore" => all.extend([keys.companion("holders"), keys.companion("permits")]),
            "rwlock" => all.extend([super::rwlock::readers(keys), super::rwlock::writers(keys)]),
            "fair" => all.extend([super::fair::queue(keys), super::fair::claims(keys)]),
            _ => {}
        }
        all
    }

    #[test]
    fn every_primitive_keeps_its_keys_in_one_cluster_slot() {
        for (primitive, prefix) in [
            ("lock", crate::keys::DEFAULT_PREFIX),
            ("semaphore", crate::DEFAULT_SEMAPHORE_PREFIX),
            ("reentrant", crate::DEFAULT_REENTRANT_PREFIX),
            ("rwlock", crate::DEFAULT_RWLOCK_PREFIX),
            ("fair", crate::DEFAULT_FAIR_PREFIX),
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
                assert_eq!(
                    all.len(),
                    all.iter().collect::<std::collections::HashSet<_>>().len()
                );
            }
        }
    }
}
