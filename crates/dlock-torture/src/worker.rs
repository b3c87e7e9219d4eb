//! One torture worker: acquire → read-modify-write the protected resource → release, in a
//! loop until its deadline, printing every step as a JSON line (flushed at once, so a
//! killed worker loses at most the step it was in).
//!
//! dlock's primitives all run through one loop over a [`Lock`] (a plain lock on Redis,
//! memcached, etcd, PostgreSQL or ZooKeeper, a fair lock, a read-write lock's write side,
//! a reentrant lock's holds for one owner, all fenced; a RedLock quorum, which has no
//! fence); an election's leaderships (campaign → write under the term → resign) and the
//! controls have loops of their own.

use std::io::Write as _;
use std::time::Duration;

#[cfg(feature = "etcd")]
use fencelock::backend::Etcd;
use fencelock::backend::{Memcached, Postgres, Quorum, Redis, ZooKeeper};
use fencelock::fenced::RedisFenced;
use fencelock::raw::{RawFencing, RawLock};
use fencelock::{
    Election, FairLock, FencingToken, Lock, LockGuard, Owner, ReentrantLock, RwLock, RwSide, Token,
};
use serde::Serialize;

use crate::args::TortureWorkerArgs;
use crate::exit::{self, Failure};
use crate::model::{Kind, ResourceKeys, monotonic_ns};

/// One line of a worker's history.
#[derive(Debug, Serialize, serde::Deserialize, Clone, PartialEq)]
#[serde(tag = "ev", rename_all = "snake_case")]
pub(crate) enum Step {
    /// The lock is ours (as far as the lock kind can tell), from `t`.
    Acquired { t: u64, token: String, fence: u64 },
    /// The protected resource was read (the write follows after a pause).
    Read { t: u64 },
    /// The unfenced counter was read at `read` and written back + 1.
    Wrote { t: u64, read: i64 },
    /// The fenced resource accepted (or refused) a write of `value`.
    Fenced { t: u64, ok: bool, value: i64 },
    /// The holder starts releasing at `t` (its hold ends here).
    Releasing { t: u64 },
    /// The release's outcome: `Some(true)` ours, `Some(false)` not ours, `None` unknown.
    Released { t: u64, ok: Option<bool> },
    /// A read hold of a read-write lock is ours from `t`.
    ReadAcquired { t: u64 },
    /// The reader starts releasing at `t` (its read hold ends here).
    ReadReleasing { t: u64 },
    /// A reentrant holder entered its hold again: the inner hold's fence (`None`: refused),
    /// and whether the outer hold's lease had lapsed by the time the answer came.
    Reentered {
        t: u64,
        fence: Option<u64>,
        lapsed: bool,
    },
    /// An acquire failed with an error (not contention).
    Error { t: u64, message: String },
    /// A write to the command kinds' resource at `t` by a holder's command, or by the
    /// process it left in the background (`late`): every write is a claim to hold the
    /// lock (see `crate::command`).
    Appended { t: u64, late: bool },
    /// How far the worker's wall clock is off the real one at `t`, in milliseconds
    /// (positive: ahead): reported at its start and whenever it moves by a second or more,
    /// by workers that run under a fake wall clock (the `client-clock` fault).
    Clock { t: u64, offset_ms: i64 },
}

fn emit(step: &Step) {
    if let Ok(line) = serde_json::to_string(step) {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    }
}

fn store_err(e: redis::RedisError) -> Failure {
    Failure::new(exit::UNAVAILABLE, format!("torture worker: {e}"))
}

fn error(message: impl Into<String>) {
    emit(&Step::Error {
        t: monotonic_ns(),
        message: message.into(),
    });
}

/// A release's outcome: `Some(true)` ours, `Some(false)` not ours, `None` unknown.
fn released(outcome: fencelock::Result<()>) -> Option<bool> {
    match outcome {
        Ok(()) => Some(true),
        Err(e) if e.is_lock_lost() => Some(false),
        Err(_) => None,
    }
}

struct Worker {
    kind: Kind,
    keys: ResourceKeys,
    ttl: Duration,
    until: u64,
    resource: redis::aio::MultiplexedConnection,
    fenced: RedisFenced,
}

/// How the loop learns a grant's fence: its fencing token, or none (RedLock's quorum
/// cannot mint one, and its guards have no `fencing_token()`).
type FenceOf<B> = fn(&LockGuard<B>) -> u64;

