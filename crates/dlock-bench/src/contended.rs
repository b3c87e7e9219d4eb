//! Contended hand-off: N waiters loop on ONE hot name (acquire, empty critical section,
//! release, acquire again). Measured: acquisitions/s, hand-off latency (from the moment
//! the holder calls release while others wait to the moment another waiter's acquire
//! returns), the waiters' wait, and fairness (most / fewest acquisitions of one waiter).
//! Two behaviours after a release ([`Mode`]): step aside until someone else got the lock
//! (pure hand-off), or ask again at once (barging).
//!
//! * **dlock, a client per waiter**: every waiter is its own `Redis` client (its own
//!   connections), as separate processes would be. The store queues the waiters and a
//!   release wakes the head of the queue, whichever client it is on.
//! * **dlock, one shared client**: all waiters in one process share one client (and its
//!   engine).
//! * **rslock**: its `acquire` retry loop with default settings (3 tries, a random
//!   0–200 ms pause between them, then again), a manager per waiter.
//! * **BLPOP hand-off**: python-redis-lock's scheme in Rust — `SET NX EX`, and when held,
//!   `BLPOP` on a signal list that the release script refills (`DEL` + `LPUSH` +
//!   `PEXPIRE` of the signal, then `DEL` of the lock), so one blocked waiter is woken per
//!   release. Each waiter has its own connection (`BLPOP` blocks it).

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use dlock_test::server::RedisServer;
use fencelock::backend::Redis;
use fencelock::raw::RawLock;
use fencelock::{Lock, LockGuard};
use indicatif::ProgressBar;
use redis::AsyncConnectionConfig;
use redis::aio::MultiplexedConnection;

use crate::measure::{self, CpuMeter, Latencies};
use crate::report::{fmt_dur, fmt_rate};
use crate::svg::{self, Panel, Series};
use crate::targets::{Goal, HandoffFigures, Targets, ratio_text};
use crate::{Profile, Result};

/// The clients compared, in table order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Client {
    /// dlock, one `Redis` client per waiter.
    DlockPerWaiter,
    /// dlock, one `Redis` client shared by every waiter.
    DlockShared,
    /// rslock's retry loop.
    Rslock,
    /// python-redis-lock's BLPOP hand-off.
    Blpop,
}

/// How a waiter behaves after releasing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// The releaser asks again only once another waiter got the lock: every acquisition
    /// is a hand-off to someone who was waiting, so this measures pure hand-off latency.
    StepAside,
    /// The releaser asks again at once, competing with the waiters (barging).
    Barging,
}

/// Every client, in the order they run within a round.
pub(crate) const CLIENTS: [Client; 4] = [
    Client::DlockPerWaiter,
    Client::DlockShared,
    Client::Rslock,
    Client::Blpop,
];

impl Client {
    fn label(self) -> &'static str {
        match self {
            Client::DlockPerWaiter => "**dlock**, a client per waiter",
            Client::DlockShared => "**dlock**, one shared client",
            Client::Rslock => "rslock 0.10 retry loop (defaults)",
            Client::Blpop => "BLPOP hand-off (python-redis-lock style)",
        }
    }

    fn color(self) -> &'static str {
        match self {
            Client::DlockPerWaiter => "#1f77b4",
            Client::DlockShared => "#17becf",
            Client::Rslock => "#d62728",
            Client::Blpop => "#ff7f0e",
        }
    }

    fn short(self) -> &'static str {
        match self {
            Client::DlockPerWaiter => "dlock (client per waiter)",
            Client::DlockShared => "dlock (shared client)",
            Client::Rslock => "rslock",
            Client::Blpop => "BLPOP hand-off",
        }
    }
}

/// Each run starts with this long on another name.
pub(crate) const WARM_UP: Duration = Duration::from_millis(300);
/// Lease length of the hot lock (never reached: holders release at once).
pub(crate) const TTL: Duration = Duration::from_secs(10);
/// How long the python-redis-lock signal list lives (its default).
const SIGNAL_TTL_MS: u64 = 1_000;
/// python-redis-lock's release script.
pub(crate) const BLPOP_RELEASE: &str = r#"
if redis.call("get", KEYS[1]) ~= ARGV[1] then
  return 1
