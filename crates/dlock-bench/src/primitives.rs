//! The primitives beyond the plain lock — `Semaphore`, `ReentrantLock`, `RwLock`,
//! `FairLock`, `MultiLock` — each beside the bare round trips it needs (the limit) and the
//! plain dlock `Lock` (the reference), all measured interleaved on one server in one run.
//! None of them has a peer in Rust: rslock offers a plain lock only.
//!
//! * **Uncontended, one task**: one operation's acquire + release in a loop, on a name of
//!   its own. Every primitive is one script to acquire and one to release, so its limit is
//!   two `EVALSHA`s of a script that does nothing (`return 1`); a multi-lock of three is
//!   six.
//! * **Many readers**: N tasks reading ONE `RwLock` name at once, beside the same tasks on
//!   names of their own, the plain lock and the limit at the same concurrency.
//! * **Contended hand-off**: waiters with a client each on one hot name, as in the
//!   contended section (step-aside mode): `FairLock`, whose release wakes exactly the
//!   head of its queue, beside the plain `Lock` (its waiters queue in the store too); a
//!   `Semaphore` of one permit (held to the lock's targets) and of [`PERMITS`]; and, as
//!   the limit, python-redis-lock's `BLPOP` hand-off, which wakes one waiter with bare
//!   commands.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use dlock_test::server::RedisServer;
use fencelock::backend::Redis;
use fencelock::{
    FairGuard, FairLock, Lock, MultiLock, Owner, ReentrantGuard, ReentrantLock, RwLock, Semaphore,
    SemaphorePermit,
};
use indicatif::ProgressBar;
use redis::aio::ConnectionManager;

use crate::contended::{self, Mode, Waiter};
use crate::measure::{self, CpuMeter, Latencies};
use crate::report::{fmt_dur, fmt_rate, fmt_ratio};
use crate::svg::{self, Panel, Series};
use crate::targets::{Goal, HandoffFigures, Targets, fairness_text, ratio_text};
use crate::{Profile, Result};

/// Permits of every benchmarked semaphore.
pub(crate) const PERMITS: u32 = 4;
/// Lease length of every uncontended hold (dlock's default; the watchdog is on, as by
/// default, but a run is far shorter than a renewal period).
const TTL: Duration = Duration::from_secs(30);
/// The limit's script: one key and one argument, like dlock's, and no work.
const TRIVIAL: &str = "return 1";
/// Compare-and-delete, as in the uncontended section's limit.
const RELEASE: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";

/// One uncontended operation, limit or dlock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    /// Two `EVALSHA`s of [`TRIVIAL`].
    LimitEval2,
    /// `SET NX PX` + `EVALSHA` compare-and-delete (the uncontended section's limit).
    LimitSetNx,
    /// The plain dlock lock.
    Lock,
    /// One permit of a semaphore of [`PERMITS`].
    Semaphore,
    /// A reentrant lock's first hold.
    ReentrantFirst,
    /// One more hold of a reentrant lock its owner already holds.
    ReentrantAgain,
    /// A read hold, each task on a name of its own.
    Read,
    /// A read hold, every task on one shared name.
    ReadShared,
    /// The write hold.
    Write,
    /// A fair lock.
    Fair,
    /// Six `EVALSHA`s of [`TRIVIAL`].
    LimitEval6,
    /// Three plain locks taken one after another, released in reverse.
    Lock3,
    /// A multi-lock of three plain locks.
    Multi3,
}

/// The one-task table, in run order.
pub(crate) const SINGLE: [Op; 12] = [
    Op::LimitEval2,
    Op::LimitSetNx,
    Op::Lock,
    Op::Semaphore,
    Op::ReentrantFirst,
    Op::ReentrantAgain,
    Op::Read,
    Op::Write,
    Op::Fair,
    Op::LimitEval6,
    Op::Lock3,
    Op::Multi3,
];

/// The many-readers table, in run order.
pub(crate) const READERS: [Op; 4] = [Op::LimitEval2, Op::Lock, Op::Read, Op::ReadShared];

