//! `dlock-sim`: runs seeds of fencelock's deterministic simulation, in parallel across
//! cores; replays one seed with its whole trace; shows that every planted bug is caught.

use std::process::ExitCode;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use dlock_sim::world::FaultCounts;
use dlock_sim::{Options, Outcome, Plant, run};

/// Runs seeds of fencelock's deterministic simulation: the real library against a
/// simulated store, network and clock under seeded faults, with checkers.
#[derive(Parser, Debug)]
#[command(name = "dlock-sim", version)]
struct Args {
    /// How many seeds to run (from --start).
    #[arg(long, default_value_t = 1000)]
    seeds: u64,
    /// The first seed.
    #[arg(long, default_value_t = 0)]
    start: u64,
    /// Replays one seed and prints its whole trace.
    #[arg(long, conflicts_with_all = ["plants"])]
    seed: Option<u64>,
    /// Threads to run seeds on (default: every core).
    #[arg(long)]
    jobs: Option<usize>,
    /// Plants one bug (see --plants for the names) in every seed run.
    #[arg(long, value_parser = parse_plant)]
    plant: Option<Plant>,
    /// Plants each bug in turn and runs seeds until the checkers catch it (at most
    /// --seeds per plant); fails if one is not caught.
    #[arg(long)]
    plants: bool,
}

fn parse_plant(s: &str) -> Result<Plant, String> {
    Plant::from_id(s).ok_or_else(|| {
        let names: Vec<&str> = Plant::ALL.iter().map(|p| p.id()).collect();
        format!("no plant named {s:?}; the plants: {}", names.join(", "))
    })
}

fn main() -> ExitCode {
    let args = Args::parse();
    let jobs = args.jobs.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    });
    if let Some(seed) = args.seed {
        return replay(seed, args.plant);
    }
    if args.plants {
        return plants(&args, jobs);
    }
    sweep(&args, jobs)
}

/// The command that replays `seed`.
fn replay_command(seed: u64, plant: Option<Plant>) -> String {
    let plant = plant
        .map(|p| format!(" --plant {}", p.id()))
        .unwrap_or_default();
    format!("cargo run --release -p dlock-sim -- --seed {seed}{plant}")
}

fn replay(seed: u64, plant: Option<Plant>) -> ExitCode {
    let o = run(
        seed,
        Options {
            plant,
            trace_all: true,
        },
    );
    for line in &o.trace {
        println!("{line}");
    }
    println!(
        "seed {seed}: {} events, {:.1} s simulated, trace hash {:016x}, {} violations",
        o.events,
        o.simulated.as_secs_f64(),
        o.hash,
        o.violations.len()
    );
    if o.violations.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Runs `seeds` seeds from `start` on `jobs` threads (with `stop_at_first`, no seed
/// after the first with a violation is started). Returns the outcomes with violations
/// and the totals.
fn parallel(
    start: u64,
    seeds: u64,
    jobs: usize,
    plant: Option<Plant>,
    stop_at_first: bool,
) -> (Vec<Outcome>, Totals) {
    let next = AtomicU64::new(start);
    let end = start.saturating_add(seeds);
    let bad = Mutex::new(Vec::new());
    let totals = Mutex::new(Totals::default());
    let stop = AtomicU64::new(u64::MAX);
    std::thread::scope(|s| {
        for _ in 0..jobs.max(1) {
            s.spawn(|| {
                let mut mine = Totals::default();
                loop {
                    let seed = next.fetch_add(1, Ordering::Relaxed);
                    if seed >= end || seed > stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let o = run(
                        seed,
                        Options {
                            plant,
                            trace_all: false,
                        },
                    );
                    mine.seeds += 1;
                    mine.simulated += o.simulated;
                    mine.events += o.events;
                    mine.faults.merge(&o.faults);
                    if !o.violations.is_empty() {
                        if stop_at_first {
                            stop.fetch_min(seed, Ordering::Relaxed);
                        }
                        bad.lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner)
                            .push(o);
                    }
                }
                let mut t = totals
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                t.seeds += mine.seeds;
                t.simulated += mine.simulated;
                t.events += mine.events;
                t.faults.merge(&mine.faults);
            });
        }
    });
    let mut bad = bad.into_inner().unwrap_or_default();
    bad.sort_by_key(|o| o.seed);
    (bad, totals.into_inner().unwrap_or_default())
}

#[derive(Default)]
struct Totals {
    seeds: u64,
    simulated: Duration,
    events: u64,
    faults: FaultCounts,
}

fn print_failure(o: &Outcome, plant: Option<Plant>) {
    let v = &o.violations[0];
    eprintln!(
        "seed {}: VIOLATION [{}] at {:.3} s: {}",
        o.seed,
        v.checker,
        v.at.as_secs_f64(),
        v.what
    );
    eprintln!("  the last events before it:");
    for line in &o.trace {
        eprintln!("    {line}");
    }
    eprintln!("  replay: {}", replay_command(o.seed, plant));
}

fn sweep(args: &Args, jobs: usize) -> ExitCode {
    let began = Instant::now();
    let (bad, t) = parallel(args.start, args.seeds, jobs, args.plant, false);
    let took = began.elapsed();
    let faults: Vec<String> = t.faults.0.iter().map(|(k, v)| format!("{k} {v}")).collect();
    println!(
        "dlock-sim: {} seeds (from {}) on {jobs} threads in {:.1} s: {:.0} seeds/s, {:.2} simulated hours, {} events",
        t.seeds,
        args.start,
        took.as_secs_f64(),
        t.seeds as f64 / took.as_secs_f64().max(1e-9),
        t.simulated.as_secs_f64() / 3600.0,
        t.events
    );
    println!("faults injected: {}", faults.join(", "));
    if let Some(p) = args.plant {
        println!(
            "planted: {} — caught in {} of {} seeds",
            p.id(),
            bad.len(),
            t.seeds
        );
        return if bad.is_empty() {
            ExitCode::FAILURE
        } else {
            ExitCode::SUCCESS
        };
    }
    if bad.is_empty() {
        println!("no violation");
        return ExitCode::SUCCESS;
    }
    println!("{} seeds with violations", bad.len());
    for o in bad.iter().take(3) {
        print_failure(o, None);
    }
    ExitCode::FAILURE
}

fn plants(args: &Args, jobs: usize) -> ExitCode {
    let mut missed = 0;
    let mut caught_after = Vec::new();
    println!(
        "{:<30} {:>14} {:>12}  checker",
        "plant", "seeds to catch", "first seed"
    );
    for plant in Plant::ALL {
        let began = Instant::now();
        let (bad, t) = parallel(args.start, args.seeds, jobs, Some(plant), true);
        match bad.first() {
            Some(o) => {
                let n = o.seed - args.start + 1;
                // The control is not a bug: it stays out of the mean.
                if plant != Plant::DriftBeyond {
                    caught_after.push(n as f64);
                }
                println!(
                    "{:<30} {:>14} {:>12}  {} ({:.1} s)",
                    plant.id(),
                    n,
                    o.seed,
                    o.violations[0].checker,
                    began.elapsed().as_secs_f64()
                );
            }
            None => {
                missed += 1;
                println!(
                    "{:<30} {:>14} {:>12}  NOT CAUGHT in {} seeds",
                    plant.id(),
                    "-",
                    "-",
                    t.seeds
                );
            }
        }
    }
    if !caught_after.is_empty() {
        println!(
            "mean seeds to catch over the planted bugs: {:.1}",
            caught_after.iter().sum::<f64>() / caught_after.len() as f64
        );
    }
    if missed > 0 {
        eprintln!("dlock-sim: {missed} planted bug(s) not caught");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
