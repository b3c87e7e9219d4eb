//! Uncontended acquire + release cycles: each task locks and unlocks its own name as fast
//! as it can, all tasks of a client sharing one connection.
//!
//! * **limit**: the two round trips done with bare redis-rs commands on a
//!   `ConnectionManager` (dlock's connection type): `SET key token NX PX ttl`, then
//!   `EVALSHA` of a compare-and-delete script. No token generation, no bookkeeping: the
//!   cost of the round trips alone.
//! * **dlock**: `lock()` then `release()`, default options (30 s ttl, watchdog on).
//! * **dlock, watchdog off**: the same without lease renewal, to show what the watchdog's
//!   bookkeeping costs.
//! * **rslock**: `LockManager::lock` then `unlock` on one server.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use dlock_test::server::RedisServer;
use fencelock::Lock;
use fencelock::backend::Redis;
use indicatif::ProgressBar;
use redis::aio::ConnectionManager;

use crate::measure::{self, CpuMeter, Latencies};
use crate::report::{fmt_dur, fmt_rate, fmt_ratio};
use crate::svg::{self, Panel, Series};
use crate::targets::{Goal, Targets, ratio_text, tasks_text};
use crate::{Profile, Result};

/// The clients compared, in table order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Client {
    /// Bare redis-rs commands.
    Limit,
    /// dlock with its defaults.
    Dlock,
    /// dlock without the watchdog.
    DlockNoWatchdog,
    /// The rslock crate.
    Rslock,
}

/// Every client, in the order they run within a round.
pub(crate) const CLIENTS: [Client; 4] = [
    Client::Limit,
    Client::Dlock,
    Client::DlockNoWatchdog,
    Client::Rslock,
];

impl Client {
    fn label(self) -> &'static str {
        match self {
            Client::Limit => "limit (bare SET NX PX + EVALSHA)",
            Client::Dlock => "**dlock**",
            Client::DlockNoWatchdog => "dlock, watchdog off",
            Client::Rslock => "rslock 0.10",
        }
    }

    fn color(self) -> &'static str {
        match self {
            Client::Limit => "#666666",
            Client::Dlock => "#1f77b4",
            Client::DlockNoWatchdog => "#17becf",
            Client::Rslock => "#d62728",
        }
    }

    fn short(self) -> &'static str {
        match self {
            Client::Limit => "limit",
            Client::Dlock => "dlock",
            Client::DlockNoWatchdog => "dlock (no watchdog)",
            Client::Rslock => "rslock",
        }
    }
}

/// Compare-and-delete, as every correct Redis lock releases.
const RELEASE: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";
/// Lease length for every client (dlock's default).
const TTL: Duration = Duration::from_secs(30);

struct Clients {
    server_pid: Option<u32>,
    limit: ConnectionManager,
    release_sha: String,
    dlock: Redis,
    rslock: rslock::LockManager,
}

impl Clients {
    async fn connect(url: &str, server_pid: Option<u32>) -> Result<Clients> {
        let mut limit = measure::connection_manager(url).await?;
        let release_sha: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(RELEASE)
            .query_async(&mut limit)
            .await?;
        let dlock = Redis::connect(url).await?;
        let rslock = rslock::LockManager::new(vec![url.to_owned()]);
        // rslock connects on first use: do that now, outside the measurement.
        rslock
            .query_redis_for_key_value(b"bench:warmup")
            .await
            .map_err(|e| format!("rslock: {e}"))?;
        Ok(Clients {
            server_pid,
            limit,
            release_sha,
            dlock,
            rslock,
        })
    }
}

/// One run of one client at one concurrency.
struct Run {
    rate: f64,
    p50: Duration,
    p99: Duration,
    allocs_per_cycle: f64,
    client_cpu_per_cycle: Duration,
    server_cpu_per_cycle: Duration,
    latencies: Latencies,
}

/// All runs of one client at one concurrency.
struct Cell {
    client: Client,
    tasks: usize,
    runs: Vec<Run>,
}

impl Cell {
    fn rate(&self) -> f64 {
        measure::median(&self.runs.iter().map(|r| r.rate).collect::<Vec<_>>())
    }
    fn p50(&self) -> Duration {
        measure::median_duration(&self.runs.iter().map(|r| r.p50).collect::<Vec<_>>())
    }
    fn p99(&self) -> Duration {
        measure::median_duration(&self.runs.iter().map(|r| r.p99).collect::<Vec<_>>())
    }
    fn allocs(&self) -> f64 {
        measure::median(
            &self
                .runs
                .iter()
                .map(|r| r.allocs_per_cycle)
                .collect::<Vec<_>>(),
        )
    }
    fn client_cpu(&self) -> Duration {
        measure::median_duration(
            &self
                .runs
                .iter()
                .map(|r| r.client_cpu_per_cycle)
                .collect::<Vec<_>>(),
        )
    }
    fn server_cpu(&self) -> Duration {
        measure::median_duration(
            &self
                .runs
                .iter()
                .map(|r| r.server_cpu_per_cycle)
                .collect::<Vec<_>>(),
        )
    }
    fn merged(&self) -> Latencies {
        let mut all = Latencies::new();
        for r in &self.runs {
            all.merge(&r.latencies);
        }
        all
    }
}

