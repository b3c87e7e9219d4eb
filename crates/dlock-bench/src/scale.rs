//! Many leases and many waiters: the watchdog's cost at 1k–100k held leases (plain locks,
//! or a mix of every primitive on one client), and client memory per held lock and per
//! waiter.

use std::time::{Duration, Instant};

use dlock_test::server::RedisServer;
use fencelock::backend::Redis;
use fencelock::raw::RawLock;
use fencelock::{
    FairGuard, FairLock, Lock, LockGuard, Owner, ReadGuard, ReentrantGuard, ReentrantLock, RwLock,
    Semaphore, SemaphorePermit, WriteGuard,
};
use indicatif::ProgressBar;
use redis::aio::ConnectionManager;

use crate::measure::{self, CpuMeter};
use crate::report::{fmt_bytes, fmt_dur, fmt_rate};
use crate::targets::{Goal, Targets};
use crate::{Profile, Result};

/// What the leases of one watchdog run are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mix {
    /// Plain `Lock`s only.
    Locks,
    /// A fifth each of plain locks, semaphore permits, reentrant holds, read-write holds
    /// (reads and writes alternately) and fair locks, every one on a name of its own.
    Mixed,
}

/// Permits of each semaphore of a mixed run (one of them is held).
const MIXED_PERMITS: u32 = 2;

/// One held lease of any primitive.
enum Held {
    Lock(LockGuard<Redis>),
    Permit(SemaphorePermit<Redis>),
    Reentrant(ReentrantGuard<Redis>),
    Read(ReadGuard<Redis>),
    Write(WriteGuard<Redis>),
    Fair(FairGuard<Redis>),
}

impl Held {
    fn is_lost(&self) -> bool {
        match self {
            Held::Lock(g) => g.is_lost(),
            Held::Permit(g) => g.is_lost(),
            Held::Reentrant(g) => g.is_lost(),
            Held::Read(g) => g.is_lost(),
            Held::Write(g) => g.is_lost(),
            Held::Fair(g) => g.is_lost(),
        }
    }

    /// Stops renewing without a release round trip.
    fn forget(self) {
        match self {
            Held::Lock(g) => g.forget(),
            Held::Permit(g) => g.forget(),
            Held::Reentrant(g) => g.forget(),
            Held::Read(g) => g.forget(),
            Held::Write(g) => g.forget(),
            Held::Fair(g) => g.forget(),
        }
    }
}

/// Takes lease `i` of a mixed run: kind `i % 5`, on a name of its own (`{tag}:{kind}:{i}`).
async fn take_mixed(redis: &Redis, i: usize, ttl: Duration, tag: &str) -> Result<Held> {
    let name = |kind: &str| format!("{tag}:{kind}:{i}");
    let busy = |name: String| move || format!("{name} is held by someone else");
    Ok(match i % 5 {
        0 => {
            let lock = Lock::builder(redis.clone(), name("lock"))
                .ttl(ttl)
                .build()?;
            Held::Lock(lock.try_lock().await?.ok_or_else(busy(name("lock")))?)
        }
        1 => {
            let sem = Semaphore::builder(redis.clone(), name("sem"), MIXED_PERMITS)
                .ttl(ttl)
                .build()?;
            Held::Permit(sem.try_acquire().await?.ok_or_else(busy(name("sem")))?)
        }
        2 => {
            let lock = ReentrantLock::builder(redis.clone(), name("re"))
                .ttl(ttl)
                .build()?;
            let owner = Owner::new(format!("o{i}"))?;
            Held::Reentrant(lock.try_lock(&owner).await?.ok_or_else(busy(name("re")))?)
        }
        3 => {
            let rw = RwLock::builder(redis.clone(), name("rw"))
                .ttl(ttl)
                .build()?;
            if (i / 5).is_multiple_of(2) {
                Held::Read(rw.try_read().await?.ok_or_else(busy(name("rw")))?)
            } else {
                Held::Write(rw.try_write().await?.ok_or_else(busy(name("rw")))?)
            }
        }
        _ => {
            let fair = FairLock::builder(redis.clone(), name("fair"))
                .ttl(ttl)
                .build()?;
            Held::Fair(fair.try_lock().await?.ok_or_else(busy(name("fair")))?)
        }
    })
}