impl Op {
    fn label(self) -> &'static str {
        match self {
            Op::LimitEval2 => "limit: 2 × `EVALSHA` of `return 1`",
            Op::LimitSetNx => "limit: `SET NX PX` + `EVALSHA` compare-and-delete (§1's limit)",
            Op::Lock => "dlock `Lock`: lock + release (reference)",
            Op::Semaphore => "`Semaphore` (4 permits): acquire + release one permit",
            Op::ReentrantFirst => "`ReentrantLock`: first lock + release",
            Op::ReentrantAgain => "`ReentrantLock`: re-entry lock + release, owner holding it",
            Op::Read => "`RwLock`: read + release",
            Op::ReadShared => "`RwLock`: read + release, every task on ONE name",
            Op::Write => "`RwLock`: write + release",
            Op::Fair => "`FairLock`: lock + release",
            Op::LimitEval6 => "limit: 6 × `EVALSHA` of `return 1`",
            Op::Lock3 => "3 dlock `Lock`s one after another, released in reverse (reference)",
            Op::Multi3 => "`MultiLock` of 3 `Lock`s: lock + release",
        }
    }

    fn short(self) -> &'static str {
        match self {
            Op::LimitEval2 => "eval2",
            Op::LimitSetNx => "setnx",
            Op::Lock => "lock",
            Op::Semaphore => "sem",
            Op::ReentrantFirst => "re1",
            Op::ReentrantAgain => "re2",
            Op::Read => "read",
            Op::ReadShared => "read1",
            Op::Write => "write",
            Op::Fair => "fair",
            Op::LimitEval6 => "eval6",
            Op::Lock3 => "lock3",
            Op::Multi3 => "multi3",
        }
    }

    /// Round trips of one cycle.
    fn round_trips(self) -> u32 {
        match self {
            Op::LimitEval6 | Op::Lock3 | Op::Multi3 => 6,
            _ => 2,
        }
    }

    /// The limit this row is divided by.
    fn limit(self) -> Op {
        if self.round_trips() == 6 {
            Op::LimitEval6
        } else {
            Op::LimitEval2
        }
    }

    /// The dlock row this one is compared with (`None`: limits and references).
    fn reference(self) -> Option<Op> {
        match self {
            Op::LimitEval2 | Op::LimitSetNx | Op::LimitEval6 | Op::Lock | Op::Lock3 => None,
            Op::Multi3 => Some(Op::Lock3),
            _ => Some(Op::Lock),
        }
    }

    fn peer(self) -> &'static str {
        match self {
            Op::LimitEval2 | Op::LimitSetNx | Op::LimitEval6 | Op::Lock3 => "",
            Op::Lock => "rslock: see §1",
            _ => "no peer in Rust",
        }
    }
}

/// One task's state for one operation.
enum Task {
    Eval {
        conn: ConnectionManager,
        sha: String,
        key: String,
        token: String,
        calls: usize,
    },
    SetNx {
        conn: ConnectionManager,
        sha: String,
        key: String,
        token: String,
    },
    Lock(Lock<Redis>),
    Locks(Vec<Lock<Redis>>),
    Semaphore(Semaphore<Redis>),
    Reentrant {
        lock: ReentrantLock<Redis>,
        owner: Owner,
        /// The hold taken before the loop, for re-entry.
        outer: Option<ReentrantGuard<Redis>>,
    },
    Read(RwLock<Redis>),
    Write(RwLock<Redis>),
    Fair(FairLock<Redis>),
    Multi(MultiLock),
}

impl Task {
    async fn cycle(&mut self) -> Result<()> {
        match self {
            Task::Eval {
                conn,
                sha,
                key,
                token,
                calls,
            } => {
                for _ in 0..*calls {
                    let _: i64 = redis::cmd("EVALSHA")
                        .arg(sha.as_str())
                        .arg(1)
                        .arg(key.as_str())
                        .arg(token.as_str())
                        .query_async(conn)
                        .await?;
                }
            }
            Task::SetNx {
                conn,
                sha,
                key,
                token,
            } => {
                let set: Option<String> = redis::cmd("SET")
                    .arg(key.as_str())
                    .arg(token.as_str())
                    .arg("NX")
                    .arg("PX")
                    .arg(TTL.as_millis() as u64)
                    .query_async(conn)
                    .await?;
                let deleted: i64 = redis::cmd("EVALSHA")
                    .arg(sha.as_str())
                    .arg(1)
                    .arg(key.as_str())
                    .arg(token.as_str())
                    .query_async(conn)
                    .await?;
                if set.is_none() || deleted != 1 {
                    return Err(format!("limit: the private key {key} was not ours").into());
                }
            }
            Task::Lock(lock) => lock.lock().await?.release().await?,
            Task::Locks(locks) => {
                let mut held = Vec::with_capacity(locks.len());
                for lock in locks.iter() {
                    held.push(lock.lock().await?);
                }
                while let Some(guard) = held.pop() {
                    guard.release().await?;
                }
            }
            Task::Semaphore(sem) => sem.acquire().await?.release().await?,
            Task::Reentrant { lock, owner, .. } => lock.lock(owner).await?.release().await?,
            Task::Read(rw) => rw.read().await?.release().await?,
            Task::Write(rw) => rw.write().await?.release().await?,
            Task::Fair(fair) => fair.lock().await?.release().await?,
            Task::Multi(multi) => multi.lock().await?.release().await?,
        }
        Ok(())
    }

