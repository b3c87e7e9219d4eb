//! Section 10, leader election: how long a standby candidate takes to lead once the
//! leader is gone — because it resigned, or because it crashed — on every store, beside
//! the same hand-off on the plain [`Lock`] that [`Election`] is built on, measured in the
//! same run, round by round interleaved.
//!
//! Every leader, holder, standby and waiter has a client of its own, as separate
//! processes would. A crashed leader is a client whose tokio runtime, on a thread of its
//! own, is shut down without resigning (the conformance suite's way): no release, no
//! renewal, its connections closed, as when a process is killed. Its client is made in
//! that runtime, so that nothing of it (a ZooKeeper session's pings, a watchdog) lives on
//! in ours.
//!
//! Figures only: nothing here judges a time. The section fails only when something is
//! broken — a campaign or store error, a standby that led while the leader still did, a
//! term or fence that did not increase, a store that names another leader or holder.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock_test::postgres::PostgresServer;
use dlock_test::server::{EtcdCluster, MemcachedServer, RedisServer};
use dlock_test::zookeeper::ZooKeeper as ZkServer;
use fencelock::backend::{Etcd, Memcached, Memory, Postgres, Redis, ZooKeeper};
use fencelock::raw::RawElection;
use fencelock::{Election, Leadership, Lock, LockGuard};
use indicatif::ProgressBar;
use tokio::task::JoinHandle;

use crate::measure::{self, Latencies};
use crate::report::{fmt_dur, fmt_ratio};
use crate::stores;
use crate::{BoxError, Profile, Result};

/// The stores measured, in table order.
const STORES: usize = 6;

/// Lease of the resign rounds: long enough never to run out during one.
const RESIGN_TTL: Duration = Duration::from_secs(10);

/// Lease of the crash rounds on most stores.
const CRASH_TTL: Duration = Duration::from_secs(1);

/// Lease of the crash rounds on memcached: its expiry clock has whole seconds, and its
/// backend's minimum is 2 s (a validity one second shorter).
const MEMCACHED_CRASH_TTL: Duration = Duration::from_secs(2);

/// How long the standby campaigns (or waits in `lock()`) before the leader goes: long
/// enough on every store to be queued and listening.
const SETTLE: Duration = Duration::from_millis(150);

/// The longest a step that should be quick may take before the section gives up.
const HANG: Duration = Duration::from_secs(30);

/// ZooKeeper clients work under this chroot (dlock creates it).
const ZK_CHROOT: &str = "/bench-election";

/// A store the section measures: how its clients connect.
trait Store: Send + Sync + 'static {
    /// Its backend.
    type Backend: RawElection;
    /// The table's label.
    const NAME: &'static str;
    /// The lease of the crash rounds.
    const CRASH_TTL: Duration = CRASH_TTL;

    /// A new client, as a process of its own would have; `crash`: for the crash rounds.
    fn connect(&self, crash: bool) -> impl Future<Output = Result<Self::Backend>> + Send;
}

/// The in-process store; each client has a watchdog of its own.
struct MemoryStore(Memory);

impl Store for MemoryStore {
    type Backend = Memory;
    const NAME: &'static str = "memory (in-process)";

    async fn connect(&self, _crash: bool) -> Result<Memory> {
        Ok(self.0.client())
    }
}

struct RedisStore(String);

impl Store for RedisStore {
    type Backend = Redis;
    const NAME: &'static str = "Redis";

    async fn connect(&self, _crash: bool) -> Result<Redis> {
        Ok(Redis::connect(self.0.as_str()).await?)
    }
}

struct MemcachedStore(String);

impl Store for MemcachedStore {
    type Backend = Memcached;
    const NAME: &'static str = "memcached";
    const CRASH_TTL: Duration = MEMCACHED_CRASH_TTL;

    async fn connect(&self, _crash: bool) -> Result<Memcached> {
        Ok(Memcached::connect(&self.0).await?)
    }
}