else
  redis.call("del", KEYS[2])
  redis.call("lpush", KEYS[2], 1)
  redis.call("pexpire", KEYS[2], ARGV[2])
  redis.call("del", KEYS[1])
  return 0
end
"#;

/// One waiter of a contended run: a client of some lock, asked by the run's loop to
/// acquire and release the hot name. The sections implement it for their own clients
/// (beside those clients), so this module names no other section.
pub(crate) trait Waiter: Send + 'static {
    /// What an acquire holds until its release.
    type Held: Send + 'static;

    /// Waits for `name` and holds it.
    fn acquire(&mut self, name: &str) -> impl Future<Output = Result<Self::Held>> + Send;

    /// Gives back `held`, the hold of `name`.
    fn release(&mut self, held: Self::Held, name: &str) -> impl Future<Output = Result<()>> + Send;
}

/// The future of a boxed waiter's acquire or release.
pub(crate) type WaitFuture<'a> = Pin<Box<dyn Future<Output = Result<()>> + Send + 'a>>;

/// A [`Waiter`] that keeps its hold inside, so that waiters of different kinds can run
/// side by side; see [`boxed`].
pub(crate) trait AnyWaiter: Send {
    /// Waits for `name` and holds it.
    fn acquire<'a>(&'a mut self, name: &'a str) -> WaitFuture<'a>;
    /// Gives back the hold of `name`.
    fn release<'a>(&'a mut self, name: &'a str) -> WaitFuture<'a>;
}

/// A boxed waiter. The boxing costs every waiter (peers included) one allocation per
/// acquire and per release alike.
pub(crate) type BoxWaiter = Box<dyn AnyWaiter>;

/// `waiter`, boxed.
pub(crate) fn boxed<W: Waiter>(waiter: W) -> BoxWaiter {
    Box::new(Holding { waiter, held: None })
}

/// A waiter and its hold, if any.
struct Holding<W: Waiter> {
    waiter: W,
    held: Option<W::Held>,
}

impl<W: Waiter> AnyWaiter for Holding<W> {
    fn acquire<'a>(&'a mut self, name: &'a str) -> WaitFuture<'a> {
        Box::pin(async move {
            self.held = Some(self.waiter.acquire(name).await?);
            Ok(())
        })
    }

    fn release<'a>(&'a mut self, name: &'a str) -> WaitFuture<'a> {
        Box::pin(async move {
            let held = self.held.take().ok_or("release without a hold")?;
            self.waiter.release(held, name).await
        })
    }
}

/// dlock's plain `Lock` on a client of any store (the client is its own unless cloned
/// from a shared one), built per name as an application would.
pub(crate) struct LockWaiter<B: RawLock>(pub(crate) B);

impl<B: RawLock> Waiter for LockWaiter<B> {
    type Held = LockGuard<B>;

    async fn acquire(&mut self, name: &str) -> Result<LockGuard<B>> {
        let lock = Lock::builder(self.0.clone(), name).ttl(TTL).build()?;
        Ok(lock.lock().await?)
    }

    async fn release(&mut self, held: LockGuard<B>, _name: &str) -> Result<()> {
        Ok(held.release().await?)
    }
}

/// rslock's `acquire` retry loop, a manager of its own.
struct RslockWaiter(rslock::LockManager);

impl Waiter for RslockWaiter {
    type Held = rslock::LockGuard;

    async fn acquire(&mut self, name: &str) -> Result<rslock::LockGuard> {
        Ok(self
            .0
            .acquire(name.as_bytes(), TTL)
            .await
            .map_err(|e| format!("rslock acquire: {e}"))?)
    }

    async fn release(&mut self, held: rslock::LockGuard, _name: &str) -> Result<()> {
        held.release().await;
        Ok(())
    }
}

