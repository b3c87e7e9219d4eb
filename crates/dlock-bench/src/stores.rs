//! The harness of the sections on other deployments and stores (RedLock, replica
//! acknowledgement, Redis Cluster, Memcached, etcd, PostgreSQL, ZooKeeper): every
//! client's acquire + release is one boxed [`Cycle`], timed by the same loop whatever the
//! store; contended runs reuse the contended section's waiters and add the servers' CPU;
//! the Markdown tables put every row beside its limit, its reference and its peer, all
//! measured in the same run.
//!
//! The boxing costs every client (limits included) one allocation per cycle alike.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use fencelock::Lock;
use fencelock::raw::RawLock;
use redis::aio::ConnectionLike;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufStream};
use tokio::net::TcpStream;

use crate::Result;
use crate::contended::{self, BoxWaiter, Mode};
use crate::measure::{self, CpuMeter, Latencies};
use crate::report::{fmt_dur, fmt_rate, fmt_ratio};

/// Lease length of every uncontended hold (dlock's default, as in section 1).
pub(crate) const TTL: Duration = Duration::from_secs(30);
/// Compare-and-delete, as every correct Redis lock releases (section 1's limit).
pub(crate) const RELEASE: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";

/// The future of one cycle: how long its acquire took.
pub(crate) type CycleFuture<'a> = Pin<Box<dyn Future<Output = Result<Duration>> + Send + 'a>>;

/// One client's acquire + release on a name of its own.
pub(crate) trait Cycle: Send {
    /// Acquires, releases; returns how long the acquire took.
    fn cycle(&mut self) -> CycleFuture<'_>;
}

/// A boxed cycle.
pub(crate) type BoxCycle = Box<dyn Cycle>;

/// dlock's plain `Lock` on any store, default options but the ttl.
pub(crate) struct LockCycle<B: RawLock>(Lock<B>);

impl<B: RawLock> LockCycle<B> {
    /// The lock `name` on `backend` with ttl `ttl` (watchdog on, as by default).
    pub(crate) fn boxed(backend: B, name: String, ttl: Duration) -> Result<BoxCycle> {
        Ok(Box::new(LockCycle(
            Lock::builder(backend, name).ttl(ttl).build()?,
        )))
    }
}

impl<B: RawLock> Cycle for LockCycle<B> {
    fn cycle(&mut self) -> CycleFuture<'_> {
        Box::pin(async move {
            let start = Instant::now();
            let guard = self.0.lock().await?;
            let acquired = start.elapsed();
            guard.release().await?;
            Ok(acquired)
        })
    }
}

/// rslock's `lock` + `unlock` (over one server, several, or a cluster).
pub(crate) struct RslockCycle {
    manager: rslock::LockManager,
    key: String,
}

impl RslockCycle {
    /// `key` on `manager` (which should have connected already).
    pub(crate) fn boxed(manager: rslock::LockManager, key: String) -> BoxCycle {
        Box::new(RslockCycle { manager, key })
    }
}

impl Cycle for RslockCycle {
    fn cycle(&mut self) -> CycleFuture<'_> {
        Box::pin(async move {
            let start = Instant::now();
            let lock = self
                .manager
                .lock(self.key.as_bytes(), TTL)
                .await
                .map_err(|e| format!("rslock lock of a private key failed: {e}"))?;
            let acquired = start.elapsed();
            self.manager.unlock(&lock).await;
            Ok(acquired)
        })
    }
}

/// An rslock manager over `urls`, connected (rslock connects on first use).
pub(crate) async fn rslock_manager(urls: &[String]) -> Result<rslock::LockManager> {
    let manager = rslock::LockManager::new(urls.to_vec());
    manager
        .query_redis_for_key_value(b"bench:warmup")
        .await
        .map_err(|e| format!("rslock: {e}"))?;
    Ok(manager)
}

/// The bare Redis limit: `SET key token NX PX ttl` (pipelined with `WAIT n timeout` when
/// replicas must acknowledge), then `EVALSHA` of [`RELEASE`], on every node at once.
pub(crate) struct RedisLimit<C> {
    nodes: Vec<C>,
    sha: String,
    key: String,
    token: String,
    wait: Option<(u32, u64)>,
}

impl<C: ConnectionLike + Send + 'static> RedisLimit<C> {
    /// The limit on `nodes` (one connection each); `wait`: `(replicas, timeout ms)`.
    pub(crate) fn boxed(
        nodes: Vec<C>,
        sha: &str,
        key: String,
        token: String,
        wait: Option<(u32, u64)>,
    ) -> BoxCycle {
        Box::new(RedisLimit {
            nodes,
            sha: sha.to_owned(),
            key,
            token,
            wait,
        })
    }
}