struct EtcdStore(String);

impl Store for EtcdStore {
    type Backend = Etcd;
    const NAME: &'static str = "etcd";

    async fn connect(&self, _crash: bool) -> Result<Etcd> {
        stores::etcd_connect(&self.0).await
    }
}

struct PostgresStore(String);

impl Store for PostgresStore {
    type Backend = Postgres;
    const NAME: &'static str = "PostgreSQL";

    async fn connect(&self, _crash: bool) -> Result<Postgres> {
        Ok(Postgres::connect(&self.0).await?)
    }
}

/// ZooKeeper: a hold lives as long as its session, so the crash rounds' clients ask for
/// a session timeout equal to the crash ttl (a lease is `min(ttl, session timeout)`).
struct ZkStore {
    /// The default session timeout (10 s), for the resign rounds.
    url: String,
    /// `?session_timeout=` the crash ttl.
    crash_url: String,
}

impl Store for ZkStore {
    type Backend = ZooKeeper;
    const NAME: &'static str = "ZooKeeper (standalone)";

    async fn connect(&self, crash: bool) -> Result<ZooKeeper> {
        let url = if crash { &self.crash_url } else { &self.url };
        Ok(ZooKeeper::connect(url).await?)
    }
}

/// What takes over: an election's candidate or a plain lock's waiter.
trait Contender: Clone + Send + Sync + 'static {
    type Backend: RawElection;
    /// A leadership or a lock guard.
    type Held: Send + 'static;

    /// The election or lock `name` on `backend` with lease `ttl`.
    fn build(backend: Self::Backend, name: &str, ttl: Duration) -> Result<Self>;
    /// Campaigns with `value` / locks; returns once it leads / holds.
    fn take(&self, value: String) -> impl Future<Output = Result<Self::Held>> + Send;
    /// The term / fence.
    fn fence(held: &Self::Held) -> u64;
    /// dlock's estimate of the lease's validity left.
    fn remaining(held: &Self::Held) -> Duration;
    /// Resigns / releases.
    fn hand_over(held: Self::Held) -> impl Future<Output = Result<()>> + Send;
    /// Errs unless the store names `held` (advertising `value`) as the leader / holder.
    fn check(&self, held: &Self::Held, value: &str) -> impl Future<Output = Result<()>> + Send;
}

impl<B: RawElection> Contender for Election<B> {
    type Backend = B;
    type Held = Leadership<B>;

    fn build(backend: B, name: &str, ttl: Duration) -> Result<Self> {
        Ok(Election::builder(backend, name).ttl(ttl).build()?)
    }

    async fn take(&self, value: String) -> Result<Leadership<B>> {
        Ok(self.campaign(value).await?)
    }

    fn fence(held: &Leadership<B>) -> u64 {
        held.term().get()
    }

    fn remaining(held: &Leadership<B>) -> Duration {
        held.remaining()
    }

    async fn hand_over(held: Leadership<B>) -> Result<()> {
        Ok(held.resign().await?)
    }

    async fn check(&self, held: &Leadership<B>, value: &str) -> Result<()> {
        let leader = self.leader().await?;
        match leader {
            Some(l) if l.term == held.term() && l.value.as_deref() == Some(value) => Ok(()),
            other => Err(format!(
                "election {:?}: the store says {other:?} leads, not term {} ({value:?})",
                self.name(),
                held.term().get()
            )
            .into()),
        }
    }
}

impl<B: RawElection> Contender for Lock<B> {
    type Backend = B;
    type Held = LockGuard<B>;

    fn build(backend: B, name: &str, ttl: Duration) -> Result<Self> {
        Ok(Lock::builder(backend, name).ttl(ttl).build()?)
    }

    async fn take(&self, _value: String) -> Result<LockGuard<B>> {
        Ok(self.lock().await?)
    }

