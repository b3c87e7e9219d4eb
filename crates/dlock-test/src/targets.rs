//! Conformance targets for the built-in backends.

use fencelock::backend::{Memory, Redis};

use crate::conformance::{Freezable, Proxied, Target};
use crate::server::RedisServer;

/// The in-process store; every "client" shares it, as threads of one process would.
#[derive(Debug, Default)]
pub struct MemoryTarget {
    store: Memory,
}

impl MemoryTarget {
    /// The store (a clone shares it).
    pub fn store(&self) -> Memory {
        self.store.clone()
    }
}

impl Target for MemoryTarget {
    type Backend = Memory;

    async fn client(&self) -> Memory {
        self.store.clone()
    }

    async fn delete_key(&self, key: &str) {
        self.store.force_delete(key);
    }
}

/// A private `redis-server`; each client is a separate connection, as separate processes
/// would have.
#[derive(Debug)]
pub struct RedisTarget {
    /// The server (public so tests can restart or freeze it).
    pub server: RedisServer,
}

impl RedisTarget {
    /// Starts a private server.
    ///
    /// # Panics
    /// If `redis-server` cannot be started (the test cannot run without it).
    pub fn start() -> RedisTarget {
        RedisTarget {
            server: RedisServer::start()
                .expect("start redis-server (apt-get install redis-server)"),
        }
    }

    /// An admin connection for inspection and fault commands.
    ///
    /// # Panics
    /// If the server does not answer.
    pub async fn admin(&self) -> redis::aio::MultiplexedConnection {
        self.server
            .client()
            .get_multiplexed_async_connection()
            .await
            .expect("admin connection")
    }
}

impl Target for RedisTarget {
    type Backend = Redis;

    async fn client(&self) -> Redis {
        Redis::connect(self.server.url())
            .await
            .expect("connect to the test server")
    }

    async fn delete_key(&self, key: &str) {
        let mut admin = self.admin().await;
        let _: i64 = redis::cmd("DEL")
            .arg(key)
            .query_async(&mut admin)
            .await
            .expect("DEL");
    }
}

impl Freezable for RedisTarget {
    fn pids(&self) -> Vec<u32> {
        self.server.pid().into_iter().collect()
    }
}

impl Proxied for RedisTarget {
    fn port(&self) -> u16 {
        self.server.port()
    }

    async fn client_at(&self, addr: std::net::SocketAddr) -> Redis {
        Redis::builder(format!("redis://{addr}/"))
            .response_timeout(std::time::Duration::from_millis(300))
            .connect()
            .await
            .expect("connect through the proxy")
    }
}

/// A 3-master Redis Cluster on loopback; each client is its own cluster connection.
#[derive(Debug)]
pub struct ClusterTarget {
    /// The cluster (public so tests can fail nodes).
    pub cluster: crate::cluster::RedisCluster,
}

impl ClusterTarget {
    /// Starts a 3-master cluster without replicas.
    ///
    /// # Panics
    /// If the cluster cannot be started (the test cannot run without it).
    pub fn start() -> ClusterTarget {
        ClusterTarget {
            cluster: crate::cluster::RedisCluster::start(3, 0)
                .expect("start a redis cluster (redis-server, redis-cli)"),
        }
    }
}

impl Target for ClusterTarget {
    type Backend = Redis;

    async fn client(&self) -> Redis {
        Redis::connect(self.cluster.url())
            .await
            .expect("connect to the test cluster")
    }

    async fn delete_key(&self, key: &str) {
        let mut c = self
            .cluster
            .client()
            .get_async_connection()
            .await
            .expect("cluster connection");
        let _: i64 = redis::cmd("DEL")
            .arg(key)
            .query_async(&mut c)
            .await
            .expect("DEL");
    }
}

/// A private `memcached`; each client is its own connection.
#[derive(Debug)]
pub struct MemcachedTarget {
    /// The server (public so tests can restart it or flush it).
    pub server: crate::server::MemcachedServer,
}

impl MemcachedTarget {
    /// Starts a private memcached.
    ///
    /// # Panics
    /// If `memcached` cannot be started (the test cannot run without it).
    pub fn start() -> MemcachedTarget {
        MemcachedTarget {
            server: crate::server::MemcachedServer::start()
                .expect("start memcached (apt-get install memcached)"),
        }
    }
}

impl Target for MemcachedTarget {
    type Backend = fencelock::backend::Memcached;

