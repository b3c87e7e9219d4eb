//! The oversell demo's lesson applied to leaders: a leader that stalls past its lease
//! (a GC pause, a stopped VM) is replaced, and when it wakes up it still believes it
//! leads. Only a resource that checks the **term** stops its late writes.
//!
//! Two schedulers campaign for `scheduler`. The first leads, writes the schedule under its
//! term, then stalls — its whole runtime blocked, renewals included — for three leases.
//! The second leads meanwhile and writes under a higher term. The first wakes up and
//! writes again: the resource refuses it (it has seen a higher term), and the first learns
//! it was deposed. Exits non-zero if the stale write got through.
//!
//! ```text
//! cargo run --example leader
//! ```
//!
//! The resource here is an in-process register; against real stores, use
//! `fencelock::fenced::RedisFenced` or `fencelock::fenced::PgFencedTable` the same way.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use fencelock::backend::Memory;
use fencelock::{Election, FencingToken};

const LEASE: Duration = Duration::from_millis(300);

/// A value that accepts a write only with a term at least the highest it has seen.
#[derive(Default)]
struct Schedule {
    highest: u64,
    value: String,
}

impl Schedule {
    fn write(&mut self, term: FencingToken, value: &str) -> Result<(), u64> {
        if term.get() < self.highest {
            return Err(self.highest);
        }
        self.highest = term.get();
        self.value = value.to_owned();
        Ok(())
    }
}

fn main() -> fencelock::Result<()> {
    let store = Memory::new();
    let schedule = Arc::new(Mutex::new(Schedule::default()));
    let election = |store: &Memory| {
        Election::builder(store.client(), "scheduler")
            .ttl(LEASE)
            .build()
    };

    // The first scheduler, on a runtime of its own that it will block.
    let (first, resource) = (election(&store)?, Arc::clone(&schedule));
    let (led_tx, led_rx) = std::sync::mpsc::channel();
    let stalled =
        std::thread::spawn(move || -> fencelock::Result<bool> {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
            let leadership = first.campaign("scheduler-a").await?;
            let term = leadership.term();
            let written = resource.lock().expect("schedule").write(term, "plan by a");
            println!("a leads in term {term}: write {written:?}");
            led_tx.send(()).expect("main waits");
            println!("a stalls for {:?} (a GC pause): no renewal runs", LEASE * 3);
            std::thread::sleep(LEASE * 3);
            let late = resource.lock().expect("schedule").write(term, "late plan by a");
            match late {
                Ok(()) => println!("a writes late under term {term}: ACCEPTED (stale!)"),
                Err(highest) => println!(
                    "a writes late under term {term}: refused, the schedule has seen term {highest}"
                ),
            }
            println!("a's leadership lost: {}", leadership.is_lost());
            Ok(late.is_ok())
        })
        });

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        led_rx.recv().expect("a leads");
        let second = election(&store)?;
        let leadership = second.campaign("scheduler-b").await?;
        let term = leadership.term();
        let written = schedule.lock().expect("schedule").write(term, "plan by b");
        println!("b leads in term {term} once a's lease ran out: write {written:?}");
        // Waited for off the runtime, so that b's own renewals keep running meanwhile.
        let stale_accepted = tokio::task::spawn_blocking(move || stalled.join())
            .await
            .expect("join")
            .expect("a's thread")?;
        let leader = second.leader().await?.expect("b leads");
        println!(
            "leader: term {} ({}); schedule: {:?}",
            leader.term,
            leader.value.as_deref().unwrap_or("-"),
            schedule.lock().expect("schedule").value
        );
        leadership.resign().await?;
        if stale_accepted {
            std::process::exit(1);
        }
        Ok(())
    })
}