    fn fence(held: &LockGuard<B>) -> u64 {
        held.fencing_token().get()
    }

    fn remaining(held: &LockGuard<B>) -> Duration {
        held.remaining()
    }

    async fn hand_over(held: LockGuard<B>) -> Result<()> {
        Ok(held.release().await?)
    }

    async fn check(&self, held: &LockGuard<B>, _value: &str) -> Result<()> {
        let state = self.state().await?;
        if state.holder.as_deref() != Some(held.token().as_str()) {
            return Err(format!(
                "lock {:?}: the store says {:?} holds it, not the waiter that just acquired",
                self.name(),
                state.holder
            )
            .into());
        }
        Ok(())
    }
}

/// `fut`, or an error naming `what` after `limit`.
async fn within<T>(limit: Duration, what: &str, fut: impl Future<Output = T>) -> Result<T> {
    tokio::time::timeout(limit, fut)
        .await
        .map_err(|_| format!("{what} took over {limit:?}").into())
}

/// The standby's `take`, started now in a task of its own: when it returned, and what.
fn campaign_in_background<C: Contender>(
    standby: &C,
    value: String,
) -> JoinHandle<(Instant, Result<C::Held>)> {
    let standby = standby.clone();
    tokio::spawn(async move {
        let held = standby.take(value).await;
        (Instant::now(), held)
    })
}

/// Errs if the standby already returned while the leader should still lead.
async fn still_waiting<C: Contender>(
    waiting: &mut JoinHandle<(Instant, Result<C::Held>)>,
    what: &str,
) -> Result<()> {
    if !waiting.is_finished() {
        return Ok(());
    }
    let (_, held) = waiting.await?;
    match held {
        Ok(_) => Err(format!("two leaders: the standby led while the {what} still did").into()),
        Err(err) => Err(format!("the standby's campaign failed: {err}").into()),
    }
}

/// Errs unless `next` follows `previous` in the store: a greater term / fence, and the
/// store names it.
async fn check_successor<C: Contender>(
    standby: &C,
    previous: u64,
    next: &C::Held,
    value: &str,
) -> Result<()> {
    let fence = C::fence(next);
    if fence <= previous {
        return Err(format!("the successor's term/fence {fence} is not above {previous}").into());
    }
    standby.check(next, value).await
}

/// One hand-off on a resign (release): how long from the call of `resign()`
/// (`release()`) until the standby's `campaign` (`lock()`) returned.
async fn resign_round<C: Contender>(leader: &C, standby: &C, round: usize) -> Result<Duration> {
    let first = within(
        HANG,
        "an uncontended campaign",
        leader.take(format!("leader-{round}")),
    )
    .await??;
    let value = format!("standby-{round}");
    let mut waiting = campaign_in_background(standby, value.clone());
    tokio::time::sleep(SETTLE).await;
    still_waiting::<C>(&mut waiting, "leader").await?;
    let previous = C::fence(&first);
    let handed_over = Instant::now();
    C::hand_over(first).await?;
    let (held_at, next) = within(HANG, "the takeover after a resign", &mut waiting).await??;
    let next = next?;
    let took = held_at.saturating_duration_since(handed_over);
    check_successor(standby, previous, &next, &value).await?;
    C::hand_over(next).await?;
    Ok(took)
}

