//! The PostgreSQL backend against the lock conformance suite, plus what only it has.

mod conformance {
    crate::lock_conformance_tests!(dlock_test::targets::PostgresTarget::start());
}
