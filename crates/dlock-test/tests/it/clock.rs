//! Clock faults on the stores' servers (TESTING.md: "server wall clock jump"): each
//! server runs under a [`FakeClock`] that the test steps forward, back, or makes run fast
//! while keys, leases and dlock locks live in it. Each test states the store-level fact
//! (what a key or lease does) and the dlock-level outcome (a lock freed early is granted
//! again with a higher fence, so a fenced resource refuses the old holder; or nothing
//! happens because the store does not time by that clock).

use std::time::Duration;

use dlock_test::clock::FakeClock;
use dlock_test::conformance::unique;
use dlock_test::postgres::PostgresServer;
use dlock_test::server::{EtcdCluster, MemcachedServer, RedisServer};
use dlock_test::zookeeper::ZooKeeper;
use fencelock::fenced::RedisFenced;
use fencelock::{ErrorKind, Lock, LockGuard};
use tokio::time::{Instant, sleep, timeout};

const SECOND: Duration = Duration::from_secs(1);

fn now_secs() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs_f64()
}

/// The lock `name` on `backend`, with `ttl` and the watchdog on or off.
fn lock<B: fencelock::raw::RawLock>(
    backend: B,
    name: &str,
    ttl: Duration,
    watchdog: bool,
) -> Lock<B> {
    Lock::builder(backend, name)
        .ttl(ttl)
        .watchdog(watchdog)
        .build()
        .expect("valid lock")
}

/// The dlock-level outcome of a forward jump past the ttl on a store that expires by the
/// faked clock: the holder's key is gone at once, a second client is granted the lock with
/// a higher fence while the first still counts validity left, and the first's release
/// reports the loss.
async fn second_holder_gets_a_higher_fence<B: fencelock::raw::RawFencing>(
    first: &LockGuard<B>,
    contender: &Lock<B>,
) -> LockGuard<B> {
    assert!(
        first.remaining() > SECOND,
        "the first holder still counts on {:?} of validity",
        first.remaining()
    );
    let second = contender
        .try_lock()
        .await
        .expect("store")
        .expect("free early: the server's clock passed the holder's expiry");
    assert!(
        second.fencing_token() > first.fencing_token(),
        "fences never repeat: {:?} after {:?}",
        second.fencing_token(),
        first.fencing_token()
    );
    second
}

// ---------------------------------------------------------------------------- redis

async fn redis_conn(server: &RedisServer) -> redis::aio::MultiplexedConnection {
    server
        .client()
        .get_multiplexed_async_connection()
        .await
        .expect("redis connection")
}

async fn pttl(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> i64 {
    redis::cmd("PTTL")
        .arg(key)
        .query_async(conn)
        .await
        .expect("PTTL")
}

async fn set_px(conn: &mut redis::aio::MultiplexedConnection, key: &str, ms: u64) {
    let _: () = redis::cmd("SET")
        .arg(key)
        .arg("v")
        .arg("PX")
        .arg(ms)
        .query_async(conn)
        .await
        .expect("SET");
}

/// redis-server expires keys by its wall clock (`mstime()`): a forward jump past a key's
/// PX removes it at once. A lock held there is free early: a second client gets it with a
/// higher fence, the fenced resource refuses the first holder's late write, the first
/// holder's watchdog finds the key taken (`lost()` fires) and its release is `LockLost`.
/// A restarted server runs under the same clock (`TIME` 20 s ahead).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_forward_jump_expires_keys_and_frees_a_lock_early_fencing_refuses_the_old_holder() {
    let clock = FakeClock::wall().expect("clock");
    let server = RedisServer::start_with_clock(&clock, &[]).expect("redis-server under the clock");
    let mut conn = redis_conn(&server).await;
    let backend = fencelock::backend::Redis::connect(server.url())
        .await
        .expect("connect");
    let name = unique("jump");
    let first = lock(backend.clone(), &name, 3 * SECOND, true)
        .try_lock()
        .await
        .expect("store")
        .expect("free");
    set_px(&mut conn, "k", 10_000).await;
    assert!(pttl(&mut conn, "k").await > 9_000);

    clock.jump_forward(Duration::from_secs(20)).expect("jump");
    assert_eq!(
        pttl(&mut conn, "k").await,
        -2,
        "a key with 10 s left is gone after +20 s"
    );
    let second =
        second_holder_gets_a_higher_fence(&first, &lock(backend.clone(), &name, 3 * SECOND, true))
            .await;

    let resource = RedisFenced::new(unique("resource"));
    resource
        .write(&mut conn, second.fencing_token(), "second")
        .await
        .expect("redis")
        .expect("the new holder's fence is accepted");
    resource
        .write(&mut conn, first.fencing_token(), "first")
        .await
        .expect("redis")
        .expect_err("the old holder's late write is refused by its fence");

    timeout(3 * SECOND, first.lost())
        .await
        .expect("the watchdog's next renewal finds the key taken: lost() fires");
    assert_eq!(
        first.release().await.expect_err("taken over").kind(),
        ErrorKind::LockLost
    );
    second.release().await.expect("release");

    let mut server = server;
    server.restart().expect("restart under the same clock");
    let mut conn = redis_conn(&server).await;
    let (secs, _micros): (f64, u64) = redis::cmd("TIME")
        .query_async(&mut conn)
        .await
        .expect("TIME");
    let ahead = secs - now_secs();
    assert!(
        (18.0..21.0).contains(&ahead),
        "the restarted server runs under the clock: {ahead:+.1} s"
    );
}

