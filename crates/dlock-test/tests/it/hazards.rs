//! Store configurations that can drop a held lock or repeat a fence (issue 25, part 5),
//! and URL options that would do nothing (part 6): against real servers started with
//! those settings.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::time::Duration;

use dlock_test::conformance::unique;
use dlock_test::postgres::PostgresServer;
use dlock_test::server::{MemcachedServer, RedisServer};
use fencelock::backend::{
    ConfigHazard, HazardKind, Memcached, PgAdvisory, Postgres, Redis, refuse_config_hazards,
};
use fencelock::{ErrorKind, FairLock, Lock, RwLock};

fn kinds(hazards: &[ConfigHazard]) -> Vec<HazardKind> {
    hazards.iter().map(ConfigHazard::kind).collect()
}

/// A Redis with `maxmemory` and `policy` (AOF on, so that only eviction is reported).
fn evicting_redis(policy: &str) -> RedisServer {
    RedisServer::start_with(&[
        "--maxmemory",
        "2mb",
        "--maxmemory-policy",
        policy,
        "--appendonly",
        "yes",
    ])
    .expect("redis-server")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_allkeys_eviction_is_reported_and_refused_on_request() {
    for policy in ["allkeys-lru", "allkeys-random"] {
        let server = evicting_redis(policy);
        let redis = Redis::connect(server.url()).await.expect("connect");
        let hazards = redis.config_hazards();
        assert_eq!(
            kinds(&hazards),
            [HazardKind::EvictsLocksAndFences],
            "{policy}"
        );
        assert!(hazards[0].can_give_two_holders());
        assert!(hazards[0].setting().contains(policy), "{}", hazards[0]);
        let err = refuse_config_hazards(&hazards).expect_err("refused");
        assert_eq!(err.kind(), ErrorKind::UnsafeConfig);
        assert!(err.to_string().contains(policy), "{err}");
        // RESP3 (INFO is then a verbatim string): the same.
        let resp3 = Redis::connect(format!("{}?protocol=resp3", server.url()))
            .await
            .expect("connect");
        assert_eq!(
            kinds(&resp3.config_hazards()),
            [HazardKind::EvictsLocksAndFences]
        );
        let err = Redis::builder(server.url())
            .refuse_config_hazards(true)
            .connect()
            .await
            .expect_err("refused on connect");
        assert_eq!(err.kind(), ErrorKind::UnsafeConfig, "{err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_volatile_eviction_is_reported() {
    let server = evicting_redis("volatile-lru");
    let redis = Redis::connect(server.url()).await.expect("connect");
    let hazards = redis.config_hazards();
    assert_eq!(kinds(&hazards), [HazardKind::EvictsLocks]);
    assert!(hazards[0].to_string().contains("fence counters have none"));
    assert_eq!(
        refuse_config_hazards(&hazards).map_err(|e| e.kind()),
        Err(ErrorKind::UnsafeConfig)
    );
}

/// `noeviction` (or no `maxmemory`) with AOF: nothing to report. Without AOF (the kit's
/// default): fences restart after a restart, a warning that is never refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_without_eviction_is_safe_and_without_aof_only_warned() {
    let server = RedisServer::start_with(&[
        "--maxmemory",
        "2mb",
        "--maxmemory-policy",
        "noeviction",
        "--appendonly",
        "yes",
    ])
    .expect("redis-server");
    let redis = Redis::connect(server.url()).await.expect("connect");
    assert_eq!(redis.config_hazards(), []);

    // maxmemory 0: nothing is evicted whatever the policy.
    let server = RedisServer::start_with(&["--maxmemory-policy", "allkeys-lru"]).expect("redis");
    let redis = Redis::builder(server.url())
        .refuse_config_hazards(true)
        .connect()
        .await
        .expect("no limit, no eviction: connects");
    let hazards = redis.config_hazards();
    assert_eq!(kinds(&hazards), [HazardKind::FencesNotDurable]);
    assert!(!hazards[0].can_give_two_holders());
    refuse_config_hazards(&hazards).expect("a warning, not a refusal");
}

/// Writes `n` filler keys of about 1 kB (with an expiry when `volatile`).
async fn fill(redis: &redis::Client, round: usize, n: usize, volatile: bool) {
    let mut conn = redis
        .get_multiplexed_async_connection()
        .await
        .expect("connection");
    let mut pipe = redis::pipe();
    for i in 0..n {
        let cmd = pipe
            .cmd("SET")
            .arg(format!("filler:{round}:{i}"))
            .arg(vec![b'x'; 1000]);
        if volatile {
            cmd.arg("EX").arg(3600);
        }
        cmd.ignore();
    }
    // Under volatile-*, a full server refuses writes once only keys without a TTL are
    // left (OOM): that ends the filling, not the test.
    let _: redis::RedisResult<()> = pipe.query_async(&mut conn).await;
}

/// The hazard is real: under `allkeys-lru` a held lock is evicted by other keys and a
/// second holder is granted while the first still holds its guard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_allkeys_eviction_really_gives_two_holders() {
    let server = evicting_redis("allkeys-lru");
    let a = Redis::connect(server.url()).await.expect("connect");
    let b = Redis::connect(server.url()).await.expect("connect");
    let name = unique("evicted");
    let ttl = Duration::from_secs(60);
    let first = Lock::builder(a, &name).ttl(ttl).build().expect("valid");
    let guard = first.lock().await.expect("first holder");
    let second = Lock::builder(b, &name).ttl(ttl).build().expect("valid");
    let mut granted = None;
    for round in 0..200 {
        fill(&server.client(), round, 500, false).await;
        if let Some(g) = second.try_lock().await.expect("attempt") {
            granted = Some(g);
            break;
        }
    }
    // Granted while the first holder's guard is alive and unreleased.
    let second_guard = granted.expect("eviction dropped the held lock within 100 MB");
    drop(guard);
    drop(second_guard);
}

/// Under `volatile-lru` a held lock (its key has a TTL) is evicted, but the fence
/// counter (no TTL, ever) is kept: the next holder's fence is still higher.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_volatile_eviction_drops_locks_but_keeps_fence_counters() {
    let server = evicting_redis("volatile-lru");
    let a = Redis::connect(server.url()).await.expect("connect");
    let b = Redis::connect(server.url()).await.expect("connect");
    let name = unique("volatile");
    let ttl = Duration::from_secs(60);
    let first = Lock::builder(a, &name).ttl(ttl).build().expect("valid");
    for _ in 0..3 {
        first
            .lock()
            .await
            .expect("lock")
            .release()
            .await
            .expect("release");
    }
    let guard = first.lock().await.expect("first holder");
    let held = guard.fencing_token().get();
    let second = Lock::builder(b, &name).ttl(ttl).build().expect("valid");
    let mut granted = None;
    for round in 0..200 {
        fill(&server.client(), round, 200, true).await;
        if let Some(g) = second.try_lock().await.expect("attempt") {
            granted = Some(g);
            break;
        }
    }
    let second_guard = granted.expect("eviction dropped the held lock");
    assert!(
        second_guard.fencing_token().get() > held,
        "the fence counter was evicted: {} after {held}",
        second_guard.fencing_token()
    );
    drop(guard);
    drop(second_guard);
}

