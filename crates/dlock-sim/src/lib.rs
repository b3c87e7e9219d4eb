//! Deterministic simulation of fencelock.
//!
//! Each seed runs the real library — [`fencelock::Lock`], its engine (lease registry,
//! renewal batches, wait and wake, cancellation, background release, `lost()`) and every
//! primitive (semaphore, reentrant, read-write, fair, multi-lock, election) — against
//! a simulated store: the in-process [`Memory`](fencelock::backend::Memory) store's
//! semantics behind a simulated network and clock ([`store::SimStore`]). Everything runs
//! on one thread, on a current-thread tokio runtime with its clock paused: time moves
//! only when every task waits, so a run of minutes of simulated time takes milliseconds,
//! and the order in which tasks run follows from the seed alone. The library draws its
//! tokens and jitter from a generator seeded by the run
//! ([`fencelock::simulation`]), the store and the network draw every fault from the
//! seed, and the library's `select!`s are biased (tokio's unbiased ones draw from the
//! OS). One seed gives one trace; [`Outcome::hash`] fingerprints it.
//!
//! Why tokio's paused clock rather than `turmoil` or `madsim`: the code under test is
//! the client library over a store model in the same process, so there is no socket to
//! simulate (turmoil's strength), and madsim replaces tokio for the whole build (a
//! second build of every dependency under `--cfg madsim`). The paused clock runs the
//! library exactly as shipped, on the runtime it ships for.
//!
//! The checkers ([`world`]) look from outside: (1) every task that believes it holds is
//! the store's holder, checked after every store operation and at the instant each
//! lease the store granted ends (and a semaphore's believed permits stay within its
//! count); (2) fences strictly increase in grant order and the fenced resource never
//! takes writes of two holders under one fence (election observers never go back a
//! term); (3) after the workload, with faults stopped, every waiter is served, nothing
//! stays held and no client renews; on a quiet network no cancelled acquisition leaves
//! a grant behind and a heard release leads to an attempt; (4) a guard that can no
//! longer vouch for its lease has had `lost()` fire. SAFETY.md lists them with the
//! faults and the planted bugs they catch.

#![warn(missing_docs)]

pub mod family;
pub mod family_workload;
pub mod rng;
pub mod store;
pub mod workload;
pub mod world;

use std::time::Duration;

use fencelock::Lock;
use fencelock::backend::Memory;
use tokio::time::Instant;

use crate::family_workload::{Family, Primitive};
use crate::rng::Rng;
use crate::store::SimStore;
use crate::world::{FaultCounts, Rates, Shared, Violation};

/// A bug planted to show that the checkers catch it (or, for [`Plant::DriftBeyond`],
/// a fault beyond what the library promises to survive: a control).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Plant {
    /// A lease's validity counted from the reply instead of the request's sending.
    ValidityFromReply,
    /// No clock-drift allowance.
    NoDriftAllowance,
    /// A cancelled acquire whose in-flight grant is not given back.
    CancelledGrantKept,
    /// A wake-up (hand-over) delivered to a waiter that already left, not passed on.
    WakeNotPassedOn,
    /// A short renewal-batch reply treated as all renewed.
    ShortBatchAllRenewed,
    /// A release retried after a lost reply deletes a newer holder's lock (the store's
    /// release does not check the owner).
    ReleaseWithoutOwnerCheck,
    /// The store's fence counter reset on restart while the clients keep using fences.
    FenceReset,
    /// Control: the store's clock runs 3–13 % faster than a client's, beyond the 1 %
    /// drift allowance.
    DriftBeyond,
}

impl Plant {
    /// Every plant, in the order of the table in SAFETY.md.
    pub const ALL: [Plant; 8] = [
        Plant::ValidityFromReply,
        Plant::NoDriftAllowance,
        Plant::CancelledGrantKept,
        Plant::WakeNotPassedOn,
        Plant::ShortBatchAllRenewed,
        Plant::ReleaseWithoutOwnerCheck,
        Plant::FenceReset,
        Plant::DriftBeyond,
    ];

