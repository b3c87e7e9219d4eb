//! The Redis backend against the conformance suite, plus faults on the real server.

use std::time::Duration;

use dlock_test::conformance::{Target, unique};
use dlock_test::server::{RedisServer, free_port};
use dlock_test::targets::RedisTarget;
use fencelock::backend::Redis;
use fencelock::{ErrorKind, Lock};
use tokio::time::{Instant, sleep, timeout};

mod conformance {
    crate::all_conformance_tests!(dlock_test::targets::RedisTarget::start());
    crate::conformance_tests!(dlock_test::targets::RedisTarget::start();
        lost_fires_when_the_store_is_frozen_past_the_ttl,
        a_partitioned_holder_loses_its_lease_and_closed_connections_recover,
    );
}

mod election {
    crate::election_tests!(dlock_test::targets::RedisTarget::start());
}

async fn cmd<T: redis::FromRedisValue>(
    conn: &mut redis::aio::MultiplexedConnection,
    args: &[&str],
) -> T {
    let mut c = redis::cmd(args[0]);
    for a in &args[1..] {
        c.arg(*a);
    }
    c.query_async(conn).await.expect("admin command")
}

/// `cmdstat_<name>:calls=N` from INFO commandstats.
pub(crate) async fn calls(conn: &mut redis::aio::MultiplexedConnection, command: &str) -> u64 {
    let info: String = cmd(conn, &["INFO", "commandstats"]).await;
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// Every `command -> calls` from INFO commandstats (commands run inside scripts included).
async fn all_calls(conn: &mut redis::aio::MultiplexedConnection) -> Vec<(String, u64)> {
    let info: String = cmd(conn, &["INFO", "commandstats"]).await;
    let mut out: Vec<(String, u64)> = info
        .lines()
        .filter_map(|l| l.strip_prefix("cmdstat_"))
        .filter_map(|l| {
            let (name, rest) = l.split_once(":calls=")?;
            Some((name.to_owned(), rest.split(',').next()?.parse().ok()?))
        })
        .filter(|(name, _)| name != "info" && name != "config|resetstat")
        .collect();
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_and_release_are_one_round_trip_each() {
    let t = RedisTarget::start();
    let lock = Lock::new(t.client().await, unique("rtt")).expect("valid");
    let mut admin = t.admin().await;
    let _: () = cmd(&mut admin, &["CONFIG", "RESETSTAT"]).await;
    let guard = lock.try_lock().await.expect("store").expect("free");
    let expect = |list: &[(&str, u64)]| -> Vec<(String, u64)> {
        let mut v: Vec<_> = list.iter().map(|(n, c)| ((*n).to_owned(), *c)).collect();
        v.sort();
        v
    };
    // One transaction from the client, no script: SET NX PX and the fence's INCR
    // between MULTI and EXEC (sent together: one round trip).
    assert_eq!(
        all_calls(&mut admin).await,
        expect(&[("multi", 1), ("set", 1), ("incr", 1), ("exec", 1)])
    );
    guard.release().await.expect("release");
    // One EVALSHA: compare-and-delete (GET, DEL) and EXISTS (nobody queued). Nobody
    // waits, so nothing is announced: no PUBLISH.
    assert_eq!(
        all_calls(&mut admin).await,
        expect(&[
            ("multi", 1),
            ("set", 1),
            ("incr", 1),
            ("exec", 1),
            ("evalsha", 1),
            ("get", 1),
            ("exists", 1),
            ("del", 1),
        ])
    );
}

/// A name with a hash tag: a held lock with a waiter queue is listed once, as its lock;
/// a read-write lock held by readers alone (no lock key) is listed by its readers key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listing_names_with_a_hash_tag_shows_each_lock_once() {
    use fencelock::raw::RawInspect;
    let t = RedisTarget::start();
    let tag = unique("tag");
    let job = format!("{{{tag}}}job");
    let lock = Lock::new(t.client().await, &job).expect("valid");
    let guard = lock.try_lock().await.expect("store").expect("free");
    // A waiter of another client: the lock's waiter queue now exists beside it.
    let other = Lock::new(t.client().await, &job).expect("valid");
    let waiter = tokio::spawn(async move { other.try_lock_for(Duration::from_secs(5)).await });
    sleep(Duration::from_millis(300)).await;
    let admin = t.client().await;
    let pattern = format!("{{{tag}}}*");
    let listed = admin.list("dlock:", &pattern, 100).await.expect("list");
    assert_eq!(listed, vec![job.clone()], "the lock, not its waiter queue");
    guard.release().await.expect("release");
    let next = waiter
        .await
        .expect("join")
        .expect("store")
        .expect("handed over");
    next.release().await.expect("release");

    // A read-write lock held by a reader alone: only its readers key is there.
    let report = format!("{{{tag}}}report");
    let rw = fencelock::RwLock::new(t.client().await, &report).expect("valid");
    let read = rw.read().await.expect("read");
    let listed = admin
        .list(fencelock::DEFAULT_RWLOCK_PREFIX, &pattern, 100)
        .await
        .expect("list");
    assert_eq!(listed, vec![report.clone()]);
    read.release().await.expect("release");
}

/// A `redis::Client` the application already has: dlock connects from it, or shares the
/// application's own connection for its lock traffic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn builds_on_the_application_s_own_client_and_connection() {
    let server = RedisServer::start().expect("redis-server");
    let client =
        redis::Client::open(format!("redis://127.0.0.1:{}/3", server.port())).expect("url");
    let name = unique("app-client");

    // From the client: its database (3) is where the lock lives.
    let own = Redis::from_client(client.clone())
        .await
        .expect("from client");
    let guard = Lock::new(own, &name)
        .expect("valid")
        .try_lock()
        .await
        .expect("store")
        .expect("free");
    let mut app = client
        .get_multiplexed_async_connection()
        .await
        .expect("app connection");
    let at_key: Option<String> = cmd(&mut app, &["GET", &format!("dlock:{name}")]).await;
    assert_eq!(at_key.as_deref(), Some(guard.token().as_str()), "in db 3");
    guard.release().await.expect("release");

    // Sharing the application's connection: the lock's commands arrive on it.
    let mut shared = client.get_connection_manager().await.expect("app manager");
    let id: i64 = redis::cmd("CLIENT")
        .arg("ID")
        .query_async(&mut shared)
        .await
        .expect("CLIENT ID");
    let redis = Redis::builder_from_client(client.clone())
        .connection(shared.clone())
        .connect()
        .await
        .expect("from the shared connection");
    let lock = Lock::new(redis.clone(), &name).expect("valid");
    let guard = lock.try_lock().await.expect("store").expect("free");
    let line: String = redis::cmd("CLIENT")
        .arg("LIST")
        .arg("ID")
        .arg(id)
        .query_async(&mut app)
        .await
        .expect("CLIENT LIST");
    assert!(
        line.contains("cmd=exec"),
        "the grant went over the app's connection: {line}"
    );
    // A waiter on another client is woken by the release (dlock's own pub/sub works).
    let other = Lock::new(Redis::from_client(client).await.expect("other"), &name).expect("valid");
    let waiter = tokio::spawn(async move { other.try_lock_for(Duration::from_secs(5)).await });
    sleep(Duration::from_millis(200)).await;
    guard.release().await.expect("release");
    let next = waiter
        .await
        .expect("join")
        .expect("store")
        .expect("woken and granted");
    next.release().await.expect("release");
    // The application's connection still serves the application.
    let pong: String = redis::cmd("PING")
        .query_async(&mut shared)
        .await
        .expect("PING");
    assert_eq!(pong, "PONG");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interoperates_with_the_standard_set_nx_px_protocol() {
    let t = RedisTarget::start();
    let name = unique("interop");
    let lock = Lock::builder(t.client().await, &name)
        .prefix("")
        .build()
        .expect("valid");
    let mut raw = t.admin().await;
    // A foreign client holds the key: dlock is excluded.
    let set: Option<String> = cmd(&mut raw, &["SET", &name, "foreign", "NX", "PX", "10000"]).await;
    assert_eq!(set.as_deref(), Some("OK"));
    assert!(lock.try_lock().await.expect("store").is_none());
    let _: i64 = cmd(&mut raw, &["DEL", &name]).await;
    // dlock holds the key: the foreign client is excluded, and sees the plain token.
    let guard = lock.try_lock().await.expect("store").expect("free");
    let set: Option<String> = cmd(&mut raw, &["SET", &name, "foreign", "NX", "PX", "10000"]).await;
    assert_eq!(set, None);
    let value: String = cmd(&mut raw, &["GET", &name]).await;
    assert_eq!(value, guard.token().as_str());
    let pttl: i64 = cmd(&mut raw, &["PTTL", &name]).await;
    assert!(
        pttl > 0 && pttl <= 30_000,
        "the key must carry the lease as PX: {pttl}"
    );
    guard.release().await.expect("release");
    let exists: i64 = cmd(&mut raw, &["EXISTS", &name]).await;
    assert_eq!(exists, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_fires_when_the_server_restarts_empty_and_the_client_recovers() {
    let mut t = RedisTarget::start();
    let backend = t.client().await;
    let ttl = Duration::from_millis(600);
    let lock = Lock::builder(backend.clone(), unique("restart"))
        .ttl(ttl)
        .build()
        .expect("valid");
    let guard = lock.try_lock().await.expect("store").expect("free");
    let lost = guard.lost();
    t.server.restart().expect("restart");
    timeout(ttl * 5, lost)
        .await
        .expect("lost() must fire after the server lost the key");
    let err = guard.release().await.expect_err("not ours any more");
    assert_eq!(err.kind(), ErrorKind::LockLost, "{err}");
    // The same client reconnects by itself and locks again (scripts reloaded on NOSCRIPT).
    let deadline = Instant::now() + Duration::from_secs(10);
    let guard = loop {
        match lock.try_lock().await {
            Ok(Some(g)) => break g,
            Ok(None) => panic!("nobody else holds it"),
            Err(e) if e.is_retryable() && Instant::now() < deadline => {
                sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("client did not recover: {e}"),
        }
    };
    guard.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_flush_mid_hold_is_survived() {
    let t = RedisTarget::start();
    let ttl = Duration::from_millis(300);
    let lock = Lock::builder(t.client().await, unique("flush"))
        .ttl(ttl)
        .build()
        .expect("valid");
    let guard = lock.try_lock().await.expect("store").expect("free");
    let mut admin = t.admin().await;
    let _: () = cmd(&mut admin, &["SCRIPT", "FLUSH"]).await;
    sleep(ttl * 3).await; // several renewals, the first of which meets NOSCRIPT
    assert!(!guard.is_lost(), "renewal must reload the script and go on");
    let _: () = cmd(&mut admin, &["SCRIPT", "FLUSH"]).await;
    guard.release().await.expect("release reloads the script");
    let _: () = cmd(&mut admin, &["SCRIPT", "FLUSH"]).await;
    let guard = lock
        .try_lock()
        .await
        .expect("store")
        .expect("acquire reloads");
    assert!(guard.fencing_token().get() >= 2);
    guard.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_release_wakes_one_waiter_across_clients() {
    let t = RedisTarget::start();
    let name = unique("herd");
    let ttl = Duration::from_secs(30);
    let holder = Lock::builder(t.client().await, &name)
        .ttl(ttl)
        .build()
        .expect("valid");
    let guard = holder.try_lock().await.expect("store").expect("free");
    // Sixteen waiters, each its own client (as sixteen processes would be), plus three
    // sharing one client.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let shared = t.client().await;
    for i in 0..19 {
        let client = if i < 16 {
            t.client().await
        } else {
            shared.clone()
        };
        let lock = Lock::builder(client, &name)
            .ttl(ttl)
            .build()
            .expect("valid");
        let tx = tx.clone();
        tokio::spawn(async move {
            let g = lock.lock().await.expect("lock");
            let _ = tx.send((i, g));
        });
        sleep(Duration::from_millis(20)).await;
    }
    let queued = async {
        while holder.state().await.expect("store").queued != Some(19) {
            sleep(Duration::from_millis(10)).await;
        }
    };
    timeout(Duration::from_secs(5), queued)
        .await
        .expect("every waiter takes a place in the store's queue");
    let mut admin = t.admin().await;
    let _: () = cmd(&mut admin, &["CONFIG", "RESETSTAT"]).await;
    guard.release().await.expect("release");
    let (first, g) = timeout(Duration::from_secs(5), rx.recv())
        .await
        .expect("a waiter woke on the release")
        .expect("channel");
    assert_eq!(first, 0, "the first waiter in line gets it");
    sleep(Duration::from_millis(300)).await;
    // The release alone, which handed the lock over to the head; the woken waiter sends
    // nothing more, the others nothing at all. Two scripts: the holder never waited on the
    // name, so its release is first the compare-and-delete that finds waiters queued,
    // then the hand-over.
    assert_eq!(
        calls(&mut admin, "evalsha").await,
        2,
        "a release must hand over to one waiter, not wake the herd"
    );
    assert_eq!(calls(&mut admin, "publish").await, 1, "one announcement");
    assert!(rx.try_recv().is_err());
    // The rest follow in arrival order, one release each.
    let mut order = vec![first];
    let mut g = g;
    for _ in 1..19 {
        g.release().await.expect("release");
        let (next, ng) = timeout(Duration::from_secs(5), rx.recv())
            .await
            .expect("the next waiter woke")
            .expect("channel");
        order.push(next);
        g = ng;
    }
    g.release().await.expect("release");
    assert_eq!(order, (0..19).collect::<Vec<_>>(), "FIFO across clients");
    // 20 releases (the holder's and each waiter's), each handing the lock over: no
    // waiter attempted again after queueing. Each waiter waited on the name, so its
    // release is the hand-over script at once; the holder's took two (above).
    assert_eq!(
        calls(&mut admin, "evalsha").await,
        21,
        "every hand-off: one release"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_release_wakes_only_the_next_waiter_across_clients() {
    let t = RedisTarget::start();
    let name = unique("fair-herd");
    let ttl = Duration::from_secs(30);
    let holder = fencelock::FairLock::builder(t.client().await, &name)
        .ttl(ttl)
        .build()
        .expect("valid");
    let guard = holder.lock().await.expect("lock");
    // Four waiters, each in its own client (as four processes would be).
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    for i in 0..4 {
        let fair = fencelock::FairLock::builder(t.client().await, &name)
            .ttl(ttl)
            .build()
            .expect("valid");
        let tx = tx.clone();
        tokio::spawn(async move {
            let g = fair.lock().await.expect("lock");
            let _ = tx.send((i, g));
        });
        sleep(Duration::from_millis(50)).await;
    }
    sleep(Duration::from_millis(200)).await; // every waiter queued and subscribed
    assert_eq!(holder.state().await.expect("store").queued, Some(4));
    let mut admin = t.admin().await;
    let _: () = cmd(&mut admin, &["CONFIG", "RESETSTAT"]).await;
    guard.release().await.expect("release");
    let (first, g) = timeout(Duration::from_secs(5), rx.recv())
        .await
        .expect("the head woke on the release")
        .expect("channel");
    assert_eq!(first, 0, "not the first in line");
    sleep(Duration::from_millis(300)).await;
    // One EVALSHA for the release, one for the head's attempt: nobody else woke.
    assert_eq!(
        calls(&mut admin, "evalsha").await,
        2,
        "a fair release must wake the next waiter only"
    );
    assert!(rx.try_recv().is_err());
    drop(g);
}

/// A waiter behind a queue head that never comes (its process died) is told to look again
/// within its own lease, not when the head's claim ends, and claims no longer than that
/// plus its grace: otherwise each dead waiter's claim would sit a grace past the one in
/// front, and the queue's keys would outlive every waiter (the torture's orphan audit).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_behind_a_dead_head_claims_at_most_a_lease_and_a_grace() {
    use fencelock::raw::{Acquire, RawFair};
    let t = RedisTarget::start();
    let client = t.client().await;
    let keys =
        fencelock::keys::LockKeys::new(fencelock::DEFAULT_FAIR_PREFIX, &unique("fair-chain"))
            .expect("valid");
    let (long, grace, short) = (
        Duration::from_secs(20),
        Duration::from_millis(500),
        Duration::from_millis(300),
    );
    let token = || fencelock::Token::random().expect("token");
    let holder = token();
    let granted = client.acquire_fair(&keys, &holder, long, grace).await;
    assert!(
        matches!(granted, Ok(Acquire::Acquired { .. })),
        "{granted:?}"
    );
    // The head queues behind a 20 s lease (its claim: 20 s and a grace), then dies.
    let head = client.acquire_fair(&keys, &token(), long, grace).await;
    assert!(matches!(head, Ok(Acquire::Held { .. })), "{head:?}");
    assert!(client.release_fair(&keys, &holder).await.expect("release"));
    // Free, but reserved for the head for almost 20 s more.
    let waiter = token();
    let behind = client.acquire_fair(&keys, &waiter, short, grace).await;
    let Ok(Acquire::Held {
        remaining: Some(wait),
    }) = behind
    else {
        panic!("not held for the head: {behind:?}");
    };
    assert!(
        wait <= short,
        "told to wait {wait:?}, beyond its {short:?} lease"
    );
    let mut admin = t.admin().await;
    let ours: u64 = cmd(
        &mut admin,
        &["ZSCORE", &keys.companion("claims"), waiter.as_str()],
    )
    .await;
    let now_ms = {
        let (secs, micros): (u64, u64) = cmd(&mut admin, &["TIME"]).await;
        secs * 1000 + micros / 1000
    };
    assert!(
        ours <= now_ms + u64::try_from((short + grace).as_millis()).expect("ms"),
        "claim {} ms ahead, beyond a lease and a grace",
        ours - now_ms
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchdog_pipelines_renewals_of_many_leases() {
    let t = RedisTarget::start();
    let backend = t.client().await;
    let ttl = Duration::from_millis(600);
    let mut guards = Vec::new();
    for _ in 0..200 {
        let lock = Lock::builder(backend.clone(), unique("many"))
            .ttl(ttl)
            .build()
            .expect("valid");
        guards.push(lock.try_lock().await.expect("store").expect("free"));
    }
    assert_eq!(fencelock::raw::RawLock::engine(&backend).leases(), 200);
    sleep(ttl * 3).await;
    assert!(guards.iter().all(|g| !g.is_lost()), "every lease renewed");
    for g in guards {
        g.release().await.expect("release");
    }
    assert!(fencelock::raw::RawLock::engine(&backend).leases() == 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_string_at_the_lock_key_is_a_typed_error() {
    let t = RedisTarget::start();
    let lock = Lock::new(t.client().await, unique("wrongtype")).expect("valid");
    let mut admin = t.admin().await;
    let _: i64 = cmd(&mut admin, &["HSET", lock.keys().lock(), "f", "v"]).await;
    let err = lock.try_lock().await.expect_err("a hash is not a lock");
    assert_eq!(err.kind(), ErrorKind::Backend, "{err}");
    assert!(err.to_string().contains("WRONGTYPE"), "{err}");

    // A corrupt fence counter fails the acquire and leaves no lock behind.
    let lock = Lock::new(t.client().await, unique("badfence")).expect("valid");
    let _: () = cmd(&mut admin, &["SET", lock.keys().fence(), "not-a-number"]).await;
    let err = lock.try_lock().await.expect_err("corrupt fence counter");
    assert_eq!(err.kind(), ErrorKind::Backend, "{err}");
    let exists: i64 = cmd(&mut admin, &["EXISTS", lock.keys().lock()]).await;
    assert_eq!(exists, 0, "the lock key must not be left without a fence");
}

/// The election record: only the lock's holder writes it (any term: a reset fence counter
/// must not lock elections out), a publish is one `EVALSHA` that announces on the record's
/// channel and a refused one announces nothing, a read is one `HMGET`, u64 terms are kept
/// exactly; a record that dlock did not write is a typed error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_election_record_is_written_by_the_holder_only_in_one_round_trip() {
    use fencelock::raw::{RECORD, RawElection};
    let t = RedisTarget::start();
    let client = t.client().await;
    let name = unique("record");
    let keys =
        fencelock::keys::LockKeys::new(fencelock::DEFAULT_ELECTION_PREFIX, &name).expect("valid");
    assert_eq!(client.record(&keys).await.expect("read"), None);
    let lock = fencelock::Lock::builder(client.clone(), &name)
        .prefix(fencelock::DEFAULT_ELECTION_PREFIX)
        .build()
        .expect("valid");
    let guard = lock.try_lock().await.expect("store").expect("free");
    let token = guard.token().clone();
    let mut admin = t.admin().await;
    let _: () = cmd(&mut admin, &["CONFIG", "RESETSTAT"]).await;
    let big = u64::MAX;
    assert!(
        client
            .publish(&keys, &token, big, "a\nnew")
            .await
            .expect("publish")
    );
    assert_eq!(
        client.record(&keys).await.expect("read"),
        Some((big, "a\nnew".to_owned())),
        "u64 terms are stored exactly"
    );
    let calls = all_calls(&mut admin).await;
    let count = |name: &str| calls.iter().find(|(n, _)| n == name).map_or(0, |(_, c)| *c);
    assert_eq!(
        (count("evalsha"), count("hmget"), count("publish")),
        (1, 1, 1),
        "{calls:?}"
    );
    // A smaller term by the holder is written (a reset fence counter); another token's
    // write is refused and announces nothing.
    assert!(
        client
            .publish(&keys, &token, 3, "reset")
            .await
            .expect("publish")
    );
    let other = fencelock::Token::random().expect("rng");
    let _: () = cmd(&mut admin, &["CONFIG", "RESETSTAT"]).await;
    assert!(
        !client
            .publish(&keys, &other, 4, "forged")
            .await
            .expect("publish")
    );
    assert_eq!(
        count_of(&mut admin, "publish").await,
        0,
        "a refused write announced"
    );
    assert_eq!(
        client.record(&keys).await.expect("read"),
        Some((3, "reset".to_owned()))
    );
    let record = keys.companion(RECORD);
    let ttl: i64 = cmd(&mut admin, &["PTTL", &record]).await;
    assert_eq!(ttl, -1, "the record never expires");
    guard.release().await.expect("release");
    assert!(
        !client
            .publish(&keys, &token, 5, "late")
            .await
            .expect("publish"),
        "a released holder wrote"
    );

    // A record someone else wrote: a typed error.
    let _: i64 = cmd(&mut admin, &["HSET", &record, "term", "007"]).await;
    let err = client.record(&keys).await.expect_err("tampered");
    assert_eq!(err.kind(), ErrorKind::Backend, "{err}");
    let _: i64 = cmd(&mut admin, &["DEL", &record]).await;
    let _: () = cmd(&mut admin, &["SET", &record, "x"]).await;
    let err = client.record(&keys).await.expect_err("a string");
    assert!(err.to_string().contains("WRONGTYPE"), "{err}");
}

/// Calls of one command since the last `CONFIG RESETSTAT`.
async fn count_of(admin: &mut redis::aio::MultiplexedConnection, name: &str) -> u64 {
    all_calls(admin)
        .await
        .iter()
        .find(|(n, _)| n == name)
        .map_or(0, |(_, c)| *c)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_without_scripting_gets_a_clear_error() {
    let t = RedisTarget::start();
    let mut admin = t.admin().await;
    let _: () = cmd(
        &mut admin,
        &[
            "ACL",
            "SETUSER",
            "noscript",
            "on",
            ">pw",
            "~*",
            "&*",
            "+@all",
            "-@scripting",
        ],
    )
    .await;
    let url = format!("redis://noscript:pw@127.0.0.1:{}/", t.server.port());
    let err = Redis::connect(url)
        .await
        .expect_err("scripting is required");
    assert_eq!(err.kind(), ErrorKind::Backend, "{err}");
    assert!(err.to_string().contains("scripting"), "{err}");
    assert!(
        !err.to_string().contains(":pw@"),
        "credentials leaked: {err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_user_password_and_db_from_the_url_are_used() {
    let t = RedisTarget::start();
    let mut admin = t.admin().await;
    let _: () = cmd(
        &mut admin,
        &[
            "ACL", "SETUSER", "locker", "on", ">s3cret", "~*", "&*", "+@all",
        ],
    )
    .await;
    let url = format!("redis://locker:s3cret@127.0.0.1:{}/3", t.server.port());
    let lock =
        Lock::new(Redis::connect(url).await.expect("connect"), unique("acl")).expect("valid");
    let guard = lock.try_lock().await.expect("store").expect("free");
    let in_db0: i64 = cmd(&mut admin, &["EXISTS", lock.keys().lock()]).await;
    let _: () = cmd(&mut admin, &["SELECT", "3"]).await;
    let in_db3: i64 = cmd(&mut admin, &["EXISTS", lock.keys().lock()]).await;
    assert_eq!((in_db0, in_db3), (0, 1), "the lock must live in db 3");
    guard.release().await.expect("release");

    let bad = format!("redis://locker:wrong@127.0.0.1:{}/", t.server.port());
    let err = Redis::connect(bad).await.expect_err("wrong password");
    assert!(
        matches!(err.kind(), ErrorKind::Backend | ErrorKind::Unavailable),
        "{err}"
    );
    assert!(
        !err.to_string().contains("wrong@"),
        "credentials leaked: {err}"
    );
}

#[tokio::test]
async fn malformed_urls_are_invalid_arguments() {
    for url in [
        "",
        "http://127.0.0.1/",
        "127.0.0.1:6379",
        "redis://127.0.0.1:notaport/",
        "redis://[::1/",
    ] {
        let err = Redis::connect(url).await.expect_err(url);
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{url}: {err}");
    }
    let err = Redis::builder("redis://127.0.0.1/")
        .connect_timeout(Duration::ZERO)
        .connect()
        .await
        .expect_err("zero timeout");
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
}

#[tokio::test]
async fn an_unreachable_server_fails_within_the_connect_timeout() {
    let port = free_port().expect("port");
    let started = Instant::now();
    let err = Redis::builder(format!("redis://127.0.0.1:{port}/"))
        .connect_timeout(Duration::from_millis(500))
        .connect()
        .await
        .expect_err("nobody listens there");
    assert!(
        matches!(err.kind(), ErrorKind::Unavailable | ErrorKind::TimedOut),
        "{err}"
    );
    assert!(err.is_retryable());
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "connect must be bounded, took {:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_server_with_persistence_keeps_fences_increasing() {
    // The fence counter's durability is the server's: with AOF it survives a restart.
    let server = RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"])
        .expect("redis-server");
    let mut t = RedisTarget { server };
    let name = unique("durable-fence");
    let lock = Lock::new(t.client().await, &name).expect("valid");
    let g = lock.try_lock().await.expect("store").expect("free");
    let before = g.fencing_token();
    g.release().await.expect("release");
    t.server.restart().expect("restart");
    let lock = Lock::new(t.client().await, &name).expect("valid");
    let g = lock.try_lock().await.expect("store").expect("free");
    assert!(
        g.fencing_token() > before,
        "fence went backwards across a restart"
    );
    g.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_urls_lock_over_tls() {
    let server = RedisServer::start_tls().expect("redis-server with TLS (and openssl)");
    let port = server.tls_port().expect("tls port");
    // A self-signed test certificate: `#insecure` skips verification, as redis-rs documents.
    let url = format!("rediss://127.0.0.1:{port}/#insecure");
    let backend = Redis::connect(url).await.expect("TLS connect");
    let lock = Lock::builder(backend, unique("tls"))
        .ttl(Duration::from_millis(300))
        .build()
        .expect("valid");
    let guard = lock.try_lock().await.expect("store").expect("free");
    sleep(Duration::from_millis(500)).await; // renewed over TLS
    assert!(!guard.is_lost());
    let waiter = lock.clone();
    let waiting = tokio::spawn(async move { waiter.lock().await.map(|g| g.fencing_token()) });
    sleep(Duration::from_millis(100)).await;
    let first = guard.fencing_token();
    guard.release().await.expect("release over TLS");
    let second = timeout(Duration::from_secs(5), waiting)
        .await
        .expect("woken through pub/sub over TLS")
        .expect("task")
        .expect("lock");
    assert!(second > first);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_whose_reply_timed_out_leaves_no_orphan() {
    let t = RedisTarget::start();
    let name = unique("orphan");
    let slow_client = Redis::builder(t.server.url())
        .response_timeout(Duration::from_millis(300))
        .connect()
        .await
        .expect("connect");
    let lock = Lock::new(slow_client, &name).expect("valid");
    let mut admin = t.admin().await;
    // Writes wait 1.5 s: the acquire and both of its repeats are applied after the
    // caller gave up on their replies (300 ms each, 50 + 100 ms apart).
    let _: () = cmd(&mut admin, &["CLIENT", "PAUSE", "1500", "WRITE"]).await;
    let err = lock.try_lock().await.expect_err("no reply in time");
    assert_eq!(err.kind(), ErrorKind::TimedOut, "{err}");
    assert!(err.is_retryable());
    let other = Lock::new(t.client().await, &name).expect("valid");
    let g = other
        .try_lock_for(Duration::from_secs(5))
        .await
        .expect("store")
        .expect("the unknown-outcome grant must be given back, not held for its 30 s ttl");
    g.release().await.expect("release");
}

/// A client whose replies time out after 250 ms, and a pause of every client for 600 ms:
/// a call's first attempt (and maybe its second) times out, the server applies all of them
/// when the pause ends, and the call's last repeat gets its answer.
async fn retried_through_a_pause<F: std::future::Future>(t: &RedisTarget, call: F) -> F::Output {
    let mut admin = t.admin().await;
    let _: () = cmd(&mut admin, &["CLIENT", "PAUSE", "600", "ALL"]).await;
    let started = Instant::now();
    let out = call.await;
    assert!(
        started.elapsed() >= Duration::from_millis(250),
        "the call was answered during the pause: nothing was retried"
    );
    out
}

async fn impatient_client(t: &RedisTarget) -> Redis {
    Redis::builder(t.server.url())
        .response_timeout(Duration::from_millis(250))
        .connect()
        .await
        .expect("connect")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retried_reentrant_calls_are_applied_once() {
    let t = RedisTarget::start();
    let lock = fencelock::ReentrantLock::builder(impatient_client(&t).await, unique("re-retry"))
        .ttl(Duration::from_secs(20))
        .build()
        .expect("valid");
    let me = fencelock::Owner::new("me").expect("owner");
    let outer = lock.lock(&me).await.expect("lock");
    let inner = retried_through_a_pause(&t, lock.lock(&me))
        .await
        .expect("re-entry answered by a repeat");
    assert_eq!(
        lock.hold_count(&me).await.expect("store"),
        2,
        "a repeated re-entry was counted twice"
    );
    retried_through_a_pause(&t, inner.release())
        .await
        .expect("a repeated release is not LockLost");
    assert_eq!(
        lock.hold_count(&me).await.expect("store"),
        1,
        "a repeated release was applied twice"
    );
    retried_through_a_pause(&t, outer.release())
        .await
        .expect("a repeated last release is not LockLost");
    assert!(!lock.is_locked().await.expect("store"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retried_lock_calls_are_applied_once() {
    let t = RedisTarget::start();
    let name = unique("retry");
    let lock = Lock::builder(impatient_client(&t).await, &name)
        .ttl(Duration::from_secs(20))
        .build()
        .expect("valid");
    let guard = retried_through_a_pause(&t, lock.lock())
        .await
        .expect("granted through a repeat");
    let state = lock.state().await.expect("store");
    assert_eq!(state.holder.as_deref(), Some(guard.token().as_str()));
    assert_eq!(
        state.last_fence,
        Some(guard.fencing_token().get()),
        "the repeat minted another fence"
    );
    retried_through_a_pause(&t, guard.release())
        .await
        .expect("a repeated release is not LockLost");
    assert!(!lock.is_locked().await.expect("store"));
    // Semaphore permits: a repeated acquire takes one permit, not two.
    let sem = fencelock::Semaphore::builder(impatient_client(&t).await, &name, 2)
        .ttl(Duration::from_secs(20))
        .build()
        .expect("valid");
    let permit = retried_through_a_pause(&t, sem.acquire())
        .await
        .expect("permit through a repeat");
    assert_eq!(sem.available_permits().await.expect("store"), 1);
    retried_through_a_pause(&t, permit.release())
        .await
        .expect("a repeated permit release is not LockLost");
    assert_eq!(sem.available_permits().await.expect("store"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_waiters_leave_no_subscription_behind() {
    let t = RedisTarget::start();
    let holders = t.client().await;
    let waiters = t.client().await;
    let mut guards = Vec::new();
    let mut locks = Vec::new();
    for _ in 0..20 {
        let name = unique("unsub");
        let h = Lock::new(holders.clone(), &name).expect("valid");
        guards.push(h.try_lock().await.expect("store").expect("free"));
        locks.push(Lock::new(waiters.clone(), &name).expect("valid"));
    }
    // Cancel each waiter at a different point: before, during and after its SUBSCRIBE.
    for (i, lock) in locks.iter().enumerate() {
        let _ = timeout(Duration::from_micros(200 * i as u64), lock.lock()).await;
    }
    let mut admin = t.admin().await;
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let channels: Vec<String> = cmd(&mut admin, &["PUBSUB", "CHANNELS", "*unsub*"]).await;
        if channels.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "subscriptions left behind by cancelled waiters: {channels:?}"
        );
        sleep(Duration::from_millis(50)).await;
    }
    for g in guards {
        g.release().await.expect("release");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_replaced_by_another_type_is_lock_lost_and_a_bad_fence_is_refused() {
    let t = RedisTarget::start();
    let mut admin = t.admin().await;
    let lock = Lock::new(t.client().await, unique("replaced")).expect("valid");
    let guard = lock.try_lock().await.expect("store").expect("free");
    let _: i64 = cmd(&mut admin, &["DEL", lock.keys().lock()]).await;
    let _: i64 = cmd(&mut admin, &["HSET", lock.keys().lock(), "f", "v"]).await;
    let err = guard.release().await.expect_err("not ours");
    assert_eq!(err.kind(), ErrorKind::LockLost, "{err}");

    let lock = Lock::new(t.client().await, unique("negative-fence")).expect("valid");
    let _: () = cmd(&mut admin, &["SET", lock.keys().fence(), "-5"]).await;
    let err = lock.try_lock().await.expect_err("fences would repeat");
    assert_eq!(err.kind(), ErrorKind::Backend, "{err}");
    let exists: i64 = cmd(&mut admin, &["EXISTS", lock.keys().lock()]).await;
    assert_eq!(exists, 0, "the refused grant was given back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_fails_a_grant_that_no_replica_acknowledged() {
    let master = RedisServer::start().expect("master");
    let port = master.port().to_string();
    let mut replica =
        RedisServer::start_with(&["--replicaof", "127.0.0.1", &port]).expect("replica");
    let mut admin = master
        .client()
        .get_multiplexed_async_connection()
        .await
        .expect("admin");
    let linked = async {
        loop {
            let info: String = cmd(&mut admin, &["INFO", "replication"]).await;
            if info.contains("connected_slaves:1") && info.contains("state=online") {
                break;
            }
            sleep(Duration::from_millis(50)).await;
        }
    };
    timeout(Duration::from_secs(20), linked)
        .await
        .expect("the replica links up");
    let redis = Redis::builder(master.url())
        .min_replicas(1)
        .replica_timeout(Duration::from_millis(300))
        .connect()
        .await
        .expect("connect");
    let lock = Lock::builder(redis, unique("wait"))
        .ttl(Duration::from_secs(5))
        .build()
        .expect("valid");
    let guard = lock
        .try_lock()
        .await
        .expect("a replica acknowledges")
        .expect("free");
    let mut on_replica = replica
        .client()
        .get_multiplexed_async_connection()
        .await
        .expect("replica connection");
    let copied: Option<String> = cmd(&mut on_replica, &["GET", lock.keys().lock()]).await;
    assert_eq!(copied.as_deref(), Some(guard.token().as_str()));
    guard.release().await.expect("release");

    replica.freeze().expect("SIGSTOP the replica");
    let err = lock.try_lock().await.expect_err("no replica acknowledges");
    assert_eq!(err.kind(), ErrorKind::NotReplicated, "{err}");
    assert!(
        !lock.is_locked().await.expect("store"),
        "the grant was given back"
    );

    // While one request waits for the frozen replica (WAIT blocks its connection), the
    // client's other requests do not wait behind it: each WAIT has a connection of its own.
    let slow = Redis::builder(master.url())
        .min_replicas(1)
        .replica_timeout(Duration::from_millis(1500))
        .connect()
        .await
        .expect("connect");
    let waiting = Lock::builder(slow.clone(), unique("wait-blocked"))
        .ttl(Duration::from_secs(5))
        .build()
        .expect("valid");
    let pending = tokio::spawn(async move { waiting.try_lock().await.map(|g| g.is_some()) });
    let blocked = async {
        loop {
            let info: String = cmd(&mut admin, &["INFO", "clients"]).await;
            if info.contains("blocked_clients:1") {
                break;
            }
            sleep(Duration::from_millis(5)).await;
        }
    };
    timeout(Duration::from_secs(1), blocked)
        .await
        .expect("the WAIT is under way");
    let inspected = Lock::new(slow, lock.name())
        .expect("valid")
        .state()
        .await
        .expect("an inspection on the same client");
    assert!(inspected.holder.is_none());
    let info: String = cmd(&mut admin, &["INFO", "clients"]).await;
    assert!(
        info.contains("blocked_clients:1"),
        "the inspection returned only after the WAIT ended: it waited behind it"
    );
    let err = pending
        .await
        .expect("task")
        .expect_err("no replica acknowledges");
    assert_eq!(err.kind(), ErrorKind::NotReplicated, "{err}");
    replica.thaw().expect("SIGCONT");
    let guard = timeout(Duration::from_secs(10), async {
        loop {
            if let Ok(Some(g)) = lock.try_lock().await {
                return g;
            }
            sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("grants are acknowledged again once the replica is back");
    guard.release().await.expect("release");
}