/// No fence counter of any primitive ever has a TTL (so `volatile-*` cannot evict it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_fence_counters_never_expire() {
    let server = RedisServer::start().expect("redis");
    let redis = Redis::connect(server.url()).await.expect("connect");
    let ttl = Duration::from_secs(30);
    let plain = Lock::builder(redis.clone(), unique("ttl-plain"))
        .ttl(ttl)
        .build()
        .expect("valid");
    let g = plain.lock().await.expect("lock");
    let fair = FairLock::builder(redis.clone(), unique("ttl-fair"))
        .ttl(ttl)
        .build()
        .expect("valid");
    let f = fair.lock().await.expect("fair");
    let rw = RwLock::builder(redis.clone(), unique("ttl-rw"))
        .ttl(ttl)
        .build()
        .expect("valid");
    let w = rw.write().await.expect("write");
    let mut conn = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .expect("connection");
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*fence*")
        .query_async(&mut conn)
        .await
        .expect("KEYS");
    assert!(keys.len() >= 3, "{keys:?}");
    for key in keys {
        let ttl: i64 = redis::cmd("PTTL")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .expect("PTTL");
        assert_eq!(ttl, -1, "{key} expires");
    }
    g.release().await.expect("release");
    f.release().await.expect("release");
    w.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memcached_eviction_is_reported_unless_started_with_no_evictions() {
    let server = MemcachedServer::start_evicting(&[]).expect("memcached");
    let mc = Memcached::connect(&server.url()).await.expect("connect");
    let hazards = mc.config_hazards();
    assert_eq!(kinds(&hazards), [HazardKind::EvictsLocksAndFences]);
    assert!(
        hazards[0].setting().contains("evictions on"),
        "{}",
        hazards[0]
    );
    let err = refuse_config_hazards(&hazards).expect_err("refused");
    assert_eq!(err.kind(), ErrorKind::UnsafeConfig);
    assert!(err.to_string().contains("-M"), "{err}");

    // The kit's default: -M.
    let server = MemcachedServer::start().expect("memcached -M");
    let mc = Memcached::connect(&server.url()).await.expect("connect");
    assert_eq!(mc.config_hazards(), []);
}

