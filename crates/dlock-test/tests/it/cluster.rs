//! The Redis backend on a Redis Cluster: the whole conformance suite, plus a failover.

mod conformance {
    crate::all_conformance_tests!(dlock_test::targets::ClusterTarget::start());
}

mod election {
    crate::election_tests!(dlock_test::targets::ClusterTarget::start());
}

use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock_test::cluster::RedisCluster;
use dlock_test::conformance::unique;
use fencelock::backend::Redis;
use fencelock::{ErrorKind, Lock};
use tokio::time::{Instant, sleep};

/// One hold as its worker saw it: from the grant to the start of the release, and
/// whether the release said the lock had been ours all along.
#[derive(Debug, Clone, Copy)]
struct Hold {
    from: Instant,
    to: Instant,
    valid: bool,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_failover_leaves_no_lock_double_held_that_was_reported_valid() {
    let mut cluster = RedisCluster::start(3, 1).expect("3 masters, 1 replica each");
    let name = unique("failover");
    let key = format!("dlock:{name}");
    let victim = cluster.master_of(&key).expect("the key's master");
    let holds: Arc<Mutex<Vec<Hold>>> = Arc::default();
    let stop = Instant::now() + Duration::from_secs(10);
    let mut workers = Vec::new();
    for _ in 0..4 {
        let client = Redis::connect(cluster.url()).await.expect("connect");
        let lock = Lock::builder(client, &name)
            .ttl(Duration::from_secs(2))
            .build()
            .expect("valid");
        let holds = Arc::clone(&holds);
        workers.push(tokio::spawn(async move {
            let mut errors = 0u32;
            while Instant::now() < stop {
                let guard = match lock.try_lock_for(Duration::from_millis(500)).await {
                    Ok(Some(g)) => g,
                    Ok(None) => continue,
                    Err(_) => {
                        // The slot's master is down until its replica takes over.
                        errors += 1;
                        sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let from = Instant::now();
                sleep(Duration::from_millis(30)).await;
                let to = Instant::now();
                let valid = match guard.release().await {
                    Ok(()) => true,
                    Err(e) => {
                        assert!(
                            matches!(
                                e.kind(),
                                ErrorKind::LockLost | ErrorKind::Unavailable | ErrorKind::TimedOut
                            ),
                            "{e}"
                        );
                        false
                    }
                };
                holds.lock().expect("holds").push(Hold { from, to, valid });
            }
            errors
        }));
    }
    sleep(Duration::from_secs(2)).await;
    let killed = Instant::now();
    cluster.nodes[victim].kill();
    let mut errors = 0;
    for w in workers {
        errors += w.await.expect("worker");
    }
    let promoted = cluster.master_of(&key).expect("a master again");
    assert_ne!(promoted, victim, "the replica took over");
    let holds = holds.lock().expect("holds").clone();
    let valid: Vec<&Hold> = holds.iter().filter(|h| h.valid).collect();
    for (i, a) in valid.iter().enumerate() {
        for b in &valid[i + 1..] {
            assert!(
                a.to <= b.from || b.to <= a.from,
                "two holds reported valid overlapped: {a:?} and {b:?}"
            );
        }
    }
    let after = valid.iter().filter(|h| h.from > killed).count();
    println!(
        "{} holds ({} valid), {errors} errors while the master was down, {after} valid holds after the kill",
        holds.len(),
        valid.len()
    );
    assert!(after > 0, "no lock was granted after the failover");
    assert!(
        valid.iter().any(|h| h.to < killed),
        "no lock was granted before the failover"
    );
}