async fn set_nx<C: ConnectionLike>(
    conn: &mut C,
    key: &str,
    token: &str,
    wait: Option<(u32, u64)>,
) -> Result<()> {
    let ttl_ms = TTL.as_millis() as u64;
    let set: Option<String> = match wait {
        None => {
            redis::cmd("SET")
                .arg(key)
                .arg(token)
                .arg("NX")
                .arg("PX")
                .arg(ttl_ms)
                .query_async(conn)
                .await?
        }
        Some((replicas, timeout_ms)) => {
            let mut pipe = redis::pipe();
            pipe.cmd("SET")
                .arg(key)
                .arg(token)
                .arg("NX")
                .arg("PX")
                .arg(ttl_ms)
                .cmd("WAIT")
                .arg(replicas)
                .arg(timeout_ms);
            let (set, acks): (Option<String>, i64) = pipe.query_async(conn).await?;
            if acks < i64::from(replicas) {
                return Err(format!("limit: WAIT saw {acks} of {replicas} replicas").into());
            }
            set
        }
    };
    if set.is_none() {
        return Err(format!("limit: SET NX refused on the private key {key}").into());
    }
    Ok(())
}

async fn compare_and_delete<C: ConnectionLike>(
    conn: &mut C,
    sha: &str,
    key: &str,
    token: &str,
) -> Result<()> {
    let deleted: i64 = redis::cmd("EVALSHA")
        .arg(sha)
        .arg(1)
        .arg(key)
        .arg(token)
        .query_async(conn)
        .await?;
    if deleted != 1 {
        return Err(format!("limit: compare-and-delete missed the private key {key}").into());
    }
    Ok(())
}

impl<C: ConnectionLike + Send + 'static> Cycle for RedisLimit<C> {
    fn cycle(&mut self) -> CycleFuture<'_> {
        Box::pin(async move {
            let start = Instant::now();
            let (key, token, sha, wait) = (&self.key, &self.token, &self.sha, self.wait);
            if let [conn] = self.nodes.as_mut_slice() {
                set_nx(conn, key, token, wait).await?;
                let acquired = start.elapsed();
                compare_and_delete(conn, sha, key, token).await?;
                return Ok(acquired);
            }
            futures::future::try_join_all(
                self.nodes
                    .iter_mut()
                    .map(|conn| set_nx(conn, key, token, wait)),
            )
            .await?;
            let acquired = start.elapsed();
            futures::future::try_join_all(
                self.nodes
                    .iter_mut()
                    .map(|conn| compare_and_delete(conn, sha, key, token)),
            )
            .await?;
            Ok(acquired)
        })
    }
}

/// The bare memcached limit over a raw TCP socket: the meta commands dlock's memcached
/// backend sends, with no token generation nor bookkeeping. Acquire: `ms … ME` (add),
/// `ma` of the fence counter and `mg` of the key, pipelined in one round trip; release:
/// `mg … v c` (value and CAS), then `md … C<cas>`.
pub(crate) struct MemcachedLimit {
    conn: BufStream<TcpStream>,
    key: String,
    token: String,
    /// The pipelined acquire request, made once.
    acquire: Vec<u8>,
}

impl MemcachedLimit {
    /// Connects to `addr` (`host:port`) for `key`.
    pub(crate) async fn boxed(addr: &str, key: String, token: String) -> Result<BoxCycle> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let fence = format!("{key}~fence");
        let acquire = format!(
            "ms {key} {} T{} ME\r\n{token}\r\nma {fence} N0 J1 v\r\nmg {key} v t\r\n",
            token.len(),
            TTL.as_secs()
        )
        .into_bytes();
        Ok(Box::new(MemcachedLimit {
            conn: BufStream::new(stream),
            key,
            token,
            acquire,
        }))
    }
}

/// One meta-protocol reply: its line and, for `VA`, its data.
async fn mc_reply(conn: &mut BufStream<TcpStream>) -> Result<(String, Option<Vec<u8>>)> {
    let mut line = String::new();
    if conn.read_line(&mut line).await? == 0 {
        return Err("memcached closed the connection".into());
    }
    let line = line.trim_end().to_owned();
    let data = match line.strip_prefix("VA ") {
        Some(rest) => {
            let len: usize = rest.split(' ').next().unwrap_or_default().parse()?;
            let mut data = vec![0; len + 2];
            conn.read_exact(&mut data).await?;
            data.truncate(len);
            Some(data)
        }
        None => None,
    };
    Ok((line, data))
}

impl Cycle for MemcachedLimit {
    fn cycle(&mut self) -> CycleFuture<'_> {
        Box::pin(async move {
            let start = Instant::now();
            let conn = &mut self.conn;
            conn.write_all(&self.acquire).await?;
            conn.flush().await?;
            let (added, _) = mc_reply(conn).await?;
            let (_, fence) = mc_reply(conn).await?;
            let (_, value) = mc_reply(conn).await?;
            if added != "HD" || fence.is_none() || value.as_deref() != Some(self.token.as_bytes()) {
                return Err(format!(
                    "memcached limit: the private key {} was not ours ({added})",
                    self.key
                )
                .into());
            }
            let acquired = start.elapsed();
            conn.write_all(format!("mg {} v c\r\n", self.key).as_bytes())
                .await?;
            conn.flush().await?;
            let (line, value) = mc_reply(conn).await?;
            let cas = line
                .split(' ')
                .find_map(|f| f.strip_prefix('c'))
                .ok_or("memcached limit: no CAS in the mg reply")?
                .to_owned();
            if value.as_deref() != Some(self.token.as_bytes()) {
                return Err(format!("memcached limit: lost the private key {}", self.key).into());
            }
            conn.write_all(format!("md {} C{cas}\r\n", self.key).as_bytes())
                .await?;
            conn.flush().await?;
            let (deleted, _) = mc_reply(conn).await?;
            if deleted != "HD" {
                return Err(format!("memcached limit: md answered {deleted}").into());
            }
            Ok(acquired)
        })
    }
}

