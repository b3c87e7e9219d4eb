//! The lock servers a kind runs on, as the nemesis and the audit reach them: spawned by
//! the test kit (a redis-server, RedLock's masters, memcached, an etcd cluster, PostgreSQL,
//! a ZooKeeper ensemble) or named by `--url`, with admin connections that never go through
//! a worker's proxy, and the audit of what a run left behind.

use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

use dlock_test::clock::FakeClock;
use dlock_test::postgres::PostgresServer;
use dlock_test::proxy::Proxy;
#[cfg(feature = "etcd")]
use dlock_test::server::EtcdCluster;
use dlock_test::server::{MemcachedServer, RedisServer};
use dlock_test::zookeeper::ZooKeeper as ZkEnsemble;
use fencelock::keys::LockKeys;

use crate::exit::{self, Failure};
use crate::failover::{Cluster, Sentinel};
use crate::model::{Rng, ZOOKEEPER_CHROOT, ZOOKEEPER_MEMBERS};

/// Where the locks of the kinds without servers of their own live.
pub(crate) enum LockServer {
    /// A redis-server of the run's own.
    Own(RedisServer),
    /// The Redis server `--url` names.
    Given(String),
    /// The PostgreSQL server `--url` names: `postgres-fenced` runs on it (and no kind
    /// needs a Redis lock server).
    Postgres(String),
}

impl LockServer {
    pub(crate) fn url(&self) -> String {
        match self {
            LockServer::Own(s) => s.url(),
            LockServer::Given(u) | LockServer::Postgres(u) => u.clone(),
        }
    }
}

/// Starts the `zookeeper-fenced` kind's ensemble (JVMs: seconds, so on a blocking thread),
/// once `java` is known to be there: the kit would otherwise wait a minute, three times,
/// for servers that never started.
pub(crate) async fn start_zookeeper(clock: Option<FakeClock>) -> Result<ZkEnsemble, String> {
    let on_path = std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join("java").is_file()));
    if !on_path {
        return Err("java not found on PATH".to_owned());
    }
    tokio::task::spawn_blocking(move || match clock {
        Some(clock) => ZkEnsemble::start_with_clock(ZOOKEEPER_MEMBERS, &clock),
        None => ZkEnsemble::start(ZOOKEEPER_MEMBERS),
    })
    .await
    .map_err(|e| format!("starting ZooKeeper: {e}"))?
    .map_err(|e| e.to_string())
}

/// A redis-server of the run's own: a lock server under `clock` when given (the store
/// clock faults move it), or the resource server (never faulted).
pub(crate) fn start_server(clock: Option<&FakeClock>) -> Result<RedisServer, Failure> {
    match clock {
        Some(clock) => RedisServer::start_with_clock(clock, &[]),
        None => RedisServer::start(),
    }
    .map_err(|e| {
        Failure::new(
            exit::UNAVAILABLE,
            format!("dlock torture needs redis-server on PATH: {e}"),
        )
    })
}

/// The lock servers of one kind's run, as the nemesis and the audit reach them.
pub(crate) enum Store<'a> {
    /// One Redis server (ours or the one `--url` named), shared by the single-Redis kinds.
    Redis {
        server: &'a mut LockServer,
        admin: redis::aio::ConnectionManager,
    },
    /// RedLock's independent masters, ours, each with an admin connection.
    Quorum {
        nodes: Vec<RedisServer>,
        admins: Vec<redis::aio::ConnectionManager>,
    },
    /// A memcached of our own.
    Memcached(MemcachedServer),
    /// A PostgreSQL of our own, or the one `--url` names (`server` is then `None`: never
    /// frozen or restarted), with an admin client for the audit and the clean-up (dlock's
    /// own client: its pool replaces a connection a crash broke, and it speaks TLS and
    /// knows the URL's `?schema=`).
    Postgres {
        server: Option<PostgresServer>,
        url: String,
        admin: fencelock::backend::Postgres,
    },
    /// An etcd cluster of our own, with an admin client per member (straight to it, not
    /// through a proxy) to find the leader and audit the keys.
    #[cfg(feature = "etcd")]
    Etcd {
        cluster: EtcdCluster,
        admins: Vec<etcd_client::Client>,
    },
    /// A master, its replica and sentinels of our own (the `sentinel-*` kinds).
    Sentinel(Sentinel),
    /// A Redis Cluster of our own (`cluster-fenced`).
    Cluster(Cluster),
    /// A ZooKeeper ensemble of our own; the workers' sessions time out after
    /// `session_timeout` (the kind's ttl).
    ZooKeeper {
        ensemble: ZkEnsemble,
        session_timeout: Duration,
    },
}