/// A backward jump makes every key set before it live that much longer (its expiry is an
/// absolute wall-clock time): PTTL grows by the jump. A lock whose holder stopped renewing
/// stays held on the server after the holder's own validity ran out (liveness, not safety:
/// nobody else is let in); its release still deletes it (reported `LockLost`: the lease
/// had lapsed on the holder's clock), and a renewed lock's watchdog and release work as
/// usual. The next grant's fence is higher.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_backward_jump_keeps_keys_and_locks_longer_and_fences_still_increase() {
    let clock = FakeClock::wall().expect("clock");
    let server = RedisServer::start_with_clock(&clock, &[]).expect("redis-server under the clock");
    let mut conn = redis_conn(&server).await;
    let backend = fencelock::backend::Redis::connect(server.url())
        .await
        .expect("connect");
    let (renewed_name, idle_name) = (unique("renewed"), unique("idle"));
    let renewed = lock(backend.clone(), &renewed_name, 2 * SECOND, true)
        .try_lock()
        .await
        .expect("store")
        .expect("free");
    let idle = lock(backend.clone(), &idle_name, 2 * SECOND, false)
        .try_lock()
        .await
        .expect("store")
        .expect("free");
    set_px(&mut conn, "k", 10_000).await;

    clock.jump_backward(Duration::from_secs(20)).expect("jump");
    let left = pttl(&mut conn, "k").await;
    eprintln!("clock: redis PTTL of a 10 s key after −20 s: {left} ms");
    assert!(
        (28_000..=30_000).contains(&left),
        "10 s left + 20 s back = {left} ms"
    );

    sleep(Duration::from_millis(2_500)).await;
    assert!(
        idle.is_lost(),
        "the idle holder's 2 s lease ran out on its clock"
    );
    assert!(!renewed.is_lost(), "the watchdog kept the other one");
    let contender = lock(backend.clone(), &idle_name, 2 * SECOND, false);
    assert!(
        contender.try_lock().await.expect("store").is_none(),
        "the server still holds the idle lock: its expiry moved 20 s away"
    );
    let idle_fence = idle.fencing_token();
    assert_eq!(
        idle.release().await.expect_err("lapsed").kind(),
        ErrorKind::LockLost
    );
    let next = contender
        .try_lock()
        .await
        .expect("store")
        .expect("the release deleted it");
    assert!(next.fencing_token() > idle_fence);
    next.release().await.expect("release");

    let renewed_fence = renewed.fencing_token();
    renewed
        .release()
        .await
        .expect("the watchdog kept it; release works");
    let again = lock(backend, &renewed_name, 2 * SECOND, false)
        .try_lock()
        .await
        .expect("store")
        .expect("released");
    assert!(again.fencing_token() > renewed_fence);
    again.release().await.expect("release");
}

