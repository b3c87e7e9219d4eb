//! Issue 25, part 4, store by store: what the conformance behaviour
//! `semaphore_other_count_is_refused` cannot see.

use dlock_test::conformance::{Target, unique};
use dlock_test::targets::PostgresTarget;
use fencelock::Semaphore;

/// A schema made by the release before the permit-count check (no
/// `sem_acquire_checked`) is completed by the next client that connects, whose
/// semaphores then work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_schema_without_the_permit_check_is_completed_on_connect() {
    let t = PostgresTarget::start();
    let _first = t.client().await;
    let admin = t.server.admin().await;
    admin
        .batch_execute(
            "DROP FUNCTION dlock.sem_acquire_checked(text, text, int, int, boolean, bigint,
                                                     boolean, text, bigint, bigint);",
        )
        .await
        .expect("the previous release's schema");
    let sem = Semaphore::new(t.client().await, unique("sem-upgrade"), 2).expect("valid");
    let permit = sem
        .try_acquire()
        .await
        .expect("the schema is completed on connect")
        .expect("free");
    permit.release().await.expect("release");
    let other = Semaphore::new(t.client().await, sem.name(), 3).expect("valid");
    let err = other
        .try_acquire()
        .await
        .map(|_| ())
        .expect_err("another count");
    assert_eq!(err.kind(), fencelock::ErrorKind::PermitsMismatch, "{err}");
}