/// The PID of memcached from its own `stats`.
pub(crate) fn memcached_pid(server: &dlock_test::server::MemcachedServer) -> Result<u32> {
    let stats = server.command("stats\r\n")?;
    Ok(stats
        .lines()
        .find_map(|l| l.strip_prefix("STAT pid "))
        .ok_or("no pid in memcached's stats")?
        .trim()
        .parse()?)
}

/// The round trip of memcached's `mn` (no-op) on a raw socket, one at a time.
pub(crate) async fn memcached_round_trip(addr: &str, samples: usize) -> Result<Latencies> {
    let stream = TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    let mut conn = BufStream::new(stream);
    let mut lat = Latencies::new();
    for i in 0..samples + samples / 10 {
        let start = Instant::now();
        conn.write_all(b"mn\r\n").await?;
        conn.flush().await?;
        let (line, _) = mc_reply(&mut conn).await?;
        if line != "MN" {
            return Err(format!("memcached answered {line} to mn").into());
        }
        if i >= samples / 10 {
            lat.record(start.elapsed());
        }
    }
    Ok(lat)
}

/// PostgreSQL `SELECT 1` round trips on `client` (the first tenth discarded).
pub(crate) async fn pg_round_trip(
    client: &tokio_postgres::Client,
    samples: usize,
) -> Result<Latencies> {
    let statement = client.prepare("SELECT 1").await?;
    let mut lat = Latencies::new();
    for i in 0..samples + samples / 10 {
        let start = Instant::now();
        client.query_one(&statement, &[]).await?;
        if i >= samples / 10 {
            lat.record(start.elapsed());
        }
    }
    Ok(lat)
}

/// The bare PostgreSQL limit: the two calls dlock's `Lock<Postgres>` makes, as prepared
/// statements on one shared connection (`dlock.acquire`, then `dlock.release`).
pub(crate) struct PgLimit {
    client: Arc<tokio_postgres::Client>,
    acquire: tokio_postgres::Statement,
    release: tokio_postgres::Statement,
    key: String,
    token: String,
}

impl PgLimit {
    /// `key` on `client` (dlock's schema must exist: a dlock client connected before).
    pub(crate) async fn boxed(
        client: Arc<tokio_postgres::Client>,
        key: String,
        token: String,
    ) -> Result<BoxCycle> {
        let acquire = client
            .prepare(
                "SELECT granted, fence, wait_ms FROM \"dlock\".acquire($1::text, $2::text,
                   $3::bigint, $4::boolean, $5::text, $6::text, $7::bigint, $8::boolean,
                   $9::int)",
            )
            .await?;
        let release = client
            .prepare("SELECT \"dlock\".release($1::text, $2::text, $3::text, $4::bigint)")
            .await?;
        Ok(Box::new(PgLimit {
            client,
            acquire,
            release,
            key: format!("dlock:{key}"),
            token,
        }))
    }
}

impl Cycle for PgLimit {
    fn cycle(&mut self) -> CycleFuture<'_> {
        Box::pin(async move {
            let start = Instant::now();
            let ttl = i64::try_from(TTL.as_millis()).unwrap_or(i64::MAX);
            let row = self
                .client
                .query_one(
                    &self.acquire,
                    &[
                        &self.key,
                        &self.token,
                        &ttl,
                        &false,
                        &None::<&str>,
                        &None::<&str>,
                        &1000i64,
                        &false,
                        &None::<i32>,
                    ],
                )
                .await?;
            if !row.get::<_, bool>(0) {
                return Err(
                    format!("postgres limit: the private key {} was taken", self.key).into(),
                );
            }
            let acquired = start.elapsed();
            self.client
                .query_one(&self.release, &[&self.key, &self.token, &"own", &1000i64])
                .await?;
            Ok(acquired)
        })
    }
}

/// The peer on PostgreSQL: distributed-lock-postgres's `create_lock(name).acquire(None)`
/// and `release()` (a session advisory lock held on a pooled connection).
pub(crate) struct PgPeer {
    provider: Arc<distributed_lock_postgres::PostgresLockProvider>,
    name: String,
}

impl PgPeer {
    /// The lock `name` from `provider`.
    pub(crate) fn boxed(
        provider: Arc<distributed_lock_postgres::PostgresLockProvider>,
        name: String,
    ) -> BoxCycle {
        Box::new(PgPeer { provider, name })
    }
}

impl Cycle for PgPeer {
    fn cycle(&mut self) -> CycleFuture<'_> {
        Box::pin(async move {
            use distributed_lock_core::traits::{DistributedLock, LockHandle, LockProvider};
            let start = Instant::now();
            let handle = self
                .provider
                .create_lock(&self.name)
                .acquire(None)
                .await
                .map_err(|e| format!("distributed-lock-postgres acquire: {e}"))?;
            let acquired = start.elapsed();
            handle
                .release()
                .await
                .map_err(|e| format!("distributed-lock-postgres release: {e}"))?;
            Ok(acquired)
        })
    }
}