fn fence_of<B: RawFencing>(guard: &LockGuard<B>) -> u64 {
    guard.fencing_token().get()
}

fn no_fence<B: RawLock>(_: &LockGuard<B>) -> u64 {
    0
}

/// How often a worker looks at its wall clock's offset, and by how much it must move to be
/// reported again.
const CLOCK_EVERY: Duration = Duration::from_millis(50);
const CLOCK_MOVED_MS: i64 = 1000;

/// Reports the worker's wall clock's offset from the real one (`real_base`: the real wall
/// clock minus CLOCK_MONOTONIC, which no fake clock moves here) now, and again whenever it
/// moves, until `until`: the proof that a jump of the workers' clock reached them. A
/// thread of its own, so that every kind's loop reports alike.
fn watch_wall_clock(real_base: i64, until: u64) {
    std::thread::spawn(move || {
        let mut last: Option<i64> = None;
        while monotonic_ns() < until {
            let mono = monotonic_ns();
            let offset_ms = wall_ns()
                .saturating_sub(i128::from(mono))
                .saturating_sub(i128::from(real_base))
                / 1_000_000;
            let offset_ms = i64::try_from(offset_ms).unwrap_or(i64::MAX);
            if last.is_none_or(|l| (offset_ms - l).abs() >= CLOCK_MOVED_MS) {
                last = Some(offset_ms);
                emit(&Step::Clock { t: mono, offset_ms });
            }
            std::thread::sleep(CLOCK_EVERY);
        }
    });
}