/// A clock running 5× fast shortens every key's life 5×: after 1.6 s a key set with 10 s
/// has at most a few seconds left. A 6 s lock without watchdog is gone from the server
/// after 1.2 s while its holder still counts on more than 3 s: a second client gets it
/// with a higher fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_fast_clock_shortens_keys_and_a_lock_is_granted_twice_with_higher_fence() {
    let clock = FakeClock::wall().expect("clock");
    let server = RedisServer::start_with_clock(&clock, &[]).expect("redis-server under the clock");
    let mut conn = redis_conn(&server).await;
    let backend = fencelock::backend::Redis::connect(server.url())
        .await
        .expect("connect");
    clock.run_fast(5.0).expect("rate");
    let name = unique("fast");
    let first = lock(backend.clone(), &name, 6 * SECOND, false)
        .try_lock()
        .await
        .expect("store")
        .expect("free");
    set_px(&mut conn, "k", 10_000).await;
    sleep(Duration::from_millis(1_600)).await;
    let left = pttl(&mut conn, "k").await;
    eprintln!("clock: redis PTTL of a 10 s key after 1.6 s at 5×: {left} ms");
    assert!(
        left < 5_000,
        "1.6 s at 5× is 8 s of the server's time: {left} ms left of 10 s"
    );
    let second =
        second_holder_gets_a_higher_fence(&first, &lock(backend, &name, 6 * SECOND, false)).await;
    assert_eq!(
        first.release().await.expect_err("taken over").kind(),
        ErrorKind::LockLost
    );
    second.release().await.expect("release");
}

// ------------------------------------------------------------------------ memcached

fn mc(server: &MemcachedServer, command: &str) -> String {
    server.command(command).expect("memcached answers")
}

fn mc_set(server: &MemcachedServer, key: &str, exptime: u32) {
    let reply = mc(server, &format!("set {key} 0 {exptime} 1\r\nv\r\n"));
    assert!(reply.starts_with("STORED"), "{reply}");
}

fn mc_has(server: &MemcachedServer, key: &str) -> bool {
    mc(server, &format!("get {key}\r\n")).starts_with("VALUE")
}

/// memcached's `STAT time`: its own clock (seconds).
fn mc_time(server: &MemcachedServer) -> f64 {
    mc(server, "stats\r\n")
        .lines()
        .find_map(|l| l.strip_prefix("STAT time "))
        .and_then(|t| t.trim().parse().ok())
        .expect("STAT time")
}

/// Waits (up to `within`) until memcached's clock reads at least `at`.
async fn mc_clock_reaches(server: &MemcachedServer, at: f64, within: Duration) -> f64 {
    let deadline = Instant::now() + within;
    loop {
        let t = mc_time(server);
        if t >= at || Instant::now() > deadline {
            return t;
        }
        sleep(Duration::from_millis(100)).await;
    }
}

/// memcached's clock ticks from `CLOCK_MONOTONIC`: a wall-clock-only jump (+20 s, and a
/// 4× wall clock) changes neither `STAT time` nor any key's expiry, and a held lock stays
/// held. A restart keeps the clock: the new process reads its start time from the wall
/// clock, so its `STAT time` is ahead by the clock's skew.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memcached_ignores_a_wall_clock_jump_and_a_fast_wall_clock() {
    let clock = FakeClock::wall().expect("clock");
    let server = MemcachedServer::start_with_clock(&clock, &[]).expect("memcached under the clock");
    let backend = fencelock::backend::Memcached::connect(&server.url())
        .await
        .expect("connect");
    let name = unique("wall");
    let held = lock(backend.clone(), &name, 10 * SECOND, false)
        .try_lock()
        .await
        .expect("store")
        .expect("free");
    mc_set(&server, "k", 10);
    clock.jump_forward(Duration::from_secs(20)).expect("jump");
    clock.run_fast(4.0).expect("rate");
    sleep(Duration::from_millis(1_500)).await;
    let skew = mc_time(&server) - now_secs();
    assert!(
        skew.abs() < 3.0,
        "memcached's clock did not move: {skew:+.1} s"
    );
    assert!(
        mc_has(&server, "k"),
        "10 s key alive after a +20 s wall jump"
    );
    assert!(
        lock(backend, &name, 10 * SECOND, false)
            .try_lock()
            .await
            .expect("store")
            .is_none(),
        "still held"
    );
    held.release().await.expect("release");

    let mut server = server;
    server.restart().expect("restart under the same clock");
    let (ahead, skew) = (mc_time(&server) - now_secs(), clock.skew_secs());
    assert!(skew > 20.0, "{skew}");
    assert!(
        (ahead - skew).abs() < 3.0,
        "the restarted memcached starts at the clock's time: {ahead:+.1} s, clock {skew:+.1} s"
    );
}

