//! The physical limit: one client holding and releasing many independent locks at once,
//! against `redis-benchmark -t set -P 16` on the same server in the same run.
//!
//! * **`redis-benchmark -t set -P 16`**: the server's own load generator (50 connections,
//!   16 `SET`s in flight on each): how many writes per second this server takes on this
//!   machine. Every lock cycle writes the lock key twice (grant, release), so the figure
//!   compared is SET/s counted per lock cycle, as the issue states it.
//! * **dlock, 1 000 tasks**: one `Redis` client (one multiplexed connection), 1 000 tasks
//!   each locking and releasing a name of its own (`lock()` + `release()`, default
//!   options). The connection pipelines: every request of every task is written as soon
//!   as it is made, without waiting for the replies before it; "in flight" (cycles/s ×
//!   p50, Little's law) shows how many cycles overlap.
//! * **dlock `MultiLock` of 100 names**: tasks each taking a `MultiLock` of 100 names of
//!   its own and releasing it; counted per lock (per name) cycle. A `MultiLock` asks for
//!   all its members at once (pipelined on the one connection) and releases them all at
//!   once, so an uncontended one is about two round trips; several of them run side by
//!   side on the one client.
//! * **rslock, 1 000 tasks**: the peer, the same way on one `LockManager`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use dlock_test::server::RedisServer;
use fencelock::backend::Redis;
use fencelock::{Lock, MultiLock};
use indicatif::ProgressBar;

use crate::measure::{self, CpuMeter, Latencies};
use crate::report::{fmt_dur, fmt_rate};
use crate::{Profile, Result};

/// The rows, in table order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Row {
    /// `redis-benchmark -t set -P 16`.
    SetBenchmark,
    /// dlock, 1 000 tasks of one name each.
    Dlock,
    /// dlock, `MultiLock`s of 100 names.
    Multi(usize),
    /// rslock, 1 000 tasks.
    Rslock,
}

/// Every row, in the order they run within a round.
pub(crate) const ROWS: [Row; 5] = [
    Row::SetBenchmark,
    Row::Dlock,
    Row::Multi(1),
    Row::Multi(10),
    Row::Rslock,
];

/// Tasks of the one-name-each rows.
const TASKS: usize = 1_000;
/// Names of one `MultiLock`.
const NAMES: usize = 100;
/// Lease length (dlock's default).
const TTL: Duration = Duration::from_secs(30);

impl Row {
    fn label(self) -> String {
        match self {
            Row::SetBenchmark => "`redis-benchmark -t set -P 16` (SET/s ÷ 2)".to_owned(),
            Row::Dlock => format!("**dlock**, {TASKS} tasks, a name each"),
            Row::Multi(n) => format!(
                "**dlock** `MultiLock` of {NAMES} names, {n} task{}",
                if n == 1 { "" } else { "s" }
            ),
            Row::Rslock => format!("rslock 0.10, {TASKS} tasks, a name each"),
        }
    }

    fn short(self) -> String {
        match self {
            Row::SetBenchmark => "redis-benchmark".to_owned(),
            Row::Dlock => "dlock".to_owned(),
            Row::Multi(n) => format!("multi{n}"),
            Row::Rslock => "rslock".to_owned(),
        }
    }
}

/// One run of one row.
struct Run {
    /// Lock cycles per second (for `redis-benchmark`: SET/s ÷ 2).
    rate: f64,
    /// Of one whole cycle (a `MultiLock`'s: all its names); none for `redis-benchmark`.
    p50: Option<Duration>,
    client_cpu_per_cycle: Option<Duration>,
    server_cpu_per_cycle: Duration,
}

/// The section's results.
pub(crate) struct Section {
    rounds: usize,
    run: Duration,
    requests: u64,
    cells: Vec<(Row, Vec<Run>)>,
}

/// Steps of the progress bar.
pub(crate) fn steps(profile: &Profile) -> u64 {
    (profile.rounds * ROWS.len()) as u64
}