    async fn client(&self) -> fencelock::backend::Memcached {
        fencelock::backend::Memcached::connect(&self.server.url())
            .await
            .expect("connect to the test memcached")
    }

    async fn delete_key(&self, key: &str) {
        let key = fencelock::backend::memcached::memcached_key(key);
        let reply = self.server.command(&format!("md {key}\r\n")).expect("md");
        assert!(
            reply.starts_with("HD") || reply.starts_with("NF"),
            "{reply}"
        );
    }

    /// Memcached expires on a one-second clock: five times what the behaviour wants, and
    /// at least 3 s. At the 2 s minimum a key lives only a little over one second after
    /// each renewal, and memcached's clock tick, which runs late on a loaded machine (two
    /// tests at once on two cores under `.ci/run`), took the rest: a renewed key expired
    /// (`watchdog_keeps_lock` failed once in `.ci/run`).
    fn ttl(&self, wanted: std::time::Duration) -> std::time::Duration {
        (wanted * 5).max(std::time::Duration::from_secs(3))
    }
}

impl Freezable for MemcachedTarget {
    fn pids(&self) -> Vec<u32> {
        self.server.pid().into_iter().collect()
    }
}

impl Proxied for MemcachedTarget {
    fn port(&self) -> u16 {
        self.server.port()
    }

    async fn client_at(&self, addr: std::net::SocketAddr) -> fencelock::backend::Memcached {
        fencelock::backend::Memcached::connect(&format!("memcache://{addr}"))
            .await
            .expect("connect through the proxy")
    }
}

/// A private etcd (one member); each client is its own gRPC channel.
#[cfg(feature = "etcd")]
#[derive(Debug)]
pub struct EtcdTarget {
    /// The cluster (public so tests can kill members).
    pub cluster: crate::server::EtcdCluster,
}

#[cfg(feature = "etcd")]
impl EtcdTarget {
    /// Starts a single-member etcd.
    ///
    /// # Panics
    /// If `etcd` cannot be started (the test cannot run without it).
    pub fn start() -> EtcdTarget {
        EtcdTarget {
            cluster: crate::server::EtcdCluster::start(1)
                .expect("start etcd (apt-get install etcd-server)"),
        }
    }
}

#[cfg(feature = "etcd")]
impl Target for EtcdTarget {
    type Backend = fencelock::backend::Etcd;