    /// The plant's name on the command line.
    pub fn id(self) -> &'static str {
        match self {
            Plant::ValidityFromReply => "validity-from-reply",
            Plant::NoDriftAllowance => "no-drift-allowance",
            Plant::CancelledGrantKept => "cancelled-grant-kept",
            Plant::WakeNotPassedOn => "wake-not-passed-on",
            Plant::ShortBatchAllRenewed => "short-batch-all-renewed",
            Plant::ReleaseWithoutOwnerCheck => "release-without-owner-check",
            Plant::FenceReset => "fence-reset",
            Plant::DriftBeyond => "drift-beyond-allowance",
        }
    }

    /// The plant named `id`.
    pub fn from_id(id: &str) -> Option<Plant> {
        Plant::ALL.into_iter().find(|p| p.id() == id)
    }

    /// The library's switch for this plant, if the bug sits in the library.
    fn library(self) -> Option<fencelock::simulation::Plant> {
        use fencelock::simulation::Plant as L;
        match self {
            Plant::ValidityFromReply => Some(L::ValidityFromReply),
            Plant::NoDriftAllowance => Some(L::NoDriftAllowance),
            Plant::CancelledGrantKept => Some(L::CancelledGrantKept),
            Plant::WakeNotPassedOn => Some(L::WakeNotPassedOn),
            Plant::ShortBatchAllRenewed => Some(L::ShortBatchAllRenewed),
            _ => None,
        }
    }
}

/// A fault the nemesis injects at a moment of the run.
#[derive(Debug, Clone, Copy)]
pub enum Fault {
    /// One client cut off from the store.
    Partition {
        /// Which client.
        client: usize,
        /// For how long.
        length: Duration,
    },
    /// One client's notification channel dropped and re-established: its waiters are
    /// woken; with `lose`, notifications are lost for a ttl.
    Reset {
        /// Which client.
        client: usize,
        /// Whether notifications are lost meanwhile.
        lose: bool,
    },
    /// The store stops answering for `length` (its clock runs on: leases expire).
    Pause {
        /// For how long.
        length: Duration,
    },
    /// The store restarts, with its state or without its holds (fences kept, unless the
    /// fence-reset plant is in).
    Restart {
        /// Whether the holds survive.
        keep_state: bool,
    },
}

/// What one run is asked to do.
#[derive(Debug, Clone, Copy, Default)]
pub struct Options {
    /// The planted bug, if any.
    pub plant: Option<Plant>,
    /// Keep every trace line (for a replay), not only the last ones.
    pub trace_all: bool,
}

/// The result of one seed.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The seed.
    pub seed: u64,
    /// The trace's fingerprint: one seed, one hash.
    pub hash: u64,
    /// Events traced.
    pub events: u64,
    /// Simulated time the run covered.
    pub simulated: Duration,
    /// What the checkers found.
    pub violations: Vec<Violation>,
    /// The last trace lines (all of them with [`Options::trace_all`]).
    pub trace: Vec<String>,
    /// Faults injected, by kind.
    pub faults: FaultCounts,
}

/// Runs seed `seed`.
pub fn run(seed: u64, options: Options) -> Outcome {
    /// Puts the thread's generator and plant back however the run ends (a panic too).
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            fencelock::simulation::set_plant(None);
            fencelock::simulation::seed_thread_rng(None);
        }
    }
    let _reset = Reset;
    fencelock::simulation::seed_thread_rng(Some(seed));
    fencelock::simulation::set_plant(options.plant.and_then(Plant::library));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build();
    match runtime {
        Ok(rt) => rt.block_on(simulate(seed, options)),
        Err(e) => Outcome {
            seed,
            hash: 0,
            events: 0,
            simulated: Duration::ZERO,
            violations: vec![Violation {
                checker: "setup",
                at: Duration::ZERO,
                what: format!("no runtime: {e}"),
            }],
            trace: Vec::new(),
            faults: FaultCounts::default(),
        },
    }
}