/// Takes `n` leases on one client, `ACQUIRE_TASKS` at a time: plain locks `{tag}:{i}`, or
/// mixed ones (see [`take_mixed`]).
async fn acquire_leases(
    redis: &Redis,
    n: usize,
    ttl: Duration,
    tag: &str,
    mix: Mix,
) -> Result<Vec<Held>> {
    if mix == Mix::Locks {
        let guards = acquire_dlock(redis, n, ttl, tag).await?;
        return Ok(guards.into_iter().map(Held::Lock).collect());
    }
    let mut handles = Vec::with_capacity(ACQUIRE_TASKS);
    for k in 0..ACQUIRE_TASKS {
        let redis = redis.clone();
        let tag = tag.to_owned();
        handles.push(tokio::spawn(async move {
            let mut held = Vec::new();
            for i in (k..n).step_by(ACQUIRE_TASKS) {
                held.push(take_mixed(&redis, i, ttl, &tag).await?);
            }
            Result::Ok(held)
        }));
    }
    let mut all = Vec::with_capacity(n);
    for h in handles {
        all.extend(h.await??);
    }
    Ok(all)
}

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
                // The plain lock, watchdog on (the default, spelled out: the per-lock heap
                // figure includes the lease's renewal entry).
                let lock = Lock::builder(redis.clone(), format!("{tag}:{i}"))
                    .ttl(ttl)
                    .watchdog(true)
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
    mix: Mix,
    window: Duration,
    acquire_time: Duration,
    renewals_per_s: f64,
    client_cpu: f64,
    server_cpu: f64,
    rss: u64,
    heap_per_lease: f64,
    lost: usize,
    /// Renewal tasks the client started in its life (one expected: it never went idle).
    tasks_started: u64,
    /// Leases renewed per batch over the window (from the engine's counters).
    per_batch: f64,
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
    for &(n, ttl, mix) in &profile.lease_runs {
        bar.set_message(format!(
            "watchdog: holding {n} leases ({mix:?}), ttl {ttl:?}"
        ));
        flush(&mut admin).await?;
        let redis = Redis::connect(&url).await?;
        let heap_before = measure::live_heap();
        let started = Instant::now();
        let guards = acquire_leases(&redis, n, ttl, &format!("w{n}:{mix:?}"), mix).await?;
        let acquire_time = started.elapsed();
        // Let the renewal schedule reach its steady state before measuring.
        tokio::time::sleep(ttl / 3 + Duration::from_millis(500)).await;

        let engine_before = redis.engine().stats();
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
        let engine = redis.engine().stats();
        let batches = engine
            .renewal_batches
            .saturating_sub(engine_before.renewal_batches);
        let renewed = engine.renewals.saturating_sub(engine_before.renewals);
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
            mix,
            window,
            acquire_time,
            renewals_per_s: calls as f64 / window.as_secs_f64(),
            client_cpu,
            server_cpu,
            rss,
            heap_per_lease: heap as f64 / n as f64,
            lost,
            tasks_started: engine.renewal_tasks_started,
            per_batch: renewed as f64 / batches.max(1) as f64,
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

    /// The row 8: 100 000 leases of mixed primitives on one client at ttl 30 s.
    pub(crate) fn targets(&self, targets: &mut Targets) {
        const LEASES: usize = 100_000;
        const TTL: Duration = Duration::from_secs(30);
        const TARGET: &str = "0 lost, < 5 % of a core, one renewal task";
        let what = "100 000 mixed leases, one client, ttl 30 s";
        let Some(r) = self
            .runs
            .iter()
            .find(|r| r.mix == Mix::Mixed && r.leases == LEASES && r.ttl == TTL)
        else {
            let shown = self
                .runs
                .iter()
                .rfind(|r| r.mix == Mix::Mixed)
                .map(|r| {
                    format!(
                        "{} mixed at ttl {} s instead: {} lost, client CPU {:.1} %, {} renewal \
                         task(s)",
                        fmt_rate(r.leases as f64),
                        r.ttl.as_secs(),
                        r.lost,
                        r.client_cpu,
                        r.tasks_started
                    )
                })
                .unwrap_or_default();
            targets.not_judged(8, what, shown, TARGET, "not in this profile's lease runs");
            return;
        };
        targets.judge(
            8,
            format!("{what}: lost leases"),
            Some(r.lost as f64),
            format!("{} of {}", r.lost, fmt_rate(r.leases as f64)),
            Goal::Exactly(0.0),
            "0",
        );
        targets.judge(
            8,
            format!("{what}: client CPU"),
            Some(r.client_cpu),
            format!(
                "{:.1} % of a core (redis-server {:.1} %)",
                r.client_cpu, r.server_cpu
            ),
            Goal::Below(5.0),
            "< 5 % of a core",
        );
        targets.judge(
            8,
            format!("{what}: renewal tasks started"),
            Some(r.tasks_started as f64),
            format!(
                "{} ({:.0} renewals per batch)",
                r.tasks_started, r.per_batch
            ),
            Goal::Exactly(1.0),
            "1",
        );
    }

    /// The section's Markdown table.
    pub(crate) fn markdown(&self) -> String {
        let mut md = String::from(
            "\n## 4. Watchdog scale\n\n\
             One dlock client holds N leases at once under its engine's one renewal task, \
             which renews each every ttl/3 (ttl 3 s: every second, ten times as often as at \
             the default 30 s ttl), leases falling due together in one pipelined batch. \
             *mixed* = a fifth each of plain locks, semaphore permits (one of \
             2), reentrant holds, read-write holds (reads and writes alternately) and fair \
             locks, every one on a name of its own, all on the one client. Renewals counted \
             on the server (`INFO commandstats`, `EVALSHA` calls) over the window, which \
             starts after one renewal period of settling; CPU from `/proc/<pid>/stat` over \
             the same window (100 % = one core); heap from a counting allocator (everything \
             the client allocated for the leases, including the engine's registry and the \
             guards); lost = guards whose `is_lost()` is true at the end; renewal tasks = \
             the client's `engine().stats().renewal_tasks_started` at the end (1: one task \
             renewed everything), renewals per batch = leases renewed / batches sent over \
             the window (engine counters).\n\n\
             | leases | ttl | acquire all | window | renewals/s | needed/s | client CPU | \
             redis-server CPU | client CPU per renewal | client heap per lease | process RSS \
             | lost | renewal tasks | renewals per batch |\n\
             |---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        );
        for r in &self.runs {
            md.push_str(&format!(
                "| {}{} | {} s | {} | {:.0} s | {} | {} | {:.1} % | {:.1} % | {:.2} µs | {} | {} | {} | {} | {:.0} |\n",
                fmt_rate(r.leases as f64),
                if r.mix == Mix::Mixed { " mixed" } else { "" },
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
                r.tasks_started,
                r.per_batch,
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

/// The target for the client heap per held lock, in bytes.
const HEAP_PER_LOCK_TARGET: f64 = 400.0;

impl MemorySection {
    /// The row 9: client heap per held plain `Lock` (watchdog on).
    pub(crate) fn targets(&self, targets: &mut Targets) {
        targets.judge(
            9,
            format!(
                "client heap per held `Lock` (watchdog on, {} locks)",
                fmt_rate(self.locks as f64)
            ),
            Some(self.dlock_per_lock),
            format!(
                "{} (rslock {})",
                fmt_bytes(self.dlock_per_lock),
                fmt_bytes(self.rslock_per_lock)
            ),
            Goal::AtMost(HEAP_PER_LOCK_TARGET),
            "≤ 400 B",
        );
    }

    /// The section's Markdown table.
    pub(crate) fn markdown(&self) -> String {
        format!(
            "\n## 5. Client memory\n\n\
             Heap bytes the client allocated, from a counting global allocator, divided by \
             the number of locks or waiters (one client, one connection; dlock's held lock \
             is the plain `Lock` with default options, 30 s ttl and watchdog on, and its \
             figure includes the guard, the lease and its renewal entry; rslock does not \
             renew). Waiters are parked on one held name and counted after {:.1} s.\n\n\
             | | **dlock** | rslock 0.10 | target (dlock) |\n\
             |---|---:|---:|---:|\n\
             | per held lock ({} locks) | {} | {} | ≤ {} |\n\
             | per waiter (dlock {} waiters, rslock {}) | {} | {} | – |\n",
            SETTLE.as_secs_f64(),
            fmt_rate(self.locks as f64),
            fmt_bytes(self.dlock_per_lock),
            fmt_bytes(self.rslock_per_lock),
            fmt_bytes(HEAP_PER_LOCK_TARGET),
            fmt_rate(self.dlock_waiters as f64),
            fmt_rate(self.rslock_waiters as f64),
            fmt_bytes(self.dlock_per_waiter),
            fmt_bytes(self.rslock_per_waiter),
        )
    }
}