/// The hazard is real: a full memcached (2 MB, its smallest with 1 MB items) evicts a held lock when another client
/// writes, and a second holder is granted while the first holds its guard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memcached_eviction_really_gives_two_holders() {
    let server = MemcachedServer::start_evicting(&["-m", "2"]).expect("memcached");
    let a = Memcached::connect(&server.url()).await.expect("connect");
    let b = Memcached::connect(&server.url()).await.expect("connect");
    let name = unique("mc-evicted");
    let ttl = Duration::from_secs(60);
    let first = Lock::builder(a, &name).ttl(ttl).build().expect("valid");
    let guard = first.lock().await.expect("first holder");
    let (key_len, value_len) = (first.keys().lock().len(), guard.token().as_str().len());
    let second = Lock::builder(b, &name).ttl(ttl).build().expect("valid");
    let mut conn = TcpStream::connect(("127.0.0.1", server.port())).expect("connect");
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut replies = BufReader::new(conn.try_clone().expect("clone"));
    let mut granted = None;
    for round in 0..400 {
        // Items as large as the lock's (memcached evicts within a slab class).
        let mut batch = Vec::new();
        for i in 0..2000 {
            let mut key = format!("f{round}:{i}:");
            while key.len() < key_len {
                key.push('x');
            }
            batch.extend_from_slice(
                format!(
                    "set {key} 0 0 {value_len} noreply\r\n{}\r\n",
                    "x".repeat(value_len)
                )
                .as_bytes(),
            );
        }
        // `mn` answers once every fill before it is done.
        batch.extend_from_slice(b"mn\r\n");
        conn.write_all(&batch).expect("fill");
        let mut line = String::new();
        while !line.starts_with("MN") {
            line.clear();
            assert_ne!(replies.read_line(&mut line).expect("reply"), 0, "closed");
        }
        // An attempt reads the lock's item, which keeps it warm in memcached's LRU:
        // attempts come after several times the cache's size in writes.
        if round % 20 == 19
            && let Some(g) = second.try_lock().await.expect("attempt")
        {
            granted = Some(g);
            break;
        }
    }
    let second_guard = granted.expect("eviction dropped the held lock");
    drop(guard);
    drop(second_guard);
}