/// Revokes an etcd lease in the background, as dlock's etcd backend does after a release.
pub(crate) fn revoke_later(client: &etcd_client::Client, lease: i64) {
    let mut client = client.clone();
    tokio::spawn(async move {
        let _ = client.lease_revoke(lease).await;
    });
}

/// Lease seconds of [`TTL`] for etcd.
fn lease_secs(ttl: Duration) -> i64 {
    i64::try_from(ttl.as_secs().max(1)).unwrap_or(i64::MAX)
}

/// The bare etcd limit: `LeaseGrant`, a transaction that puts the key on that lease if it
/// does not exist, then `DeleteRange` of the key; the lease is revoked in the background,
/// as dlock does.
pub(crate) struct EtcdLimit {
    client: etcd_client::Client,
    key: String,
    token: String,
}

impl EtcdLimit {
    /// `key` on `client`.
    pub(crate) fn boxed(client: etcd_client::Client, key: String, token: String) -> BoxCycle {
        Box::new(EtcdLimit { client, key, token })
    }
}

impl Cycle for EtcdLimit {
    fn cycle(&mut self) -> CycleFuture<'_> {
        Box::pin(async move {
            use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
            let start = Instant::now();
            let lease = self.client.lease_grant(lease_secs(TTL), None).await?.id();
            let txn = Txn::new()
                .when([Compare::create_revision(
                    self.key.as_str(),
                    CompareOp::Equal,
                    0,
                )])
                .and_then([TxnOp::put(
                    self.key.as_str(),
                    self.token.as_str(),
                    Some(PutOptions::new().with_lease(lease)),
                )]);
            if !self.client.txn(txn).await?.succeeded() {
                return Err(format!("etcd limit: the private key {} was taken", self.key).into());
            }
            let acquired = start.elapsed();
            self.client.delete(self.key.as_str(), None).await?;
            revoke_later(&self.client, lease);
            Ok(acquired)
        })
    }
}

/// etcd's own lock service: `LeaseGrant`, `Lock` (the server creates a key under the
/// name's prefix on that lease and answers once it is the oldest), `Unlock`; the lease is
/// revoked in the background.
pub(crate) struct EtcdNative {
    client: etcd_client::Client,
    name: String,
}

impl EtcdNative {
    /// The lock `name` on `client`.
    pub(crate) fn boxed(client: etcd_client::Client, name: String) -> BoxCycle {
        Box::new(EtcdNative { client, name })
    }
}

impl Cycle for EtcdNative {
    fn cycle(&mut self) -> CycleFuture<'_> {
        Box::pin(async move {
            let start = Instant::now();
            let lease = self.client.lease_grant(lease_secs(TTL), None).await?.id();
            let options = etcd_client::LockOptions::new().with_lease(lease);
            let key = self
                .client
                .lock(self.name.as_str(), Some(options))
                .await?
                .key()
                .to_vec();
            let acquired = start.elapsed();
            self.client.unlock(key).await?;
            revoke_later(&self.client, lease);
            Ok(acquired)
        })
    }
}

/// A bare etcd-client connected like dlock's (2 s timeouts, leader required), retried
/// while a fresh member elects itself.
pub(crate) async fn etcd_client(url: &str) -> Result<etcd_client::Client> {
    etcd_client_with(url, Some(Duration::from_secs(2))).await
}

/// As [`etcd_client`], with `timeout` on every request (`None`: no per-request timeout).
pub(crate) async fn etcd_client_with(
    url: &str,
    timeout: Option<Duration>,
) -> Result<etcd_client::Client> {
    let endpoints: Vec<String> = url
        .strip_prefix("etcd://")
        .ok_or("not an etcd:// URL")?
        .split(',')
        .map(|h| format!("http://{h}"))
        .collect();
    let mut options = etcd_client::ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(2))
        .with_require_leader(true);
    if let Some(timeout) = timeout {
        options = options.with_timeout(timeout);
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let attempt = async {
            let mut client =
                etcd_client::Client::connect(endpoints.clone(), Some(options.clone())).await?;
            client.get("bench:ready", None).await?;
            Ok::<_, etcd_client::Error>(client)
        };
        match attempt.await {
            Ok(client) => return Ok(client),
            Err(err) if Instant::now() < deadline => {
                let _ = err;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(err) => return Err(format!("etcd not ready after 20 s: {err}").into()),
        }
    }
}

/// dlock's etcd client, retried while a fresh member elects itself.
pub(crate) async fn etcd_connect(url: &str) -> Result<fencelock::backend::Etcd> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match fencelock::backend::Etcd::connect(url).await {
            Ok(etcd) => return Ok(etcd),
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(err) => return Err(err.into()),
        }
    }
}

/// The round trip of a bare etcd `Range` (get) of one key, one at a time.
pub(crate) async fn etcd_round_trip(
    client: &etcd_client::Client,
    samples: usize,
) -> Result<Latencies> {
    let mut client = client.clone();
    let mut lat = Latencies::new();
    for i in 0..samples + samples / 10 {
        let start = Instant::now();
        client.get("bench:rtt", None).await?;
        if i >= samples / 10 {
            lat.record(start.elapsed());
        }
    }
    Ok(lat)
}