/// One takeover after a crash: a leader (holder) on a client of its own, in a runtime of
/// its own on a thread of its own, leads; the standby campaigns; the runtime is shut down
/// without resigning. Returns how long from the shutdown until the standby led, and the
/// lease's validity that dlock estimated left at the crash.
async fn crash_round<S, C>(
    store: &Arc<S>,
    name: &str,
    standby: &C,
    round: usize,
) -> Result<(Duration, Duration)>
where
    S: Store,
    C: Contender<Backend = S::Backend>,
{
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel::<u64>();
    let (crash_tx, crash_rx) = tokio::sync::oneshot::channel::<()>();
    let leader = {
        let store = Arc::clone(store);
        let name = name.to_owned();
        std::thread::Builder::new()
            .name("crashing-leader".to_owned())
            .spawn(move || -> Result<(Instant, Duration)> {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?;
                let left = rt.block_on(async move {
                    let backend = store.connect(true).await?;
                    let leader = C::build(backend, &name, S::CRASH_TTL)?;
                    let held = leader.take(format!("doomed-{round}")).await?;
                    let _ = ready_tx.send(C::fence(&held));
                    // The main task says when; if it gave up, crash anyway.
                    let _ = crash_rx.await;
                    let left = C::remaining(&held);
                    // Never resigned nor released, and no client drop that could close a
                    // session politely: the runtime's shutdown below ends it all at once.
                    std::mem::forget((held, leader));
                    Ok::<_, BoxError>(left)
                });
                let crashed = Instant::now();
                rt.shutdown_background();
                Ok((crashed, left?))
            })?
    };
    let join = || async move {
        tokio::task::spawn_blocking(move || leader.join())
            .await?
            .map_err(|_| BoxError::from("the crashing leader's thread panicked"))?
    };
    let previous = match within(HANG, "the crashing leader's campaign", ready_rx).await? {
        Ok(fence) => fence,
        Err(_) => {
            return Err(match join().await {
                Err(err) => format!("the crashing leader failed: {err}").into(),
                Ok(_) => "the crashing leader ended before it led".into(),
            });
        }
    };
    let value = format!("heir-{round}");
    let mut waiting = campaign_in_background(standby, value.clone());
    tokio::time::sleep(SETTLE).await;
    still_waiting::<C>(&mut waiting, "crashing leader").await?;
    let _ = crash_tx.send(());
    let (crashed, left) = join().await?;
    let (held_at, next) = within(
        S::CRASH_TTL * 10 + HANG,
        "the takeover after a crash",
        &mut waiting,
    )
    .await??;
    let next = next?;
    if held_at < crashed {
        return Err("two leaders: the standby led before the leader crashed".into());
    }
    check_successor(standby, previous, &next, &value).await?;
    C::hand_over(next).await?;
    Ok((held_at - crashed, left))
}

/// An election's and a plain lock's samples of one kind of takeover.
#[derive(Clone)]
struct Pair {
    election: Latencies,
    lock: Latencies,
    /// Validity left at the crash (crash rounds only).
    election_left: Vec<Duration>,
    lock_left: Vec<Duration>,
}

impl Pair {
    fn new() -> Pair {
        Pair {
            election: Latencies::new(),
            lock: Latencies::new(),
            election_left: Vec::new(),
            lock_left: Vec::new(),
        }
    }
}

/// One store's figures.
struct Figures {
    store: &'static str,
    resign: Pair,
    crash: Pair,
    crash_ttl: Duration,
}

