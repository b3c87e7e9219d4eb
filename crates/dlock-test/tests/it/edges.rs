//! Edges of the stores, each found by a user: PostgreSQL's `text` and a NUL in a name,
//! PostgreSQL's waiter rows left by killed clients, a ZooKeeper lock directory deleted
//! under its waiters, and a ZooKeeper holder that crashes.

use std::time::Duration;

use dlock::backend::{PgAdvisory, Postgres};
use dlock::{
    Election, ErrorKind, FairLock, Lock, Owner, ReentrantLock, RwLock, Semaphore,
};
use dlock_test::conformance::unique;
use dlock_test::postgres::PostgresServer;

/// The kind of `result`'s error (`None`: it succeeded).
fn kind_of<T>(result: dlock::Result<T>) -> Option<ErrorKind> {
    result.err().map(|e| e.kind())
}

/// A NUL byte in a name (or a prefix) is `InvalidArgument`, as every other limit on names,
/// for every primitive in lease mode and for advisory mode: PostgreSQL's `text` cannot
/// hold it, and the server's "invalid byte sequence" is not the caller's answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_refuses_a_nul_in_a_name_before_the_store_is_touched() {
    let server = PostgresServer::start().expect("postgres");
    let pg = Postgres::connect(&server.url()).await.expect("connect");
    let bad = format!("{}\0tail", unique("nul"));
    let invalid = Some(ErrorKind::InvalidArgument);

    let lock = Lock::new(pg.clone(), &bad).expect("a name's bytes are the store's to judge");
    assert_eq!(kind_of(lock.try_lock().await), invalid, "lock");
    assert_eq!(kind_of(lock.state().await), invalid, "state");
    assert_eq!(kind_of(lock.force_unlock().await), invalid, "force_unlock");
    let prefixed = Lock::builder(pg.clone(), "plain")
        .prefix("pre\0fix:")
        .build()
        .expect("valid");
    assert_eq!(kind_of(prefixed.try_lock().await), invalid, "prefix");

    let fair = FairLock::new(pg.clone(), &bad).expect("valid");
    assert_eq!(kind_of(fair.try_lock().await), invalid, "fair lock");
    let sem = Semaphore::new(pg.clone(), &bad, 2).expect("valid");
    assert_eq!(kind_of(sem.try_acquire().await), invalid, "semaphore");
    assert_eq!(kind_of(sem.available_permits().await), invalid, "permits");
    let rw = RwLock::new(pg.clone(), &bad).expect("valid");
    assert_eq!(kind_of(rw.try_read().await), invalid, "read lock");
    assert_eq!(kind_of(rw.try_write().await), invalid, "write lock");
    let re = ReentrantLock::new(pg.clone(), &bad).expect("valid");
    let owner = Owner::new("edges").expect("owner");
    assert_eq!(kind_of(re.try_lock(&owner).await), invalid, "reentrant");
    let election = Election::new(pg.clone(), &bad).expect("valid");
    assert_eq!(kind_of(election.try_campaign("v").await), invalid, "campaign");
    assert_eq!(kind_of(election.leader().await), invalid, "leader");

    let advisory = PgAdvisory::connect(&server.url()).await.expect("advisory");
    let lock = Lock::new(advisory, &bad).expect("valid");
    assert_eq!(kind_of(lock.try_lock().await), invalid, "advisory lock");
    assert_eq!(kind_of(lock.state().await), invalid, "advisory state");

    // The same names without the NUL work: the refusal is the NUL's alone.
    let good = bad.replace('\0', "-");
    let guard = Lock::new(pg.clone(), &good)
        .expect("valid")
        .try_lock()
        .await
        .expect("store")
        .expect("free");
    guard.release().await.expect("release");
}