/// The PID of a child of this process whose command line contains `needle` (for servers
/// whose handle does not say, such as etcd).
pub(crate) fn child_pid(needle: &str) -> Option<u32> {
    let me = std::process::id();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // Field 4 (ppid) is the second field after the command name's ')'.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if ppid != Some(me) {
            continue;
        }
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains(needle) {
            return Some(pid);
        }
    }
    None
}

/// One uncontended run of one client.
pub(crate) struct Run {
    rate: f64,
    p50: Duration,
    p99: Duration,
    acquire_p50: Duration,
    acquire_p99: Duration,
    client_cpu: Duration,
    server_cpu: Duration,
}

/// Runs `tasks` in a loop for `length`, each task on its own tokio task; `servers`: the
/// PIDs whose CPU time is counted as the server's.
pub(crate) async fn run(tasks: Vec<BoxCycle>, length: Duration, servers: &[u32]) -> Result<Run> {
    let stop = Arc::new(AtomicBool::new(false));
    let client_cpu = CpuMeter::start(None)?;
    let server_cpu = servers
        .iter()
        .map(|&pid| CpuMeter::start(Some(pid)))
        .collect::<Result<Vec<_>>>()?;
    let started = Instant::now();
    let handles: Vec<_> = tasks
        .into_iter()
        .map(|task| tokio::spawn(cycle_loop(task, Arc::clone(&stop))))
        .collect();
    tokio::time::sleep(length).await;
    stop.store(true, Ordering::Relaxed);
    let mut cycles = Latencies::new();
    let mut acquires = Latencies::new();
    for h in handles {
        let (c, a) = h.await??;
        cycles.merge(&c);
        acquires.merge(&a);
    }
    let elapsed = started.elapsed();
    let client_secs = client_cpu.cpu_seconds()?;
    let mut server_secs = 0.0;
    for meter in &server_cpu {
        server_secs += meter.cpu_seconds()?;
    }
    let n = cycles.len().max(1) as f64;
    Ok(Run {
        rate: cycles.len() as f64 / elapsed.as_secs_f64(),
        p50: cycles.quantile(0.5),
        p99: cycles.quantile(0.99),
        acquire_p50: acquires.quantile(0.5),
        acquire_p99: acquires.quantile(0.99),
        client_cpu: Duration::from_secs_f64(client_secs / n),
        server_cpu: Duration::from_secs_f64(server_secs / n),
    })
}

/// Cycles until `stop`; the cycle `stop` ends counts too.
async fn cycle_loop(mut task: BoxCycle, stop: Arc<AtomicBool>) -> Result<(Latencies, Latencies)> {
    let mut cycles = Latencies::new();
    let mut acquires = Latencies::new();
    while !stop.load(Ordering::Relaxed) {
        let start = Instant::now();
        let acquired = task.cycle().await?;
        cycles.record(start.elapsed());
        acquires.record(acquired);
    }
    Ok((cycles, acquires))
}

/// One contended run: what the waiters saw, and the servers' CPU per acquisition.
pub(crate) struct HandoffRun {
    run: contended::Run,
    server_cpu: Duration,
}

/// Runs `n` waiters of row `id` on one hot name (step-aside mode, as in section 2) for
/// the profile's contended run, after its warm-up on another name (fresh waiters for the
/// measured run unless [`Setup::REUSE_WAITERS`]), letting the setup settle after each;
/// `servers`: the PIDs whose CPU is the server's.
async fn handoff<S: Setup>(
    setup: &S,
    id: &'static str,
    n: usize,
    tag: &str,
    profile: &crate::Profile,
    servers: &[u32],
) -> Result<HandoffRun> {
    let waiters = setup.waiters(id, n).await?;
    let (warmed, _) = contended::contend(
        waiters,
        &format!("bench:warm:{tag}"),
        Mode::StepAside,
        profile.store_warm_up,
    )
    .await?;
    setup.settle().await?;
    let waiters = if S::REUSE_WAITERS {
        warmed
    } else {
        drop(warmed);
        setup.waiters(id, n).await?
    };
    let length = profile.store_contended_run;
    let meters = servers
        .iter()
        .map(|&pid| CpuMeter::start(Some(pid)))
        .collect::<Result<Vec<_>>>()?;
    let (waiters, stats) = contended::contend(
        waiters,
        &format!("bench:hot:{tag}"),
        Mode::StepAside,
        length,
    )
    .await?;
    let mut server_secs = 0.0;
    for meter in &meters {
        server_secs += meter.cpu_seconds()?;
    }
    drop(waiters);
    setup.settle().await?;
    let run = contended::summarise(&stats, length);
    let acquisitions = (run.rate * length.as_secs_f64()).max(1.0);
    Ok(HandoffRun {
        server_cpu: Duration::from_secs_f64(server_secs / acquisitions),
        run,
    })
}

/// Every run of one row at one task or waiter count.
pub(crate) struct Cell<R> {
    /// The row.
    pub(crate) id: &'static str,
    /// Tasks or waiters.
    pub(crate) n: usize,
    /// One per round.
    pub(crate) runs: Vec<R>,
}

