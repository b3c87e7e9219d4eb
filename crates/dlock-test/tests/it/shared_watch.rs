//! A client's observers of one election share one store watch (etcd and ZooKeeper open
//! one watch per election and client, not one per observer), and each of them still sees
//! every change; the watch closes with the last of them.

use std::time::Duration;

use dlock_test::conformance::{Target, unique};
use fencelock::raw::RawElection;
use fencelock::{Election, LeaderChange};
use tokio::time::timeout;

/// The observer's next report, within 10 s.
async fn next<B: RawElection>(observer: &mut fencelock::Observer<B>, what: &str) -> LeaderChange {
    timeout(Duration::from_secs(10), observer.next())
        .await
        .unwrap_or_else(|_| panic!("not reported in time: {what}"))
        .expect("observe")
}

/// Three observers of one election on one client (and one on another client), counted
/// by `open`: the client's open store watches.
async fn observers_of_one_election_share_one_watch<T: Target>(
    target: &T,
    open: impl Fn(&T::Backend) -> usize,
) where
    T::Backend: RawElection,
{
    let name = unique("shared-watch");
    let client = target.client().await;
    let election = Election::builder(client.clone(), &name)
        .ttl(Duration::from_secs(10))
        .build()
        .expect("valid election");
    assert_eq!(open(&client), 0, "no watch before anyone observes");
    let mut observers = vec![election.observe(), election.observe(), election.observe()];
    for (i, observer) in observers.iter_mut().enumerate() {
        let first = next(observer, "the empty seat").await;
        assert!(
            matches!(first, LeaderChange::Vacant(_)),
            "observer {i}: nobody leads yet: {first:?}"
        );
    }
    assert_eq!(
        open(&client),
        1,
        "three observers of one election on one client: one store watch"
    );
    // A leader elected through another client: every observer hears of it.
    let candidate = Election::builder(target.client().await, &name)
        .ttl(Duration::from_secs(10))
        .build()
        .expect("valid election");
    let waiting: Vec<_> = observers
        .into_iter()
        .map(|mut observer| {
            tokio::spawn(async move {
                let change = next(&mut observer, "the new leader").await;
                (observer, change)
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let leadership = candidate.campaign("host-a").await.expect("campaign");
    let mut observers = Vec::new();
    for task in waiting {
        let (observer, change) = task.await.expect("observer task");
        match change {
            LeaderChange::Leader(leader) => assert_eq!(leader.value.as_deref(), Some("host-a")),
            other => panic!("the new leader was not reported: {other:?}"),
        }
        observers.push(observer);
    }
    assert_eq!(open(&client), 1, "still one watch");
    drop(observers);
    assert_eq!(open(&client), 0, "the watch goes with the last observer");
    leadership.resign().await.expect("resign");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_observers_of_one_election_share_one_watch() {
    let target = dlock_test::targets::ZooKeeperTarget::start();
    observers_of_one_election_share_one_watch(&target, |zk| zk.records_watched()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_observers_of_one_election_share_one_watch() {
    let target = dlock_test::targets::EtcdTarget::start();
    observers_of_one_election_share_one_watch(&target, |etcd| etcd.watches_open()).await;
}