    /// Gives back what the task held across its loop.
    async fn finish(self) -> Result<()> {
        if let Task::Reentrant {
            outer: Some(outer), ..
        } = self
        {
            outer.release().await?;
        }
        Ok(())
    }
}

/// The section's server and clients.
struct Clients {
    url: String,
    server_pid: Option<u32>,
    admin: ConnectionManager,
    /// The limits' connection (one per client, as dlock's).
    limit: ConnectionManager,
    trivial_sha: String,
    release_sha: String,
    blpop_sha: String,
    dlock: Redis,
}

impl Clients {
    /// The task state of task `t` of `tasks` running `op` in the run tagged `tag`.
    async fn task(&self, op: Op, tasks: usize, t: usize, tag: &str) -> Result<Task> {
        let name = format!("bench:p:{}:{tag}:{tasks}:{t}", op.short());
        let token = format!("{:032x}", 0x9e11_0000_0000_u128 + t as u128);
        let redis = self.dlock.clone();
        Ok(match op {
            Op::LimitEval2 | Op::LimitEval6 => Task::Eval {
                conn: self.limit.clone(),
                sha: self.trivial_sha.clone(),
                key: name,
                token,
                calls: op.round_trips() as usize,
            },
            Op::LimitSetNx => Task::SetNx {
                conn: self.limit.clone(),
                sha: self.release_sha.clone(),
                key: name,
                token,
            },
            Op::Lock => Task::Lock(Lock::builder(redis, name).ttl(TTL).build()?),
            Op::Lock3 => Task::Locks(three_locks(&redis, &name)?),
            Op::Multi3 => {
                let mut builder = MultiLock::new();
                for lock in three_locks(&redis, &name)? {
                    builder = builder.with(lock);
                }
                Task::Multi(builder.build()?)
            }
            Op::Semaphore => {
                Task::Semaphore(Semaphore::builder(redis, name, PERMITS).ttl(TTL).build()?)
            }
            Op::ReentrantFirst | Op::ReentrantAgain => {
                let lock = ReentrantLock::builder(redis, name).ttl(TTL).build()?;
                let owner = Owner::new(format!("task-{t}"))?;
                let outer = if op == Op::ReentrantAgain {
                    Some(lock.lock(&owner).await?)
                } else {
                    None
                };
                Task::Reentrant { lock, owner, outer }
            }
            Op::Read => Task::Read(RwLock::builder(redis, name).ttl(TTL).build()?),
            Op::ReadShared => {
                return Err("shared readers are made from one lock, in `run`".into());
            }
            Op::Write => Task::Write(RwLock::builder(redis, name).ttl(TTL).build()?),
            Op::Fair => Task::Fair(FairLock::builder(redis, name).ttl(TTL).build()?),
        })
    }
}

fn three_locks(redis: &Redis, name: &str) -> Result<Vec<Lock<Redis>>> {
    (0..3)
        .map(|i| {
            Ok(Lock::builder(redis.clone(), format!("{name}:{i}"))
                .ttl(TTL)
                .build()?)
        })
        .collect()
}

/// One uncontended run.
struct Run {
    rate: f64,
    p50: Duration,
    p99: Duration,
    client_cpu: Duration,
    server_cpu: Duration,
    commands: f64,
    allocs: f64,
}

/// Every run of one operation at one concurrency.
struct Cell {
    op: Op,
    tasks: usize,
    runs: Vec<Run>,
}

impl Cell {
    fn median(&self, f: impl Fn(&Run) -> f64) -> f64 {
        measure::median(&self.runs.iter().map(f).collect::<Vec<_>>())
    }
    fn median_dur(&self, f: impl Fn(&Run) -> Duration) -> Duration {
        measure::median_duration(&self.runs.iter().map(f).collect::<Vec<_>>())
    }
    fn rate(&self) -> f64 {
        self.median(|r| r.rate)
    }
}