/// python-redis-lock's BLPOP hand-off, a connection of its own.
struct BlpopWaiter {
    conn: MultiplexedConnection,
    token: String,
    sha: String,
}

impl Waiter for BlpopWaiter {
    type Held = ();

    async fn acquire(&mut self, name: &str) -> Result<()> {
        let (key, signal) = blpop_keys(name);
        loop {
            let set: Option<String> = redis::cmd("SET")
                .arg(&key)
                .arg(self.token.as_str())
                .arg("NX")
                .arg("EX")
                .arg(TTL.as_secs())
                .query_async(&mut self.conn)
                .await?;
            if set.is_some() {
                return Ok(());
            }
            let _: Option<(String, String)> = redis::cmd("BLPOP")
                .arg(&signal)
                .arg(TTL.as_secs())
                .query_async(&mut self.conn)
                .await?;
        }
    }

    async fn release(&mut self, _held: (), name: &str) -> Result<()> {
        let (key, signal) = blpop_keys(name);
        let refused: i64 = redis::cmd("EVALSHA")
            .arg(self.sha.as_str())
            .arg(2)
            .arg(&key)
            .arg(&signal)
            .arg(self.token.as_str())
            .arg(SIGNAL_TTL_MS)
            .query_async(&mut self.conn)
            .await?;
        if refused != 0 {
            return Err("BLPOP lock: released a lock that was not ours".into());
        }
        Ok(())
    }
}

fn blpop_keys(name: &str) -> (String, String) {
    (format!("lock:{name}"), format!("lock-signal:{name}"))
}

/// Shared by the waiters of one run.
struct Board {
    epoch: Instant,
    /// When holders called release while others waited (ns since `epoch`), oldest first;
    /// each acquisition by a waiter takes the oldest. A lock has at most one entry here
    /// (release and acquisition alternate); a semaphore's permits queue up.
    released_at: Mutex<VecDeque<u64>>,
    /// The last holder's index (`usize::MAX`: none yet).
    last_holder: AtomicUsize,
    /// Counts acquisitions; a waiter that steps aside waits for it to move on.
    generation: tokio::sync::watch::Sender<u64>,
    /// Waiters inside an acquire call now. A release with nobody waiting is no hand-off
    /// (the lock goes idle until a waiter comes back from thinking), so it is not timed.
    waiting: AtomicUsize,
}

impl Board {
    fn now_ns(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos())
            .unwrap_or(u64::MAX)
            .max(1)
    }
}

/// What one waiter saw.
pub(crate) struct WaiterStats {
    acquisitions: u64,
    to_self: u64,
    handoffs: Latencies,
    waits: Latencies,
}

async fn waiter_loop(
    index: usize,
    mut waiter: BoxWaiter,
    name: String,
    board: Arc<Board>,
    mode: Mode,
    deadline: Instant,
) -> Result<(BoxWaiter, WaiterStats)> {
    let mut stats = WaiterStats {
        acquisitions: 0,
        to_self: 0,
        handoffs: Latencies::new(),
        waits: Latencies::new(),
    };
    let mut generation = board.generation.subscribe();
    loop {
        let asked = Instant::now();
        board.waiting.fetch_add(1, Ordering::SeqCst);
        let acquired = tokio::time::timeout_at(deadline.into(), waiter.acquire(&name)).await;
        board.waiting.fetch_sub(1, Ordering::SeqCst);
        match acquired {
            Ok(acquired) => acquired?,
            Err(_) => {
                // Still waiting at the end: count the wait so far, or a waiter that
                // starves would not show in the wait percentiles at all.
                stats.waits.record(asked.elapsed());
                break;
            }
        };
        stats.waits.record(asked.elapsed());
        let mut mine = 0;
        board.generation.send_modify(|g| {
            *g += 1;
            mine = *g;
        });
        let now = board.now_ns();
        let released = board
            .released_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop_front();
        let previous = board.last_holder.swap(index, Ordering::SeqCst);
        if previous == index {
            // The holder won its own lock back: no hand-off happened.
            stats.to_self += 1;
        } else if let Some(released) = released {
            stats
                .handoffs
                .record(Duration::from_nanos(now.saturating_sub(released)));
        }
        stats.acquisitions += 1;
        tokio::task::yield_now().await; // the (empty) critical section
        // Acquisitions so far: stepping aside waits for one more. For a lock this is our
        // own (nobody else acquires while we hold it); a semaphore's other holders may
        // have acquired meanwhile.
        let seen = (*board.generation.borrow()).max(mine);
        if board.waiting.load(Ordering::SeqCst) > 0 {
            let now = board.now_ns();
            board
                .released_at
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push_back(now);
        }
        waiter.release(&name).await?;
        if Instant::now() >= deadline {
            break;
        }
        if mode == Mode::StepAside {
            let next = generation.wait_for(|g| *g > seen);
            if tokio::time::timeout_at(deadline.into(), next)
                .await
                .is_err()
            {
                break;
            }
        }
    }
    Ok((waiter, stats))
}

