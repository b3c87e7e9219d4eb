//! Section `pg-stale`, PostgreSQL lease mode after a crash of many waiting clients: 3 000
//! waiters at ttl 2 s on one name, each granted once, on a clean waiters table and on one
//! holding the 5 000 places that killed clients left on that name (their `LISTEN`
//! sessions gone, their claims running out a few seconds later, as right after a `kill
//! -9`). Both times are printed side by side; nothing is asserted (a run that does not
//! finish within the cap says how far it got). A wait that fails (a call that timed out,
//! a grant whose reply came after its lease) is waited again, as an application would,
//! and counted.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use dlock_test::postgres::PostgresServer;
use fencelock::Lock;
use fencelock::backend::Postgres;
use indicatif::ProgressBar;

use crate::report::fmt_dur;
use crate::{Profile, Result};

/// The waiters' lease.
const TTL: Duration = Duration::from_secs(2);
/// Clients the waiters are spread over (as processes would be), each with its pool, its
/// wait sessions and its `LISTEN` session: well under the server's connection limit.
const CLIENTS: usize = 10;
/// A listener pid no session has.
const DEAD_LISTENER: i32 = 2_147_483_000;

/// The section's sizes: (waiters, stale places, cap on one run).
fn sizes(profile: &Profile) -> (usize, i32, Duration) {
    if profile.quick {
        (300, 500, Duration::from_secs(60))
    } else {
        (3_000, 5_000, Duration::from_secs(300))
    }
}

/// Progress steps.
pub(crate) fn steps(_profile: &Profile) -> u64 {
    2
}

/// One run's outcome.
struct Outcome {
    stale: i32,
    granted: usize,
    took: Duration,
    /// Rows left in the waiters table after the run.
    left: i64,
    /// Attempts that failed (and were made again, as an application would).
    errors: usize,
}

/// The section's results.
pub(crate) struct Section {
    waiters: usize,
    cap: Duration,
    runs: Vec<Outcome>,
}

/// Runs the section: the clean table first, then the stale one, each in a schema of its
/// own on one server.
pub(crate) async fn bench(profile: &Profile, bar: &ProgressBar) -> Result<Section> {
    let (waiters, stale, cap) = sizes(profile);
    bar.set_message("pg-stale: starting a server");
    let server = PostgresServer::start()?;
    let mut runs = Vec::new();
    for (schema, planted) in [("clean", 0), ("stale", stale)] {
        bar.set_message(format!(
            "pg-stale: {waiters} waiters, {planted} stale places"
        ));
        runs.push(run(&server, schema, waiters, planted, cap).await?);
        bar.inc(1);
    }
    Ok(Section { waiters, cap, runs })
}

/// `waiters` waiters queue behind a holder on one name, after `stale` places of killed
/// clients were planted ahead of them; the holder lets go and the time until each waiter
/// was granted (and released) once is measured.
async fn run(
    server: &PostgresServer,
    schema: &str,
    waiters: usize,
    stale: i32,
    cap: Duration,
) -> Result<Outcome> {
    let url = format!("{}?schema={schema}", server.url());
    let mut clients = Vec::with_capacity(CLIENTS);
    for _ in 0..CLIENTS {
        clients.push(Postgres::connect(&url).await?);
    }
    let name = "bench:pg-stale";
    let holder = Lock::builder(clients[0].clone(), name).ttl(TTL).build()?;
    let held = holder
        .try_lock()
        .await?
        .ok_or("the bench's name is held already")?;
    let admin = server.try_admin().await?;
    let key = holder.keys().lock().to_owned();
    admin
        .execute(
            &format!(
                "INSERT INTO {schema}.waiters (key, token, claim_until, ttl_ms, channel, lpid)
                 SELECT $1, 'killed-' || g, now() + interval '3 seconds', 2000, 'dlk_gone', $2
                 FROM generate_series(1, $3) AS g"
            ),
            &[&key, &DEAD_LISTENER, &stale],
        )
        .await?;
    let granted = Arc::new(AtomicUsize::new(0));
    let errors = Arc::new(AtomicUsize::new(0));
    let end = Instant::now() + cap;
    let mut tasks = Vec::with_capacity(waiters);
    for i in 0..waiters {
        let lock = Lock::builder(clients[i % CLIENTS].clone(), name)
            .ttl(TTL)
            .build()?;
        let (granted, errors) = (Arc::clone(&granted), Arc::clone(&errors));
        tasks.push(tokio::spawn(async move {
            // A failed wait (a reply that came too late, a call timed out) is waited
            // again, until the cap.
            while Instant::now() < end {
                match lock.try_lock_until(end.into()).await {
                    Ok(Some(guard)) => {
                        granted.fetch_add(1, Ordering::Relaxed);
                        let _ = guard.release().await;
                        return;
                    }
                    Ok(None) => return,
                    Err(_) => {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }));
    }
    // The waiters queue (a moment for their first attempts), then the holder lets go.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let started = Instant::now();
    // Under the waiters' load its lease may have run out already: it lets go either way.
    let _ = held.release().await;
    for task in tasks {
        let _ = task.await;
    }
    let took = started.elapsed();
    let left: i64 = admin
        .query_one(&format!("SELECT count(*) FROM {schema}.waiters"), &[])
        .await?
        .get(0);
    Ok(Outcome {
        stale,
        granted: granted.load(Ordering::Relaxed),
        took,
        left,
        errors: errors.load(Ordering::Relaxed),
    })
}

impl Section {
    /// The section's Markdown: both runs side by side.
    pub(crate) fn markdown(&self) -> String {
        let mut md = format!(
            "\n## PostgreSQL after killed clients\n\n\
             {} waiters at ttl {} s on one name (spread over {CLIENTS} clients, each \
             granted once and releasing at once), behind a holder that lets go; the \
             waiters table clean, or holding the places of killed clients on that name \
             (their `LISTEN` sessions gone, their claims ending 3 s later). Each run is \
             capped at {} s; the store's own calls clean the stale places (no operator).\n\n\
             | waiters table | stale places | granted | all granted in | failed waits (waited again) | rows left |\n\
             |---|---:|---:|---:|---:|---:|\n",
            self.waiters,
            TTL.as_secs(),
            self.cap.as_secs(),
        );
        for run in &self.runs {
            let took = if run.granted == self.waiters {
                fmt_dur(run.took)
            } else {
                format!("not within {} s", self.cap.as_secs())
            };
            md.push_str(&format!(
                "| {} | {} | {} of {} | {} | {} | {} |\n",
                if run.stale == 0 { "clean" } else { "stale" },
                run.stale,
                run.granted,
                self.waiters,
                took,
                run.errors,
                run.left,
            ));
        }
        md
    }
}