async fn simulate(seed: u64, options: Options) -> Outcome {
    let mut rng = Rng::new(seed);
    let clients = rng.range(2, 4) as usize;
    let per_client = rng.range(1, 3) as usize;
    let names = rng.range(1, 2) as usize;
    let ttl = Duration::from_millis(rng.range(3, 20) * 100);
    let length = ttl * rng.range(8, 20) as u32;
    let mut rates = Rates {
        lose_request: rng.unit() * 0.05,
        lose_reply: rng.unit() * 0.05,
        duplicate: rng.unit() * 0.03,
        short_batch: rng.unit() * 0.3,
        slow: rng.unit() * 0.02,
    };
    if rng.chance(0.3) {
        // A quiet network: where the wake-up and ghost checkers can look.
        rates = Rates {
            lose_request: 0.0,
            lose_reply: 0.0,
            duplicate: 0.0,
            short_batch: 0.0,
            slow: 0.0,
        };
    }
    let store = Memory::new();
    let world = Shared::new(store.clone(), clients, &mut rng, ttl, rates, options);
    let start = Instant::now();
    let until = start + length;
    world.event(
        "sim",
        format_args!(
            "seed {seed}: {clients} clients × {per_client} tasks, {names} locks, ttl {ttl:?}, {length:?}, {rates:?}"
        ),
    );
    let stores: Vec<SimStore> = (0..clients)
        .map(|c| SimStore::new(&world, &store, c))
        .collect();
    let mut tasks = Vec::new();
    // Each task runs one primitive of the seed's mix (the plain lock in about a third).
    let family = Family::draw(&mut rng, &store, ttl, names);
    world.event("sim", format_args!("mix: {}", family.describe()));
    for (c, s) in stores.iter().enumerate() {
        let locks: Vec<Lock<SimStore>> = (0..names)
            .filter_map(|n| {
                Lock::builder(s.clone(), format!("l{n}"))
                    .ttl(ttl)
                    .build()
                    .ok()
            })
            .collect();
        for t in 0..per_client {
            let who = format!("c{c}t{t}");
            let task = match family.pick(&mut rng) {
                Primitive::Lock => tokio::spawn(workload::lock_task(
                    who,
                    locks.clone(),
                    world.clone(),
                    rng.fork(),
                    until,
                )),
                p => tokio::spawn(family_workload::task(
                    p,
                    who,
                    c,
                    s.clone(),
                    family.clone(),
                    world.clone(),
                    rng.fork(),
                    until,
                )),
            };
            tasks.push(task);
        }
    }
    family.spawn_checker(world.clone(), until);
    let nemesis = tokio::spawn(nemesis(world.clone(), rng.fork(), clients, ttl, until));
    let _ = nemesis.await;
    world.calm();
    // Liveness: every task ends (its waits served) within a bound after the faults stop.
    let bound = until + ttl * (8 * (clients * per_client) as u32 + 8);
    for task in tasks {
        let left = bound.saturating_duration_since(Instant::now());
        if tokio::time::timeout(left, task).await.is_err() {
            world.violation(
                "liveness",
                "a task's wait was not served long after the faults stopped".into(),
            );
        }
    }
    // Nothing held or renewed a ttl after the last task ended (plus the
    // network's slowest trip: a renewal sent just before a forget may land that late).
    tokio::time::sleep(ttl * 2).await;
    let keys: Vec<String> = world.lock().keys.iter().cloned().collect();
    for key in keys {
        let held = store.holders(&key);
        if !held.is_empty() {
            world.violation(
                "leak",
                format!("{key} still held a ttl after the run: {held:?}"),
            );
        }
    }
    for (c, s) in stores.iter().enumerate() {
        let leases = fencelock::raw::RawLock::engine(s).leases();
        if leases > 0 {
            world.violation(
                "leak",
                format!("client {c}'s engine still renews {leases} leases after the run"),
            );
        }
    }
    let w = world.lock();
    Outcome {
        seed,
        hash: w.trace_hash(),
        events: w.trace_events(),
        simulated: Instant::now() - start,
        violations: w.violations.clone(),
        trace: w.trace_tail(),
        faults: w.faults.clone(),
    }
}

/// Injects the seed's faults until `until`: partitions, channel resets, store pauses and
/// restarts, a few of each kind a run draws.
async fn nemesis(world: Shared, mut rng: Rng, clients: usize, ttl: Duration, until: Instant) {
    let count = rng.range(0, 6);
    let mut at = Instant::now();
    for _ in 0..count {
        at += rng.duration(ttl, ttl * 4);
        if at >= until {
            break;
        }
        tokio::time::sleep_until(at).await;
        let client = rng.below(clients as u64) as usize;
        let fault = match rng.below(100) {
            0..30 => Fault::Partition {
                client,
                length: rng.duration(ttl / 5, ttl * 2),
            },
            30..50 => Fault::Reset {
                client,
                lose: rng.chance(0.5),
            },
            50..75 => Fault::Pause {
                length: rng.duration(ttl / 2, ttl * 2),
            },
            _ => Fault::Restart {
                keep_state: rng.chance(0.5),
            },
        };
        world.inject(fault);
    }
    tokio::time::sleep_until(until).await;
}