pub(crate) async fn bench(profile: &Profile, bar: &ProgressBar) -> Result<Section> {
    let server = RedisServer::start()?;
    let url = server.url();
    let dlock = Redis::connect(&url).await?;
    let rslock = rslock::LockManager::new(vec![url.clone()]);
    rslock
        .query_redis_for_key_value(b"bench:warmup")
        .await
        .map_err(|e| format!("rslock: {e}"))?;
    // About as long as one run of the others at this server's speed.
    let requests: u64 = if profile.quick { 300_000 } else { 1_000_000 };
    let mut cells: Vec<(Row, Vec<Run>)> = ROWS.iter().map(|&r| (r, Vec::new())).collect();
    // Warm-up: connections, script caches, allocator.
    run(
        &dlock,
        &rslock,
        &server,
        Row::Dlock,
        Duration::from_millis(200),
        "warm",
        requests,
    )
    .await?;
    for round in 0..profile.rounds {
        for (row, runs) in &mut cells {
            bar.set_message(format!(
                "physical limit: {} (round {})",
                row.short(),
                round + 1
            ));
            let tag = format!("r{round}");
            runs.push(
                run(
                    &dlock,
                    &rslock,
                    &server,
                    *row,
                    profile.uncontended_run,
                    &tag,
                    requests,
                )
                .await?,
            );
            bar.inc(1);
        }
    }
    Ok(Section {
        rounds: profile.rounds,
        run: profile.uncontended_run,
        requests,
        cells,
    })
}

async fn run(
    dlock: &Redis,
    rslock: &rslock::LockManager,
    server: &RedisServer,
    row: Row,
    length: Duration,
    tag: &str,
    requests: u64,
) -> Result<Run> {
    let server_cpu = CpuMeter::start(server.pid())?;
    if row == Row::SetBenchmark {
        let started = Instant::now();
        let sets = redis_benchmark(server.port(), requests)?;
        let elapsed = started.elapsed().as_secs_f64();
        let cycles = sets * elapsed / 2.0;
        return Ok(Run {
            rate: sets / 2.0,
            p50: None,
            client_cpu_per_cycle: None,
            server_cpu_per_cycle: Duration::from_secs_f64(
                server_cpu.cpu_seconds()? / cycles.max(1.0),
            ),
        });
    }
    let client_cpu = CpuMeter::start(None)?;
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let mut handles = Vec::new();
    let (tasks, per_cycle) = match row {
        Row::Multi(n) => (n, NAMES as u64),
        _ => (TASKS, 1),
    };
    for t in 0..tasks {
        let stop = Arc::clone(&stop);
        let name = format!("bench:p:{}:{tag}:{t}", row.short());
        let handle = match row {
            Row::Dlock => {
                let lock = Lock::builder(dlock.clone(), name).ttl(TTL).build()?;
                tokio::spawn(async move {
                    let mut lat = Latencies::new();
                    while !stop.load(Ordering::Relaxed) {
                        let start = Instant::now();
                        lock.lock().await?.release().await?;
                        lat.record(start.elapsed());
                    }
                    Ok::<_, crate::BoxError>(lat)
                })
            }
            Row::Multi(_) => {
                let mut builder = MultiLock::new();
                for i in 0..NAMES {
                    builder = builder.with(
                        Lock::builder(dlock.clone(), format!("{name}:{i}"))
                            .ttl(TTL)
                            .build()?,
                    );
                }
                let multi = builder.build()?;
                tokio::spawn(async move {
                    let mut lat = Latencies::new();
                    while !stop.load(Ordering::Relaxed) {
                        let start = Instant::now();
                        multi.lock().await?.release().await?;
                        lat.record(start.elapsed());
                    }
                    Ok(lat)
                })
            }
            Row::Rslock => {
                let manager = rslock.clone();
                tokio::spawn(async move {
                    let mut lat = Latencies::new();
                    while !stop.load(Ordering::Relaxed) {
                        let start = Instant::now();
                        let lock = manager
                            .lock(name.as_bytes(), TTL)
                            .await
                            .map_err(|e| format!("rslock lock of a private key failed: {e}"))?;
                        manager.unlock(&lock).await;
                        lat.record(start.elapsed());
                    }
                    Ok(lat)
                })
            }
            Row::SetBenchmark => unreachable!("handled above"),
        };
        handles.push(handle);
    }
    tokio::time::sleep(length).await;
    stop.store(true, Ordering::Relaxed);
    let mut latencies = Latencies::new();
    for h in handles {
        latencies.merge(&h.await??);
    }
    let elapsed = started.elapsed().as_secs_f64();
    let cycles = (latencies.len() * per_cycle).max(1) as f64;
    Ok(Run {
        rate: cycles / elapsed,
        p50: Some(latencies.quantile(0.5)),
        client_cpu_per_cycle: Some(Duration::from_secs_f64(client_cpu.cpu_seconds()? / cycles)),
        server_cpu_per_cycle: Duration::from_secs_f64(server_cpu.cpu_seconds()? / cycles),
    })
}

