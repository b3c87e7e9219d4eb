//! Store configurations that can drop a held lock (issue 25, part 5): `dlock run`, `elect`
//! and `acquire` refuse them (exit 69, naming the setting) unless --allow-unsafe-store,
//! and warn of the rest on stderr. URL options that would do nothing are refused (part
//! 6), and `?min_replicas=N` waits for replicas, through a Sentinel failover.

use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use dlock_test::server::{MemcachedServer, RedisServer, SentinelServer};

use super::{CONFLICT, UNAVAILABLE, USAGE, dlock, output, scratch, stderr, wait_exit};

/// `dlock run NAME -- touch <marker>` on `url` with `extra` flags: its output, and
/// whether the command ran.
fn run_touch(url: &str, extra: &[&str], name: &str) -> (std::process::Output, bool) {
    let dir = scratch(name);
    let marker = dir.join("ran");
    let out = output(
        dlock(url)
            .arg("run")
            .args(extra)
            .args([name, "--", "touch"])
            .arg(&marker),
    );
    (out, marker.exists())
}

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

#[test]
fn redis_eviction_policies_are_refused_unless_allowed() {
    for policy in ["allkeys-lru", "volatile-lru"] {
        let server = evicting_redis(policy);
        let url = server.url();
        let (out, ran) = run_touch(&url, &[], "evict");
        assert_eq!(
            out.status.code(),
            Some(UNAVAILABLE),
            "{policy}: {}",
            stderr(&out)
        );
        assert!(!ran, "{policy}: the command ran");
        let text = stderr(&out);
        for word in [policy, "maxmemory", "--allow-unsafe-store", "noeviction"] {
            assert!(text.contains(word), "{policy}: no {word:?} in {text}");
        }
        assert_eq!(text.lines().count(), 1, "{text}");
        // acquire and elect take locks too.
        let out = output(dlock(&url).args(["acquire", "evict-acq"]));
        assert_eq!(out.status.code(), Some(UNAVAILABLE), "{}", stderr(&out));
        let out = output(dlock(&url).args(["elect", "evict-el", "--", "true"]));
        assert_eq!(out.status.code(), Some(UNAVAILABLE), "{}", stderr(&out));
        // Looking is not locking: status still works.
        let out = output(dlock(&url).args(["status", "evict"]));
        assert_ne!(out.status.code(), Some(UNAVAILABLE), "{}", stderr(&out));
        // The override: runs, and says what it accepted.
        let (out, ran) = run_touch(&url, &["--allow-unsafe-store"], "evict");
        assert_eq!(out.status.code(), Some(0), "{policy}: {}", stderr(&out));
        assert!(ran);
        assert!(stderr(&out).contains("warning"), "{}", stderr(&out));
        assert!(stderr(&out).contains(policy), "{}", stderr(&out));
    }
}

/// No eviction, no AOF (the test kit's default Redis): run, with a warning that fences
/// restart after a restart.
#[test]
fn redis_without_aof_runs_with_a_warning() {
    let server = RedisServer::start().expect("redis-server");
    let (out, ran) = run_touch(&server.url(), &[], "noaof");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(ran);
    let text = stderr(&out);
    assert!(
        text.contains("warning") && text.contains("aof_enabled:0") && text.contains("appendonly"),
        "{text}"
    );
    // With AOF and noeviction: nothing to say.
    let server = RedisServer::start_with(&["--appendonly", "yes"]).expect("redis-server");
    let (out, ran) = run_touch(&server.url(), &[], "aof");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(ran);
    assert!(!stderr(&out).contains("warning"), "{}", stderr(&out));
}