impl<R> Cell<R> {
    /// An empty cell.
    pub(crate) fn new(id: &'static str, n: usize) -> Cell<R> {
        Cell {
            id,
            n,
            runs: Vec::new(),
        }
    }

    fn median(&self, f: impl Fn(&R) -> f64) -> f64 {
        measure::median(&self.runs.iter().map(f).collect::<Vec<_>>())
    }

    fn median_dur(&self, f: impl Fn(&R) -> Duration) -> Duration {
        measure::median_duration(&self.runs.iter().map(f).collect::<Vec<_>>())
    }
}

fn find<'a, R>(cells: &'a [Cell<R>], id: &str, n: usize) -> Option<&'a Cell<R>> {
    cells.iter().find(|c| c.id == id && c.n == n)
}

/// The counts (tasks or waiters) of `cells`, in order of first appearance.
fn counts<R>(cells: &[Cell<R>]) -> Vec<usize> {
    let mut out: Vec<usize> = Vec::new();
    for c in cells {
        if !out.contains(&c.n) {
            out.push(c.n);
        }
    }
    out
}

/// One row of an uncontended table.
pub(crate) struct Row {
    /// The cells' id.
    pub(crate) id: &'static str,
    /// What the reader sees.
    pub(crate) label: String,
    /// Round trips of one cycle, as text.
    pub(crate) round_trips: String,
    /// The row whose throughput `× limit` divides by.
    pub(crate) limit: Option<&'static str>,
    /// The row whose throughput (and acquire p50) `× reference` divides by.
    pub(crate) reference: Option<&'static str>,
    /// The row whose throughput `× peer` divides by.
    pub(crate) peer: Option<&'static str>,
}

/// `12.3 µs`.
pub(crate) fn fmt_us(d: Duration) -> String {
    format!("{:.1} µs", d.as_secs_f64() * 1e6)
}

/// The uncontended table of `rows` over `cells` (every count present).
pub(crate) fn uncontended_table(rows: &[Row], cells: &[Cell<Run>]) -> String {
    let mut md = String::from(
        "| tasks | client | round trips | cycles/s | p50 | p99 | acquire p50 | acquire p99 \
         | × limit | × reference | acquire p50 × reference | × peer | client CPU/cycle \
         | server CPU/cycle |\n\
         |---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for n in counts(cells) {
        for row in rows {
            let Some(cell) = find(cells, row.id, n) else {
                continue;
            };
            let rate = cell.median(|r| r.rate);
            let acquire = cell.median_dur(|r| r.acquire_p50);
            let other = |id: Option<&str>| id.and_then(|id| find(cells, id, n));
            let ratio = |id: Option<&str>| match other(id) {
                Some(o) => fmt_ratio(rate, Some(o.median(|r| r.rate))),
                None => "–".to_owned(),
            };
            let acquire_ratio = match other(row.reference) {
                Some(o) => fmt_ratio(
                    acquire.as_secs_f64(),
                    Some(o.median_dur(|r| r.acquire_p50).as_secs_f64()),
                ),
                None => "–".to_owned(),
            };
            md.push_str(&format!(
                "| {n} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
                row.label,
                row.round_trips,
                fmt_rate(rate),
                fmt_dur(cell.median_dur(|r| r.p50)),
                fmt_dur(cell.median_dur(|r| r.p99)),
                fmt_dur(acquire),
                fmt_dur(cell.median_dur(|r| r.acquire_p99)),
                ratio(row.limit),
                ratio(row.reference),
                acquire_ratio,
                ratio(row.peer),
                fmt_us(cell.median_dur(|r| r.client_cpu)),
                fmt_us(cell.median_dur(|r| r.server_cpu)),
            ));
        }
    }
    md
}

/// The median acquire p50 of row `id` at `n` tasks.
pub(crate) fn acquire_p50(cells: &[Cell<Run>], id: &str, n: usize) -> Option<Duration> {
    find(cells, id, n).map(|c| c.median_dur(|r| r.acquire_p50))
}

/// One row of a contended table.
pub(crate) struct HandoffRow {
    /// The cells' id.
    pub(crate) id: &'static str,
    /// What the reader sees.
    pub(crate) label: String,
    /// The round trip of this row's store, for "p50 in round trips".
    pub(crate) rtt: Duration,
    /// The row whose hand-off p50 `p50 × limit` divides by (the column is shown only when
    /// some row has a limit).
    pub(crate) limit: Option<&'static str>,
    /// The row whose hand-off p50 `p50 × reference` divides by.
    pub(crate) reference: Option<&'static str>,
    /// The row whose hand-off p50 `p50 × peer` divides by (the column is shown only when
    /// some row has a peer).
    pub(crate) peer: Option<&'static str>,
}