/// Runs `waiters` against `name` for `length`; returns them with what each saw.
pub(crate) async fn contend(
    waiters: Vec<BoxWaiter>,
    name: &str,
    mode: Mode,
    length: Duration,
) -> Result<(Vec<BoxWaiter>, Vec<WaiterStats>)> {
    let board = Arc::new(Board {
        epoch: Instant::now(),
        released_at: Mutex::new(VecDeque::new()),
        last_holder: AtomicUsize::new(usize::MAX),
        waiting: AtomicUsize::new(0),
        generation: tokio::sync::watch::Sender::new(0),
    });
    let deadline = Instant::now() + length;
    let handles: Vec<_> = waiters
        .into_iter()
        .enumerate()
        .map(|(i, w)| {
            tokio::spawn(waiter_loop(
                i,
                w,
                name.to_owned(),
                Arc::clone(&board),
                mode,
                deadline,
            ))
        })
        .collect();
    let mut back = Vec::with_capacity(handles.len());
    let mut stats = Vec::with_capacity(handles.len());
    for h in handles {
        let (w, s) = h.await??;
        back.push(w);
        stats.push(s);
    }
    Ok((back, stats))
}

/// `n` waiters of `client` on the Redis at `url` (`sha`: the BLPOP release script's).
pub(crate) async fn make_waiters(
    client: Client,
    n: usize,
    url: &str,
    sha: &str,
) -> Result<Vec<BoxWaiter>> {
    let mut waiters = Vec::with_capacity(n);
    let shared = match client {
        Client::DlockShared => Some(Redis::connect(url).await?),
        _ => None,
    };
    for i in 0..n {
        waiters.push(match client {
            Client::DlockPerWaiter => boxed(LockWaiter(Redis::connect(url).await?)),
            Client::DlockShared => boxed(LockWaiter(
                shared.clone().ok_or("shared dlock client missing")?,
            )),
            Client::Rslock => {
                let manager = rslock::LockManager::new(vec![url.to_owned()]);
                manager
                    .query_redis_for_key_value(b"bench:warmup")
                    .await
                    .map_err(|e| format!("rslock: {e}"))?;
                boxed(RslockWaiter(manager))
            }
            Client::Blpop => {
                // BLPOP blocks for up to the lease length: no response timeout.
                let config = AsyncConnectionConfig::new().set_response_timeout(None);
                let conn = redis::Client::open(url)?
                    .get_multiplexed_async_connection_with_config(&config)
                    .await?;
                boxed(BlpopWaiter {
                    conn,
                    token: format!("{:032x}", 0xb1b0_0000_u128 + i as u128),
                    sha: sha.to_owned(),
                })
            }
        });
    }
    Ok(waiters)
}

