//! One inspection and one force-unlock for every kind of primitive
//! ([`RawInspect`] taking a [`Kind`]): the kind reaches that kind's own recipe, and a
//! store answers a kind it does not offer with a typed error, sending nothing.

use dlock_test::conformance::unique;
use dlock_test::targets::PostgresTarget;
use fencelock::backend::{Memory, PgAdvisory};
use fencelock::keys::LockKeys;
use fencelock::raw::{Kind, RawInspect};
use fencelock::{ErrorKind, Semaphore};

/// Advisory locks are plain locks only: every other kind is `Unsupported`, for both
/// calls, while the plain lock is inspected as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn advisory_locks_refuse_every_other_kind_as_unsupported() {
    let t = PostgresTarget::start();
    let store = PgAdvisory::connect(&t.server.url()).await.expect("connect");
    let keys = LockKeys::new("dlock:", &unique("adv-kind")).expect("valid");
    let state = store.inspect(Kind::Lock, &keys).await.expect("store");
    assert_eq!(state.holder, None, "nobody holds it");
    assert!(
        !store.force_unlock(Kind::Lock, &keys).await.expect("store"),
        "nothing held"
    );
    for kind in [Kind::Semaphore, Kind::Reentrant, Kind::RwLock, Kind::Fair] {
        let err = store
            .inspect(kind, &keys)
            .await
            .expect_err("advisory locks have no such kind");
        assert_eq!(err.kind(), ErrorKind::Unsupported, "{kind:?}: {err}");
        assert!(err.to_string().contains(kind.described()), "{err}");
        let err = store
            .force_unlock(kind, &keys)
            .await
            .expect_err("advisory locks have no such kind");
        assert_eq!(err.kind(), ErrorKind::Unsupported, "{kind:?}: {err}");
    }
}

/// The kind picks the recipe: a semaphore's permits are seen and taken back as a
/// semaphore's; the plain lock's view of the same keys has no permits.
#[tokio::test]
async fn the_kind_reaches_its_own_recipe() {
    let store = Memory::new();
    let sem = Semaphore::new(store.clone(), unique("kind-sem"), 3).expect("valid");
    let held = sem.acquire_many(2).await.expect("free");
    let keys = sem.keys().clone();
    let state = store.inspect(Kind::Semaphore, &keys).await.expect("store");
    assert_eq!((state.hold_count, state.holders), (Some(2), Some(1)));
    let plain = store.inspect(Kind::Lock, &keys).await.expect("store");
    assert_eq!(plain.hold_count, None, "the plain lock has no permits");
    assert!(sem.is_locked().await.expect("store"), "still held");
    assert!(
        store
            .force_unlock(Kind::Semaphore, &keys)
            .await
            .expect("store"),
        "the permits were held"
    );
    assert!(!sem.is_locked().await.expect("store"), "taken back");
    drop(held);
}