/// The uncontended section's results.
pub(crate) struct Section {
    rounds: usize,
    run: Duration,
    rtt: Duration,
    cells: Vec<Cell>,
}

/// Runs the uncontended benchmark: every round runs every client at every concurrency,
/// interleaved, so slow drifts of a shared machine hit all clients alike.
pub(crate) async fn bench(profile: &Profile, bar: &ProgressBar) -> Result<Section> {
    let server = RedisServer::start()?;
    let url = server.url();
    let clients = Clients::connect(&url, server.pid()).await?;
    let rtt = measure::round_trip(&url, 2_000).await?.quantile(0.5);

    let mut cells: Vec<Cell> = Vec::new();
    for &tasks in &profile.concurrencies {
        for client in CLIENTS {
            cells.push(Cell {
                client,
                tasks,
                runs: Vec::new(),
            });
        }
    }
    // Warm-up: connections, script caches, allocator, CPU frequency.
    for client in CLIENTS {
        run(&clients, client, 16, Duration::from_millis(200), "warm").await?;
    }
    for round in 0..profile.rounds {
        for cell in &mut cells {
            bar.set_message(format!(
                "uncontended: {} × {} tasks (round {})",
                cell.client.short(),
                cell.tasks,
                round + 1
            ));
            let tag = format!("r{round}");
            let r = run(
                &clients,
                cell.client,
                cell.tasks,
                profile.uncontended_run,
                &tag,
            )
            .await?;
            cell.runs.push(r);
            bar.inc(1);
        }
    }
    drop(clients);
    drop(server);
    Ok(Section {
        rounds: profile.rounds,
        run: profile.uncontended_run,
        rtt,
        cells,
    })
}

async fn run(
    clients: &Clients,
    client: Client,
    tasks: usize,
    length: Duration,
    tag: &str,
) -> Result<Run> {
    let stop = Arc::new(AtomicBool::new(false));
    let allocs_before = measure::allocations();
    let client_cpu = CpuMeter::start(None)?;
    let server_cpu = CpuMeter::start(clients.server_pid)?;
    let started = Instant::now();
    let mut handles = Vec::with_capacity(tasks);
    for t in 0..tasks {
        let stop = Arc::clone(&stop);
        let name = format!("bench:u:{}:{tag}:{tasks}:{t}", client.short());
        let handle = match client {
            Client::Limit => {
                let conn = clients.limit.clone();
                let sha = clients.release_sha.clone();
                // A fixed token per task (32 hex digits, like dlock's): the limit pays for
                // round trips only.
                let token = format!("{:032x}", 0x5eed_0000_0000_u128 + t as u128);
                tokio::spawn(limit_task(conn, sha, name, token, stop))
            }
            Client::Dlock | Client::DlockNoWatchdog => {
                let lock = Lock::builder(clients.dlock.clone(), name)
                    .ttl(TTL)
                    .watchdog(client == Client::Dlock)
                    .build()?;
                tokio::spawn(dlock_task(lock, stop))
            }
            Client::Rslock => tokio::spawn(rslock_task(clients.rslock.clone(), name, stop)),
        };
        handles.push(handle);
    }
    tokio::time::sleep(length).await;
    stop.store(true, Ordering::Relaxed);
    let mut latencies = Latencies::new();
    for h in handles {
        latencies.merge(&h.await??);
    }
    let elapsed = started.elapsed();
    let cycles = latencies.len().max(1);
    let per_cycle = |secs: f64| Duration::from_secs_f64(secs / cycles as f64);
    Ok(Run {
        rate: latencies.len() as f64 / elapsed.as_secs_f64(),
        p50: latencies.quantile(0.5),
        p99: latencies.quantile(0.99),
        allocs_per_cycle: measure::allocations().saturating_sub(allocs_before) as f64
            / cycles as f64,
        client_cpu_per_cycle: per_cycle(client_cpu.cpu_seconds()?),
        server_cpu_per_cycle: per_cycle(server_cpu.cpu_seconds()?),
        latencies,
    })
}

async fn limit_task(
    mut conn: ConnectionManager,
    sha: String,
    key: String,
    token: String,
    stop: Arc<AtomicBool>,
) -> Result<Latencies> {
    let mut lat = Latencies::new();
    let ttl_ms = TTL.as_millis() as u64;
    while !stop.load(Ordering::Relaxed) {
        let start = Instant::now();
        let set: Option<String> = redis::cmd("SET")
            .arg(&key)
            .arg(&token)
            .arg("NX")
            .arg("PX")
            .arg(ttl_ms)
            .query_async(&mut conn)
            .await?;
        if set.is_none() {
            return Err(format!("limit: SET NX refused on the private key {key}").into());
        }
        let deleted: i64 = redis::cmd("EVALSHA")
            .arg(&sha)
            .arg(1)
            .arg(&key)
            .arg(&token)
            .query_async(&mut conn)
            .await?;
        if deleted != 1 {
            return Err(format!("limit: compare-and-delete missed the private key {key}").into());
        }
        lat.record(start.elapsed());
    }
    Ok(lat)
}