/// The contended clients, in table order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Contender {
    /// python-redis-lock's `BLPOP` hand-off: bare commands, one waiter woken per release.
    Blpop,
    /// The plain dlock lock, a client per waiter.
    Lock,
    /// `FairLock`, a client per waiter.
    Fair,
    /// One permit of a semaphore of one permit (a lock by another name), a client per
    /// waiter: it is held to the lock's targets.
    Semaphore1,
    /// One permit of a semaphore of [`PERMITS`], a client per waiter.
    Semaphore,
}

/// Every contended client, in run order.
pub(crate) const CONTENDERS: [Contender; 5] = [
    Contender::Blpop,
    Contender::Lock,
    Contender::Fair,
    Contender::Semaphore1,
    Contender::Semaphore,
];

impl Contender {
    fn label(self) -> &'static str {
        match self {
            Contender::Blpop => "limit: `BLPOP` hand-off, bare commands (python-redis-lock style)",
            Contender::Lock => "dlock `Lock` (reference)",
            Contender::Fair => "`FairLock`",
            Contender::Semaphore1 => "`Semaphore`, 1 permit",
            Contender::Semaphore => "`Semaphore`, 4 permits",
        }
    }

    fn short(self) -> &'static str {
        match self {
            Contender::Blpop => "BLPOP hand-off",
            Contender::Lock => "dlock Lock",
            Contender::Fair => "FairLock",
            Contender::Semaphore1 => "Semaphore (1 permit)",
            Contender::Semaphore => "Semaphore (4 permits)",
        }
    }

    fn color(self) -> &'static str {
        match self {
            Contender::Blpop => "#ff7f0e",
            Contender::Lock => "#1f77b4",
            Contender::Fair => "#2ca02c",
            Contender::Semaphore1 => "#8c564b",
            Contender::Semaphore => "#9467bd",
        }
    }

    fn peer(self) -> &'static str {
        match self {
            Contender::Blpop => "",
            Contender::Lock => "rslock: see §2",
            Contender::Fair | Contender::Semaphore1 | Contender::Semaphore => "no peer in Rust",
        }
    }
}

/// One contended run: the common figures plus redis-server's CPU per acquisition.
struct ContendedRun {
    run: contended::Run,
    server_cpu: Duration,
    client_cpu: Duration,
}

struct ContendedCell {
    client: Contender,
    waiters: usize,
    runs: Vec<ContendedRun>,
}

impl ContendedCell {
    fn median(&self, f: impl Fn(&ContendedRun) -> f64) -> f64 {
        measure::median(&self.runs.iter().map(f).collect::<Vec<_>>())
    }
    fn median_dur(&self, f: impl Fn(&contended::Run) -> Duration) -> Duration {
        Duration::from_secs_f64(self.median(|r| f(&r.run).as_secs_f64()))
    }
    fn merged(&self) -> Latencies {
        let mut all = Latencies::new();
        for r in &self.runs {
            all.merge(&r.run.handoffs);
        }
        all
    }
}

/// The section's results.
pub(crate) struct Section {
    rounds: usize,
    run: Duration,
    contended_run: Duration,
    rtt: Duration,
    single: Vec<Cell>,
    readers: Vec<Cell>,
    contended: Vec<ContendedCell>,
}

/// Progress-bar steps of the section.
pub(crate) fn steps(profile: &Profile) -> u64 {
    (profile.rounds
        * (SINGLE.len()
            + READERS.len() * profile.reader_tasks.len()
            + CONTENDERS.len() * profile.primitive_waiters.len())) as u64
}