/// Measures one store: warm-up, the resign rounds, the crash rounds; election and plain
/// lock alternate which goes first.
async fn bench_store<S: Store>(store: S, profile: &Profile, bar: &ProgressBar) -> Result<Figures> {
    let name = S::NAME;
    let fail =
        |what: &str, e: BoxError| -> BoxError { format!("election, {name}, {what}: {e}").into() };
    let store = Arc::new(store);
    bar.set_message(format!("election: {name}: connecting"));
    let connect = || store.connect(false);
    let e_leader = Election::build(connect().await?, "bench:resign", RESIGN_TTL)?;
    let e_standby = Election::build(connect().await?, "bench:resign", RESIGN_TTL)?;
    let l_holder = Lock::build(connect().await?, "bench:resign", RESIGN_TTL)?;
    let l_waiter = Lock::build(connect().await?, "bench:resign", RESIGN_TTL)?;

    // Warm-up: connections, scripts, statements, watchers.
    resign_round(&e_leader, &e_standby, usize::MAX)
        .await
        .map_err(|e| fail("election warm-up", e))?;
    resign_round(&l_holder, &l_waiter, usize::MAX)
        .await
        .map_err(|e| fail("lock warm-up", e))?;

    let mut resign = Pair::new();
    for round in 0..profile.election_rounds {
        bar.set_message(format!("election: {name}: resign (round {})", round + 1));
        for election_turn in order(round) {
            if election_turn {
                let took = resign_round(&e_leader, &e_standby, round)
                    .await
                    .map_err(|e| fail("election resign", e))?;
                resign.election.record(took);
            } else {
                let took = resign_round(&l_holder, &l_waiter, round)
                    .await
                    .map_err(|e| fail("lock release", e))?;
                resign.lock.record(took);
            }
        }
        bar.inc(1);
    }

    let ttl = S::CRASH_TTL;
    let e_heir = Election::build(store.connect(true).await?, "bench:crash", ttl)?;
    let l_heir = Lock::build(store.connect(true).await?, "bench:crash", ttl)?;
    let mut crash = Pair::new();
    for round in 0..profile.election_crash_rounds {
        bar.set_message(format!("election: {name}: crash (round {})", round + 1));
        for election_turn in order(round) {
            if election_turn {
                let (took, left) = crash_round(&store, "bench:crash", &e_heir, round)
                    .await
                    .map_err(|e| fail("election crash", e))?;
                crash.election.record(took);
                crash.election_left.push(left);
            } else {
                let (took, left) = crash_round(&store, "bench:crash", &l_heir, round)
                    .await
                    .map_err(|e| fail("lock crash", e))?;
                crash.lock.record(took);
                crash.lock_left.push(left);
            }
        }
        bar.inc(1);
    }
    Ok(Figures {
        store: name,
        resign,
        crash,
        crash_ttl: ttl,
    })
}

/// Whether the election goes first, then the lock, in `round` (alternating).
fn order(round: usize) -> [bool; 2] {
    if round.is_multiple_of(2) {
        [true, false]
    } else {
        [false, true]
    }
}

/// Progress steps.
pub(crate) fn steps(profile: &Profile) -> u64 {
    (STORES * (profile.election_rounds + profile.election_crash_rounds)) as u64
}

/// The section's results.
pub(crate) struct Section {
    resign_rounds: usize,
    crash_rounds: usize,
    figures: Vec<Figures>,
}

/// A server started on a blocking thread.
async fn start<T: Send + 'static>(
    what: &str,
    f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await?
        .map_err(|e| format!("election: starting {what}: {e}").into())
}

/// Runs the section.
pub(crate) async fn bench(profile: &Profile, bar: &ProgressBar) -> Result<Section> {
    bar.set_message("election: starting redis, memcached, etcd, PostgreSQL, ZooKeeper");
    // Started at once: ZooKeeper's JVM and PostgreSQL's initdb take seconds each.
    let (redis, memcached, etcd, postgres, zookeeper) = tokio::join!(
        start("redis-server", RedisServer::start),
        start("memcached", MemcachedServer::start),
        start("etcd", || EtcdCluster::start(1)),
        start("PostgreSQL", PostgresServer::start),
        start("ZooKeeper", ZkServer::standalone),
    );
    let (redis, memcached, etcd, postgres, zookeeper) =
        (redis?, memcached?, etcd?, postgres?, zookeeper?);

    let mut figures = Vec::with_capacity(STORES);
    figures.push(bench_store(MemoryStore(Memory::new()), profile, bar).await?);
    figures.push(bench_store(RedisStore(redis.url()), profile, bar).await?);
    drop(redis);
    figures.push(bench_store(MemcachedStore(memcached.url()), profile, bar).await?);
    drop(memcached);
    figures.push(bench_store(EtcdStore(etcd.url()), profile, bar).await?);
    drop(etcd);
    figures.push(bench_store(PostgresStore(postgres.url()), profile, bar).await?);
    drop(postgres);
    let session = format!("?session_timeout={}ms", CRASH_TTL.as_millis());
    let zk = ZkStore {
        url: zookeeper.url(ZK_CHROOT, ""),
        crash_url: zookeeper.url(ZK_CHROOT, &session),
    };
    figures.push(bench_store(zk, profile, bar).await?);
    tokio::task::block_in_place(|| drop(zookeeper));
    Ok(Section {
        resign_rounds: profile.election_rounds,
        crash_rounds: profile.election_crash_rounds,
        figures,
    })
}