/// With the monotonic clock moved too, memcached's clock follows at its next tick: +20 s
/// expires a 10 s key, and a lock is free early (higher fence for the next holder). A 4×
/// clock expires an 8 s key within about 2.5 s, and an 8 s lock with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memcached_monotonic_jump_forward_and_fast_clock_expire_keys_and_locks_early() {
    let clock = FakeClock::wall_and_monotonic().expect("clock");
    let server = MemcachedServer::start_with_clock(&clock, &[]).expect("memcached under the clock");
    let backend = fencelock::backend::Memcached::connect(&server.url())
        .await
        .expect("connect");
    let name = unique("mono");
    let first = lock(backend.clone(), &name, 10 * SECOND, false)
        .try_lock()
        .await
        .expect("store")
        .expect("free");
    mc_set(&server, "k", 10);
    let before = mc_time(&server);
    clock.jump_forward(Duration::from_secs(20)).expect("jump");
    let after = mc_clock_reaches(&server, before + 20.0, 3 * SECOND).await;
    assert!(
        after >= before + 20.0,
        "memcached's clock {before} → {after}"
    );
    assert!(!mc_has(&server, "k"), "a 10 s key is gone after +20 s");
    let second = second_holder_gets_a_higher_fence(
        &first,
        &lock(backend.clone(), &name, 10 * SECOND, false),
    )
    .await;
    assert_eq!(
        first.release().await.expect_err("taken over").kind(),
        ErrorKind::LockLost
    );
    second.release().await.expect("release");

    clock.run_fast(4.0).expect("rate");
    let first = lock(backend.clone(), &name, 8 * SECOND, false)
        .try_lock()
        .await
        .expect("store")
        .expect("free");
    mc_set(&server, "fast", 8);
    mc_set(&server, "slow", 60);
    let started = Instant::now();
    while mc_has(&server, "fast") && started.elapsed() < 6 * SECOND {
        sleep(Duration::from_millis(100)).await;
    }
    let lived = started.elapsed();
    eprintln!("clock: memcached at 4×: an 8 s key lived {lived:?}");
    // Gone before 6 s of real time had passed (at the real rate it lives 8 s): the
    // mechanism, not a speed — the loop above stops at 6 s either way.
    assert!(
        !mc_has(&server, "fast"),
        "an 8 s key still there after {lived:?} at 4×"
    );
    assert!(mc_has(&server, "slow"));
    sleep(SECOND).await;
    let second =
        second_holder_gets_a_higher_fence(&first, &lock(backend, &name, 8 * SECOND, false)).await;
    assert_eq!(
        first.release().await.expect_err("taken over").kind(),
        ErrorKind::LockLost
    );
    second.release().await.expect("release");
}