async fn dlock_task(lock: Lock<Redis>, stop: Arc<AtomicBool>) -> Result<Latencies> {
    let mut lat = Latencies::new();
    while !stop.load(Ordering::Relaxed) {
        let start = Instant::now();
        let guard = lock.lock().await?;
        guard.release().await?;
        lat.record(start.elapsed());
    }
    Ok(lat)
}

async fn rslock_task(
    manager: rslock::LockManager,
    key: String,
    stop: Arc<AtomicBool>,
) -> Result<Latencies> {
    let mut lat = Latencies::new();
    while !stop.load(Ordering::Relaxed) {
        let start = Instant::now();
        let lock = manager
            .lock(key.as_bytes(), TTL)
            .await
            .map_err(|e| format!("rslock lock of a private key failed: {e}"))?;
        manager.unlock(&lock).await;
        lat.record(start.elapsed());
    }
    Ok(lat)
}

/// `12.3 µs`: CPU per cycle needs a decimal.
fn fmt_us(d: Duration) -> String {
    format!("{:.1} µs", d.as_secs_f64() * 1e6)
}

impl Section {
    fn cell(&self, client: Client, tasks: usize) -> Option<&Cell> {
        self.cells
            .iter()
            .find(|c| c.client == client && c.tasks == tasks)
    }

    /// The row 1: dlock (defaults: fencing and watchdog on) against rslock at 1, 16
    /// and 64 tasks.
    pub(crate) fn targets(&self, targets: &mut Targets) {
        const TARGET: &str = "≥ 1.0×";
        for tasks in [1, 16, 64] {
            let figure = format!("uncontended cycles/s × rslock, {}", tasks_text(tasks));
            match (
                self.cell(Client::Dlock, tasks),
                self.cell(Client::Rslock, tasks),
            ) {
                (Some(dlock), Some(rslock)) => targets.judge(
                    1,
                    figure,
                    Some(dlock.rate() / rslock.rate()),
                    ratio_text(dlock.rate(), rslock.rate()),
                    Goal::AtLeast(1.0),
                    TARGET,
                ),
                _ => targets.not_judged(1, figure, "", TARGET, "not in this profile's task counts"),
            }
        }
    }

    /// The section's Markdown: one table, ratios to the limit and to rslock.
    pub(crate) fn markdown(&self) -> String {
        let mut md = format!(
            "\n## 1. Uncontended acquire + release\n\n\
             Each task locks and releases its own name in a loop; all tasks of a client share \
             one connection. Median of {} runs of {:.1} s each (clients interleaved); p50/p99 \
             are of one whole acquire + release cycle (two round trips). PING round trip on \
             this connection: p50 {}.\n\n\
             CPU per cycle: the client process's and redis-server's CPU time over the run \
             divided by the cycles (both share the machine's cores).\n\n\
             | tasks | client | cycles/s | p50 | p99 | × limit | × rslock | client CPU/cycle \
             | redis CPU/cycle | allocs/cycle |\n\
             |---:|---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
            self.rounds,
            self.run.as_secs_f64(),
            fmt_dur(self.rtt),
        );
        let tasks: Vec<usize> = {
            let mut t: Vec<usize> = self.cells.iter().map(|c| c.tasks).collect();
            t.dedup();
            t
        };
        for &n in &tasks {
            let limit = self.cell(Client::Limit, n).map(Cell::rate);
            let rslock = self.cell(Client::Rslock, n).map(Cell::rate);
            for client in CLIENTS {
                let Some(cell) = self.cell(client, n) else {
                    continue;
                };
                let rate = cell.rate();
                md.push_str(&format!(
                    "| {n} | {} | {} | {} | {} | {} | {} | {} | {} | {:.1} |\n",
                    client.label(),
                    fmt_rate(rate),
                    fmt_dur(cell.p50()),
                    fmt_dur(cell.p99()),
                    fmt_ratio(rate, limit),
                    fmt_ratio(rate, rslock),
                    fmt_us(cell.client_cpu()),
                    fmt_us(cell.server_cpu()),
                    cell.allocs(),
                ));
            }
        }
        md.push_str("\n![latency CDF of one uncontended cycle](crates/dlock-bench/charts/uncontended-cdf.svg)\n");
        md
    }

    /// Latency CDFs, one panel per concurrency.
    pub(crate) fn cdf_svg(&self) -> String {
        let mut tasks: Vec<usize> = self.cells.iter().map(|c| c.tasks).collect();
        tasks.dedup();
        let panels: Vec<Panel> = tasks
            .iter()
            .map(|&n| Panel {
                title: format!("{n} task{}", if n == 1 { "" } else { "s" }),
                series: CLIENTS
                    .iter()
                    .filter_map(|&client| {
                        let cell = self.cell(client, n)?;
                        Some(Series {
                            label: client.short().to_owned(),
                            color: client.color(),
                            points: cell.merged().cdf_points(60),
                        })
                    })
                    .collect(),
            })
            .collect();
        svg::cdf_chart(
            "Uncontended acquire + release: latency CDF (all runs)",
            &panels,
        )
    }
}
