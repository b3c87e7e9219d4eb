//! The Redis backend on a Redis Cluster: the whole conformance suite, plus a failover.

mod conformance {
    crate::all_conformance_tests!(dlock_test::targets::ClusterTarget::start());
}