/// `SET`s per second from `redis-benchmark -t set -P 16 -n <requests> --csv` against the
/// server on `port` (its defaults otherwise: 50 connections, 3-byte values).
fn redis_benchmark(port: u16, requests: u64) -> Result<f64> {
    let out = std::process::Command::new("redis-benchmark")
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-t",
            "set",
            "-P",
            "16",
        ])
        .args(["-n", &requests.to_string(), "--csv"])
        .output()
        .map_err(|e| format!("cannot run redis-benchmark: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "redis-benchmark failed: {}",
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| {
            let mut fields = l.split(',').map(|f| f.trim_matches('"'));
            (fields.next() == Some("SET")).then(|| fields.next()?.parse::<f64>().ok())?
        })
        .ok_or_else(|| format!("no SET line in redis-benchmark's output: {text}").into())
}

impl Section {
    fn median_of(&self, row: Row, f: impl Fn(&Run) -> Option<f64>) -> Option<f64> {
        let (_, runs) = self.cells.iter().find(|(r, _)| *r == row)?;
        let values: Vec<f64> = runs.iter().filter_map(f).collect();
        (!values.is_empty()).then(|| measure::median(&values))
    }

    pub(crate) fn markdown(&self) -> String {
        let mut md = format!(
            "\n## The physical limit: many locks on one client\n\n\
             One client holding and releasing many independent locks at once, beside the \
             server's own load generator on the same `redis-server` in the same rounds: \
             `redis-benchmark -h 127.0.0.1 -p <port> -t set -P 16 -n {}` (50 connections, \
             16 requests in flight on each). A lock cycle writes the lock key twice (grant, \
             release), so its SET/s are halved to count lock cycles. dlock: one `Redis` \
             client, one multiplexed connection, default options (30 s ttl, watchdog on); \
             every task's requests are written to the connection as they are made, \
             without waiting for the replies of the others (pipelined). \"In flight\" = \
             cycles/s × p50 (Little's law): the cycles that overlap. A `MultiLock` asks \
             for all its names at once (pipelined) and releases them all at once; its \
             cycles are counted per name and its p50 is of all {NAMES} names. Median of {} runs of {:.1} s.\n\n\
             | client | lock cycles/s | × redis-benchmark | p50 | in flight | client CPU/cycle | redis CPU/cycle |\n\
             |---|---:|---:|---:|---:|---:|---:|\n",
            self.requests,
            self.rounds,
            self.run.as_secs_f64()
        );
        let base = self.median_of(Row::SetBenchmark, |r| Some(r.rate));
        for row in ROWS {
            let rate = self.median_of(row, |r| Some(r.rate)).unwrap_or(f64::NAN);
            let p50 = self.median_of(row, |r| r.p50.map(|d| d.as_secs_f64()));
            let per_cycle = match row {
                Row::Multi(_) => NAMES as f64,
                _ => 1.0,
            };
            let cpu =
                |secs: Option<f64>| secs.map_or("–".to_owned(), |s| format!("{:.1} µs", s * 1e6));
            md.push_str(&format!(
                "| {} | {} | {} | {} | {} | {} | {} |\n",
                row.label(),
                fmt_rate(rate),
                base.map_or("–".to_owned(), |b| format!("{:.2}×", rate / b)),
                p50.map_or("–".to_owned(), |s| fmt_dur(Duration::from_secs_f64(s))),
                p50.map_or("–".to_owned(), |s| format!("{:.0}", rate / per_cycle * s)),
                cpu(self.median_of(row, |r| { r.client_cpu_per_cycle.map(|d| d.as_secs_f64()) })),
                cpu(self.median_of(row, |r| Some(r.server_cpu_per_cycle.as_secs_f64()))),
            ));
        }
        md
    }
}