/// One run of one client at one waiter count.
pub(crate) struct Run {
    pub(crate) rate: f64,
    pub(crate) wait_p50: Duration,
    pub(crate) wait_p99: Duration,
    pub(crate) p50: Duration,
    pub(crate) p99: Duration,
    pub(crate) fairness: f64,
    pub(crate) to_self: f64,
    pub(crate) handoffs: Latencies,
    /// This process's CPU time (every waiter's client) per acquisition; zero if not
    /// measured.
    pub(crate) client_cpu: Duration,
    /// redis-server's CPU time per acquisition; zero if not measured.
    pub(crate) server_cpu: Duration,
}

struct Cell {
    mode: Mode,
    client: Client,
    waiters: usize,
    runs: Vec<Run>,
}

impl Cell {
    fn median(&self, f: impl Fn(&Run) -> f64) -> f64 {
        measure::median(&self.runs.iter().map(f).collect::<Vec<_>>())
    }
    fn merged(&self) -> Latencies {
        let mut all = Latencies::new();
        for r in &self.runs {
            all.merge(&r.handoffs);
        }
        all
    }
}

/// The contended section's results.
pub(crate) struct Section {
    modes: Vec<Mode>,
    rounds: usize,
    run: Duration,
    rtt: Duration,
    cells: Vec<Cell>,
}

/// `12.3 µs`.
fn fmt_cpu(d: Duration) -> String {
    format!("{:.1} µs", d.as_secs_f64() * 1e6)
}

/// Runs the contended benchmark, clients interleaved within each round.
pub(crate) async fn bench(profile: &Profile, bar: &ProgressBar) -> Result<Section> {
    let server = RedisServer::start()?;
    let url = server.url();
    let mut admin = measure::connection_manager(&url).await?;
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(BLPOP_RELEASE)
        .query_async(&mut admin)
        .await?;
    let rtt = measure::round_trip(&url, 2_000).await?.quantile(0.5);

    let mut cells = Vec::new();
    for &mode in &profile.modes {
        for &n in &profile.waiters {
            for client in CLIENTS {
                cells.push(Cell {
                    mode,
                    client,
                    waiters: n,
                    runs: Vec::new(),
                });
            }
        }
    }
    for round in 0..profile.rounds {
        for cell in &mut cells {
            bar.set_message(format!(
                "contended: {} × {} waiters, {:?} (round {})",
                cell.client.short(),
                cell.waiters,
                cell.mode,
                round + 1
            ));
            let waiters = make_waiters(cell.client, cell.waiters, &url, &sha).await?;
            // Warm up on another name: opens dlock's pub/sub connections, so the measured
            // run does not pay for connection set-up.
            let tag = format!(
                "{}:{}:{:?}:{round}",
                cell.client.short(),
                cell.waiters,
                cell.mode
            );
            let (waiters, _) =
                contend(waiters, &format!("bench:warm:{tag}"), cell.mode, WARM_UP).await?;
            let (waiters, run) = contend_measured(
                waiters,
                &format!("bench:hot:{tag}"),
                cell.mode,
                profile.contended_run,
                server.pid(),
            )
            .await?;
            drop(waiters);
            cell.runs.push(run);
            bar.inc(1);
        }
    }
    drop(server);
    Ok(Section {
        modes: profile.modes.clone(),
        rounds: profile.rounds,
        run: profile.contended_run,
        rtt,
        cells,
    })
}

pub(crate) fn summarise(stats: &[WaiterStats], length: Duration) -> Run {
    let mut handoffs = Latencies::new();
    let mut waits = Latencies::new();
    for s in stats {
        handoffs.merge(&s.handoffs);
        waits.merge(&s.waits);
    }
    let total: u64 = stats.iter().map(|s| s.acquisitions).sum();
    let max = stats.iter().map(|s| s.acquisitions).max().unwrap_or(0);
    let min = stats.iter().map(|s| s.acquisitions).min().unwrap_or(0);
    let to_self: u64 = stats.iter().map(|s| s.to_self).sum();
    Run {
        rate: total as f64 / length.as_secs_f64(),
        wait_p50: waits.quantile(0.5),
        wait_p99: waits.quantile(0.99),
        p50: handoffs.quantile(0.5),
        p99: handoffs.quantile(0.99),
        fairness: if min == 0 {
            f64::INFINITY
        } else {
            max as f64 / min as f64
        },
        to_self: if total == 0 {
            0.0
        } else {
            to_self as f64 / total as f64
        },
        handoffs,
        client_cpu: Duration::ZERO,
        server_cpu: Duration::ZERO,
    }
}

