//! The family in the simulation: 300 seeds run every primitive (each granted in some
//! seed) and no checker finds a violation.

use dlock_sim::family_workload::Primitive;
use dlock_sim::{Options, run};

#[test]
fn every_primitive_runs_and_no_seed_breaks_a_promise() {
    let mut seeds_holding = [0u32; Primitive::ALL.len()];
    let mut bad = Vec::new();
    for seed in 0..300 {
        let o = run(
            seed,
            Options {
                plant: None,
                trace_all: true,
            },
        );
        for (i, p) in Primitive::ALL.iter().enumerate() {
            let marker = p.held_marker();
            if o.trace.iter().any(|line| line.contains(&marker)) {
                seeds_holding[i] += 1;
            }
        }
        if let Some(v) = o.violations.first() {
            bad.push(format!("seed {seed}: [{}] {}", v.checker, v.what));
        }
    }
    for (i, p) in Primitive::ALL.iter().enumerate() {
        eprintln!(
            "{:<10} held in {:>3} of 300 seeds",
            p.id(),
            seeds_holding[i]
        );
        assert!(
            seeds_holding[i] >= 10,
            "{} was held in only {} of 300 seeds",
            p.id(),
            seeds_holding[i]
        );
    }
    assert!(bad.is_empty(), "violations: {bad:#?}");
}