/// `1 s`, `2 s`, `0.5 s`.
fn fmt_ttl(ttl: Duration) -> String {
    format!("{} s", ttl.as_secs_f64())
}

impl Section {
    /// The section's Markdown.
    pub(crate) fn markdown(&self) -> String {
        let mut md = format!(
            "\n## 10. Leader election: takeover\n\n\
             How long a standby candidate takes to lead once the leader is gone, beside the \
             same hand-off on the plain `Lock` that `Election` is built on, on every store \
             (a private server each, on loopback; memory in-process). Every leader, holder, \
             standby and waiter has a client of its own, as separate processes would. \
             **resign**: a leader leads (`campaign`), one standby campaigns ({settle} ms \
             before, so it is queued), and the time runs from the call of `resign()` until \
             the standby's `campaign` returns — it leads and has advertised its value (one \
             more write than the lock's). Plain lock: a holder, one waiter in `lock()`; \
             from the call of `release()` until the waiter's `lock()` returns. {} rounds, \
             lease 10 s (never reached). **crash**: the leader (holder) runs on a client in \
             a tokio runtime of its own thread, which is shut down without resigning \
             (`std::mem::forget` of the leadership, `shutdown_background()`): no release, \
             no renewal, its connections closed, as when its process is killed; the time \
             runs from the shutdown until the standby leads. {} rounds at the ttl shown: \
             the standby can only lead once the lease runs out, so the takeover is about \
             the lease left at the crash (dlock's own conservative estimate, \
             `remaining()`: the ttl less the time since the lease's last write and a drift \
             allowance) plus the time the store and the standby take to notice. Memcached \
             expires on a whole-second clock (2 s; its validity is a second shorter); \
             ZooKeeper's lease is its session (session timeout = ttl). Medians and p99 are \
             over the rounds (with this few, p99 is the slowest round); `election / lock` \
             divides the p50s.\n\n\
             | store | takeover after | ttl | election p50 | election p99 | plain lock p50 \
             | plain lock p99 | election / lock (p50) | lease left at crash p50, election / \
             lock |\n\
             |---|---|---:|---:|---:|---:|---:|---:|---:|\n",
            self.resign_rounds,
            self.crash_rounds,
            settle = SETTLE.as_millis(),
        );
        for f in &self.figures {
            for (kind, pair, ttl) in [
                ("resign", &f.resign, RESIGN_TTL),
                ("crash", &f.crash, f.crash_ttl),
            ] {
                let (e50, l50) = (pair.election.quantile(0.5), pair.lock.quantile(0.5));
                let left = if pair.election_left.is_empty() {
                    "–".to_owned()
                } else {
                    format!(
                        "{} / {}",
                        fmt_dur(measure::median_duration(&pair.election_left)),
                        fmt_dur(measure::median_duration(&pair.lock_left))
                    )
                };
                md.push_str(&format!(
                    "| {} | {kind} | {} | {} | {} | {} | {} | {} | {left} |\n",
                    f.store,
                    fmt_ttl(ttl),
                    fmt_dur(e50),
                    fmt_dur(pair.election.quantile(0.99)),
                    fmt_dur(l50),
                    fmt_dur(pair.lock.quantile(0.99)),
                    fmt_ratio(e50.as_secs_f64(), Some(l50.as_secs_f64())),
                ));
            }
        }
        md
    }
}
