//! Many leases and many waiters: the watchdog's cost at 1k–100k held leases, and client
//! memory per held lock and per waiter.

use std::time::{Duration, Instant};

use dlock::backend::Redis;
use dlock::{Lock, LockGuard};
use dlock_test::server::RedisServer;
use indicatif::ProgressBar;
use redis::aio::ConnectionManager;

use crate::measure::{self, CpuMeter};
use crate::report::{fmt_bytes, fmt_dur, fmt_rate};
use crate::{Profile, Result};

/// Acquires in flight at once while taking many locks.
const ACQUIRE_TASKS: usize = 64;

async fn flush(admin: &mut ConnectionManager) -> Result<()> {
    let _: String = redis::cmd("FLUSHALL").query_async(admin).await?;
    Ok(())
}

/// Takes `n` distinct locks `{tag}:{i}` on one client, `ACQUIRE_TASKS` at a time. The
/// returned vector is allocated here, so a heap measurement around the call includes it.
async fn acquire_dlock(
    redis: &Redis,
    n: usize,
    ttl: Duration,
    tag: &str,
) -> Result<Vec<LockGuard<Redis>>> {
    let mut handles = Vec::with_capacity(ACQUIRE_TASKS);
    for k in 0..ACQUIRE_TASKS {
        let redis = redis.clone();
        let tag = tag.to_owned();
        handles.push(tokio::spawn(async move {
            let mut guards = Vec::new();
            for i in (k..n).step_by(ACQUIRE_TASKS) {
                let lock = Lock::builder(redis.clone(), format!("{tag}:{i}"))
                    .ttl(ttl)
                    .build()?;
                let guard = lock
                    .try_lock()
                    .await?
                    .ok_or_else(|| format!("lock {tag}:{i} is held by someone else"))?;
                guards.push(guard);
            }
            Result::Ok(guards)
        }));
    }
    let mut all = Vec::with_capacity(n);
    for h in handles {
        all.extend(h.await??);
    }
    Ok(all)
}

/// As [`acquire_dlock`], with rslock (which does not renew).
async fn acquire_rslock(
    manager: &rslock::LockManager,
    n: usize,
    ttl: Duration,
    tag: &str,
) -> Result<Vec<rslock::Lock>> {
    let mut handles = Vec::with_capacity(ACQUIRE_TASKS);
    for k in 0..ACQUIRE_TASKS {
        let manager = manager.clone();
        let tag = tag.to_owned();
        handles.push(tokio::spawn(async move {
            let mut locks = Vec::new();
            for i in (k..n).step_by(ACQUIRE_TASKS) {
                let lock = manager
                    .lock(format!("{tag}:{i}").as_bytes(), ttl)
                    .await
                    .map_err(|e| format!("rslock lock {tag}:{i}: {e}"))?;
                locks.push(lock);
            }
            Result::Ok(locks)
        }));
    }
    let mut all = Vec::with_capacity(n);
    for h in handles {
        all.extend(h.await??);
    }
    Ok(all)
}

/// The watchdog at one lease count.
struct LeaseRun {
    leases: usize,
    ttl: Duration,
    window: Duration,
    acquire_time: Duration,
    renewals_per_s: f64,
    client_cpu: f64,
    server_cpu: f64,
    rss: u64,
    heap_per_lease: f64,
    lost: usize,
}

/// The watchdog section's results.
pub(crate) struct WatchdogSection {
    runs: Vec<LeaseRun>,
}