/// A role with `idle_session_timeout` and `idle_in_transaction_session_timeout` set.
async fn role_with_timeouts(server: &PostgresServer, role: &str) -> String {
    let admin = server.admin().await;
    admin
        .batch_execute(&format!(
            "CREATE ROLE {role} LOGIN SUPERUSER PASSWORD 'pw';
             ALTER ROLE {role} SET idle_session_timeout = '1s';
             ALTER ROLE {role} SET idle_in_transaction_session_timeout = '1s';"
        ))
        .await
        .expect("role");
    server.url_as(role, "pw")
}

/// Advisory mode: a lock lives in its session, and the role's `idle_session_timeout`
/// would end it (and free the lock) after 1 s idle. The session turns it off for itself:
/// held for 3 s, nobody else gets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_advisory_locks_outlive_the_roles_idle_session_timeout() {
    let server = PostgresServer::start().expect("postgres");
    let url = role_with_timeouts(&server, "idler").await;
    // The role's setting is in force for its other sessions.
    let (check, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .expect("connect as the role");
    tokio::spawn(conn);
    let row = check
        .query_one("SELECT current_setting('idle_session_timeout')", &[])
        .await
        .expect("SHOW");
    assert_eq!(row.get::<_, String>(0), "1s");

    let a = PgAdvisory::connect(&url).await.expect("connect");
    let b = PgAdvisory::connect(&url).await.expect("connect");
    let name = unique("idle");
    // A long ttl: the session is checked every 20 s, so it sits idle meanwhile.
    let ttl = Duration::from_secs(60);
    let guard = Lock::builder(a, &name)
        .ttl(ttl)
        .build()
        .expect("valid")
        .lock()
        .await
        .expect("first holder");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let second = Lock::builder(b, &name).ttl(ttl).build().expect("valid");
    assert!(
        second.try_lock().await.expect("attempt").is_none(),
        "the idle timeout ended the holding session: two holders"
    );
    assert!(!guard.is_lost());
    guard.release().await.expect("still ours");
}

/// Lease mode: a lock is a row with an expiry, so sessions the server ends lose nothing
/// (the pool opens new ones): held across the role's 1 s idle timeout, nobody else gets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_lease_locks_do_not_depend_on_sessions() {
    let server = PostgresServer::start().expect("postgres");
    let url = role_with_timeouts(&server, "leaser").await;
    let a = Postgres::connect(&url).await.expect("connect");
    let b = Postgres::connect(&url).await.expect("connect");
    let name = unique("lease-idle");
    let ttl = Duration::from_secs(60);
    let guard = Lock::builder(a, &name)
        .ttl(ttl)
        .build()
        .expect("valid")
        .lock()
        .await
        .expect("first holder");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let second = Lock::builder(b, &name).ttl(ttl).build().expect("valid");
    assert!(
        second.try_lock().await.expect("attempt").is_none(),
        "two holders"
    );
    assert!(!guard.is_lost());
    guard.release().await.expect("still ours");
}

/// Part 6: every scheme refuses a query parameter it does not know, naming it, before
/// anything connects (no server needed: nothing listens on port 1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_scheme_refuses_unknown_parameters() {
    let check = |url: &str, err: fencelock::Error| {
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{url}: {err}");
        assert!(err.to_string().contains("bogus"), "{url}: {err}");
        assert!(!err.to_string().contains("s3cret"), "{url}: {err}");
    };
    for url in [
        "redis://127.0.0.1:1/?bogus=1",
        "redis://:s3cret@127.0.0.1:1/0?protocol=resp3&bogus=s3cret",
        "rediss://127.0.0.1:1/?bogus=1#insecure",
        "redis+unix:///tmp/x.sock?db=1&bogus",
        "redis+sentinel://127.0.0.1:1/master?bogus=1",
        "redis+cluster://127.0.0.1:1,127.0.0.1:2/?bogus=1",
    ] {
        let err = Redis::connect(url).await.expect_err(url);
        check(url, err);
    }
    let url = "memcache://127.0.0.1:1?bogus=1";
    check(url, Memcached::connect(url).await.expect_err(url));
    let url = "etcd://127.0.0.1:1?bogus=1";
    check(
        url,
        fencelock::backend::Etcd::connect(url).await.expect_err(url),
    );
    let url = "postgres://u:s3cret@127.0.0.1:1/db?bogus=1";
    check(url, Postgres::connect(url).await.expect_err(url));
    check(url, PgAdvisory::connect(url).await.expect_err(url));
    let url = "zk://127.0.0.1:1/chroot?bogus=1";
    check(
        url,
        fencelock::backend::ZooKeeper::connect(url)
            .await
            .expect_err(url),
    );
    // min_replicas must be a number.
    let err = Redis::connect("redis://127.0.0.1:1/?min_replicas=x")
        .await
        .expect_err("not a number");
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
}