#[test]
fn memcached_with_evictions_is_refused_unless_allowed() {
    let server = MemcachedServer::start_evicting(&[]).expect("memcached");
    let (out, ran) = run_touch(&server.url(), &[], "mc");
    assert_eq!(out.status.code(), Some(UNAVAILABLE), "{}", stderr(&out));
    assert!(!ran);
    let text = stderr(&out);
    assert!(
        text.contains("evictions on") && text.contains("-M"),
        "{text}"
    );
    let (out, ran) = run_touch(&server.url(), &["--allow-unsafe-store"], "mc");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(ran);
    // Started with -M (the kit's default): runs, no warning.
    let server = MemcachedServer::start().expect("memcached -M");
    let (out, ran) = run_touch(&server.url(), &[], "mc");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(ran);
    assert!(!stderr(&out).contains("warning"), "{}", stderr(&out));
}

/// Advisory mode with sessions that time out after 1 s idle (libpq's `options`, as a
/// role's or database's setting would): the holder's session turns the timeout off, so
/// a second run does not get the lock while the first holds it.
#[test]
fn postgres_advisory_holds_through_an_idle_session_timeout() {
    let pg = dlock_test::postgres::PostgresServer::start().expect("postgres");
    let url = format!(
        "{}?mode=advisory&options=-c%20idle_session_timeout%3D1000",
        pg.url()
    );
    let dir = scratch("pg-idle");
    let started = dir.join("started");
    let mut first: Child = dlock(&url)
        .args(["run", "--ttl", "60s", "pg-idle", "--", "sh", "-c"])
        .arg(format!("touch {}; sleep 4", started.display()))
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !started.exists() {
        assert!(Instant::now() < deadline, "the first run never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Past the 1 s idle timeout of the holding session.
    std::thread::sleep(Duration::from_secs(2));
    let out = output(dlock(&url).args(["run", "--no-wait", "pg-idle", "--", "true"]));
    assert_eq!(out.status.code(), Some(CONFLICT), "{}", stderr(&out));
    let status = wait_exit(&mut first, Duration::from_secs(30));
    assert_eq!(status.code(), Some(0), "the first run lost its lock");
}

/// Every scheme refuses a query parameter it does not know, naming it (exit 64).
#[test]
fn every_scheme_refuses_unknown_parameters() {
    for url in [
        "redis://127.0.0.1:1/?bogus=1",
        "rediss://127.0.0.1:1/?bogus=1",
        "redis+unix:///tmp/dlock-none.sock?bogus=1",
        "redis+sentinel://127.0.0.1:1/master?bogus=1",
        "redis+cluster://127.0.0.1:1/?bogus=1",
        "redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3?bogus=1",
        "memcache://127.0.0.1:1?bogus=1",
        #[cfg(feature = "etcd")]
        "etcd://127.0.0.1:1?bogus=1",
        "postgres://u:s3cret@127.0.0.1:1/db?bogus=1",
        "postgres://u:s3cret@127.0.0.1:1/db?mode=advisory&bogus=1",
        "zk://127.0.0.1:1/chroot?bogus=1",
    ] {
        let out = output(dlock(url).args(["run", "j", "--", "true"]));
        assert_eq!(out.status.code(), Some(USAGE), "{url}: {}", stderr(&out));
        let text = stderr(&out);
        assert!(text.contains("bogus"), "{url}: {text}");
        assert!(!text.contains("s3cret"), "{url}: {text}");
    }
    // A mode that is neither advisory nor lease.
    let out =
        output(dlock("postgres://127.0.0.1:1/db?mode=advisroy").args(["run", "j", "--", "true"]));
    assert_eq!(out.status.code(), Some(USAGE), "{}", stderr(&out));
    assert!(stderr(&out).contains("mode=advisory"), "{}", stderr(&out));
}

/// `?min_replicas=1` on a lone server: not granted (the command never runs).
#[test]
fn min_replicas_without_a_replica_is_refused() {
    let server = RedisServer::start_with(&["--appendonly", "yes"]).expect("redis-server");
    let url = format!("{}?min_replicas=1", server.url());
    for wait in [&["--no-wait"][..], &["--wait", "2s"]] {
        let (out, ran) = run_touch(&url, wait, "replicated");
        assert!(!ran, "granted without a replica");
        assert_eq!(out.status.code(), Some(UNAVAILABLE), "{}", stderr(&out));
        assert!(stderr(&out).contains("replica"), "{}", stderr(&out));
    }
}

/// Whether `INFO <section>` of the server at `client` contains `needle`.
fn info_has(client: &redis::Client, section: &str, needle: &str) -> bool {
    let Ok(mut conn) = client.get_connection_with_timeout(Duration::from_secs(1)) else {
        return false;
    };
    redis::cmd("INFO")
        .arg(section)
        .query::<String>(&mut conn)
        .is_ok_and(|text| text.contains(needle))
}

/// `redis+sentinel://…/name?min_replicas=1`: granted with a replica; the master dies and
/// the sentinels promote the replica: the lock taken before is still held there (its grant
/// was acknowledged by the replica), and with no replica left a new grant is refused.
#[test]
fn min_replicas_through_a_sentinel_failover() {
    let mut master = RedisServer::start().expect("master");
    let port = master.port().to_string();
    let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &port]).expect("replica");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !info_has(&master.client(), "replication", "state=online") {
        assert!(Instant::now() < deadline, "the replica never linked up");
        std::thread::sleep(Duration::from_millis(50));
    }
    let name = "hazardmaster";
    let sentinels: Vec<SentinelServer> = (0..3)
        .map(|_| SentinelServer::start(master.port(), name, 2).expect("sentinel"))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !sentinels.iter().all(|s| {
        info_has(&s.client(), "sentinel", "slaves=1")
            && info_has(&s.client(), "sentinel", "sentinels=3")
    }) {
        assert!(
            Instant::now() < deadline,
            "the sentinels never saw the replica"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let hosts: Vec<String> = sentinels.iter().map(SentinelServer::addr).collect();
    let base = format!("redis+sentinel://{}/{name}", hosts.join(","));
    let url = format!("{base}?min_replicas=1");

    // With the replica: granted.
    let (out, ran) = run_touch(&url, &["--no-wait"], "sentinel-ok");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(ran);

    // A holder through the failover.
    let dir = scratch("sentinel-hold");
    let started = dir.join("started");
    let mut holder = dlock(&url)
        .args(["run", "--ttl", "60s", "failover", "--", "sh", "-c"])
        .arg(format!("touch {}; sleep 60", started.display()))
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    let _ = wait_for_file_exists(&started, Duration::from_secs(20));
    master.kill();
    let deadline = Instant::now() + Duration::from_secs(60);
    let promoted = replica.port();
    while !info_has(&replica.client(), "replication", "role:master")
        || !sentinels.iter().all(|s| names_master(s, name, promoted))
    {
        assert!(Instant::now() < deadline, "no failover");
        std::thread::sleep(Duration::from_millis(100));
    }
    // The lock survived on the promoted replica: not granted to another run.
    let out = output(dlock(&base).args(["run", "--no-wait", "failover", "--", "true"]));
    assert_eq!(out.status.code(), Some(CONFLICT), "{}", stderr(&out));
    // No replica left: a grant that needs one is refused.
    let (out, ran) = run_touch(&url, &["--no-wait"], "sentinel-alone");
    assert!(!ran, "granted with no replica left");
    assert_eq!(out.status.code(), Some(UNAVAILABLE), "{}", stderr(&out));
    let _ = holder.kill();
    let _ = holder.wait();
}

/// Whether `sentinel` names the server on `port` as `name`'s master.
fn names_master(sentinel: &SentinelServer, name: &str, port: u16) -> bool {
    let Ok(mut conn) = sentinel
        .client()
        .get_connection_with_timeout(Duration::from_secs(1))
    else {
        return false;
    };
    redis::cmd("SENTINEL")
        .arg("GET-MASTER-ADDR-BY-NAME")
        .arg(name)
        .query::<(String, u16)>(&mut conn)
        .is_ok_and(|(_, p)| p == port)
}

/// Waits until `path` exists.
fn wait_for_file_exists(path: &std::path::Path, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}