/// Holds 1k, 10k (and 100k) leases under dlock's watchdog and watches it renew them.
pub(crate) async fn watchdog(profile: &Profile, bar: &ProgressBar) -> Result<WatchdogSection> {
    let server = RedisServer::start()?;
    let url = server.url();
    let mut admin = measure::connection_manager(&url).await?;
    let mut runs = Vec::new();
    for &(n, ttl) in &profile.lease_runs {
        bar.set_message(format!("watchdog: holding {n} leases, ttl {ttl:?}"));
        flush(&mut admin).await?;
        let redis = Redis::connect(&url).await?;
        let heap_before = measure::live_heap();
        let started = Instant::now();
        let guards = acquire_dlock(&redis, n, ttl, &format!("w{n}")).await?;
        let acquire_time = started.elapsed();
        // Let the renewal schedule reach its steady state before measuring.
        tokio::time::sleep(ttl / 3 + Duration::from_millis(500)).await;

        let calls_before = measure::command_calls(&mut admin, "evalsha").await?;
        let client_cpu = CpuMeter::start(None)?;
        let server_cpu = CpuMeter::start(server.pid())?;
        let window_start = Instant::now();
        tokio::time::sleep(profile.watch_window.max(ttl / 3 * 2)).await;
        let calls = measure::command_calls(&mut admin, "evalsha")
            .await?
            .saturating_sub(calls_before);
        let window = window_start.elapsed();
        let client_cpu = client_cpu.percent()?;
        let server_cpu = server_cpu.percent()?;
        let heap = measure::live_heap() - heap_before;
        let rss = measure::rss_bytes()?;
        let lost = guards.iter().filter(|g| g.is_lost()).count();
        if lost > 0 {
            bar.println(format!(
                "LOST: {lost} of {n} leases held under the watchdog were lost"
            ));
        }
        runs.push(LeaseRun {
            leases: n,
            ttl,
            window,
            acquire_time,
            renewals_per_s: calls as f64 / window.as_secs_f64(),
            client_cpu,
            server_cpu,
            rss,
            heap_per_lease: heap as f64 / n as f64,
            lost,
        });
        // Stop renewing without n release round trips; the flush deletes the keys.
        for guard in guards {
            guard.forget();
        }
        drop(redis);
        flush(&mut admin).await?;
        bar.inc(1);
    }
    drop(server);
    Ok(WatchdogSection { runs })
}

impl WatchdogSection {
    /// Whether every lease was kept.
    pub(crate) fn all_kept(&self) -> bool {
        self.runs.iter().all(|r| r.lost == 0)
    }