/// A monotonic jump back stops memcached's clock until the monotonic time has caught up
/// (libevent's one-second tick waits for it): keys and locks outlive their ttl by the
/// jump. A 3 s lock whose holder's validity ran out is still held on the server; its
/// release deletes it (reported `LockLost`), and the next grant's fence is higher.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memcached_monotonic_jump_back_stops_its_clock_and_keeps_keys_and_locks() {
    let clock = FakeClock::wall_and_monotonic().expect("clock");
    let server = MemcachedServer::start_with_clock(&clock, &[]).expect("memcached under the clock");
    let backend = fencelock::backend::Memcached::connect(&server.url())
        .await
        .expect("connect");
    let name = unique("back");
    let held = lock(backend.clone(), &name, 3 * SECOND, false)
        .try_lock()
        .await
        .expect("store")
        .expect("free");
    mc_set(&server, "k", 3);
    let before = mc_time(&server);
    clock.jump_backward(Duration::from_secs(20)).expect("jump");
    sleep(Duration::from_millis(4_500)).await;
    let after = mc_time(&server);
    eprintln!("clock: memcached STAT time 4.5 s after −20 s: {before} → {after}");
    assert!(
        after <= before + 1.0,
        "memcached's clock stood still: {before} → {after}"
    );
    assert!(mc_has(&server, "k"), "a 3 s key alive after 4.5 s");
    assert!(held.is_lost(), "the holder's own 3 s validity ran out");
    let contender = lock(backend, &name, 3 * SECOND, false);
    assert!(
        contender.try_lock().await.expect("store").is_none(),
        "still held on the server"
    );
    let fence = held.fencing_token();
    assert_eq!(
        held.release().await.expect_err("lapsed").kind(),
        ErrorKind::LockLost
    );
    let next = contender
        .try_lock()
        .await
        .expect("store")
        .expect("the release deleted it");
    assert!(next.fencing_token() > fence);
    next.release().await.expect("release");
}

// ------------------------------------------------------------------------- postgres

async fn pg_clock(admin: &tokio_postgres::Client) -> f64 {
    admin
        .query_one("SELECT extract(epoch FROM clock_timestamp())::float8", &[])
        .await
        .expect("clock_timestamp()")
        .get(0)
}

/// PostgreSQL's `clock_timestamp()` follows the wall clock (+20 s, then −40 s, then 4×
/// without a step), and dlock's lease mode expires by it: after +20 s a 10 s lease, and
/// after 1.3 s at 4× a 4 s lease, is granted to a second client with a higher fence while
/// the first still counts validity left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_clock_timestamp_follows_the_clock_and_a_forward_jump_frees_a_lease_early() {
    let clock = FakeClock::wall().expect("clock");
    let server = PostgresServer::start_with_clock(&clock).expect("postgres under the clock");
    let admin = server.admin().await;
    let skew = pg_clock(&admin).await - now_secs();
    assert!(skew.abs() < 1.0, "{skew}");

    let backend = fencelock::backend::Postgres::connect(&server.url())
        .await
        .expect("connect");
    let name = unique("pg-jump");
    let first = lock(backend.clone(), &name, 10 * SECOND, false)
        .try_lock()
        .await
        .expect("store")
        .expect("free");
    clock.jump_forward(Duration::from_secs(20)).expect("jump");
    let skew = pg_clock(&admin).await - now_secs();
    assert!((19.0..21.0).contains(&skew), "+20 s: {skew:+.2}");
    let second = second_holder_gets_a_higher_fence(
        &first,
        &lock(backend.clone(), &name, 10 * SECOND, false),
    )
    .await;
    assert_eq!(
        first.release().await.expect_err("taken over").kind(),
        ErrorKind::LockLost
    );
    second.release().await.expect("release");

    clock.jump_backward(Duration::from_secs(40)).expect("jump");
    let skew = pg_clock(&admin).await - now_secs();
    assert!((-21.0..-19.0).contains(&skew), "−20 s: {skew:+.2}");

    clock.reset().expect("reset");
    clock.run_fast(4.0).expect("rate");
    let (t0, r0) = (pg_clock(&admin).await, Instant::now());
    let skew = t0 - now_secs();
    assert!(
        skew.abs() < 0.5,
        "no step when the rate changes (libfaketime alone would step by 3 × the server's \
         uptime): {skew:+.2} s"
    );
    let name = unique("pg-fast");
    let first = lock(backend.clone(), &name, 4 * SECOND, false)
        .try_lock()
        .await
        .expect("store")
        .expect("free");
    sleep(Duration::from_millis(1_300)).await;
    let (t1, elapsed) = (pg_clock(&admin).await, r0.elapsed().as_secs_f64());
    let rate = (t1 - t0) / elapsed;
    eprintln!(
        "clock: postgres clock_timestamp() at 4×: {rate:.2}× (skew at the switch {skew:+.3} s)"
    );
    // Faster than real time by far (a real clock gives 1×; query latency only lowers
    // the figure, so a loaded machine cannot make it pass wrongly).
    assert!(rate > 2.0, "clock_timestamp() ran {rate:.2}×");
    let second =
        second_holder_gets_a_higher_fence(&first, &lock(backend, &name, 4 * SECOND, false)).await;
    assert_eq!(
        first.release().await.expect_err("taken over").kind(),
        ErrorKind::LockLost
    );
    second.release().await.expect("release");
}