pub(crate) async fn run(args: TortureWorkerArgs) -> Result<u8, Failure> {
    let kind = Kind::parse(&args.kind)?;
    if let Some(base) = args.real_wall_minus_monotonic_ns {
        watch_wall_clock(base, args.until_ns);
    }
    let keys = ResourceKeys::parse(&args.keys);
    let ttl = Duration::from_millis(args.ttl_ms);
    let open = |url: &str| {
        redis::Client::open(url).map_err(|e| Failure::usage(format!("torture worker URL: {e}")))
    };
    let resource = open(&args.resource_url)?
        .get_multiplexed_async_connection()
        .await
        .map_err(store_err)?;
    let fenced = RedisFenced::new(keys.fenced.clone())
        .fence_key(keys.highest.clone())
        .journal(keys.log.clone());
    let mut worker = Worker {
        kind,
        keys,
        ttl,
        until: args.until_ns,
        resource,
        fenced,
    };
    // The known-broken locks; the RedLock restart control runs dlock itself.
    if kind.is_control() && !kind.holds_long() {
        // Reconnects by itself after a closed connection or a server restart.
        // No reply timeout: a paused control worker must finish the very call it was
        // stopped in (a timeout would fire the moment it resumes and hide the bug under
        // test).
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_response_timeout(None)
            .set_connection_timeout(Some(ttl))
            .set_number_of_retries(2);
        let lock_conn = open(&args.lock_url)?
            .get_connection_manager_with_config(config)
            .await
            .map_err(store_err)?;
        worker.run_control(lock_conn).await;
        return Ok(exit::SUCCESS);
    }
    let name = worker.keys.lock.clone();
    // The kind's prefix (none for a plain lock), on every store: the orphan audit looks
    // for the lock's key where `Kind::lock_keys` says it is.
    let prefix = kind.lock_prefix();
    match kind {
        // One URL per node, comma-separated.
        Kind::Redlock | Kind::RedlockImmediateRestart | Kind::RedlockDelayedRestart => {
            let mut nodes = Vec::new();
            for url in args.lock_url.split(',') {
                // A failed attempt gives its grants back with each node's response
                // timeout: the restart kinds' clients, two of whose nodes never answer,
                // keep it short so that they ask again soon.
                let timeout = if kind.holds_long() { ttl / 20 } else { ttl };
                nodes.push(
                    Redis::builder(url)
                        .response_timeout(timeout)
                        .connect()
                        .await?,
                );
            }
            // The restart kinds' workers always find two nodes cut off: a short per-node
            // timeout keeps their attempts quick (the hazard needs the other half to try
            // again soon after the bridge restarted).
            let quorum = if kind.holds_long() {
                Quorum::builder(nodes).node_timeout_fraction(0.02).build()?
            } else {
                Quorum::new(nodes)?
            };
            // The restart kinds hold half a lease without renewing (as `dlock acquire`
            // does): the RedLock restart scenario, where nothing but the lease's validity speaks for
            // the holder while the bridge node restarts.
            let lock = Lock::builder(quorum, name)
                .prefix(prefix)
                .ttl(ttl)
                .watchdog(!kind.holds_long())
                .build()?;
            worker.run_dlock(&lock, None, false, no_fence).await;
            return Ok(exit::SUCCESS);
        }
        Kind::MemcachedFenced => {
            let memcached = Memcached::connect(&args.lock_url).await?;
            let lock = Lock::builder(memcached, name)
                .prefix(prefix)
                .ttl(ttl)
                .build()?;
            worker.run_dlock(&lock, None, false, fence_of).await;
            return Ok(exit::SUCCESS);
        }
        // The read-write lock (writers fenced, readers beside them) on memcached's index
        // item and lease items.
        Kind::MemcachedFamilyFenced => {
            let memcached = Memcached::connect(&args.lock_url).await?;
            let rw = RwLock::builder(memcached, name)
                .prefix(prefix)
                .ttl(ttl)
                .build()?;
            worker
                .run_dlock_with(rw.write_lock(), Some(rw.read_lock()), false, fence_of)
                .await;
            return Ok(exit::SUCCESS);
        }
        Kind::PostgresFenced => {
            let postgres = connect_retrying(|| Postgres::connect(&args.lock_url)).await?;
            let lock = Lock::builder(postgres, name)
                .prefix(prefix)
                .ttl(ttl)
                .build()?;
            worker.run_dlock(&lock, None, false, fence_of).await;
            return Ok(exit::SUCCESS);
        }
        // One endpoint per member, comma-separated.
        #[cfg(feature = "etcd")]
        Kind::EtcdFenced => {
            let etcd = connect_retrying(|| Etcd::connect(&args.lock_url)).await?;
            let lock = Lock::builder(etcd, name).prefix(prefix).ttl(ttl).build()?;
            worker.run_dlock(&lock, None, false, fence_of).await;
            return Ok(exit::SUCCESS);
        }
        // The read-write lock (writers fenced, readers beside them) on etcd's queue.
        #[cfg(feature = "etcd")]
        Kind::EtcdFamilyFenced => {
            let etcd = connect_retrying(|| Etcd::connect(&args.lock_url)).await?;
            let rw = RwLock::builder(etcd, name)
                .prefix(prefix)
                .ttl(ttl)
                .build()?;
            worker
                .run_dlock_with(rw.write_lock(), Some(rw.read_lock()), false, fence_of)
                .await;
            return Ok(exit::SUCCESS);
        }
        // One proxy per server, comma-separated, a chroot, and the session timeout (the
        // lease: the kind's ttl) in the URL.
        Kind::ZookeeperFenced => {
            let zk = connect_retrying(|| ZooKeeper::connect(&args.lock_url)).await?;
            let lock = Lock::builder(zk, name).prefix(prefix).ttl(ttl).build()?;
            worker.run_dlock(&lock, None, false, fence_of).await;
            return Ok(exit::SUCCESS);
        }
        _ => {}
    }
    // A replacement may start while a failover is under way: it retries until the
    // sentinels (or the cluster) name a master. With `min_replicas`, a grant counts only
    // once the replica has it.
    let min_replicas = u32::from(kind == Kind::SentinelWaitFenced);
    let redis = connect_retrying(|| {
        Redis::builder(args.lock_url.clone())
            .response_timeout(ttl)
            .min_replicas(min_replicas)
            .connect()
    })
    .await?;
    // Some for the kinds that use it.
    let grace = kind
        .waiter_grace(ttl)
        .unwrap_or(fencelock::DEFAULT_WAITER_GRACE);
    match kind {
        Kind::FairFenced => {
            let fair = FairLock::builder(redis, name)
                .prefix(prefix)
                .ttl(ttl)
                .waiter_grace(grace)
                .build()?;
            worker
                .run_dlock(fair.as_lock(), None, false, fence_of)
                .await;
        }
        Kind::RwlockFenced => {
            let rw = RwLock::builder(redis, name)
                .prefix(prefix)
                .ttl(ttl)
                .writer_grace(grace)
                .build()?;
            worker
                .run_dlock(rw.write_lock(), Some(rw.read_lock()), false, fence_of)
                .await;
        }
        Kind::ReentrantFenced => {
            let lock = ReentrantLock::builder(redis, name)
                .prefix(prefix)
                .ttl(ttl)
                .build()?;
            let me = Owner::new(format!("worker-{}", std::process::id()))?;
            worker
                .run_dlock(&lock.holds_of(&me)?, None, true, fence_of)
                .await;
        }
        Kind::ElectionFenced => {
            let election = Election::builder(redis, name)
                .prefix(prefix)
                .ttl(ttl)
                .build()?;
            // What a candidate advertises: who it is.
            let me = format!("worker-{}", std::process::id());
            worker.run_election(&election, &me).await;
        }
        _ => {
            let lock = Lock::builder(redis, name).prefix(prefix).ttl(ttl).build()?;
            worker.run_dlock(&lock, None, false, fence_of).await;
        }
    }
    Ok(exit::SUCCESS)
}

