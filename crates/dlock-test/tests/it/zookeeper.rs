//! The ZooKeeper backend against the lock conformance suite, plus what only ZooKeeper
//! has: sessions as leases (expiry by partition, by a frozen client), an ensemble's
//! leader killed mid-run, and one waiter woken per release (watches counted).

mod conformance {
    crate::lock_conformance_tests!(dlock_test::targets::ZooKeeperTarget::start());
    crate::conformance_tests!(dlock_test::targets::ZooKeeperTarget::start();
        waiter_wakes_on_release,
        inspection_and_administration,
    );
}
