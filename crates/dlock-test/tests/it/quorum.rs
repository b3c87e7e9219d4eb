//! RedLock (`Quorum`) over five independent redis-servers, each behind a fault proxy.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use dlock_test::conformance::unique;
use dlock_test::proxy::{Fault, Proxy};
use dlock_test::server::RedisServer;
use fencelock::backend::{Quorum, Redis};
use fencelock::raw::{Acquire, RawLock};
use fencelock::{ErrorKind, Lock, NodeErrors, Token};
use tokio::time::{Instant, sleep, timeout};

/// Five servers, each reached through its own proxy.
struct Five {
    servers: Vec<RedisServer>,
    proxies: Vec<Proxy>,
}

impl Five {
    async fn start() -> Five {
        let mut servers = Vec::new();
        let mut proxies = Vec::new();
        for _ in 0..5 {
            let server = RedisServer::start().expect("redis-server");
            let addr = format!("127.0.0.1:{}", server.port())
                .parse()
                .expect("addr");
            proxies.push(Proxy::start(addr).await.expect("proxy"));
            servers.push(server);
        }
        Five { servers, proxies }
    }

    /// A client of the five nodes (as one process would have), through the proxies.
    async fn quorum(&self, fraction: f64) -> Quorum<Redis> {
        self.quorum_with(fraction, Duration::from_millis(400)).await
    }

    async fn quorum_with(&self, fraction: f64, response: Duration) -> Quorum<Redis> {
        let mut nodes = Vec::new();
        for p in &self.proxies {
            nodes.push(
                Redis::builder(format!("redis://{}/", p.addr()))
                    .response_timeout(response)
                    .connect()
                    .await
                    .expect("connect through the proxy"),
            );
        }
        Quorum::builder(nodes)
            .node_timeout_fraction(fraction)
            .build()
            .expect("valid")
    }

    fn faults(&self, mask: u32, fault: Fault) {
        for (i, p) in self.proxies.iter().enumerate() {
            p.set_fault(if mask & (1 << i) != 0 {
                fault
            } else {
                Fault::Pass
            });
        }
    }

