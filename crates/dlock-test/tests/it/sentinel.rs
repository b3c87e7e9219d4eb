//! The Redis backend behind Sentinel: master + replica + 3 sentinels; the master dies.

use std::time::Duration;

use dlock_test::conformance::unique;
use dlock_test::server::{RedisServer, SentinelServer};
use fencelock::backend::Redis;
use fencelock::{Election, Lock};
use tokio::time::{Instant, sleep, timeout};

async fn info(client: &redis::Client, section: &str) -> String {
    let mut c = client
        .get_multiplexed_async_connection()
        .await
        .expect("connection");
    redis::cmd("INFO")
        .arg(section)
        .query_async(&mut c)
        .await
        .expect("INFO")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_follow_a_sentinel_failover() {
    let mut master = RedisServer::start().expect("master");
    let port = master.port().to_string();
    let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &port]).expect("replica");
    timeout(Duration::from_secs(20), async {
        while !info(&master.client(), "replication")
            .await
            .contains("state=online")
        {
            sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the replica links up");
    let name = "dlockmaster";
    let sentinels: Vec<SentinelServer> = (0..3)
        .map(|_| SentinelServer::start(master.port(), name, 2).expect("sentinel"))
        .collect();
    // Every sentinel knows the replica and the other two sentinels.
    timeout(Duration::from_secs(30), async {
        loop {
            let mut ready = 0;
            for s in &sentinels {
                let text = info(&s.client(), "sentinel").await;
                if text.contains("slaves=1") && text.contains("sentinels=3") {
                    ready += 1;
                }
            }
            if ready == 3 {
                break;
            }
            sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("the sentinels discover the replica and each other");

    let url = format!(
        "redis+sentinel://{}/{name}",
        sentinels
            .iter()
            .map(SentinelServer::addr)
            .collect::<Vec<_>>()
            .join(",")
    );
    let ttl = Duration::from_secs(20);
    let holder = Redis::connect(&url).await.expect("connect via sentinel");
    let waiter = Redis::connect(&url).await.expect("connect via sentinel");
    let lock_name = unique("failover");
    let lock = Lock::builder(holder.clone(), &lock_name)
        .ttl(ttl)
        .build()
        .expect("valid");
    let guard = lock.lock().await.expect("lock");
    let waiting = {
        let lock = Lock::builder(waiter, &lock_name)
            .ttl(ttl)
            .build()
            .expect("valid");
        tokio::spawn(async move {
            let g = lock.lock().await.expect("lock");
            (Instant::now(), g)
        })
    };
    sleep(Duration::from_millis(300)).await; // the waiter is subscribed
    // The grant reached the replica before the master dies.
    let mut m = master
        .client()
        .get_multiplexed_async_connection()
        .await
        .expect("master");
    let acked: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(2000)
        .query_async(&mut m)
        .await
        .expect("WAIT");
    assert_eq!(acked, 1);

    master.kill();
    let killed = Instant::now();
    let probe = Lock::builder(holder, unique("probe"))
        .ttl(Duration::from_secs(5))
        .build()
        .expect("valid");
    let usable = timeout(Duration::from_secs(60), async {
        loop {
            if let Ok(Some(g)) = probe.try_lock().await {
                let _ = g.release().await;
                return killed.elapsed();
            }
            sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("locks work again after the failover");
    println!("locks usable again {usable:?} after the master was killed");
    assert!(
        info(&replica.client(), "replication")
            .await
            .contains("role:master"),
        "the replica was promoted"
    );

    // The holder's lease survived on the promoted replica; its release is announced
    // there, and the waiter — resubscribed on the new master — wakes at once (its
    // fallback would be the 20 s ttl).
    let released = Instant::now();
    guard
        .release()
        .await
        .expect("the lease survived the failover");
    let (got, g) = timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiter wakes")
        .expect("task");
    let woke = got.duration_since(released);
    println!("the waiter acquired {woke:?} after the release on the new master");
    assert!(
        woke < Duration::from_secs(5),
        "woke by timer, not by pub/sub: {woke:?}"
    );
    g.release().await.expect("release");

    // A failover cuts every pub/sub connection. A release announced while the waiter's
    // subscription is down is not lost for good: when its subscription is back, every
    // waiter of the client tries again (long before the 20 s fallback timer).
    let guard = lock.lock().await.expect("lock again on the new master");
    let waiter = Redis::connect(&url).await.expect("connect via sentinel");
    let waiting = {
        let lock = Lock::builder(waiter, &lock_name)
            .ttl(ttl)
            .build()
            .expect("valid");
        tokio::spawn(async move { lock.lock().await.expect("lock") })
    };
    timeout(Duration::from_secs(10), async {
        while lock.state().await.expect("store").queued != Some(1) {
            sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the waiter queues on the new master");
    let mut new_master = replica
        .client()
        .get_multiplexed_async_connection()
        .await
        .expect("new master");
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(&mut new_master)
        .await
        .expect("CLIENT KILL");
    assert!(killed >= 1, "the waiter's subscription was cut");
    guard.release().await.expect("release");
    // Its fallback timer is the holder's 20 s ttl: within 10 s means it was woken.
    let g = timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiter wakes although its announcement may have been lost")
        .expect("task");
    g.release().await.expect("release");
}

/// An election over clients configured by sentinel: a candidate leads, `leader()` on
/// another client reports it, its resign hands over to the queued candidate at once (long
/// before the 20 s lease), and an observer hears both leaders through the master found by
/// the sentinel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_election_over_sentinel_hands_over_on_resign() {
    let master = RedisServer::start().expect("master");
    let name = "dlockelect";
    let sentinel = SentinelServer::start(master.port(), name, 1).expect("sentinel");
    let url = format!("redis+sentinel://{}/{name}", sentinel.addr());
    let ttl = Duration::from_secs(20);
    let election_name = unique("sentinel-elect");
    let mut candidates = Vec::new();
    for _ in 0..3 {
        let client = Redis::connect(&url).await.expect("connect via sentinel");
        candidates.push(
            Election::builder(client, &election_name)
                .ttl(ttl)
                .build()
                .expect("valid"),
        );
    }
    let watcher = candidates.pop().expect("three");
    let b = candidates.pop().expect("two");
    let a = candidates.pop().expect("one");
    assert_eq!(watcher.leader().await.expect("read"), None);
    let mut observer = watcher.observe();

    let first = a.campaign("host-a:8080").await.expect("campaign");
    let seen = watcher.leader().await.expect("read").expect("a leader");
    assert_eq!(seen.term, first.term());
    assert_eq!(seen.value.as_deref(), Some("host-a:8080"));
    let change = timeout(Duration::from_secs(10), observer.next())
        .await
        .expect("the observer sees the first leader")
        .expect("observe");
    let change = change.leader().expect("a leader");
    assert_eq!(
        (change.term, change.value.as_deref()),
        (first.term(), Some("host-a:8080"))
    );
    assert!(
        b.try_campaign("host-b:8080").await.expect("try").is_none(),
        "a second leader while the first leads"
    );

    let waiting = tokio::spawn(async move { b.campaign("host-b:8080").await.expect("campaign") });
    sleep(Duration::from_millis(300)).await; // b queues
    let first_term = first.term();
    first.resign().await.expect("resign");
    // Half the lease: only the resign's hand-over can be that quick (the bound tells the
    // mechanism apart; no speed is measured).
    let second = timeout(ttl / 2, waiting)
        .await
        .expect("the standby leads long before the resigned lease could run out")
        .expect("task");
    assert!(second.term() > first_term);
    let seen = watcher.leader().await.expect("read").expect("a leader");
    assert_eq!(
        (seen.term, seen.value.as_deref()),
        (second.term(), Some("host-b:8080"))
    );
    let change = timeout(Duration::from_secs(10), observer.next())
        .await
        .expect("the observer sees the hand-over")
        .expect("observe");
    let change = change.leader().expect("a leader");
    assert_eq!(
        (change.term, change.value.as_deref()),
        (second.term(), Some("host-b:8080"))
    );
    second.resign().await.expect("resign");
    assert_eq!(watcher.leader().await.expect("read"), None);
}