    /// The section's Markdown table.
    pub(crate) fn markdown(&self) -> String {
        let mut md = String::from(
            "\n## 4. Watchdog scale\n\n\
             One dlock client holds N leases at once under its watchdog, which renews each \
             every ttl/3 (ttl 3 s: every second, ten times as often as at the default 30 s \
             ttl). Renewals counted on the server (`INFO commandstats`, `EVALSHA` calls) over \
             the window, which starts after one renewal period of settling; CPU from \
             `/proc/<pid>/stat` over the same window (100 % = one core); heap from a counting \
             allocator (everything the client allocated for the leases, including the \
             watchdog's registry and the guards); lost = guards whose `is_lost()` is true at \
             the end.\n\n\
             | leases | ttl | acquire all | window | renewals/s | needed/s | client CPU | \
             redis-server CPU | client CPU per renewal | client heap per lease | process RSS \
             | lost |\n\
             |---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        );
        for r in &self.runs {
            md.push_str(&format!(
                "| {} | {} s | {} | {:.0} s | {} | {} | {:.1} % | {:.1} % | {:.2} µs | {} | {} | {} |\n",
                fmt_rate(r.leases as f64),
                r.ttl.as_secs(),
                fmt_dur(r.acquire_time),
                r.window.as_secs_f64(),
                fmt_rate(r.renewals_per_s),
                fmt_rate(r.leases as f64 / (r.ttl.as_secs_f64() / 3.0)),
                r.client_cpu,
                r.server_cpu,
                r.client_cpu / 100.0 / r.renewals_per_s.max(1.0) * 1e6,
                fmt_bytes(r.heap_per_lease),
                fmt_bytes(r.rss as f64),
                r.lost,
            ));
        }
        md
    }
}

/// The memory section's results.
pub(crate) struct MemorySection {
    locks: usize,
    dlock_per_lock: f64,
    rslock_per_lock: f64,
    dlock_waiters: usize,
    dlock_per_waiter: f64,
    rslock_waiters: usize,
    rslock_per_waiter: f64,
}

/// rslock waiters poll the server; more than this would only measure a saturated server.
const RSLOCK_WAITERS: usize = 1_000;
/// Lease length of the memory measurements.
const MEMORY_TTL: Duration = Duration::from_secs(30);
/// How long parked waiters get to settle before their memory is counted.
const SETTLE: Duration = Duration::from_millis(1_500);

/// Client heap bytes per held lock and per waiter, dlock beside rslock.
pub(crate) async fn memory(profile: &Profile, bar: &ProgressBar) -> Result<MemorySection> {
    let server = RedisServer::start()?;
    let url = server.url();
    let mut admin = measure::connection_manager(&url).await?;
    let n = profile.memory_locks;

    bar.set_message(format!("memory: dlock, {n} held locks"));
    let redis = Redis::connect(&url).await?;
    let before = measure::live_heap();
    let guards = acquire_dlock(&redis, n, MEMORY_TTL, "m").await?;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let dlock_per_lock = (measure::live_heap() - before) as f64 / n as f64;
    for guard in guards {
        guard.forget();
    }
    drop(redis);
    flush(&mut admin).await?;
    bar.inc(1);

    bar.set_message(format!("memory: rslock, {n} held locks"));
    let manager = rslock::LockManager::new(vec![url.clone()]);
    manager
        .query_redis_for_key_value(b"bench:warmup")
        .await
        .map_err(|e| format!("rslock: {e}"))?;
    let before = measure::live_heap();
    let locks = acquire_rslock(&manager, n, MEMORY_TTL, "mr").await?;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let rslock_per_lock = (measure::live_heap() - before) as f64 / n as f64;
    drop(locks);
    flush(&mut admin).await?;
    bar.inc(1);

    let w = profile.memory_waiters;
    bar.set_message(format!("memory: dlock, {w} waiters"));
    let redis = Redis::connect(&url).await?;
    let holder = Lock::builder(redis.clone(), "mem:hot")
        .ttl(MEMORY_TTL)
        .build()?
        .lock()
        .await?;
    let before = measure::live_heap();
    let mut tasks = Vec::with_capacity(w);
    for _ in 0..w {
        let lock = Lock::builder(redis.clone(), "mem:hot")
            .ttl(MEMORY_TTL)
            .build()?;
        tasks.push(tokio::spawn(async move { lock.lock().await.map(drop) }));
    }
    tokio::time::sleep(SETTLE).await;
    let dlock_per_waiter = (measure::live_heap() - before) as f64 / w as f64;
    for t in &tasks {
        t.abort();
    }
    for t in tasks {
        if let Ok(Ok(())) = t.await {
            return Err("a dlock waiter got a lock that was held all along".into());
        }
    }
    holder.release().await?;
    drop(redis);
    flush(&mut admin).await?;
    bar.inc(1);

    let wr = RSLOCK_WAITERS.min(w);
    bar.set_message(format!("memory: rslock, {wr} waiters"));
    let holder = manager
        .lock(b"mem:hot", MEMORY_TTL)
        .await
        .map_err(|e| format!("rslock: {e}"))?;
    let before = measure::live_heap();
    let mut tasks = Vec::with_capacity(wr);
    for _ in 0..wr {
        let manager = manager.clone();
        tasks.push(tokio::spawn(async move {
            manager.acquire(b"mem:hot", MEMORY_TTL).await.map(drop)
        }));
    }
    tokio::time::sleep(SETTLE).await;
    let rslock_per_waiter = (measure::live_heap() - before) as f64 / wr as f64;
    for t in &tasks {
        t.abort();
    }
    for t in tasks {
        let _ = t.await;
    }
    manager.unlock(&holder).await;
    flush(&mut admin).await?;
    bar.inc(1);
    drop(server);

    Ok(MemorySection {
        locks: n,
        dlock_per_lock,
        rslock_per_lock,
        dlock_waiters: w,
        dlock_per_waiter,
        rslock_waiters: wr,
        rslock_per_waiter,
    })
}

impl MemorySection {
    /// The section's Markdown table.
    pub(crate) fn markdown(&self) -> String {
        format!(
            "\n## 5. Client memory\n\n\
             Heap bytes the client allocated, from a counting global allocator, divided by \
             the number of locks or waiters (one client, one connection; dlock's figure per \
             held lock includes the guard, the lease and its watchdog entry; rslock does not \
             renew). Waiters are parked on one held name and counted after {:.1} s.\n\n\
             | | **dlock** | rslock 0.10 |\n\
             |---|---:|---:|\n\
             | per held lock ({} locks) | {} | {} |\n\
             | per waiter (dlock {} waiters, rslock {}) | {} | {} |\n",
            SETTLE.as_secs_f64(),
            fmt_rate(self.locks as f64),
            fmt_bytes(self.dlock_per_lock),
            fmt_bytes(self.rslock_per_lock),
            fmt_rate(self.dlock_waiters as f64),
            fmt_rate(self.rslock_waiters as f64),
            fmt_bytes(self.dlock_per_waiter),
            fmt_bytes(self.rslock_per_waiter),
        )
    }
}