/// The contended table of `rows` over `cells`.
pub(crate) fn handoff_table(rows: &[HandoffRow], cells: &[Cell<HandoffRun>]) -> String {
    let limits = rows.iter().any(|r| r.limit.is_some());
    let peers = rows.iter().any(|r| r.peer.is_some());
    let mut md = format!(
        "| waiters | client | acquisitions/s | hand-off p50 | p50 in round trips | hand-off p99 \
         |{} p50 × reference |{} wait p50 | wait p99 | fairness max/min | server CPU/acquisition |\n\
         |---:|---|---:|---:|---:|---:|{}---:|{}---:|---:|---:|---:|\n",
        if limits { " p50 × limit |" } else { "" },
        if peers { " p50 × peer |" } else { "" },
        if limits { "---:|" } else { "" },
        if peers { "---:|" } else { "" },
    );
    for n in counts(cells) {
        for row in rows {
            let Some(cell) = find(cells, row.id, n) else {
                continue;
            };
            let p50 = cell.median_dur(|r| r.run.p50);
            let p50_ratio = |other: Option<&str>| match other {
                Some(id) => fmt_ratio(p50.as_secs_f64(), handoff_p50(cells, id, n)),
                None => "–".to_owned(),
            };
            let fairness = cell.median(|r| r.run.fairness);
            md.push_str(&format!(
                "| {n} | {} | {} | {} | {:.1} | {} |{} {} |{} {} | {} | {} | {} |\n",
                row.label,
                fmt_rate(cell.median(|r| r.run.rate)),
                fmt_dur(p50),
                p50.as_secs_f64() / row.rtt.as_secs_f64().max(1e-9),
                fmt_dur(cell.median_dur(|r| r.run.p99)),
                if limits {
                    format!(" {} |", p50_ratio(row.limit))
                } else {
                    String::new()
                },
                p50_ratio(row.reference),
                if peers {
                    format!(" {} |", p50_ratio(row.peer))
                } else {
                    String::new()
                },
                fmt_dur(cell.median_dur(|r| r.run.wait_p50)),
                fmt_dur(cell.median_dur(|r| r.run.wait_p99)),
                if fairness.is_finite() {
                    format!("{fairness:.2}")
                } else {
                    "∞".to_owned()
                },
                fmt_us(cell.median_dur(|r| r.server_cpu)),
            ));
        }
    }
    md
}

/// The median hand-off p50 of contended row `id` at `n` waiters, in seconds.
pub(crate) fn handoff_p50(cells: &[Cell<HandoffRun>], id: &str, n: usize) -> Option<f64> {
    find(cells, id, n).map(|c| c.median_dur(|r| r.run.p50).as_secs_f64())
}

/// The median fairness (most / fewest acquisitions of one waiter) of contended row `id`
/// at `n` waiters.
pub(crate) fn handoff_fairness(cells: &[Cell<HandoffRun>], id: &str, n: usize) -> Option<f64> {
    find(cells, id, n).map(|c| c.median(|r| r.run.fairness))
}

/// The median cycles/s of uncontended row `id` at `n` tasks.
pub(crate) fn rate(cells: &[Cell<Run>], id: &str, n: usize) -> Option<f64> {
    find(cells, id, n).map(|c| c.median(|r| r.rate))
}