    /// What each node's key holds, read directly (not through the proxies).
    async fn values(&self, key: &str) -> Vec<Option<String>> {
        let mut out = Vec::new();
        for s in &self.servers {
            let mut c = s
                .client()
                .get_multiplexed_async_connection()
                .await
                .expect("admin");
            out.push(
                redis::cmd("GET")
                    .arg(key)
                    .query_async(&mut c)
                    .await
                    .expect("GET"),
            );
        }
        out
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quorum_acquires_iff_a_majority_of_nodes_is_reachable() {
    let five = Five::start().await;
    let q = five.quorum(0.1).await;
    let ttl = Duration::from_secs(2);
    for mask in 0u32..32 {
        let down = mask.count_ones() as usize;
        let keys = fencelock::keys::LockKeys::new("dlock:", &unique("subset")).expect("keys");
        let token = Token::random().expect("rng");
        five.faults(mask, Fault::Blackhole);
        let outcome = q.acquire(&keys, &token, ttl).await;
        let reachable: Vec<usize> = (0..5).filter(|i| mask & (1 << i) == 0).collect();
        let values = five.values(keys.lock()).await;
        let ours = reachable
            .iter()
            .filter(|&&i| values[i].as_deref() == Some(token.as_str()))
            .count();
        if 5 - down >= 3 {
            assert!(
                matches!(outcome, Ok(Acquire::Acquired { .. })),
                "mask {mask:05b}: {} reachable, got {outcome:?}",
                5 - down
            );
            assert_eq!(
                ours,
                reachable.len(),
                "mask {mask:05b}: every reachable node holds it"
            );
            assert!(q.release(&keys, &token).await.expect("majority released"));
        } else {
            let err = outcome.expect_err("a minority cannot grant");
            assert!(err.is_retryable(), "{err}");
            // Not one node's failure: the quorum's, with each silent node's own error.
            assert_eq!(err.kind(), ErrorKind::QuorumNotReached, "{err}");
            let nodes = std::error::Error::source(&err)
                .and_then(|s| s.downcast_ref::<NodeErrors>())
                .expect("per-node errors behind source()");
            assert_eq!(nodes.nodes(), 5);
            let failed: Vec<usize> = nodes.iter().map(|(i, _, _)| i).collect();
            let silent: Vec<usize> = (0..5).filter(|i| mask & (1 << i) != 0).collect();
            assert_eq!(failed, silent, "mask {mask:05b}: {nodes}");
            for (_, store, e) in nodes.iter() {
                assert_eq!(e.kind(), ErrorKind::TimedOut, "{e}");
                assert!(store.starts_with("redis:127.0.0.1:"), "{store}");
            }
            assert_eq!(ours, 0, "mask {mask:05b}: a reachable node kept our token");
        }
        five.faults(0, Fault::Pass);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quorum_subtracts_a_slow_majority_from_the_validity_and_gives_grants_back() {
    let five = Five::start().await;
    // Every node may take the whole ttl, and 40 % of it is set aside for drift; three
    // nodes answer after about 700 ms of a 1 s lease: the majority comes in with no
    // validity left.
    let q = Quorum::builder(
        five.quorum_with(1.0, Duration::from_secs(2))
            .await
            .nodes()
            .to_vec(),
    )
    .node_timeout_fraction(1.0)
    .drift(0.4, Duration::ZERO)
    .build()
    .expect("valid");
    let ttl = Duration::from_millis(1000);
    let keys = fencelock::keys::LockKeys::new("dlock:", &unique("slow")).expect("keys");
    let token = Token::random().expect("rng");
    five.faults(0b00111, Fault::Delay(Duration::from_millis(350)));
    let started = Instant::now();
    let outcome = q.acquire(&keys, &token, ttl).await.expect("answered");
    assert!(
        matches!(outcome, Acquire::Held { .. }),
        "granted after {:?} of a {ttl:?} lease: {outcome:?}",
        started.elapsed()
    );
    five.faults(0, Fault::Pass);
    sleep(Duration::from_millis(1000)).await; // delayed releases land
    let values = five.values(keys.lock()).await;
    assert!(
        values.iter().all(|v| v.as_deref() != Some(token.as_str())),
        "a node kept the token of a failed acquire: {values:?}"
    );

    // Two slow nodes out of five: they count as noes, the fast majority grants.
    let q = five.quorum(0.1).await;
    five.faults(0b11000, Fault::Delay(Duration::from_millis(500)));
    let lock = Lock::builder(q, unique("slow-minority"))
        .ttl(Duration::from_secs(2))
        .build()
        .expect("valid");
    let guard = lock
        .try_lock()
        .await
        .expect("store")
        .expect("a fast majority grants");
    assert!(guard.remaining() > Duration::from_millis(1500));
    five.faults(0, Fault::Pass);
    guard.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contenders_of_a_quorum_exclude_each_other_and_split_votes_resolve() {
    let five = Five::start().await;
    let name = unique("contend");
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let entries = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let lock = Lock::builder(five.quorum(0.1).await, &name)
            .ttl(Duration::from_secs(2))
            .build()
            .expect("valid");
        let (inside, most, entries) =
            (Arc::clone(&inside), Arc::clone(&most), Arc::clone(&entries));
        tasks.push(tokio::spawn(async move {
            for _ in 0..5 {
                // Everyone starts together: votes split, partial grants are given back.
                let g = lock.lock().await.expect("lock");
                let n = inside.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(n, Ordering::SeqCst);
                entries.fetch_add(1, Ordering::SeqCst);
                sleep(Duration::from_millis(5)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                g.release().await.expect("release");
            }
        }));
    }
    for t in tasks {
        timeout(Duration::from_secs(60), t)
            .await
            .expect("contenders made no progress")
            .expect("task");
    }
    assert_eq!(most.load(Ordering::SeqCst), 1, "two holders at once");
    assert_eq!(entries.load(Ordering::SeqCst), 20);
    let values = five.values(&format!("dlock:{name}")).await;
    assert!(
        values.iter().all(Option::is_none),
        "left behind: {values:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quorum_lease_is_lost_when_a_majority_stops_answering() {
    let mut five = Five::start().await;
    let lock = Lock::builder(five.quorum(0.1).await, unique("lost"))
        .ttl(Duration::from_millis(900))
        .build()
        .expect("valid");
    // Two frozen nodes: the majority still renews.
    five.servers[0].freeze().expect("SIGSTOP");
    five.servers[1].freeze().expect("SIGSTOP");
    let guard = lock.lock().await.expect("three of five grant");
    sleep(Duration::from_millis(1500)).await;
    assert!(!guard.is_lost(), "renewed by three of five");
    // A third node goes silent: no majority renews, the lease runs out.
    five.faults(0b00100, Fault::Blackhole);
    timeout(Duration::from_secs(3), guard.lost())
        .await
        .expect("lost() fires once no majority renews");
    five.servers[0].thaw().expect("SIGCONT");
    five.servers[1].thaw().expect("SIGCONT");
    five.faults(0, Fault::Pass);
    let err = guard.release().await.expect_err("the lease lapsed");
    assert_eq!(err.kind(), fencelock::ErrorKind::LockLost);
}

/// Each node gets only what RedLock needs: one `SET NX PX` to acquire and one
/// compare-and-delete to release; no fence counter, no waiter queue, no announcement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_get_only_what_redlock_needs() {
    let servers: Vec<RedisServer> = (0..3)
        .map(|_| RedisServer::start().expect("redis-server"))
        .collect();
    let mut nodes = Vec::new();
    let mut admins = Vec::new();
    for s in &servers {
        let url = format!("redis://127.0.0.1:{}/", s.port());
        nodes.push(Redis::connect(&url).await.expect("connect"));
        let client = redis::Client::open(url).expect("url");
        let mut admin = client
            .get_multiplexed_async_connection()
            .await
            .expect("admin");
        let _: () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query_async(&mut admin)
            .await
            .expect("resetstat");
        admins.push(admin);
    }
    let lock = Lock::builder(Quorum::new(nodes).expect("quorum"), unique("lean"))
        .watchdog(false)
        .build()
        .expect("valid");
    let guard = lock.try_lock().await.expect("store").expect("free");
    guard.release().await.expect("release");
    for admin in &mut admins {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(admin)
            .await
            .expect("info");
        let mut calls: Vec<(String, u64)> = info
            .lines()
            .filter_map(|l| l.strip_prefix("cmdstat_"))
            .filter_map(|l| {
                let (name, rest) = l.split_once(":calls=")?;
                Some((name.to_owned(), rest.split(',').next()?.parse().ok()?))
            })
            .filter(|(name, _)| !matches!(name.as_str(), "info" | "config|resetstat"))
            .collect();
        calls.sort();
        assert_eq!(
            calls,
            vec![
                ("del".to_owned(), 1),
                ("evalsha".to_owned(), 1),
                ("get".to_owned(), 1),
                ("set".to_owned(), 1),
            ],
            "a node saw more than SET NX PX and a compare-and-delete"
        );
    }
}
