//! The etcd backend against the lock conformance suite, plus leader loss and leases
//! that run out while waiting.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock::backend::Etcd;
use dlock::{ErrorKind, Lock};
use dlock_test::conformance::unique;
use dlock_test::server::EtcdCluster;
use tokio::time::{Instant, sleep, timeout};

mod conformance {
    crate::lock_conformance_tests!(dlock_test::targets::EtcdTarget::start());
    crate::conformance_tests!(dlock_test::targets::EtcdTarget::start();
        waiter_wakes_on_release,
        inspection_and_administration,
    );
    crate::family_tests!(dlock_test::targets::EtcdTarget::start();
        multi_locks_on_overlapping_sets_do_not_deadlock,
    );
}

async fn connect(url: &str) -> Etcd {
    let mut last = None;
    for _ in 0..100 {
        match Etcd::connect(url).await {
            Ok(c) => return c,
            Err(e) => last = Some(e),
        }
        sleep(Duration::from_millis(100)).await;
    }
    panic!("connect to etcd: {last:?}");
}

/// The index of the member that leads now.
async fn leader(cluster: &EtcdCluster) -> usize {
    for _ in 0..100 {
        for (i, m) in cluster.members.iter().enumerate() {
            if !m.is_running() {
                continue;
            }
            let Ok(mut c) =
                etcd_client::Client::connect([format!("http://{}", m.addr())], None).await
            else {
                continue;
            };
            if let Ok(status) = c.status().await
                && let Some(header) = status.header()
                && status.leader() == header.member_id()
            {
                return i;
            }
        }
        sleep(Duration::from_millis(100)).await;
    }
    panic!("no leader");
}

#[derive(Debug, Clone, Copy)]
struct Hold {
    from: Instant,
    to: Instant,
    fence: u64,
    valid: bool,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_leader_grants_no_lock_twice_and_locks_work_after_the_election() {
    let mut cluster = EtcdCluster::start(3).expect("3 etcd members");
    let url = cluster.url();
    let name = unique("leader-kill");
    let holds: Arc<Mutex<Vec<Hold>>> = Arc::default();
    let stop = Instant::now() + Duration::from_secs(10);
    let mut workers = Vec::new();
    for _ in 0..3 {
        let lock = Lock::builder(connect(&url).await, &name)
            .ttl(Duration::from_secs(3))
            .build()
            .expect("valid");
        let holds = Arc::clone(&holds);
        workers.push(tokio::spawn(async move {
            while Instant::now() < stop {
                let guard = match lock.try_lock_for(Duration::from_millis(500)).await {
                    Ok(Some(g)) => g,
                    Ok(None) => continue,
                    Err(_) => {
                        sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let from = Instant::now();
                let fence = guard.fencing_token().get();
                sleep(Duration::from_millis(20)).await;
                let to = Instant::now();
                let valid = guard.release().await.is_ok();
                holds.lock().expect("holds").push(Hold {
                    from,
                    to,
                    fence,
                    valid,
                });
            }
        }));
    }
    sleep(Duration::from_secs(2)).await;
    let victim = leader(&cluster).await;
    cluster.members[victim].kill();
    let killed = Instant::now();
    for w in workers {
        w.await.expect("worker");
    }
    let holds = holds.lock().expect("holds").clone();
    let valid: Vec<&Hold> = holds.iter().filter(|h| h.valid).collect();
    for (i, a) in valid.iter().enumerate() {
        for b in &valid[i + 1..] {
            assert!(
                a.to <= b.from || b.to <= a.from,
                "two holds reported valid overlapped: {a:?} {b:?}"
            );
        }
    }
    let mut fences: Vec<u64> = holds.iter().map(|h| h.fence).collect();
    let n = fences.len();
    fences.sort_unstable();
    fences.dedup();
    assert_eq!(fences.len(), n, "a fence was granted twice");
    let after: Vec<&&Hold> = valid.iter().filter(|h| h.from > killed).collect();
    println!(
        "{} holds, {} valid; first grant after the leader was killed: {:?} later",
        holds.len(),
        valid.len(),
        after.iter().map(|h| h.from - killed).min()
    );
    assert!(!after.is_empty(), "no lock after the election");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_wait_outlasts_its_ttl_is_never_told_it_holds_the_lock() {
    // etcd issue 11456: a waiter whose session lease expired while queued was told it
    // held the lock. Here waiters hold no lease while waiting; a grant is a fresh lease.
    let cluster = EtcdCluster::start(1).expect("etcd");
    let url = cluster.url();
    let name = unique("wait-expired");
    let holder = Lock::builder(connect(&url).await, &name)
        .ttl(Duration::from_secs(2))
        .build()
        .expect("valid");
    let guard = holder.lock().await.expect("lock");
    let waiter = Lock::builder(connect(&url).await, &name)
        .ttl(Duration::from_secs(2))
        .build()
        .expect("valid");
    let waiting = tokio::spawn(async move { waiter.lock().await.map(|g| (Instant::now(), g)) });
    sleep(Duration::from_secs(5)).await; // more than twice the waiter's ttl
    assert!(!waiting.is_finished(), "granted while held");
    let released = Instant::now();
    guard.release().await.expect("release");
    let (at, g) = timeout(Duration::from_secs(3), waiting)
        .await
        .expect("the waiter wakes on the deletion (watch)")
        .expect("task")
        .expect("lock");
    assert!(at >= released);
    // The grant is a live lease of the full ttl, not one that ran out while waiting.
    assert!(
        g.remaining() > Duration::from_millis(900),
        "{:?}",
        g.remaining()
    );
    let state = holder.state().await.expect("store");
    assert_eq!(state.holder.as_deref(), Some(g.token().as_str()));
    assert!(
        state.remaining.is_some_and(|r| r >= Duration::from_secs(1)),
        "{state:?}"
    );
    sleep(Duration::from_secs(3)).await; // past the ttl: the watchdog kept it
    assert!(!g.is_lost());
    g.release().await.expect("still ours");
    let err = Etcd::connect("etcd://").await.expect_err("no endpoint");
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
}