/// Runs the section: every round runs every operation and contender once, interleaved.
pub(crate) async fn bench(profile: &Profile, bar: &ProgressBar) -> Result<Section> {
    let server = RedisServer::start()?;
    let url = server.url();
    let mut admin = measure::connection_manager(&url).await?;
    let trivial_sha = script_load(&mut admin, TRIVIAL).await?;
    let release_sha = script_load(&mut admin, RELEASE).await?;
    let blpop_sha = script_load(&mut admin, contended::BLPOP_RELEASE).await?;
    let clients = Clients {
        url: url.clone(),
        server_pid: server.pid(),
        admin,
        limit: measure::connection_manager(&url).await?,
        trivial_sha,
        release_sha,
        blpop_sha,
        dlock: Redis::connect(&url).await?,
    };
    // PING is timed in every round (the median is reported): one measurement at a
    // moment when the shared machine is busy would skew every "in round trips" figure.
    let mut rtts = Vec::with_capacity(profile.rounds);

    let mut single: Vec<Cell> = SINGLE
        .iter()
        .map(|&op| Cell {
            op,
            tasks: 1,
            runs: Vec::new(),
        })
        .collect();
    let mut readers: Vec<Cell> = Vec::new();
    for &tasks in &profile.reader_tasks {
        for op in READERS {
            readers.push(Cell {
                op,
                tasks,
                runs: Vec::new(),
            });
        }
    }
    let mut contended_cells: Vec<ContendedCell> = Vec::new();
    for &waiters in &profile.primitive_waiters {
        for client in CONTENDERS {
            contended_cells.push(ContendedCell {
                client,
                waiters,
                runs: Vec::new(),
            });
        }
    }

    // Warm-up: connections, script caches, every primitive's watchdog code path.
    for op in SINGLE {
        run(&clients, op, 4, Duration::from_millis(100), "warm").await?;
    }
    for round in 0..profile.rounds {
        rtts.push(measure::round_trip(&url, 1_000).await?.quantile(0.5));
        for cell in single.iter_mut().chain(readers.iter_mut()) {
            bar.set_message(format!(
                "primitives: {} × {} tasks (round {})",
                cell.op.short(),
                cell.tasks,
                round + 1
            ));
            let r = run(
                &clients,
                cell.op,
                cell.tasks,
                profile.primitive_run,
                &format!("r{round}"),
            )
            .await?;
            cell.runs.push(r);
            bar.inc(1);
        }
        for cell in &mut contended_cells {
            bar.set_message(format!(
                "primitives: {} × {} waiters (round {})",
                cell.client.short(),
                cell.waiters,
                round + 1
            ));
            let r = contend(
                &clients,
                cell.client,
                cell.waiters,
                profile.primitive_contended_run,
                round,
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
        run: profile.primitive_run,
        contended_run: profile.primitive_contended_run,
        rtt: measure::median_duration(&rtts),
        single,
        readers,
        contended: contended_cells,
    })
}

async fn script_load(conn: &mut ConnectionManager, script: &str) -> Result<String> {
    Ok(redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(script)
        .query_async(conn)
        .await?)
}

/// `tasks` tasks run `op` in a loop for `length` on one client.
async fn run(clients: &Clients, op: Op, tasks: usize, length: Duration, tag: &str) -> Result<Run> {
    let mut states = Vec::with_capacity(tasks);
    if op == Op::ReadShared {
        let name = format!("bench:p:{}:{tag}:{tasks}", op.short());
        let rw = RwLock::builder(clients.dlock.clone(), name)
            .ttl(TTL)
            .build()?;
        for _ in 0..tasks {
            states.push(Task::Read(rw.clone()));
        }
    } else {
        for t in 0..tasks {
            states.push(clients.task(op, tasks, t, tag).await?);
        }
    }
    let mut admin = clients.admin.clone();
    let stop = Arc::new(AtomicBool::new(false));
    let commands_before = measure::commands_run(&mut admin).await?;
    let allocs_before = measure::allocations();
    let client_cpu = CpuMeter::start(None)?;
    let server_cpu = CpuMeter::start(clients.server_pid)?;
    let started = Instant::now();
    let handles: Vec<_> = states
        .into_iter()
        .map(|task| tokio::spawn(task_loop(task, Arc::clone(&stop))))
        .collect();
    tokio::time::sleep(length).await;
    stop.store(true, Ordering::Relaxed);
    let mut latencies = Latencies::new();
    for h in handles {
        latencies.merge(&h.await??);
    }
    let elapsed = started.elapsed();
    let client_secs = client_cpu.cpu_seconds()?;
    let server_secs = server_cpu.cpu_seconds()?;
    let allocs = measure::allocations().saturating_sub(allocs_before);
    let commands = measure::commands_run(&mut admin)
        .await?
        .saturating_sub(commands_before);
    let cycles = latencies.len().max(1) as f64;
    Ok(Run {
        rate: latencies.len() as f64 / elapsed.as_secs_f64(),
        p50: latencies.quantile(0.5),
        p99: latencies.quantile(0.99),
        client_cpu: Duration::from_secs_f64(client_secs / cycles),
        server_cpu: Duration::from_secs_f64(server_secs / cycles),
        commands: commands as f64 / cycles,
        allocs: allocs as f64 / cycles,
    })
}

/// Cycles until `stop`, timing each; the last cycle (the one `stop` ends) counts too.
async fn task_loop(mut task: Task, stop: Arc<AtomicBool>) -> Result<Latencies> {
    let mut lat = Latencies::new();
    while !stop.load(Ordering::Relaxed) {
        let start = Instant::now();
        task.cycle().await?;
        lat.record(start.elapsed());
    }
    task.finish().await?;
    Ok(lat)
}

/// A [`FairLock`] waiter on a client of its own, the lock built once per name, as an
/// application would.
struct FairWaiter {
    redis: Redis,
    lock: Option<FairLock<Redis>>,
}

impl Waiter for FairWaiter {
    type Held = FairGuard<Redis>;

    async fn acquire(&mut self, name: &str) -> Result<FairGuard<Redis>> {
        if self.lock.as_ref().is_none_or(|l| l.name() != name) {
            self.lock = Some(
                FairLock::builder(self.redis.clone(), name)
                    .ttl(contended::TTL)
                    .build()?,
            );
        }
        let lock = self.lock.as_ref().ok_or("fair lock missing")?;
        Ok(lock.lock().await?)
    }

    async fn release(&mut self, held: FairGuard<Redis>, _name: &str) -> Result<()> {
        Ok(held.release().await?)
    }
}

/// A waiter for one permit of a [`Semaphore`] of `permits`, on a client of its own, the
/// semaphore built once per name.
struct PermitWaiter {
    redis: Redis,
    permits: u32,
    sem: Option<Semaphore<Redis>>,
}

impl Waiter for PermitWaiter {
    type Held = SemaphorePermit<Redis>;

    async fn acquire(&mut self, name: &str) -> Result<SemaphorePermit<Redis>> {
        if self.sem.as_ref().is_none_or(|s| s.name() != name) {
            self.sem = Some(
                Semaphore::builder(self.redis.clone(), name, self.permits)
                    .ttl(contended::TTL)
                    .build()?,
            );
        }
        let sem = self.sem.as_ref().ok_or("semaphore missing")?;
        Ok(sem.acquire().await?)
    }

    async fn release(&mut self, held: SemaphorePermit<Redis>, _name: &str) -> Result<()> {
        Ok(held.release().await?)
    }
}

/// One contended run of `client` with `n` waiters (step-aside mode), after a warm-up on
/// another name.
async fn contend(
    clients: &Clients,
    client: Contender,
    n: usize,
    length: Duration,
    round: usize,
) -> Result<ContendedRun> {
    let url = clients.url.as_str();
    let waiters = match client {
        Contender::Blpop => {
            contended::make_waiters(contended::Client::Blpop, n, url, &clients.blpop_sha).await?
        }
        Contender::Lock => {
            contended::make_waiters(contended::Client::DlockPerWaiter, n, url, "").await?
        }
        Contender::Fair => {
            let mut w = Vec::with_capacity(n);
            for _ in 0..n {
                w.push(contended::boxed(FairWaiter {
                    redis: Redis::connect(url).await?,
                    lock: None,
                }));
            }
            w
        }
        Contender::Semaphore1 | Contender::Semaphore => {
            let permits = if client == Contender::Semaphore1 {
                1
            } else {
                PERMITS
            };
            let mut w = Vec::with_capacity(n);
            for _ in 0..n {
                w.push(contended::boxed(PermitWaiter {
                    redis: Redis::connect(url).await?,
                    permits,
                    sem: None,
                }));
            }
            w
        }
    };
    let tag = format!("p:{}:{n}:{round}", client.short());
    let (waiters, _) = contended::contend(
        waiters,
        &format!("bench:warm:{tag}"),
        Mode::StepAside,
        contended::WARM_UP,
    )
    .await?;
    let (waiters, run) = contended::contend_measured(
        waiters,
        &format!("bench:hot:{tag}"),
        Mode::StepAside,
        length,
        clients.server_pid,
    )
    .await?;
    drop(waiters);
    Ok(ContendedRun {
        server_cpu: run.server_cpu,
        client_cpu: run.client_cpu,
        run,
    })
}

/// `12.3 µs`.
fn fmt_us(d: Duration) -> String {
    format!("{:.1} µs", d.as_secs_f64() * 1e6)
}

impl Section {
    fn cell(cells: &[Cell], op: Op, tasks: usize) -> Option<&Cell> {
        cells.iter().find(|c| c.op == op && c.tasks == tasks)
    }

    fn uncontended_table(&self, cells: &[Cell], tasks: &[usize], ops: &[Op]) -> String {
        let mut md = String::from(
            "| tasks | operation | round trips | cycles/s | p50 | p99 | × limit | × reference \
             | redis commands/cycle | redis CPU/cycle | client CPU/cycle | allocs/cycle | peer |\n\
             |---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n",
        );
        for &n in tasks {
            for &op in ops {
                let Some(cell) = Self::cell(cells, op, n) else {
                    continue;
                };
                let rate = cell.rate();
                let limit = Self::cell(cells, op.limit(), n).map(Cell::rate);
                let reference = op
                    .reference()
                    .and_then(|r| Self::cell(cells, r, n))
                    .map(Cell::rate);
                md.push_str(&format!(
                    "| {n} | {} | {} | {} | {} | {} | {} | {} | {:.1} | {} | {} | {:.1} | {} |\n",
                    op.label(),
                    op.round_trips(),
                    fmt_rate(rate),
                    fmt_dur(cell.median_dur(|r| r.p50)),
                    fmt_dur(cell.median_dur(|r| r.p99)),
                    fmt_ratio(rate, limit),
                    if op.reference().is_some() {
                        fmt_ratio(rate, reference)
                    } else {
                        "–".to_owned()
                    },
                    cell.median(|r| r.commands),
                    fmt_us(cell.median_dur(|r| r.server_cpu)),
                    fmt_us(cell.median_dur(|r| r.client_cpu)),
                    cell.median(|r| r.allocs),
                    op.peer(),
                ));
            }
        }
        md
    }

    fn contended_cell(&self, client: Contender, waiters: usize) -> Option<&ContendedCell> {
        self.contended
            .iter()
            .find(|c| c.client == client && c.waiters == waiters)
    }

    /// The row 5: the semaphore of one permit at 64 waiters in 64 clients, held to
    /// the lock's targets, beside the `BLPOP` hand-off of the same run.
    pub(crate) fn targets(&self, targets: &mut Targets) {
        const N: usize = 64;
        let what = format!("semaphore (1 permit), {N} waiters in {N} clients");
        let (Some(sem), Some(blpop)) = (
            self.contended_cell(Contender::Semaphore1, N),
            self.contended_cell(Contender::Blpop, N),
        ) else {
            targets.not_judged(5, what, "", "", "not in this profile's waiter counts");
            return;
        };
        let (rate, base) = (sem.median(|r| r.run.rate), blpop.median(|r| r.run.rate));
        targets.judge(
            5,
            format!("{what}: acquisitions/s × BLPOP"),
            Some(rate / base),
            ratio_text(rate, base),
            Goal::AtLeast(1.0),
            "≥ 1.0×",
        );
        HandoffFigures {
            row: 5,
            what,
            rtt: self.rtt,
            p50: sem.median_dur(|r| r.p50),
            fairness: sem.median(|r| r.run.fairness),
            wait_p99: Some(sem.median_dur(|r| r.wait_p99)),
            max_rt: 3.0,
        }
        .judge(targets);
    }

    fn waiter_counts(&self) -> Vec<usize> {
        let mut counts: Vec<usize> = self.contended.iter().map(|c| c.waiters).collect();
        counts.sort_unstable();
        counts.dedup();
        counts
    }

    /// The section's Markdown.
    pub(crate) fn markdown(&self) -> String {
        let mut md = format!(
            "\n## 7. Semaphore, ReentrantLock, RwLock, FairLock, MultiLock\n\n\
             All on one `redis-server`, every row of a round run one after another (median of \
             {} rounds). Uncontended runs last {:.1} s; each primitive is built once per task \
             with default options (30 s ttl, watchdog on) and one `Redis` client shared by \
             the tasks. **limit** = the same number of round trips as `EVALSHA` of a script \
             that does nothing (each primitive is one script to acquire and one to release); \
             **reference** = the plain dlock `Lock` (for the multi-lock: three of them taken \
             by hand). Redis commands per cycle count the commands run inside the scripts \
             too (`INFO commandstats`). PING round trip: p50 {} (median of the rounds). rslock has none of these \
             primitives: no peer in Rust.\n\n\
             ### One task\n\n",
            self.rounds,
            self.run.as_secs_f64(),
            fmt_dur(self.rtt),
        );
        md.push_str(&self.uncontended_table(&self.single, &[1], &SINGLE));
        let mut reader_tasks: Vec<usize> = self.readers.iter().map(|c| c.tasks).collect();
        reader_tasks.dedup();
        md.push_str(
            "\n### Many readers\n\n\
             N tasks on one client; *ONE name*: every task reads the same `RwLock`, so its \
             readers set holds N leases at once.\n\n",
        );
        md.push_str(&self.uncontended_table(&self.readers, &reader_tasks, &READERS));
        md.push_str(&format!(
            "\n### Contended hand-off, a client per waiter\n\n\
             As in section 2 (step-aside mode: every acquisition is a hand-off to a waiter), \
             {:.1} s runs after a {:.1} s warm-up; every waiter has its own client, as \
             separate processes would, and every row ran interleaved with the others in \
             each round. For a semaphore, a release while others wait is paired with the \
             next acquisition by another waiter (oldest release first); a semaphore of ONE \
             permit is a lock by another name, held to the lock's targets. `× BLPOP` = \
             acquisitions/s over the `BLPOP` hand-off's in the same round's run; `p50 × \
             reference` = hand-off p50 over the plain `Lock`'s. CPU per acquisition = CPU \
             time over the run divided by the acquisitions: the client's is this whole \
             process (every waiter's client), redis-server's shows what waking waiters \
             costs the server.\n\n\
             | waiters | client | acquisitions/s | × BLPOP | hand-off p50 | p50 in round trips | \
             hand-off p99 | p50 × reference | wait p50 | wait p99 | fairness max/min | \
             to self | client CPU/acquisition | redis CPU/acquisition | peer |\n\
             |---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n",
            self.contended_run.as_secs_f64(),
            contended::WARM_UP.as_secs_f64(),
        ));
        for n in self.waiter_counts() {
            let reference = self
                .contended_cell(Contender::Lock, n)
                .map(|c| c.median_dur(|r| r.p50).as_secs_f64());
            let blpop = self
                .contended_cell(Contender::Blpop, n)
                .map(|c| c.median(|r| r.run.rate));
            for client in CONTENDERS {
                let Some(cell) = self.contended_cell(client, n) else {
                    continue;
                };
                let p50 = cell.median_dur(|r| r.p50);
                let fairness = cell.median(|r| r.run.fairness);
                let rate = cell.median(|r| r.run.rate);
                md.push_str(&format!(
                    "| {n} | {} | {} | {} | {} | {:.1} | {} | {} | {} | {} | {} | {:.0} % | {} | {} | {} |\n",
                    client.label(),
                    fmt_rate(rate),
                    if client == Contender::Blpop {
                        "–".to_owned()
                    } else {
                        fmt_ratio(rate, blpop)
                    },
                    fmt_dur(p50),
                    p50.as_secs_f64() / self.rtt.as_secs_f64().max(1e-9),
                    fmt_dur(cell.median_dur(|r| r.p99)),
                    if client == Contender::Lock || client == Contender::Blpop {
                        "–".to_owned()
                    } else {
                        fmt_ratio(p50.as_secs_f64(), reference)
                    },
                    fmt_dur(cell.median_dur(|r| r.wait_p50)),
                    fmt_dur(cell.median_dur(|r| r.wait_p99)),
                    fairness_text(fairness),
                    cell.median(|r| r.run.to_self) * 100.0,
                    fmt_us(Duration::from_secs_f64(
                        cell.median(|r| r.client_cpu.as_secs_f64()),
                    )),
                    fmt_us(Duration::from_secs_f64(
                        cell.median(|r| r.server_cpu.as_secs_f64()),
                    )),
                    client.peer(),
                ));
            }
        }
        md.push_str(
            "\n![hand-off latency histogram of the primitives](crates/dlock-bench/charts/primitives-handoff-histogram.svg)\n",
        );
        md
    }

    /// Hand-off latency histograms, one panel per waiter count.
    pub(crate) fn histogram_svg(&self) -> String {
        let panels: Vec<Panel> = self
            .waiter_counts()
            .into_iter()
            .map(|n| Panel {
                title: format!("{n} waiters, a client each"),
                series: CONTENDERS
                    .iter()
                    .filter_map(|&client| {
                        let cell = self
                            .contended
                            .iter()
                            .find(|c| c.client == client && c.waiters == n)?;
                        Some(Series {
                            label: client.short().to_owned(),
                            color: client.color(),
                            points: cell.merged().log_bins(10.0, 1e6, 8),
                        })
                    })
                    .collect(),
            })
            .collect();
        svg::histogram_chart(
            "Primitives: contended hand-off latency (release called → next waiter's acquire returns), all runs",
            &panels,
        )
    }
}