/// Part 6: `?min_replicas=N` on a `redis://` URL is `min_replicas(N)`: with no replica, a
/// grant is refused (`NotReplicated`) rather than given.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_replicas_in_the_url_waits_for_replicas() {
    let server = RedisServer::start().expect("redis");
    let url = format!("{}?min_replicas=1", server.url());
    let redis = Redis::connect(&url).await.expect("connect");
    let lock = Lock::new(redis, unique("replicated")).expect("valid");
    let err = lock.try_lock().await.expect_err("no replica acknowledges");
    assert_eq!(err.kind(), ErrorKind::NotReplicated, "{err}");
    // And the grant was given back.
    let plain = Redis::connect(server.url()).await.expect("connect");
    let again = Lock::new(plain, lock.name()).expect("valid");
    let guard = again.try_lock().await.expect("attempt").expect("free");
    guard.release().await.expect("release");
}

/// `CONFIG SET` of an eviction policy on a running server.
fn set_policy(server: &RedisServer, policy: &str) {
    let mut conn = server.client().get_connection().expect("connection");
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg("64mb")
        .arg("maxmemory-policy")
        .arg(policy)
        .query::<()>(&mut conn)
        .expect("CONFIG SET");
}

/// A Redis Cluster: every master is read (one evicts here), each hazard names its node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_reports_the_master_that_evicts() {
    let cluster = dlock_test::cluster::RedisCluster::start(3, 0).expect("cluster");
    set_policy(&cluster.nodes[1], "allkeys-lfu");
    let redis = Redis::connect(cluster.url()).await.expect("connect");
    let hazards = redis.config_hazards();
    let evicting: Vec<&ConfigHazard> = hazards
        .iter()
        .filter(|h| h.kind() == HazardKind::EvictsLocksAndFences)
        .collect();
    assert_eq!(evicting.len(), 1, "{hazards:?}");
    assert!(
        evicting[0]
            .node()
            .ends_with(&format!(":{}", cluster.nodes[1].port())),
        "{}",
        evicting[0]
    );
    // And no AOF on any of the three masters.
    let not_durable = hazards
        .iter()
        .filter(|h| h.kind() == HazardKind::FencesNotDurable)
        .count();
    assert_eq!(not_durable, 3, "{hazards:?}");
}

/// Sentinel: the master the sentinels name is read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_sentinel_reports_the_masters_policy() {
    let master = RedisServer::start_with(&["--appendonly", "yes"]).expect("master");
    set_policy(&master, "volatile-ttl");
    let name = "hazardmaster";
    let sentinel =
        dlock_test::server::SentinelServer::start(master.port(), name, 1).expect("sentinel");
    let url = format!("redis+sentinel://{}/{name}", sentinel.addr());
    let mut redis = None;
    // The sentinel may take a moment to know its master.
    for _ in 0..100 {
        match Redis::connect(&url).await {
            Ok(r) => {
                redis = Some(r);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    let redis = redis.expect("connect through the sentinel");
    let hazards = redis.config_hazards();
    assert_eq!(kinds(&hazards), [HazardKind::EvictsLocks], "{hazards:?}");
    assert!(
        hazards[0].node().ends_with(&format!(":{}", master.port())),
        "{}",
        hazards[0]
    );
}