/// What a section measures with: its clients on its servers, and what it runs.
pub(crate) trait Setup: Sized {
    /// The section's name, for the progress bar and the names' tags.
    const SECTION: &'static str;
    /// What the progress bar says while the section starts its servers, if anything.
    const STARTING: Option<&'static str> = None;
    /// Uncontended rows, in run order within a round.
    const ROWS: &'static [&'static str];
    /// Contended rows, in run order within a round (none: no contended runs).
    const HANDOFF_ROWS: &'static [&'static str] = &[];
    /// Whether the waiters of the warm-up may be reused for the measured run. The warm-up
    /// ends by cancelling the waiters' acquire calls, which some clients do not survive
    /// (see the Memcached section): those get fresh waiters.
    const REUSE_WAITERS: bool = true;

    /// What the section keeps of its clients for its text, beside the figures.
    type Extra;

    /// Starts the servers and connects the clients.
    async fn start() -> Result<Self>;
    /// What the section keeps of its clients, taken once everything is measured.
    fn extra(&self) -> Self::Extra;
    /// Whether uncontended row `id` runs at `n` tasks (every row at every count unless a
    /// section says otherwise).
    fn runs(_id: &str, _n: usize) -> bool {
        true
    }
    /// The tasks of uncontended row `id` at `n` tasks, on names tagged `tag`.
    async fn tasks(&self, id: &'static str, n: usize, tag: &str) -> Result<Vec<BoxCycle>>;
    /// The waiters of contended row `id`, `n` of them.
    async fn waiters(&self, id: &'static str, n: usize) -> Result<Vec<BoxWaiter>>;
    /// The round trips this round (one per store the section reports).
    async fn round_trips(&self) -> Result<Vec<Duration>>;
    /// The PIDs of every server the section started.
    fn servers(&self) -> Vec<u32>;
    /// Waits until what a contended run left running in the background is done.
    async fn settle(&self) -> Result<()> {
        Ok(())
    }
}

/// A store section's results: its figures, and what it kept of its clients.
pub(crate) struct Section<S: Setup> {
    /// Rounds.
    pub(crate) rounds: usize,
    /// Length of each uncontended run.
    pub(crate) run: Duration,
    /// Length of each contended run.
    pub(crate) contended_run: Duration,
    /// The median of each round trip over the rounds, in [`Setup::round_trips`]'s order.
    pub(crate) rtts: Vec<Duration>,
    /// Uncontended cells, in run order.
    pub(crate) cells: Vec<Cell<Run>>,
    /// Contended cells, in run order.
    pub(crate) handoffs: Vec<Cell<HandoffRun>>,
    /// What the section kept of its clients.
    pub(crate) extra: S::Extra,
}

/// `(row, tasks or waiters)` of a section's runs, in run order within a round.
type Cells = Vec<(&'static str, usize)>;

/// The uncontended and the contended cells of `S` in `profile`: every row at every count.
fn plan<S: Setup>(profile: &crate::Profile) -> (Cells, Cells) {
    let mut cells = Vec::new();
    for &n in &profile.store_tasks {
        for &id in S::ROWS {
            if S::runs(id, n) {
                cells.push((id, n));
            }
        }
    }
    let mut handoffs = Vec::new();
    if !S::HANDOFF_ROWS.is_empty() {
        for &n in &profile.store_waiters {
            for &id in S::HANDOFF_ROWS {
                handoffs.push((id, n));
            }
        }
    }
    (cells, handoffs)
}

/// Progress steps of section `S`.
pub(crate) fn steps<S: Setup>(profile: &crate::Profile) -> u64 {
    let (cells, handoffs) = plan::<S>(profile);
    (profile.rounds * (cells.len() + handoffs.len())) as u64
}

/// Runs section `S`: starts it, measures its plan, keeps what it says of its clients,
/// then stops its servers.
pub(crate) async fn bench<S: Setup>(
    profile: &crate::Profile,
    bar: &indicatif::ProgressBar,
) -> Result<Section<S>> {
    if let Some(starting) = S::STARTING {
        bar.set_message(starting);
    }
    let setup = S::start().await?;
    let (cells, handoffs) = plan::<S>(profile);
    let (cells, handoffs, rtts) = measure(&setup, &cells, &handoffs, profile, bar).await?;
    let extra = setup.extra();
    drop(setup);
    Ok(Section {
        rounds: profile.rounds,
        run: profile.store_run,
        contended_run: profile.store_contended_run,
        rtts,
        cells,
        handoffs,
        extra,
    })
}

/// Runs the cells `plan` and `plan_handoffs` on `setup`: a short warm-up of every
/// uncontended row, then every round runs every cell one after another (so slow drifts
/// of a shared machine hit all rows alike), measuring the round trips first. Returns the
/// uncontended cells, the contended cells (in the order asked) and the median of each
/// round trip over the rounds.
async fn measure<S: Setup>(
    setup: &S,
    plan: &[(&'static str, usize)],
    plan_handoffs: &[(&'static str, usize)],
    profile: &crate::Profile,
    bar: &indicatif::ProgressBar,
) -> Result<(Vec<Cell<Run>>, Vec<Cell<HandoffRun>>, Vec<Duration>)> {
    let section = S::SECTION;
    let servers = setup.servers();
    let mut uncontended: Vec<Cell<Run>> = plan.iter().map(|&(id, n)| Cell::new(id, n)).collect();
    let mut contended: Vec<Cell<HandoffRun>> = plan_handoffs
        .iter()
        .map(|&(id, n)| Cell::new(id, n))
        .collect();
    // Warm-up: connections, script caches, allocator, CPU frequency.
    let mut warmed: Vec<&str> = Vec::new();
    for &(id, n) in plan {
        if warmed.contains(&id) {
            continue;
        }
        warmed.push(id);
        let tasks = setup.tasks(id, n, "warm").await?;
        run(tasks, Duration::from_millis(100), &servers)
            .await
            .map_err(|e| format!("{section} warm-up of {id}: {e}"))?;
    }
    let mut rtts: Vec<Vec<Duration>> = Vec::new();
    for round in 0..profile.rounds {
        rtts.push(setup.round_trips().await?);
        for cell in &mut uncontended {
            bar.set_message(format!(
                "{}: {} × {} tasks (round {})",
                section,
                cell.id,
                cell.n,
                round + 1
            ));
            let tasks = setup.tasks(cell.id, cell.n, &format!("r{round}")).await?;
            let r = run(tasks, profile.store_run, &servers)
                .await
                .map_err(|e| format!("{section}: {} at {} tasks: {e}", cell.id, cell.n))?;
            cell.runs.push(r);
            bar.inc(1);
        }
        for cell in &mut contended {
            bar.set_message(format!(
                "{}: {} × {} waiters (round {})",
                section,
                cell.id,
                cell.n,
                round + 1
            ));
            let tag = format!("{section}:{}:{}:{round}", cell.id, cell.n);
            let r = handoff(setup, cell.id, cell.n, &tag, profile, &servers)
                .await
                .map_err(|e| format!("{section}: {} × {} waiters: {e}", cell.id, cell.n))?;
            cell.runs.push(r);
            bar.inc(1);
        }
    }
    let stores = rtts.first().map_or(0, Vec::len);
    let rtts = (0..stores)
        .map(|i| {
            measure::median_duration(
                &rtts
                    .iter()
                    .filter_map(|r| r.get(i).copied())
                    .collect::<Vec<_>>(),
            )
        })
        .collect();
    Ok((uncontended, contended, rtts))
}