/// A backward jump lengthens every lease granted before it: a holder whose validity ran
/// out (no watchdog) still holds the row, nobody else gets in; its release deletes it
/// (`LockLost`: lapsed) and the next fence is higher. A watchdog-renewed lease renews and
/// releases as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_backward_jump_keeps_leases_longer_and_fences_still_increase() {
    let clock = FakeClock::wall().expect("clock");
    let server = PostgresServer::start_with_clock(&clock).expect("postgres under the clock");
    let backend = fencelock::backend::Postgres::connect(&server.url())
        .await
        .expect("connect");
    let (renewed_name, idle_name) = (unique("pg-renewed"), unique("pg-idle"));
    let renewed = lock(backend.clone(), &renewed_name, 2 * SECOND, true)
        .try_lock()
        .await
        .expect("store")
        .expect("free");
    let idle = lock(backend.clone(), &idle_name, 2 * SECOND, false)
        .try_lock()
        .await
        .expect("store")
        .expect("free");
    clock.jump_backward(Duration::from_secs(20)).expect("jump");
    sleep(Duration::from_millis(2_500)).await;
    assert!(idle.is_lost());
    assert!(!renewed.is_lost(), "the watchdog renewed it");
    let contender = lock(backend.clone(), &idle_name, 2 * SECOND, false);
    assert!(
        contender.try_lock().await.expect("store").is_none(),
        "the lease's expiry moved 20 s away"
    );
    let fence = idle.fencing_token();
    assert_eq!(
        idle.release().await.expect_err("lapsed").kind(),
        ErrorKind::LockLost
    );
    let next = contender
        .try_lock()
        .await
        .expect("store")
        .expect("the release deleted it");
    assert!(next.fencing_token() > fence);
    next.release().await.expect("release");
    let renewed_fence = renewed.fencing_token();
    renewed.release().await.expect("release");
    let again = lock(backend, &renewed_name, 2 * SECOND, false)
        .try_lock()
        .await
        .expect("store")
        .expect("released");
    assert!(again.fencing_token() > renewed_fence);
    again.release().await.expect("release");
}

// ----------------------------------------------------------------------------- etcd

/// etcd is out of reach of a preloaded time library: Go reads the clocks through the
/// vDSO. libfaketime is loaded into the process all the same. With wall and monotonic clocks +20 s, then −40 s, then 4×, a 10 s lease keeps
/// counting down in real seconds, and a held lock stays held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_ignores_the_fake_clock_leases_keep_their_ttl() {
    let clock = FakeClock::wall_and_monotonic().expect("clock");
    let cluster = EtcdCluster::start_with_clock(1, &clock).expect("etcd under the clock");
    let pid = cluster.members[0].pid().expect("running");
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).expect("maps");
    assert!(
        maps.contains("libfaketime"),
        "libfaketime is loaded into etcd (and changes nothing)"
    );
    let backend = {
        let mut last = None;
        let mut connected = None;
        for _ in 0..50 {
            match fencelock::backend::Etcd::connect(&cluster.url()).await {
                Ok(c) => {
                    connected = Some(c);
                    break;
                }
                Err(e) => last = Some(e),
            }
            sleep(Duration::from_millis(100)).await;
        }
        connected.unwrap_or_else(|| panic!("connect to etcd: {last:?}"))
    };
    let mut admin =
        etcd_client::Client::connect([format!("http://{}", cluster.members[0].addr())], None)
            .await
            .expect("etcd admin");
    let name = unique("etcd");
    let held = lock(backend.clone(), &name, 10 * SECOND, false)
        .try_lock()
        .await
        .expect("store")
        .expect("free");
    let lease = admin.lease_grant(10, None).await.expect("grant").id();
    clock.jump_forward(Duration::from_secs(20)).expect("jump");
    sleep(Duration::from_millis(300)).await;
    clock.jump_backward(Duration::from_secs(40)).expect("jump");
    sleep(Duration::from_millis(300)).await;
    clock.run_fast(4.0).expect("rate");
    sleep(Duration::from_millis(400)).await;
    let ttl = admin
        .lease_time_to_live(lease, None)
        .await
        .expect("time to live")
        .ttl();
    eprintln!("clock: etcd lease of 10 s after +20 s, −40 s, 4× and 1 s: {ttl} s left");
    assert!(
        (7..=9).contains(&ttl),
        "a 10 s lease after 1 s of real time: {ttl} s left"
    );
    assert!(
        lock(backend, &name, 10 * SECOND, false)
            .try_lock()
            .await
            .expect("store")
            .is_none(),
        "still held"
    );
    held.release().await.expect("release");
}

