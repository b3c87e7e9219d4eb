//! `Election::observe` reports an empty seat on every store with elections: before anyone
//! led, when the leader resigns (at once, with the moment it resigned), when the guard of
//! a leadership is released, and when a leader goes without resigning (at the observer's
//! next read).

use std::future::Future;
use std::time::{Duration, SystemTime};

use dlock_test::conformance::{Target, unique};
use fencelock::raw::RawElection;
use fencelock::{Election, LeaderChange, Vacancy};
use tokio::time::timeout;

/// An election on a new client of `target`.
async fn election<T: Target>(target: &T, name: &str, ttl: Duration) -> Election<T::Backend>
where
    T::Backend: RawElection,
{
    Election::builder(target.client().await, name)
        .ttl(ttl)
        .build()
        .expect("valid election")
}

/// The observer's next report, within `within`.
async fn next<B: RawElection>(
    observer: &mut fencelock::Observer<B>,
    within: Duration,
    what: &str,
) -> LeaderChange {
    timeout(within, observer.next())
        .await
        .unwrap_or_else(|_| panic!("not reported within {within:?}: {what}"))
        .expect("observe")
}

/// The vacancy reported next (a leader reported instead fails the test).
async fn vacancy<B: RawElection>(
    observer: &mut fencelock::Observer<B>,
    within: Duration,
    what: &str,
) -> Vacancy {
    match next(observer, within, what).await {
        LeaderChange::Vacant(vacancy) => vacancy,
        LeaderChange::Leader(leader) => panic!("{what}: a leader was reported: {leader:?}"),
    }
}

/// Runs `end` while `observer` sleeps, waiting for the next change: the report that
/// follows must come from the store's announcement (or the observer's fallback read).
async fn while_asleep<B: RawElection, F: Future<Output = ()>>(
    observer: fencelock::Observer<B>,
    end: F,
) -> (fencelock::Observer<B>, LeaderChange) {
    let mut observer = observer;
    let waiting = tokio::spawn(async move {
        let change = observer.next().await.expect("observe");
        (observer, change)
    });
    // Time to read and fall asleep (nothing to report: it must wait for a change).
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !waiting.is_finished(),
        "reported a change that did not happen"
    );
    end.await;
    timeout(Duration::from_secs(10), waiting)
        .await
        .expect("woken by the announcement, long before its fallback read")
        .expect("observer task")
}

/// `since` is the resignation's moment: between `before` and `after` (to the
/// millisecond the record keeps).
fn assert_since(vacancy: &Vacancy, before: SystemTime, after: SystemTime) {
    let since = vacancy.since.expect("a resignation says since when");
    assert!(
        since + Duration::from_millis(1) >= before && since <= after,
        "since {since:?}, resigned between {before:?} and {after:?}"
    );
}

/// Every way the seat empties is reported once, with the term that ended.
async fn observe_reports_vacancies<T: Target>(target: &T)
where
    T::Backend: RawElection,
{
    let name = unique("vacancy");
    // A lease far longer than the bound below: only the resignation's announcement can
    // wake the observer in time (its fallback read comes a lease later).
    let ttl = target.ttl(Duration::from_secs(60));
    let quick = Duration::from_secs(10);
    let watcher = election(target, &name, ttl).await;
    let candidate = election(target, &name, ttl).await;
    let mut observer = watcher.observe();

    // Nobody ever led: the first report says so.
    let never = vacancy(&mut observer, quick, "the empty seat at the start").await;
    assert_eq!((never.last_term, never.since), (None, None));

    // A leader, then its resignation: reported at once, with the term and the moment.
    let first = candidate.campaign("host-a:1").await.expect("campaign");
    let term = first.term();
    match next(&mut observer, quick, "the first leader").await {
        LeaderChange::Leader(l) => {
            assert_eq!((l.term, l.value.as_deref()), (term, Some("host-a:1")))
        }
        other => panic!("expected the leader, got {other:?}"),
    }
    let before = SystemTime::now();
    let (back, change) = while_asleep(observer, async {
        first.resign().await.expect("resign");
    })
    .await;
    observer = back;
    let after = SystemTime::now();
    let LeaderChange::Vacant(resigned) = change else {
        panic!("expected the vacancy, got {change:?}");
    };
    assert_eq!(resigned.last_term, Some(term));
    assert_since(&resigned, before, after);
    assert_eq!(watcher.leader().await.expect("read"), None, "nobody leads");
    // Reported once: nothing more while the seat stays empty.
    assert!(
        timeout(Duration::from_millis(500), observer.next())
            .await
            .is_err(),
        "a vacancy was reported twice"
    );

    // The guard of a leadership (what `dlock elect` supervises), released: the same.
    let second = candidate.campaign("host-a:2").await.expect("campaign");
    let term = second.term();
    match next(&mut observer, quick, "the second leader").await {
        LeaderChange::Leader(l) => {
            assert_eq!((l.term, l.value.as_deref()), (term, Some("host-a:2")))
        }
        other => panic!("expected the leader, got {other:?}"),
    }
    let before = SystemTime::now();
    let (_, change) = while_asleep(observer, async {
        second.into_guard().release().await.expect("release");
    })
    .await;
    let after = SystemTime::now();
    let LeaderChange::Vacant(released) = change else {
        panic!("expected the vacancy, got {change:?}");
    };
    assert_eq!(released.last_term, Some(term));
    assert_since(&released, before, after);

    // A late observer starts from the empty seat, and knows the term that ended.
    let mut late = watcher.observe();
    let seen = vacancy(&mut late, quick, "a late observer's first report").await;
    assert_eq!(seen.last_term, Some(term));
}

/// A leader that goes without resigning (its leadership dropped: released in the
/// background, unannounced) is reported gone at the observer's next read, a lease later
/// at the latest; nobody says since when.
async fn a_leader_gone_without_resigning_is_reported<T: Target>(target: &T)
where
    T::Backend: RawElection,
{
    let name = unique("vacancy-gone");
    let ttl = target.ttl(Duration::from_secs(1));
    let watcher = election(target, &name, ttl).await;
    let candidate = election(target, &name, ttl).await;
    let leadership = candidate.campaign("host-b").await.expect("campaign");
    let term = leadership.term();
    let mut observer = watcher.observe();
    match next(&mut observer, Duration::from_secs(10), "the leader").await {
        LeaderChange::Leader(l) => assert_eq!(l.term, term),
        other => panic!("expected the leader, got {other:?}"),
    }
    drop(leadership);
    let gone = vacancy(&mut observer, Duration::from_secs(20), "the dropped leader").await;
    assert_eq!(gone.last_term, Some(term));
    assert_eq!(gone.since, None, "no resignation was announced");
}

macro_rules! vacancy_tests {
    ($($store:ident => $target:expr),* $(,)?) => {
        $(
            mod $store {
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn observe_reports_vacancies() {
                    super::observe_reports_vacancies(&$target).await;
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn a_leader_gone_without_resigning_is_reported() {
                    super::a_leader_gone_without_resigning_is_reported(&$target).await;
                }
            }
        )*
    };
}

vacancy_tests!(
    memory => dlock_test::targets::MemoryTarget::default(),
    redis => dlock_test::targets::RedisTarget::start(),
    postgres => dlock_test::targets::PostgresTarget::start(),
    zookeeper => dlock_test::targets::ZooKeeperTarget::start(),
    etcd => dlock_test::targets::EtcdTarget::start(),
    memcached => dlock_test::targets::MemcachedTarget::start(),
);