/// [`contend`], with this process's and the server `server_pid`'s CPU time over the run
/// divided by the acquisitions (in step-aside mode every acquisition but a run's first
/// is a hand-off), from `/proc/<pid>/stat` before and after.
pub(crate) async fn contend_measured(
    waiters: Vec<BoxWaiter>,
    name: &str,
    mode: Mode,
    length: Duration,
    server_pid: Option<u32>,
) -> Result<(Vec<BoxWaiter>, Run)> {
    let client = CpuMeter::start(None)?;
    let server = match server_pid {
        Some(pid) => Some(CpuMeter::start(Some(pid))?),
        None => None,
    };
    let (waiters, stats) = contend(waiters, name, mode, length).await?;
    let client_secs = client.cpu_seconds()?;
    let server_secs = match &server {
        Some(m) => m.cpu_seconds()?,
        None => 0.0,
    };
    let mut run = summarise(&stats, length);
    let acquisitions = (run.rate * length.as_secs_f64()).max(1.0);
    run.client_cpu = Duration::from_secs_f64(client_secs / acquisitions);
    run.server_cpu = Duration::from_secs_f64(server_secs / acquisitions);
    Ok((waiters, run))
}

impl Section {
    fn cell(&self, mode: Mode, client: Client, waiters: usize) -> Option<&Cell> {
        self.cells
            .iter()
            .find(|c| c.mode == mode && c.client == client && c.waiters == waiters)
    }

    fn waiter_counts(&self) -> Vec<usize> {
        let mut counts: Vec<usize> = self.cells.iter().map(|c| c.waiters).collect();
        counts.sort_unstable();
        counts.dedup();
        counts
    }

    /// The rows 2-4: a client per waiter at 64 and 8 waiters (step-aside mode),
    /// beside the BLPOP scheme of the same run.
    pub(crate) fn targets(&self, targets: &mut Targets) {
        let mode = Mode::StepAside;
        let per_waiter = |n| self.cell(mode, Client::DlockPerWaiter, n);
        let blpop = |n| self.cell(mode, Client::Blpop, n);
        let figure = "64 waiters, a client per waiter: acquisitions/s × BLPOP";
        match (per_waiter(64), blpop(64)) {
            (Some(dlock), Some(blpop)) => {
                let (rate, base) = (dlock.median(|r| r.rate), blpop.median(|r| r.rate));
                targets.judge(
                    2,
                    figure,
                    Some(rate / base),
                    ratio_text(rate, base),
                    Goal::AtLeast(1.0),
                    "≥ 1.0×",
                );
            }
            _ => targets.not_judged(2, figure, "", "≥ 1.0×", "not in this profile"),
        }
        for (row, n, rt) in [(3, 64, 3.0), (4, 8, 2.5)] {
            let Some(cell) = per_waiter(n) else {
                targets.not_judged(
                    row,
                    format!("{n} waiters, a client per waiter"),
                    "",
                    "",
                    "not in this profile",
                );
                continue;
            };
            HandoffFigures {
                row,
                what: format!("{n} waiters, a client per waiter"),
                rtt: self.rtt,
                p50: Duration::from_secs_f64(cell.median(|r| r.p50.as_secs_f64())),
                fairness: cell.median(|r| r.fairness),
                wait_p99: (n == 64)
                    .then(|| Duration::from_secs_f64(cell.median(|r| r.wait_p99.as_secs_f64()))),
                max_rt: rt,
            }
            .judge(targets);
        }
    }