/// How long a worker tries to reach its store before it gives up.
const CONNECT_FOR: Duration = Duration::from_secs(10);

/// Calls `connect` again and again for up to [`CONNECT_FOR`], unless the input is bad: a
/// worker may start while etcd's members or ZooKeeper's servers elect a leader, or while
/// PostgreSQL restarts after a crash (a replacement after a kill).
async fn connect_retrying<T, Fut>(connect: impl Fn() -> Fut) -> Result<T, Failure>
where
    Fut: std::future::Future<Output = fencelock::Result<T>>,
{
    let deadline = tokio::time::Instant::now() + CONNECT_FOR;
    loop {
        match connect().await {
            Ok(client) => return Ok(client),
            Err(e)
                if e.kind() != fencelock::ErrorKind::InvalidArgument
                    && tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// How soon a worker of the RedLock restart kinds asks again after a refusal.
const RETRY: Duration = Duration::from_millis(25);

/// In rwlock-fenced, every this-many-th hold of a worker is a read hold.
const READ_EVERY: u64 = 3;

/// A model of one network round trip between two commands of a non-atomic control:
/// it makes their race windows as wide as a slow network would.
const GAP: Duration = Duration::from_millis(30);

/// get-del's gap between its release's GET and DEL, where its pause must land: wide
/// enough that the nemesis, told of the release on a loaded machine, stops the worker
/// inside it (a CI run once saw the pause land after the DEL). On its resume the gap has
/// run out, and the stale DEL follows at once, inside the next holder's critical section.
const GET_DEL_GAP: Duration = Duration::from_millis(250);

/// The read-modify-write's pause between read and write: a fault aimed at a holder lands
/// inside it.
const CRITICAL: Duration = Duration::from_millis(10);

/// The controls' critical sections outlast their [`GAP`], so that a stale release that
/// lands in another holder's critical section lets a third holder in while it works.
const CONTROL_CRITICAL: Duration = Duration::from_millis(45);

impl Worker {
    fn remaining(&self) -> Duration {
        Duration::from_nanos(self.until.saturating_sub(monotonic_ns()))
    }

    fn acquired(&self, token: &str, fence: u64) {
        emit(&Step::Acquired {
            t: monotonic_ns(),
            token: token.to_owned(),
            fence,
        });
    }

    /// dlock's loop: hold `lock` (entering it again inside each hold with `reenter`), or
    /// every [`READ_EVERY`]th time take a read hold of `reads`, until the deadline.
    async fn run_dlock<B: RawLock>(
        &mut self,
        lock: &Lock<B>,
        reads: Option<&Lock<RwSide<Redis, false>>>,
        reenter: bool,
        fence_of: FenceOf<B>,
    ) {
        self.run_dlock_with(lock, reads, reenter, fence_of).await;
    }

    /// [`run_dlock`](Self::run_dlock) with the read side of a read-write lock on any
    /// store.
    async fn run_dlock_with<B: RawLock, R: RawLock>(
        &mut self,
        lock: &Lock<B>,
        reads: Option<&Lock<R>>,
        reenter: bool,
        fence_of: FenceOf<B>,
    ) {
        let mut turn = 0u64;
        while monotonic_ns() < self.until {
            turn += 1;
            match reads {
                Some(reads) if turn.is_multiple_of(READ_EVERY) => self.read_hold(reads).await,
                _ => self.hold(lock, reenter, fence_of).await,
            }
        }
    }

    /// One hold: acquire → (re-enter) → fenced or unfenced read-modify-write → release.
    async fn hold<B: RawLock>(&mut self, lock: &Lock<B>, reenter: bool, fence_of: FenceOf<B>) {
        // The RedLock restart kinds try again and again, as many clients would: the
        // other half's majority must be able to form while a holder holds.
        let attempt = if self.kind.holds_long() {
            lock.try_lock().await
        } else {
            lock.try_lock_for(self.remaining()).await
        };
        let guard = match attempt {
            Ok(Some(g)) => g,
            Ok(None) if self.kind.holds_long() => {
                tokio::time::sleep(RETRY).await;
                return;
            }
            Ok(None) => return,
            Err(e) => {
                error(e.to_string());
                tokio::time::sleep(Duration::from_millis(50)).await;
                return;
            }
        };
        let fence = fence_of(&guard);
        self.acquired(guard.token().as_str(), fence);
        if self.kind.holds_long() {
            // Hold for half a lease, or until the lease is known lost.
            tokio::select! {
                () = tokio::time::sleep(self.ttl / 2) => {}
                () = guard.lost() => {}
            }
        }
        let inner = if reenter {
            match Self::reenter(lock, &guard, fence, fence_of).await {
                Ok(inner) => Some(inner),
                Err(t) => {
                    // Not ours any more, or unknown: no write under it. The hold ends
                    // when that became known (before any logging).
                    emit(&Step::Releasing { t });
                    let ok = released(guard.release().await);
                    emit(&Step::Released {
                        t: monotonic_ns(),
                        ok,
                    });
                    return;
                }
            }
        } else {
            None
        };
        // A holder that knows its lease lost stops (the RedLock restart kinds wait on it).
        let stopped = self.kind.holds_long() && guard.is_lost();
        if !stopped && let Err(failure) = self.critical_section(fence).await {
            // The resource is never faulted, but a paused worker's own timers may time its
            // calls out when it resumes: record it and go on.
            error(failure.message);
        }
        emit(&Step::Releasing { t: monotonic_ns() });
        if let Some(inner) = inner
            && released(inner.release().await).is_none()
        {
            error("releasing the inner hold: outcome unknown");
        }
        let ok = released(guard.release().await);
        emit(&Step::Released {
            t: monotonic_ns(),
            ok,
        });
    }

    /// An election's loop: campaign as `me`, write as leader, resign, until the deadline.
    async fn run_election(&mut self, election: &Election<Redis>, me: &str) {
        while monotonic_ns() < self.until {
            self.lead(election, me).await;
        }
    }

    /// One leadership: campaign → fenced read-modify-write under the term → resign. A
    /// campaign that wins the lock but cannot announce its value (deposed, lapsed, or the
    /// store failing) returns an error and resigns in the background: no leadership, no
    /// write, and no grant recorded (its term stays unused, which the fence checks allow).
    async fn lead(&mut self, election: &Election<Redis>, me: &str) {
        let leadership = match election.campaign_for(self.remaining(), me).await {
            Ok(Some(l)) => l,
            Ok(None) => return,
            Err(e) => {
                error(format!("campaign: {e}"));
                tokio::time::sleep(Duration::from_millis(50)).await;
                return;
            }
        };
        let term = leadership.term().get();
        self.acquired(leadership.token().as_str(), term);
        if let Err(failure) = self.critical_section(term).await {
            error(failure.message);
        }
        emit(&Step::Releasing { t: monotonic_ns() });
        let ok = released(leadership.resign().await);
        emit(&Step::Released {
            t: monotonic_ns(),
            ok,
        });
    }

    /// Enters `outer`'s hold again (same owner): the inner hold if it carries the outer
    /// grant's fence. The attempt is abandoned when the outer lease lapses first (its
    /// holder must stop there), and a refusal or another fence is recorded for the checker.
    /// `Err(t)`: no inner hold to write under, known at `t` (the hold ends there).
    async fn reenter<B: RawLock>(
        lock: &Lock<B>,
        outer: &LockGuard<B>,
        fence: u64,
        fence_of: FenceOf<B>,
    ) -> Result<LockGuard<B>, u64> {
        let attempt = tokio::select! {
            got = lock.try_lock() => got,
            () = outer.lost() => {
                let t = monotonic_ns();
                error("the hold lapsed while entering it again");
                return Err(t);
            }
        };
        let t = monotonic_ns();
        match attempt {
            Ok(inner) => {
                let got = inner.as_ref().map(fence_of);
                emit(&Step::Reentered {
                    t,
                    fence: got,
                    lapsed: outer.is_lost(),
                });
                // A hold under another fence is a new tenure, not ours to write under.
                inner.filter(|_| got == Some(fence)).ok_or(t)
            }
            Err(e) => {
                error(format!("entering the hold again: {e}"));
                Err(t)
            }
        }
    }

    /// One read hold of a read-write lock: read the resource (no fence: readers exclude
    /// writers only), then release. Waits at most two ttls, as writers go first.
    async fn read_hold<R: RawLock>(&mut self, reads: &Lock<R>) {
        let guard = match reads.try_lock_for(self.remaining().min(self.ttl * 2)).await {
            Ok(Some(g)) => g,
            Ok(None) => return,
            Err(e) => {
                error(e.to_string());
                tokio::time::sleep(Duration::from_millis(50)).await;
                return;
            }
        };
        emit(&Step::ReadAcquired { t: monotonic_ns() });
        let read: redis::RedisResult<Option<i64>> = redis::cmd("GET")
            .arg(&self.keys.fenced)
            .query_async(&mut self.resource)
            .await;
        if let Err(e) = read {
            error(format!("torture worker: {e}"));
        }
        tokio::time::sleep(CRITICAL).await;
        emit(&Step::ReadReleasing { t: monotonic_ns() });
        let _ = guard.release().await;
    }

    /// The controls' loop, on their own connection to the lock server.
    async fn run_control(&mut self, mut conn: redis::aio::ConnectionManager) {
        while monotonic_ns() < self.until {
            match self.acquire_raw(&mut conn).await {
                Ok(Some(token)) => {
                    if let Err(failure) = self.critical_section(0).await {
                        error(failure.message);
                    }
                    // (get-del reports its release after its GET: see `release_raw`.)
                    if self.kind != Kind::GetDel {
                        emit(&Step::Releasing { t: monotonic_ns() });
                    }
                    let ok = self.release_raw(&mut conn, token).await;
                    emit(&Step::Released {
                        t: monotonic_ns(),
                        ok,
                    });
                }
                Ok(None) => {}
                Err(message) => {
                    error(message);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }

    /// A control's acquire: the token it set.
    async fn acquire_raw(
        &mut self,
        c: &mut redis::aio::ConnectionManager,
    ) -> Result<Option<String>, String> {
        let token = Token::random().map_err(|e| e.to_string())?.to_string();
        let key = self.keys.lock.clone();
        let ttl_ms = u64::try_from(self.ttl.as_millis()).unwrap_or(u64::MAX);
        while monotonic_ns() < self.until {
            let got = match self.kind {
                Kind::SetnxExpire => {
                    let set: bool = redis::cmd("SETNX")
                        .arg(&key)
                        .arg(&token)
                        .query_async(c)
                        .await
                        .map_err(|e| e.to_string())?;
                    if set {
                        self.acquired(&token, 0);
                        tokio::time::sleep(GAP).await;
                        let secs = ttl_ms.div_ceil(1000).max(1);
                        let _: i64 = redis::cmd("EXPIRE")
                            .arg(&key)
                            .arg(secs)
                            .query_async(c)
                            .await
                            .map_err(|e| e.to_string())?;
                        return Ok(Some(token));
                    }
                    false
                }
                Kind::SetnxGetset => {
                    let now = wall_ms();
                    let expires = (now + u128::from(ttl_ms) + 1).to_string();
                    let set: bool = redis::cmd("SETNX")
                        .arg(&key)
                        .arg(&expires)
                        .query_async(c)
                        .await
                        .map_err(|e| e.to_string())?;
                    if set {
                        true
                    } else {
                        let current: Option<String> = redis::cmd("GET")
                            .arg(&key)
                            .query_async(c)
                            .await
                            .map_err(|e| e.to_string())?;
                        let expired = current
                            .as_deref()
                            .and_then(|v| v.parse::<u128>().ok())
                            .is_some_and(|at| at < wall_ms());
                        if expired {
                            let old: Option<String> = redis::cmd("GETSET")
                                .arg(&key)
                                .arg(&expires)
                                .query_async(c)
                                .await
                                .map_err(|e| e.to_string())?;
                            old == current
                        } else {
                            false
                        }
                    }
                }
                Kind::GetDel | Kind::PlainDel => {
                    let set: Option<String> = redis::cmd("SET")
                        .arg(&key)
                        .arg(&token)
                        .arg("NX")
                        .arg("PX")
                        .arg(ttl_ms)
                        .query_async(c)
                        .await
                        .map_err(|e| e.to_string())?;
                    set.is_some()
                }
                _ => false,
            };
            if got {
                self.acquired(&token, 0);
                return Ok(Some(token));
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        Ok(None)
    }

    async fn critical_section(&mut self, fence: u64) -> Result<(), Failure> {
        let r = &mut self.resource;
        if self.kind.is_fenced() {
            // The library's fenced resource (fencelock::fenced), journaling accepted fences for
            // the checker.
            let fence = FencingToken::new(fence);
            let value = match self.fenced.read(r, fence).await? {
                Ok(value) => value.and_then(|v| v.parse::<i64>().ok()).unwrap_or(0),
                Err(_stale) => {
                    emit(&Step::Fenced {
                        t: monotonic_ns(),
                        ok: false,
                        value: 0,
                    });
                    return Ok(());
                }
            };
            emit(&Step::Read { t: monotonic_ns() });
            tokio::time::sleep(CRITICAL).await;
            let written = self
                .fenced
                .write(r, fence, &(value + 1).to_string())
                .await?;
            emit(&Step::Fenced {
                t: monotonic_ns(),
                ok: written.is_ok(),
                value: value + 1,
            });
        } else {
            let read: Option<i64> = redis::cmd("GET")
                .arg(&self.keys.counter)
                .query_async(r)
                .await
                .map_err(store_err)?;
            let read = read.unwrap_or(0);
            emit(&Step::Read { t: monotonic_ns() });
            let critical = if self.kind.is_control() {
                CONTROL_CRITICAL
            } else {
                CRITICAL
            };
            tokio::time::sleep(critical).await;
            let _: () = redis::cmd("SET")
                .arg(&self.keys.counter)
                .arg(read + 1)
                .query_async(r)
                .await
                .map_err(store_err)?;
            emit(&Step::Wrote {
                t: monotonic_ns(),
                read,
            });
        }
        Ok(())
    }

    async fn release_raw(
        &mut self,
        c: &mut redis::aio::ConnectionManager,
        token: String,
    ) -> Option<bool> {
        let key = &self.keys.lock;
        match self.kind {
            Kind::GetDel => {
                let current: Option<Option<String>> =
                    redis::cmd("GET").arg(key).query_async(c).await.ok();
                // Reported once the GET has answered, so that the pause the nemesis aims
                // at this report lands in the gap below (a pause that lands during the GET
                // would start the whole gap again after the resume, and the stale DEL
                // would then miss the next holder's critical section).
                emit(&Step::Releasing { t: monotonic_ns() });
                let current = current?;
                tokio::time::sleep(GET_DEL_GAP).await;
                if current.as_deref() == Some(token.as_str()) {
                    let n: i64 = redis::cmd("DEL").arg(key).query_async(c).await.ok()?;
                    Some(n == 1)
                } else {
                    Some(false)
                }
            }
            Kind::SetnxExpire => {
                // This control's bug is its acquire alone: its release is the correct
                // compare-and-delete, so it cannot clear another's orphaned key.
                let n: i64 = redis::Script::new(
                    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0",
                )
                .key(key)
                .arg(&token)
                .invoke_async(c)
                .await
                .ok()?;
                Some(n == 1)
            }
            _ => {
                let n: i64 = redis::cmd("DEL").arg(key).query_async(c).await.ok()?;
                Some(n == 1)
            }
        }
    }
}

fn wall_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

/// The wall clock (faked, under the `client-clock` fault), in nanoseconds.
fn wall_ns() -> i128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i128::try_from(d.as_nanos()).unwrap_or(i128::MAX))
}