// ------------------------------------------------------------------------ zookeeper

async fn zk_connect(url: &str) -> fencelock::backend::ZooKeeper {
    let mut last = None;
    for _ in 0..50 {
        match fencelock::backend::ZooKeeper::connect(url).await {
            Ok(zk) => return zk,
            Err(e) => last = Some(e),
        }
        sleep(Duration::from_millis(100)).await;
    }
    panic!("connect to {url}: {last:?}");
}

/// The latest `est` (session established, wall-clock milliseconds) ZooKeeper reports for
/// its connections (`cons`), in seconds; and the whole report.
fn zk_latest_established(zk: &ZooKeeper) -> (f64, String) {
    let cons = zk.members[0].four_letters("cons").expect("cons");
    let latest = cons
        .split([',', ')', '('])
        .filter_map(|f| f.trim().strip_prefix("est="))
        .filter_map(|ms| ms.parse::<f64>().ok())
        .fold(0.0, f64::max);
    (latest / 1000.0, cons)
}

/// ZooKeeper times sessions by `System.nanoTime` (the monotonic clock): with the wall
/// clock alone +20 s, its wall time moves (`cons` reports a new session established 20 s
/// ahead) but a 2 s session lives on past 3 s, and the lock held in it stays held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_wall_clock_jump_leaves_sessions_and_locks_alone() {
    let clock = FakeClock::wall().expect("clock");
    let zk = ZooKeeper::start_with_clock(1, &clock).expect("zookeeper under the clock");
    let url = zk.url("", "?session_timeout=2s");
    let holder = zk_connect(&url).await;
    let name = unique("zk-wall");
    let held = lock(holder.clone(), &name, 30 * SECOND, true)
        .try_lock()
        .await
        .expect("store")
        .expect("free");
    clock.jump_forward(Duration::from_secs(20)).expect("jump");
    sleep(3 * SECOND).await;
    assert!(!held.is_lost(), "the session lives on");
    let other = zk_connect(&url).await;
    let (established, cons) = zk_latest_established(&zk);
    let ahead = established - now_secs();
    assert!(
        (15.0..21.0).contains(&ahead),
        "ZooKeeper's wall clock (a new session's `est`) is 20 s ahead: {ahead:+.1} s ({cons})"
    );
    assert!(
        lock(other, &name, 30 * SECOND, true)
            .try_lock()
            .await
            .expect("store")
            .is_none(),
        "still held"
    );
    held.release().await.expect("release");
}

/// With the monotonic clock +20 s, ZooKeeper's session tracker finds every session past
/// its timeout: the holder's session expires, its lock node goes, `lost()` fires, and the
/// next client is granted the lock with a higher fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_monotonic_jump_forward_expires_sessions_and_frees_locks() {
    let clock = FakeClock::wall_and_monotonic().expect("clock");
    let zk = ZooKeeper::start_with_clock(1, &clock).expect("zookeeper under the clock");
    let url = zk.url("", "?session_timeout=2s");
    let holder = zk_connect(&url).await;
    let name = unique("zk-mono");
    let first = lock(holder.clone(), &name, 30 * SECOND, true)
        .try_lock()
        .await
        .expect("store")
        .expect("free");
    let first_fence = first.fencing_token();
    clock.jump_forward(Duration::from_secs(20)).expect("jump");
    timeout(5 * SECOND, first.lost())
        .await
        .expect("the session expired: lost() fires");
    let other = zk_connect(&url).await;
    let second = lock(other, &name, 30 * SECOND, true)
        .try_lock_for(5 * SECOND)
        .await
        .expect("store")
        .expect("the expired session's lock node is gone");
    assert!(second.fencing_token() > first_fence);
    assert_eq!(
        first.release().await.expect_err("expired").kind(),
        ErrorKind::LockLost
    );
    second.release().await.expect("release");
}