    /// The section's Markdown tables, one per mode.
    pub(crate) fn markdown(&self) -> String {
        let mut md = format!(
            "\n## 2. Contended hand-off on one hot name\n\n\
             N waiters loop on one name: acquire, empty critical section, release, acquire \
             again. Hand-off = from the holder calling release (while others wait) to \
             another waiter's acquire returning; wait = from calling acquire to holding the \
             lock. Fairness = most / fewest acquisitions of one waiter in a run (∞: some \
             waiter never got the lock); \"to self\" = share of acquisitions won back by \
             the waiter that had just released. Median of {} runs of {:.1} s each, clients \
             interleaved, each after a {:.1} s warm-up on another name (which opens \
             dlock's pub/sub connections). Every waiter runs in this one process on the \
             same machine as redis-server, so a client per waiter also means their CPU work \
             competes with redis-server's. CPU per hand-off = CPU time over the run \
             (this whole process for the client, from `/proc/self/stat`; redis-server's \
             from `/proc/<pid>/stat`) divided by the acquisitions; in the hand-off mode \
             every acquisition is a hand-off. PING round trip: p50 {}.\n",
            self.rounds,
            self.run.as_secs_f64(),
            WARM_UP.as_secs_f64(),
            fmt_dur(self.rtt),
        );
        for &mode in &self.modes {
            md.push_str(match mode {
                Mode::StepAside => {
                    "\n### Hand-off: the releaser steps aside until another waiter got the lock\n\n"
                }
                Mode::Barging => {
                    "\n### Barging: the releaser asks again at once\n\n\
                     Hand-offs here are only the acquisitions the releaser did not win back, \
                     so for a polling client they are the lucky polls that came within a \
                     round trip of the release; see \"to self\" and the waits.\n\n"
                }
            });
            md.push_str(
                "| waiters | client | acquisitions/s | hand-off p50 | p50 in round trips \
                 | hand-off p99 | wait p50 | wait p99 | fairness max/min | to self \
                 | client CPU/hand-off | redis CPU/hand-off |\n\
                 |---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
            );
            for n in self.waiter_counts() {
                for client in CLIENTS {
                    let Some(cell) = self.cell(mode, client, n) else {
                        continue;
                    };
                    let dur = |f: fn(&Run) -> Duration| {
                        Duration::from_secs_f64(cell.median(|r| f(r).as_secs_f64()))
                    };
                    let p50 = dur(|r| r.p50);
                    let fairness = cell.median(|r| r.fairness);
                    md.push_str(&format!(
                        "| {n} | {} | {} | {} | {:.1} | {} | {} | {} | {} | {:.0} % | {} | {} |\n",
                        client.label(),
                        fmt_rate(cell.median(|r| r.rate)),
                        fmt_dur(p50),
                        p50.as_secs_f64() / self.rtt.as_secs_f64().max(1e-9),
                        fmt_dur(dur(|r| r.p99)),
                        fmt_dur(dur(|r| r.wait_p50)),
                        fmt_dur(dur(|r| r.wait_p99)),
                        if fairness.is_finite() {
                            format!("{fairness:.2}")
                        } else {
                            "∞".to_owned()
                        },
                        cell.median(|r| r.to_self) * 100.0,
                        fmt_cpu(dur(|r| r.client_cpu)),
                        fmt_cpu(dur(|r| r.server_cpu)),
                    ));
                }
            }
        }
        md.push_str(
            "\n![hand-off latency histogram](crates/dlock-bench/charts/handoff-histogram.svg)\n",
        );
        md
    }

    /// Hand-off latency histograms, one panel per waiter count.
    pub(crate) fn histogram_svg(&self) -> String {
        let mode = Mode::StepAside;
        let panels: Vec<Panel> = self
            .waiter_counts()
            .into_iter()
            .map(|n| Panel {
                title: format!("{n} waiters"),
                series: CLIENTS
                    .iter()
                    .filter_map(|&client| {
                        let cell = self.cell(mode, client, n)?;
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
            "Contended hand-off latency (release called → next waiter's acquire returns), all runs",
            &panels,
        )
    }
}
