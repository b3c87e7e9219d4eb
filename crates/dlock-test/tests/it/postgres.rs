//! The PostgreSQL backend against the lock conformance suite, plus what only it has.

mod conformance {
    crate::lock_conformance_tests!(dlock_test::targets::PostgresTarget::start());
    crate::conformance_tests!(dlock_test::targets::PostgresTarget::start();
        waiter_wakes_on_release,
        inspection_and_administration,
    );
}