/// How long an admin call to one etcd member may take.
#[cfg(feature = "etcd")]
pub(crate) const ETCD_ADMIN_TIMEOUT: Duration = Duration::from_secs(2);

/// How long a new etcd cluster may take to elect its first leader.
#[cfg(feature = "etcd")]
pub(crate) const ETCD_ELECTION_TIMEOUT: Duration = Duration::from_secs(10);

/// The member etcd's running members name as their leader, if any: the one whose
/// `status` says it leads itself.
#[cfg(feature = "etcd")]
pub(crate) async fn etcd_leader(
    cluster: &EtcdCluster,
    admins: &[etcd_client::Client],
) -> Option<usize> {
    for (i, admin) in admins.iter().enumerate() {
        if !cluster.members.get(i).is_some_and(|m| m.is_running()) {
            continue;
        }
        let mut admin = admin.clone();
        if let Ok(Ok(status)) = tokio::time::timeout(ETCD_ADMIN_TIMEOUT, admin.status()).await
            && status.leader() != 0
            && status.header().map(|h| h.member_id()) == Some(status.leader())
        {
            return Some(i);
        }
    }
    None
}

/// The etcd member a restart kills, and whether it leads: the leader on its turn (waiting
/// up to a second for one, as the last restart may have left an election under way), else
/// a running follower at random.
#[cfg(feature = "etcd")]
pub(crate) async fn etcd_victim(
    cluster: &EtcdCluster,
    admins: &[etcd_client::Client],
    leader_turn: bool,
    rng: &mut Rng,
) -> Option<(usize, bool)> {
    let mut leader = etcd_leader(cluster, admins).await;
    for _ in 0..20 {
        if leader.is_some() || !leader_turn {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        leader = etcd_leader(cluster, admins).await;
    }
    if let Some(l) = leader
        && leader_turn
    {
        return Some((l, true));
    }
    let others: Vec<usize> = (0..cluster.members.len())
        .filter(|&i| cluster.members[i].is_running() && Some(i) != leader)
        .collect();
    (!others.is_empty()).then(|| (others[rng.below(others.len())], false))
}

/// How many of `keys` PostgreSQL still holds anything for: a live holder, a live lease or
/// a waiter's live place (each named on stderr). A key it could not be asked about counts
/// as present: an audit that could not look must not pass.
pub(crate) async fn postgres_count(admin: &fencelock::backend::Postgres, keys: &[String]) -> usize {
    let client = match admin.client().await {
        Ok(client) => client,
        Err(e) => {
            eprintln!(
                "dlock: torture: postgres could not be audited: {e}; every key counted as left"
            );
            return keys.len();
        }
    };
    let s = admin.schema();
    let query = format!(
        "SELECT
           (SELECT count(*) FROM \"{s}\".locks
            WHERE key = $1 AND expires_at > clock_timestamp()),
           (SELECT count(*) FROM \"{s}\".leases
            WHERE key = $1 AND expires_at > clock_timestamp()),
           (SELECT count(*) FROM \"{s}\".waiters
            WHERE key = $1 AND claim_until > clock_timestamp())"
    );
    let mut n = 0;
    for key in keys {
        let row = client.query_one(query.as_str(), &[key]).await;
        match row {
            Ok(row) => {
                let (held, leases, waiting): (i64, i64, i64) = (row.get(0), row.get(1), row.get(2));
                if held + leases + waiting > 0 {
                    eprintln!(
                        "dlock: torture: postgres still holds {key} after the run: holder {held}, leases {leases}, waiters {waiting}"
                    );
                    n += 1;
                }
            }
            Err(e) => {
                eprintln!("dlock: torture: postgres could not be asked about {key}: {e}");
                n += 1;
            }
        }
    }
    n
}

/// How many keys etcd holds at each of `keys` or under `<key>/`, asked of the first running
/// member that answers (one linearizable transaction per key, so both reads see one
/// revision). The etcd backend queues every holder and waiter at `<lock key>/<token>` and
/// stores nothing at the lock key itself, so after the run any key at either place is an
/// orphan; each is named on stderr. A key no member could be asked about counts as
/// present: an audit that could not look must not pass.
#[cfg(feature = "etcd")]
pub(crate) async fn etcd_count(
    cluster: &EtcdCluster,
    admins: &[etcd_client::Client],
    keys: &[String],
) -> usize {
    let mut n = 0;
    for key in keys {
        let txn = etcd_client::Txn::new().and_then([
            etcd_client::TxnOp::get(
                key.as_str(),
                Some(etcd_client::GetOptions::new().with_keys_only()),
            ),
            etcd_client::TxnOp::get(
                format!("{key}/"),
                Some(
                    etcd_client::GetOptions::new()
                        .with_prefix()
                        .with_keys_only(),
                ),
            ),
        ]);
        let mut answer = None;
        for (i, admin) in admins.iter().enumerate() {
            if !cluster.members.get(i).is_some_and(|m| m.is_running()) {
                continue;
            }
            let mut admin = admin.clone();
            if let Ok(Ok(resp)) =
                tokio::time::timeout(ETCD_ADMIN_TIMEOUT, admin.txn(txn.clone())).await
            {
                let left: Vec<String> = resp
                    .op_responses()
                    .into_iter()
                    .filter_map(|op| match op {
                        etcd_client::TxnOpResponse::Get(get) => Some(get),
                        _ => None,
                    })
                    .flat_map(|get| {
                        get.kvs()
                            .iter()
                            .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
                            .collect::<Vec<_>>()
                    })
                    .collect();
                for orphan in &left {
                    eprintln!("dlock: torture: etcd still holds {orphan} after the run");
                }
                answer = Some(left.len());
                break;
            }
        }
        n += answer.unwrap_or_else(|| {
            eprintln!(
                "dlock: torture: no etcd member answered the audit of {key} and {key}/; counted as left"
            );
            1
        });
    }
    n
}

/// The ZooKeeper server that leads now, as the servers' `srvr` answers say (the kit's
/// four-letter words are blocking loopback calls, each bounded by a 2 s read timeout; the
/// torture command runs on the multi-threaded runtime, where a worker thread may block).
pub(crate) fn zookeeper_leader(ensemble: &ZkEnsemble) -> Option<usize> {
    tokio::task::block_in_place(|| ensemble.leader())
}

/// The ZooKeeper server a restart kills, and whether it leads: the leader on its turn
/// (waiting up to a second for one, as the last restart may have left an election under
/// way), else a running follower at random — as `etcd_victim`.
pub(crate) async fn zookeeper_victim(
    ensemble: &ZkEnsemble,
    leader_turn: bool,
    rng: &mut Rng,
) -> Option<(usize, bool)> {
    let mut leader = zookeeper_leader(ensemble);
    for _ in 0..20 {
        if leader.is_some() || !leader_turn {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        leader = zookeeper_leader(ensemble);
    }
    if let Some(l) = leader
        && leader_turn
    {
        return Some((l, true));
    }
    let others: Vec<usize> = (0..ensemble.members.len())
        .filter(|&i| ensemble.members[i].is_running() && Some(i) != leader)
        .collect();
    (!others.is_empty()).then(|| (others[rng.below(others.len())], false))
}

/// How long the ZooKeeper audit may take to open its session and read.
pub(crate) const ZOOKEEPER_AUDIT_TIMEOUT: Duration = Duration::from_secs(10);

/// How many lock nodes ZooKeeper still holds in the directories of `keys`, read by a new
/// client connected straight to every server (not through a proxy) under the kind's
/// chroot. The backend queues every holder and waiter as an ephemeral sequential node
/// `/<escaped lock key>/<token>-<seq>`; once every worker has ended and every session of
/// theirs has expired, any such node is an orphan (named on stderr, with the holder's
/// token). A key that could not be looked at counts as present: an audit that could not
/// look must not pass.
pub(crate) async fn zookeeper_count(ensemble: &ZkEnsemble, keys: &[String]) -> usize {
    use fencelock::raw::RawInspect as _;
    let url = ensemble.url(ZOOKEEPER_CHROOT, "");
    let admin = match tokio::time::timeout(
        ZOOKEEPER_AUDIT_TIMEOUT,
        fencelock::backend::ZooKeeper::connect(&url),
    )
    .await
    {
        Ok(Ok(admin)) => admin,
        Ok(Err(e)) => {
            eprintln!(
                "dlock: torture: the ZooKeeper audit could not connect: {e}; every key counted as left"
            );
            return keys.len();
        }
        Err(_) => {
            eprintln!(
                "dlock: torture: the ZooKeeper audit could not connect in time; every key counted as left"
            );
            return keys.len();
        }
    };
    let mut n = 0;
    for key in keys {
        let dir = format!(
            "{ZOOKEEPER_CHROOT}/{}",
            fencelock::backend::zookeeper::escape(key)
        );
        let Ok(lock_keys) = LockKeys::new("", key) else {
            eprintln!("dlock: torture: {key:?} is no lock key; counted as left");
            n += 1;
            continue;
        };
        match tokio::time::timeout(
            ZOOKEEPER_AUDIT_TIMEOUT,
            admin.inspect(fencelock::raw::Kind::Lock, &lock_keys),
        )
        .await
        {
            Ok(Ok(state)) => {
                let nodes =
                    usize::from(state.holder.is_some()) + state.queued.map_or(0, |q| q as usize);
                if nodes > 0 {
                    eprintln!(
                        "dlock: torture: ZooKeeper still holds {nodes} lock node(s) in {dir} after the run (holder {:?})",
                        state.holder
                    );
                }
                n += nodes;
            }
            Ok(Err(e)) => {
                eprintln!("dlock: torture: ZooKeeper could not be asked about {dir}: {e}");
                n += 1;
            }
            Err(_) => {
                eprintln!("dlock: torture: ZooKeeper did not answer about {dir} in time");
                n += 1;
            }
        }
    }
    n
}

pub(crate) fn store_err(e: redis::RedisError) -> Failure {
    Failure::new(exit::UNAVAILABLE, format!("torture: {e}"))
}

pub(crate) async fn admin_connection(url: &str) -> Result<redis::aio::ConnectionManager, Failure> {
    redis::Client::open(url)
        .map_err(|e| Failure::usage(e.to_string()))?
        .get_connection_manager()
        .await
        .map_err(store_err)
}

/// Deletes what a run left of `keys` in a PostgreSQL it does not own (the lock's row, its
/// fence with it: the names are the run's own, never used again; leases and waiters'
/// places).
async fn postgres_remove(admin: &fencelock::backend::Postgres, keys: &[String]) {
    let Ok(client) = admin.client().await else {
        return;
    };
    let s = admin.schema();
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    for table in ["locks", "leases", "waiters"] {
        let delete = format!("DELETE FROM \"{s}\".{table} WHERE key = ANY($1)");
        if let Err(e) = client.execute(delete.as_str(), &[&keys]).await {
            eprintln!("dlock: torture: cleaning up {s}.{table}: {e}");
        }
    }
}

/// The address a PostgreSQL URL reaches, when a worker's proxy can stand in for it: one
/// TCP host, no `host=`, `hostaddr=` or `port=` parameter, and no TLS (dlock verifies the
/// server's name, which a proxy's address is not). `None` otherwise: the workers then
/// reach the server straight, and the network faults are skipped.
pub(crate) fn postgres_upstream(url: &str) -> Option<SocketAddr> {
    let (scheme, rest) = url.split_once("://")?;
    if scheme != "postgres" && scheme != "postgresql" {
        return None;
    }
    let (base, query) = rest.split_once('?').unwrap_or((rest, ""));
    let overridden = query.split('&').any(|pair| {
        let key = pair.split('=').next().unwrap_or("");
        matches!(key, "host" | "hostaddr" | "port")
            || (key == "sslmode"
                && !matches!(
                    pair.split_once('=').map(|p| p.1),
                    Some("disable" | "allow" | "prefer")
                ))
    });
    if overridden {
        return None;
    }
    let hostport = base.rsplit_once('@').map_or(base, |(_, h)| h);
    let hostport = hostport.split('/').next()?;
    if hostport.is_empty() || hostport.contains(',') || hostport.starts_with('%') {
        return None;
    }
    let with_port = if hostport.ends_with(']') || !hostport.contains(':') {
        format!("{hostport}:5432")
    } else {
        hostport.to_owned()
    };
    with_port.to_socket_addrs().ok()?.next()
}

/// A PostgreSQL URL whose host and port are replaced by `addr` (a worker's proxy): as
/// [`via`] for Redis; only for URLs [`postgres_upstream`] accepts.
pub(crate) fn postgres_via(url: &str, addr: SocketAddr) -> Option<String> {
    postgres_upstream(url)?;
    let (scheme, rest) = url.split_once("://")?;
    let (base, query) = match rest.split_once('?') {
        Some((base, query)) => (base, format!("?{query}")),
        None => (rest, String::new()),
    };
    let (auth, hostpath) = match base.rsplit_once('@') {
        Some((auth, hostpath)) => (format!("{auth}@"), hostpath),
        None => (String::new(), base),
    };
    let path = hostpath.find('/').map_or("", |i| &hostpath[i..]);
    Some(format!("{scheme}://{auth}{addr}{path}{query}"))
}

impl<'a> Store<'a> {
    /// A PostgreSQL of our own (`server`), or the one `--url` names (`given`).
    pub(crate) async fn postgres(
        server: Option<PostgresServer>,
        given: Option<&str>,
    ) -> Result<Store<'a>, Failure> {
        let url = match (&server, given) {
            (Some(s), _) => s.url(),
            (None, Some(url)) => url.to_owned(),
            (None, None) => {
                return Err(Failure::new(
                    exit::UNAVAILABLE,
                    "torture: no PostgreSQL to run on",
                ));
            }
        };
        let admin = fencelock::backend::Postgres::connect(&url)
            .await
            .map_err(|e| {
                Failure::new(
                    exit::UNAVAILABLE,
                    format!("torture: the PostgreSQL admin connection: {e}"),
                )
            })?;
        Ok(Store::Postgres { server, url, admin })
    }

    pub(crate) async fn redis(server: &'a mut LockServer) -> Result<Store<'a>, Failure> {
        let admin = admin_connection(&server.url()).await?;
        Ok(Store::Redis { server, admin })
    }

    pub(crate) async fn quorum(nodes: Vec<RedisServer>) -> Result<Store<'a>, Failure> {
        let mut admins = Vec::with_capacity(nodes.len());
        for node in &nodes {
            admins.push(admin_connection(&node.url()).await?);
        }
        Ok(Store::Quorum { nodes, admins })
    }

    /// The cluster with an admin client per member, once its members have elected a
    /// leader (the workers' first calls would fail before).
    #[cfg(feature = "etcd")]
    pub(crate) async fn etcd(cluster: EtcdCluster) -> Result<Store<'a>, Failure> {
        let mut admins = Vec::with_capacity(cluster.members.len());
        for member in &cluster.members {
            let options = etcd_client::ConnectOptions::new()
                .with_connect_timeout(ETCD_ADMIN_TIMEOUT)
                .with_timeout(ETCD_ADMIN_TIMEOUT);
            let admin =
                etcd_client::Client::connect([format!("http://{}", member.addr())], Some(options))
                    .await
                    .map_err(|e| Failure::new(exit::UNAVAILABLE, format!("torture: etcd: {e}")))?;
            admins.push(admin);
        }
        let deadline = tokio::time::Instant::now() + ETCD_ELECTION_TIMEOUT;
        while etcd_leader(&cluster, &admins).await.is_none() {
            if tokio::time::Instant::now() > deadline {
                return Err(Failure::new(
                    exit::UNAVAILABLE,
                    format!(
                        "torture: the etcd cluster elected no leader within {ETCD_ELECTION_TIMEOUT:?}"
                    ),
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(Store::Etcd { cluster, admins })
    }

    /// Whether the store has several servers that faults hit one by one (RedLock's nodes,
    /// etcd's members), whose indexes a fault window records.
    pub(crate) fn has_nodes(&self) -> bool {
        match self {
            Store::Quorum { .. } | Store::ZooKeeper { .. } => true,
            #[cfg(feature = "etcd")]
            Store::Etcd { .. } => true,
            _ => false,
        }
    }

    /// Where each lock server listens, for the proxies (none for a server given by a URL
    /// a proxy cannot stand in for, e.g. a unix socket).
    pub(crate) fn upstreams(&self) -> Vec<SocketAddr> {
        let loopback = |port| SocketAddr::from(([127, 0, 0, 1], port));
        match self {
            Store::Redis { server, .. } => upstream(&server.url()).into_iter().collect(),
            Store::Quorum { nodes, .. } => nodes.iter().map(|n| loopback(n.port())).collect(),
            Store::Memcached(server) => vec![loopback(server.port())],
            Store::Postgres {
                server: Some(server),
                ..
            } => vec![loopback(server.port())],
            Store::Postgres {
                server: None, url, ..
            } => postgres_upstream(url).into_iter().collect(),
            #[cfg(feature = "etcd")]
            Store::Etcd { cluster, .. } => cluster
                .members
                .iter()
                .filter_map(|m| m.addr().parse().ok())
                .collect(),
            Store::ZooKeeper { ensemble, .. } => ensemble
                .members
                .iter()
                .filter_map(|m| m.addr().parse().ok())
                .collect(),
            // Straight to the servers: the sentinels and the cluster hand out addresses
            // no proxy stands in for.
            Store::Sentinel(_) | Store::Cluster(_) => Vec::new(),
        }
    }

    /// The `--lock-url` of a worker whose links to the servers are `proxies` (one per
    /// server; RedLock's nodes, etcd's members and ZooKeeper's servers comma-separated).
    pub(crate) fn worker_url(&self, proxies: &[Proxy]) -> String {
        match self {
            Store::Redis { server, .. } => {
                let url = server.url();
                proxies
                    .first()
                    .and_then(|p| via(&url, p.addr()))
                    .unwrap_or(url)
            }
            Store::Quorum { .. } => proxies
                .iter()
                .map(|p| format!("redis://{}/", p.addr()))
                .collect::<Vec<_>>()
                .join(","),
            Store::Memcached(_) => proxies
                .first()
                .map(|p| format!("memcache://{}", p.addr()))
                .unwrap_or_default(),
            Store::Postgres { url, .. } => proxies
                .first()
                .and_then(|p| postgres_via(url, p.addr()))
                .unwrap_or_else(|| url.clone()),
            #[cfg(feature = "etcd")]
            Store::Etcd { .. } => format!(
                "etcd://{}",
                proxies
                    .iter()
                    .map(|p| p.addr().to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            ),
            Store::Sentinel(sentinel) => sentinel.url(),
            Store::Cluster(cluster) => cluster.cluster.url(),
            Store::ZooKeeper {
                session_timeout, ..
            } => format!(
                "zk://{}{ZOOKEEPER_CHROOT}?session_timeout={}ms",
                proxies
                    .iter()
                    .map(|p| p.addr().to_string())
                    .collect::<Vec<_>>()
                    .join(","),
                session_timeout.as_millis()
            ),
        }
    }

    /// How many of `keys` (lock keys, as the kind's Redis backend names them) are still
    /// present: on the server, on any RedLock node (counted per node), in memcached, or in
    /// etcd — there every key at a lock key or in its queue under `<lock key>/` counts.
    pub(crate) async fn count_present(&mut self, keys: &[String]) -> usize {
        // Each key left is named on stderr with its remaining ttl and (for a sorted set,
        // a waiter queue) its members and scores, so that a failed audit says what leaked.
        let exists = |admin: &mut redis::aio::ConnectionManager| {
            let mut admin = admin.clone();
            let keys = keys.to_vec();
            async move {
                let mut n = 0;
                for key in &keys {
                    let (present, pttl, kind): (i64, i64, String) = match redis::pipe()
                        .exists(key)
                        .pttl(key)
                        .cmd("TYPE")
                        .arg(key)
                        .query_async(&mut admin)
                        .await
                    {
                        Ok(r) => r,
                        Err(_) => continue,
                    };
                    if present == 0 {
                        continue;
                    }
                    n += 1;
                    let members: Vec<(String, f64)> = if kind == "zset" {
                        redis::cmd("ZRANGE")
                            .arg(key)
                            .arg(0)
                            .arg(-1)
                            .arg("WITHSCORES")
                            .query_async(&mut admin)
                            .await
                            .unwrap_or_default()
                    } else {
                        Vec::new()
                    };
                    eprintln!(
                        "dlock: torture: {key} ({kind}) still present after the run, pttl {pttl} ms{}",
                        if members.is_empty() {
                            String::new()
                        } else {
                            format!(", members {members:?}")
                        }
                    );
                }
                n
            }
        };
        match self {
            Store::Redis { admin, .. } => exists(admin).await,
            Store::Quorum { admins, .. } => {
                let mut n = 0;
                for admin in admins {
                    n += exists(admin).await;
                }
                n
            }
            // `mg <key>` answers HD for a key it holds, EN for none.
            Store::Memcached(server) => keys
                .iter()
                .filter(|k| {
                    let key = fencelock::backend::memcached::memcached_key(k);
                    server
                        .command(&format!("mg {key}\r\n"))
                        .is_ok_and(|r| r.starts_with("HD"))
                })
                .count(),
            #[cfg(feature = "etcd")]
            Store::Etcd { cluster, admins } => etcd_count(cluster, admins, keys).await,
            Store::ZooKeeper { ensemble, .. } => zookeeper_count(ensemble, keys).await,
            Store::Sentinel(sentinel) => match admin_connection(&sentinel.master().url()).await {
                Ok(mut admin) => exists(&mut admin).await,
                Err(_) => {
                    eprintln!(
                        "dlock: torture: the master could not be audited; every key counted as left"
                    );
                    keys.len()
                }
            },
            Store::Cluster(cluster) => {
                let mut n = 0;
                for key in keys {
                    let master = tokio::task::block_in_place(|| cluster.cluster.master_of(key));
                    let admin = match master {
                        Ok(m) => admin_connection(&cluster.cluster.nodes[m].url()).await.ok(),
                        Err(_) => None,
                    };
                    let present = match admin {
                        Some(mut admin) => redis::cmd("EXISTS")
                            .arg(key)
                            .query_async::<usize>(&mut admin)
                            .await
                            .unwrap_or(1),
                        None => 1,
                    };
                    if present > 0 {
                        eprintln!(
                            "dlock: torture: {key} still present in the cluster after the run (or no node could be asked)"
                        );
                    }
                    n += present;
                }
                n
            }
            // A crash restart broke the pool's connections: it opens others.
            Store::Postgres { admin, .. } => postgres_count(admin, keys).await,
        }
    }

    /// Deletes what the run left on a shared server (the lock's keys too, if a control
    /// orphaned them), or on the PostgreSQL `--url` named. Servers of a kind's own die
    /// with its run.
    pub(crate) async fn remove(&mut self, keys: &[String]) {
        match self {
            Store::Redis { admin, .. } => {
                let _: Result<(), _> = redis::cmd("DEL").arg(keys).query_async(admin).await;
            }
            Store::Postgres {
                server: None,
                admin,
                ..
            } => postgres_remove(admin, keys).await,
            _ => {}
        }
    }
}

/// Replaces host:port of a redis URL with `addr` (the worker's proxy).
pub(crate) fn via(url: &str, addr: SocketAddr) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    if !scheme.starts_with("redis") || scheme.contains("unix") {
        return None;
    }
    let (auth, hostpath) = match rest.rsplit_once('@') {
        Some((a, h)) => (format!("{a}@"), h),
        None => (String::new(), rest),
    };
    let path = hostpath.find('/').map_or("", |i| &hostpath[i..]);
    Some(format!("{scheme}://{auth}{addr}{path}"))
}

pub(crate) fn upstream(url: &str) -> Option<SocketAddr> {
    let (_, rest) = url.split_once("://")?;
    let hostpath = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
    let hostport = hostpath.split('/').next()?;
    let hostport = if hostport.contains(':') {
        hostport.to_owned()
    } else {
        format!("{hostport}:6379")
    };
    hostport.to_socket_addrs().ok()?.next()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_tcp_postgres_url_goes_through_a_worker_s_proxy_with_everything_else_kept() {
        let proxy: SocketAddr = "127.0.0.1:4000".parse().expect("addr");
        let url = "postgres://app:p%40ss@127.0.0.1:5433/db?schema=t1&application_name=a@b";
        assert_eq!(
            postgres_upstream(url),
            Some("127.0.0.1:5433".parse().expect("addr"))
        );
        assert_eq!(
            postgres_via(url, proxy).as_deref(),
            Some("postgres://app:p%40ss@127.0.0.1:4000/db?schema=t1&application_name=a@b")
        );
        // The default port, no database, no credentials, the other scheme.
        assert_eq!(
            postgres_upstream("postgresql://127.0.0.1"),
            Some("127.0.0.1:5432".parse().expect("addr"))
        );
        assert_eq!(
            postgres_via("postgresql://127.0.0.1", proxy).as_deref(),
            Some("postgresql://127.0.0.1:4000")
        );
        assert_eq!(
            postgres_upstream("postgres://u@[::1]/db"),
            Some("[::1]:5432".parse().expect("addr"))
        );
    }

    #[test]
    fn a_postgres_url_no_proxy_can_stand_in_for_is_reached_straight() {
        let proxy: SocketAddr = "127.0.0.1:4000".parse().expect("addr");
        for url in [
            // A unix socket, given as libpq allows.
            "postgres://app@/db?host=/run/postgresql",
            "postgres://app@%2Frun%2Fpostgresql/db",
            // Several hosts, or a host or port given as a parameter.
            "postgres://app@127.0.0.1:5432,127.0.0.1:5433/db",
            "postgres://app@127.0.0.1/db?port=5433",
            "postgres://app@127.0.0.1/db?hostaddr=127.0.0.2",
            // TLS: dlock verifies the server's name, which the proxy's address is not.
            "postgres://app:pw@127.0.0.1/db?sslmode=require",
            "postgres://app:pw@127.0.0.1/db?sslmode=verify-full",
            "redis://127.0.0.1:6379/",
        ] {
            assert_eq!(postgres_upstream(url), None, "{url}");
            assert_eq!(postgres_via(url, proxy), None, "{url}");
        }
        // sslmode that means plain text still goes through a proxy.
        assert!(postgres_upstream("postgres://app:pw@127.0.0.1/db?sslmode=disable").is_some());
    }
}
