//! One seed gives one trace.

use dlock_sim::{Options, run};

#[test]
fn the_same_seed_gives_the_same_trace_and_another_seed_another() {
    for seed in [0, 7, 24, 1722] {
        let a = run(seed, Options::default());
        let b = run(seed, Options::default());
        assert!(a.events > 20, "seed {seed}: {} events", a.events);
        assert_eq!(a.hash, b.hash, "seed {seed}: two runs, two traces");
        assert_eq!(a.trace, b.trace, "seed {seed}");
        assert_eq!(a.simulated, b.simulated, "seed {seed}");
        assert_eq!(a.faults, b.faults, "seed {seed}");
        // On another thread (its own hash keys, its own runtime): the same trace.
        let c = std::thread::spawn(move || run(seed, Options::default()).hash)
            .join()
            .ok();
        assert_eq!(c, Some(a.hash), "seed {seed} on another thread");
    }
    let hashes: std::collections::HashSet<u64> = (100..110)
        .map(|s| run(s, Options::default()).hash)
        .collect();
    assert_eq!(hashes.len(), 10, "ten seeds, ten traces");
}

#[test]
fn a_run_of_seeds_finds_no_violation() {
    let mut faults = dlock_sim::world::FaultCounts::default();
    for seed in 0..300 {
        let o = run(seed, Options::default());
        assert!(
            o.violations.is_empty(),
            "seed {seed}: {:?}\n{}",
            o.violations,
            o.trace.join("\n")
        );
        faults.merge(&o.faults);
    }
    // Every kind of fault was injected somewhere in the run.
    for kind in [
        "partition",
        "reset",
        "reset-lossy",
        "store-pause",
        "restart-kept",
        "restart-lost",
        "client-pause",
    ] {
        assert!(
            faults.0.get(kind).copied().unwrap_or(0) > 0,
            "{kind}: {faults:?}"
        );
    }
}