    async fn client(&self) -> fencelock::backend::Etcd {
        // The member may still be electing itself: retry for a few seconds.
        let mut last = None;
        for _ in 0..50 {
            match fencelock::backend::Etcd::connect(&self.cluster.url()).await {
                Ok(c) => return c,
                Err(e) => last = Some(e),
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        panic!("connect to the test etcd: {last:?}");
    }

    /// Deletes `key` and every key under `key/`: the etcd backend stores nothing at a
    /// lock's key and queues its holder and waiters at `<lock key>/<token>`, so deleting a
    /// lock's key behind its holder's back means deleting that queue. One transaction, so
    /// no holder or waiter sees half of it gone.
    async fn delete_key(&self, key: &str) {
        let mut c = etcd_client::Client::connect(
            [format!("http://{}", self.cluster.members[0].addr())],
            None,
        )
        .await
        .expect("etcd admin");
        let txn = etcd_client::Txn::new().and_then([
            etcd_client::TxnOp::delete(key, None),
            etcd_client::TxnOp::delete(
                format!("{key}/"),
                Some(etcd_client::DeleteOptions::new().with_prefix()),
            ),
        ]);
        c.txn(txn).await.expect("delete the key and its queue");
    }

    /// Leases are whole seconds: at least 2 s, five times what the behaviour wants.
    fn ttl(&self, wanted: std::time::Duration) -> std::time::Duration {
        (wanted * 5).max(std::time::Duration::from_secs(2))
    }
}

#[cfg(feature = "etcd")]
impl Freezable for EtcdTarget {
    fn pids(&self) -> Vec<u32> {
        self.cluster
            .members
            .iter()
            .filter_map(crate::server::EtcdMember::pid)
            .collect()
    }
}

#[cfg(feature = "etcd")]
impl Proxied for EtcdTarget {
    fn port(&self) -> u16 {
        self.cluster.members[0].client_port()
    }

    async fn client_at(&self, addr: std::net::SocketAddr) -> fencelock::backend::Etcd {
        fencelock::backend::Etcd::connect(&format!("etcd://{addr}"))
            .await
            .expect("connect through the proxy")
    }
}

/// A private PostgreSQL server; each client is its own pool of connections.
#[derive(Debug)]
pub struct PostgresTarget {
    /// The server (public so tests can restart or freeze it).
    pub server: crate::postgres::PostgresServer,
}

impl PostgresTarget {
    /// Starts a private PostgreSQL.
    ///
    /// # Panics
    /// If PostgreSQL cannot be started (the test cannot run without it).
    pub fn start() -> PostgresTarget {
        PostgresTarget {
            server: crate::postgres::PostgresServer::start()
                .expect("start postgres (apt-get install postgresql)"),
        }
    }
}

impl Target for PostgresTarget {
    type Backend = fencelock::backend::Postgres;

    async fn client(&self) -> fencelock::backend::Postgres {
        fencelock::backend::Postgres::connect(&self.server.url())
            .await
            .expect("connect to the test postgres")
    }

    /// Clears the holder and every lease of the name (permits, readers, reentrant holds)
    /// as an operator's statements would (the row, and with it the name's fence counter,
    /// stays).
    async fn delete_key(&self, key: &str) {
        let admin = self.server.admin().await;
        admin
            .execute(
                "UPDATE dlock.locks SET holder = NULL, expires_at = NULL WHERE key = $1",
                &[&key],
            )
            .await
            .expect("UPDATE");
        admin
            .execute("DELETE FROM dlock.leases WHERE key = $1", &[&key])
            .await
            .expect("DELETE");
    }
}

impl Freezable for PostgresTarget {
    fn pids(&self) -> Vec<u32> {
        self.server.pids()
    }
}

impl Proxied for PostgresTarget {
    fn port(&self) -> u16 {
        self.server.port()
    }

    async fn client_at(&self, addr: std::net::SocketAddr) -> fencelock::backend::Postgres {
        fencelock::backend::Postgres::connect(&format!(
            "postgres://dlock:{}@{addr}/postgres",
            crate::postgres::PASSWORD
        ))
        .await
        .expect("connect through the proxy")
    }
}

/// A chroot of its own on the ZooKeeper server this test binary shares; each client is
/// its own session (20 s timeout: leases are `min(ttl, session)`, and the suite extends to
/// 10 s), as separate processes would have.
#[derive(Debug)]
pub struct ZooKeeperTarget {
    /// The server.
    pub zk: &'static crate::zookeeper::ZooKeeper,
    /// This target's chroot.
    pub chroot: String,
}

impl ZooKeeperTarget {
    /// A fresh chroot on the shared server (started at the first call).
    ///
    /// # Panics
    /// If ZooKeeper cannot be started.
    pub fn start() -> ZooKeeperTarget {
        ZooKeeperTarget {
            zk: crate::zookeeper::ZooKeeper::shared(),
            chroot: format!("/{}", crate::conformance::unique("t")),
        }
    }

    /// The URL of this target's clients.
    pub fn url(&self) -> String {
        self.zk.url(&self.chroot, "?session_timeout=20s")
    }
}

impl Target for ZooKeeperTarget {
    type Backend = fencelock::backend::ZooKeeper;

    async fn client(&self) -> fencelock::backend::ZooKeeper {
        fencelock::backend::ZooKeeper::connect(&self.url())
            .await
            .expect("connect to the test zookeeper")
    }

    /// Deletes every node in the lock's directory (`/<escaped key>`): its holder's and its
    /// waiters'.
    async fn delete_key(&self, key: &str) {
        let admin = self.client().await.client();
        let dir = format!("/{}", fencelock::backend::zookeeper::escape(key));
        let children = admin.list_children(&dir).await.unwrap_or_default();
        for c in children {
            let _ = admin.delete(&format!("{dir}/{c}"), None).await;
        }
    }

    fn session_bound(&self) -> bool {
        true
    }

    /// At least two seconds: every renewal of a ZooKeeper hold is a round trip to a JVM
    /// server, and on a loaded machine (two tests at once on two cores, other builds
    /// beside them) one ran late past a 300 ms lease — the holder lost it and another
    /// client was granted it (`watchdog_renews_while_the_thread_sleeps`) — and once past
    /// a 1 s one (`watchdog_keeps_lock`: the lease lapsed by the client's clock).
    fn ttl(&self, wanted: std::time::Duration) -> std::time::Duration {
        wanted.max(std::time::Duration::from_secs(2))
    }
}
