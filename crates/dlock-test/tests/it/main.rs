//! dlock's integration tests: one binary, real servers.

mod acl;
mod blocking;
mod clock;
mod cluster;
mod edges;
mod engine;
mod etcd;
mod fenced;
mod hazards;
mod inspect_kinds;
mod kinds;
mod memcached;
mod memcached_eviction;
mod memory;
mod multi_at_once;
mod namespace;
mod observe;
mod pg_waiters;
mod postgres;
mod quorum;
mod redis;
mod redis_grant;
mod sem_total;
mod sentinel;
mod shared_watch;
mod vacancy;
mod zk_exit;
mod zookeeper;

/// One `#[tokio::test]` per conformance behaviour, against a fresh target each.
#[macro_export]
macro_rules! conformance_tests {
    ($target:expr; $($behaviour:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $behaviour() {
                let target = $target;
                dlock_test::conformance::$behaviour(&target).await;
            }
        )*
    };
}

/// The plain lock's behaviours every store must pass, except waking on a release
/// (stores without notification poll) and inspection (not every store can list).
#[macro_export]
macro_rules! lock_conformance_tests {
    ($target:expr) => {
        $crate::conformance_tests!($target;
            mutual_exclusion,
            checker_catches_no_lock,
            fences_strictly_increase,
            forgotten_holder_frees_within_ttl,
            killed_holder_frees_within_ttl,
            release_after_expiry_is_lock_lost,
            watchdog_keeps_lock,
            without_watchdog_lease_ends_at_ttl,
            lost_fires_on_external_delete,
            lost_fires_at_the_next_renewal,
            lapsed_lease_is_lost_for_good,
            shorter_extend_is_renewed_in_time,
            extreme_waits,
            late_grant_is_timed_out_and_given_back,
            cancelled_after_the_grant_gives_it_back,
            cancelled_acquire_leaks_nothing,
            dropped_guard_releases,
            bounded_waits_give_up,
            extend_resets_lease,
            bad_input_is_rejected,
        );
    };
}

/// Every conformance behaviour, for a target expression.
#[macro_export]
macro_rules! all_conformance_tests {
    ($target:expr) => {
        $crate::lock_conformance_tests!($target);
        $crate::conformance_tests!($target;
            waiter_wakes_on_release,
            inspection_and_administration,
            semaphore_never_exceeds_its_permits,
            semaphore_permits_of_a_dead_holder_come_back,
            semaphore_many_permits_and_counts,
            semaphore_waiters_wake_and_lost_permits_fire,
            semaphore_other_count_is_refused,
        );
        $crate::family_tests!($target;
            reentrant_excludes_other_owners,
            reentrant_counts_holds,
            reentrant_lost_cancel_and_expiry,
            owners_follow_tasks_not_threads,
            rwlock_readers_share_writers_exclude,
            rwlock_writer_is_not_starved,
            rwlock_downgrade_expiry_and_cancel,
            fair_lock_grants_in_arrival_order,
            fair_lock_cancelled_and_crashed_waiters,
            multi_lock_is_all_or_nothing,
            multi_locks_on_overlapping_sets_do_not_deadlock,
        );
    };
}

/// One `#[tokio::test]` per lock-family behaviour, against a fresh target each.
#[macro_export]
macro_rules! family_tests {
    ($target:expr; $($behaviour:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $behaviour() {
                let target = $target;
                dlock_test::family::$behaviour(&target).await;
            }
        )*
    };
}

/// Every leader-election behaviour, against a fresh target each.
#[macro_export]
macro_rules! election_tests {
    ($target:expr) => {
        $crate::election_tests!($target;
            election_one_leader_at_a_time,
            election_leader_reports_term_and_value,
            election_resign_hands_over,
            election_killed_leader_is_replaced_within_ttl,
            election_observe_sees_every_change_in_order,
            election_cancelled_campaign_leaves_nothing,
            election_deposed_leader_is_refused,
            election_candidates_lead_in_arrival_order,
            election_goes_on_after_a_fence_counter_reset,
        );
    };
    ($target:expr; $($behaviour:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $behaviour() {
                let target = $target;
                dlock_test::election::$behaviour(&target).await;
            }
        )*
    };
}