/// With the monotonic clock 6 s back, ZooKeeper's sessions live 6 s longer: a holder cut
/// off from the server (its connection goes through the kit's proxy, which stops passing
/// bytes) loses its lease on its own clock (`lost()` fires), but the server keeps its
/// 2 s session, and so its lock node, for about 8 s — the next client stays out meanwhile
/// (safe, not live) and is then granted the lock with a higher fence. (The session
/// tracker sleeps until the next expiry it computed, so moving the clock back again does
/// not end the wait sooner.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_monotonic_jump_back_keeps_a_cut_off_session_alive_longer() {
    use dlock_test::proxy::{Fault, Proxy};
    let clock = FakeClock::wall_and_monotonic().expect("clock");
    let zk = ZooKeeper::start_with_clock(1, &clock).expect("zookeeper under the clock");
    let proxy = Proxy::start(zk.members[0].addr().parse().expect("addr"))
        .await
        .expect("proxy");
    let holder = zk_connect(&format!("zk://{}?session_timeout=2s", proxy.addr())).await;
    let other = zk_connect(&zk.url("", "?session_timeout=2s")).await;
    let name = unique("zk-back");
    let first = lock(holder.clone(), &name, 30 * SECOND, true)
        .try_lock()
        .await
        .expect("store")
        .expect("free");
    let first_fence = first.fencing_token();
    clock.jump_backward(Duration::from_secs(6)).expect("jump");
    proxy.set_fault(Fault::Blackhole);
    let cut = Instant::now();
    timeout(3 * SECOND, first.lost())
        .await
        .expect("cut off: the holder's validity runs out on its own clock");
    tokio::time::sleep_until(cut + 4 * SECOND).await;
    let contender = lock(other, &name, 30 * SECOND, true);
    assert!(
        contender.try_lock().await.expect("store").is_none(),
        "4 s after the cut, the 2 s session still lives on the server"
    );
    let second = contender
        .try_lock_for(10 * SECOND)
        .await
        .expect("store")
        .expect("the session expires 2 s + 6 s after the cut");
    let after = cut.elapsed();
    eprintln!("clock: zookeeper 2 s session cut off after −6 s: next grant after {after:?}");
    assert!(
        after > 5 * SECOND,
        "granted {after:?} after the cut: the session outlived its 2 s timeout by the jump"
    );
    assert!(second.fencing_token() > first_fence);
    second.release().await.expect("release");
}

/// A monotonic clock running 8× fast makes a 2 s session time out after 0.25 s of real
/// time, faster than the client touches it (dlock renews a 2 s session's holds every
/// 0.44 s): the holder's session expires, `lost()` fires, and the next client is granted
/// the lock with a higher fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_fast_monotonic_clock_expires_sessions_early() {
    let clock = FakeClock::wall_and_monotonic().expect("clock");
    let zk = ZooKeeper::start_with_clock(1, &clock).expect("zookeeper under the clock");
    let url = zk.url("", "?session_timeout=2s");
    let holder = zk_connect(&url).await;
    let name = unique("zk-fast");
    let first = lock(holder.clone(), &name, 30 * SECOND, true)
        .try_lock()
        .await
        .expect("store")
        .expect("free");
    let first_fence = first.fencing_token();
    clock.run_fast(8.0).expect("rate");
    timeout(5 * SECOND, first.lost())
        .await
        .expect("the session expired: lost() fires");
    clock.reset().expect("real time");
    let other = zk_connect(&url).await;
    let second = lock(other, &name, 30 * SECOND, true)
        .try_lock_for(5 * SECOND)
        .await
        .expect("store")
        .expect("the expired session's lock node is gone");
    assert!(second.fencing_token() > first_fence);
    second.release().await.expect("release");
}
