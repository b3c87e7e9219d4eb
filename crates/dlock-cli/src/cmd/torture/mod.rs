//! `dlock torture`: a bounded, seeded, Jepsen-style safety check.
//!
//! Per lock kind: worker processes loop acquire → read-modify-write → release against the
//! lock server (each through its own fault-injecting TCP proxy), the protected resources
//! live on a separate, never-faulted redis-server, and a nemesis injects faults on a
//! schedule drawn from the seed. The history is checked afterwards ([`check`]).
//!
//! What each kind must show, under every fault (an overlap is *excused* only when one of
//! the two holders was paused while holding, or a restart without persistence — a server,
//! or RedLock nodes started empty at once — fell inside the pair; fences may start over
//! only after a restart). Every kind but the controls must also keep the lock moving:
//! every worker asks for it all the time, so after each grant the next one comes within
//! ttl + ε; a stretch without a grant longer than twice that, with no fault or crash
//! under way or ended less than twice that before, is a *stall*, and fails the run (twice:
//! so that a loaded machine's scheduling hiccup is not taken for a stuck lock).
//!
//! | kind | what the workers do | expected |
//! |---|---|---|
//! | `dlock` | [`Lock`], unfenced counter | overlaps and lost increments only in excused windows; lock free within ttl + ε after a holder's crash; no orphan keys |
//! | `dlock-fenced` | [`Lock`], fenced resource | 0 stale writes accepted, 0 fenced increments lost, fences strictly increasing in grant order, never reused; liveness and orphans as `dlock` |
//! | `fair-fenced` | [`FairLock`](dlock::FairLock) (`dlock-fair:` keys), fenced | as `dlock-fenced`, with one waiter grace (half a ttl here) added to the reacquire bound after a crash; no hold, queue entry or claim left |
//! | `rwlock-fenced` | [`RwLock`](dlock::RwLock) (`dlock-rw:` keys): two of every three holds on the write side, fenced; the third a read hold that reads the resource | as `dlock-fenced` for the writers; no read hold overlaps a write hold outside excused windows; no writer, reader lease or writer claim left |
//! | `reentrant-fenced` | [`ReentrantLock`](dlock::ReentrantLock) (`dlock-re:` keys, a hash), an owner per worker, entered again inside every hold, then the fenced write, inner hold released first | as `dlock-fenced`; every re-entry made while the outer hold was valid gets the outer hold's fence (a mismatch or refusal fails the run) |
//! | `election-fenced` | [`Election`](dlock::Election) (`dlock-election:` keys): each worker campaigns with its id, writes as leader with its **term** as the fence, then resigns | as `dlock-fenced`: 0 stale terms accepted, 0 fenced increments lost, terms strictly increasing in grant order and never reused; liveness and orphans as `dlock` (the leader's record never expires, as the fence counter: it is no orphan) |
//! | `redlock` | [`Lock`] over [`Quorum`](dlock::backend::Quorum)`<Redis>`: 5 redis-servers of its own (whatever `--url` says), each worker reaching each node through its own proxy; unfenced counter (a quorum has no fence) | as `dlock`: no overlap outside pause windows and windows where nodes restarted empty at once (the known RedLock hazard, seed 002: a node that forgot a key can let a second majority form; such overlaps are counted apart); lock free within ttl + ε after a holder's crash; no lock key left on any node |
//! | `postgres-fenced` | [`Lock`] over [`Postgres`](dlock::backend::Postgres): a PostgreSQL of its own, fenced; `restart` is a crash (every process SIGKILLed, started again on its data at once) | 0 stale writes accepted, 0 fenced increments lost, fences strictly increasing in grant order and never reused — a restart excuses no reset (the fence is a committed row); liveness and orphans as `dlock` |
//! | `memcached-fenced` | [`Lock`] over [`Memcached`](dlock::backend::Memcached): a memcached of its own, ttl at least 2 s (its expiry clock ticks in seconds), fenced | 0 stale writes accepted, 0 fenced increments lost, fences strictly increasing in grant order between restarts; overlaps only in pause/restart windows. A restart forgets the fence counter: fences start over at 1, and the resource refuses them (counted as refused) until the counter passes the highest fence it saw — the fenced resource's liveness suffers, its safety does not |
//! | `etcd-fenced` | [`Lock`] over [`Etcd`](dlock::backend::Etcd): a 3-member etcd cluster of its own, each worker reaching each member through its own proxy, ttl at least 2 s (leases count whole seconds), fenced (each acquirer queues a key `<lock key>/<token>` on a lease of its own; the fence is the holder's queue key's create revision) | 0 stale writes accepted, 0 fenced increments lost, fences strictly increasing in grant order and never reused, across member and leader restarts too (a revision never repeats); overlaps only in pause windows — a member's or the leader's restart excuses none (raft keeps the lock); lock free within ttl + ε after a holder's crash; no key left at the lock key or under `<lock key>/` — no holder's or waiter's queue key (an etcd prefix read) |
//! | `zookeeper-fenced` | [`Lock`] over [`ZooKeeper`](dlock::backend::ZooKeeper): a 3-server ensemble of its own (chroot `/dlock-torture`), each worker reaching each server through its own proxy, the session timeout equal to the ttl (at least 2 s), fenced (each acquirer queues an ephemeral sequential node `/<lock key>/<token>-<seq>`; the fence is the holder's node's creation zxid) | 0 stale writes accepted, 0 fenced increments lost, fences strictly increasing in grant order and never reused, across member and leader restarts too (a zxid never repeats: a new leader starts a new epoch in its high 32 bits); overlaps only in pause windows — a server's or the leader's restart excuses none (the quorum keeps the nodes); lock free within ttl + ε after a holder's crash (its node goes when its session expires, a session timeout = ttl after its last ping); no lock node left in `/<lock key>` |
//! | `memory` | [`Lock`] on the memory backend, threads, stalls only | as `dlock-fenced` |
//! | `setnx-expire` … `plain-del` | the seeds' broken locks (controls) | must be caught by their own bug, or the run fails |
//!
//! The nemesis per kind: every fault for the single-Redis kinds; for `redlock` the node
//! faults (freeze, client-pause, restart, script-flush) hit 1 or 2 of the 5 nodes, and the
//! network faults (delay, blackhole, close) one worker's links to 1 or 2 nodes, never more
//! than 2 nodes at a time; its restarts alternate between starting the nodes empty only
//! after 2 × ttl (RedLock's delayed restart: must not cause an overlap) and at once (the
//! hazard: excused). `memcached-fenced` takes pause, kill, restart and the network faults
//! (memcached has no freeze here, no `CLIENT PAUSE`, no scripts). So does `etcd-fenced`:
//! its restarts kill one member and start it again from its data after 2 × ttl — the
//! leader (the member whose `status` names itself leader) at the first, third, …, a
//! follower otherwise — and its network faults hit one worker's links to 1, 2 or all 3
//! members (the test kit gives no member's pid to freeze). `zookeeper-fenced` takes the
//! same faults in the same forms: its restarts kill the leader (the server whose `srvr`
//! says `Mode: leader`) at the first, third, …, a follower otherwise, and start it again
//! from its data directory after 2 × ttl; its network faults hit one worker's links to 1,
//! 2 or all 3 servers.

mod check;
mod svg;
pub(crate) mod worker;

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use dlock::Lock;
use dlock::backend::Memory;
use dlock::keys::LockKeys;
use dlock_test::postgres::PostgresServer;
use dlock_test::proxy::{Fault as ProxyFault, Proxy};
use dlock_test::server::{EtcdCluster, MemcachedServer, RedisServer};
use dlock_test::zookeeper::ZooKeeper as ZkEnsemble;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde::Serialize;
use tokio::process::Child;

use self::check::{Findings, Hold, Kill, Resources};
use self::worker::Step;
use crate::args::TortureArgs;
use crate::exit::{self, Failure};

/// Now on CLOCK_MONOTONIC, in nanoseconds: one clock for every process on the host.
pub(super) fn monotonic_ns() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .map(|ts| {
            u64::try_from(ts.tv_sec()).unwrap_or(0) * 1_000_000_000
                + u64::try_from(ts.tv_nsec()).unwrap_or(0)
        })
        .unwrap_or(0)
}

/// A lock kind under test: one of dlock's primitives, or one of the seeds' broken variants
/// (controls). See the module docs for what each must show.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(super) enum Kind {
    Dlock,
    DlockFenced,
    Memory,
    SetnxExpire,
    SetnxGetset,
    GetDel,
    PlainDel,
    // Declared last: the discriminant seeds each kind's fault schedule, so the kinds
    // above keep theirs.
    FairFenced,
    RwlockFenced,
    ReentrantFenced,
    Redlock,
    MemcachedFenced,
    EtcdFenced,
    PostgresFenced,
    ZookeeperFenced,
    ElectionFenced,
}

/// How many independent masters the `redlock` kind runs over.
const REDLOCK_NODES: usize = 5;

/// How many members the `etcd-fenced` kind's cluster has: one may be down, and raft still
/// has a majority.
const ETCD_MEMBERS: usize = 3;

/// How many servers the `zookeeper-fenced` kind's ensemble has: one may be down, and the
/// other two are still a quorum.
const ZOOKEEPER_MEMBERS: usize = 3;

/// The `zookeeper-fenced` kind's least ttl, which is also its workers' session timeout
/// (their lease). A worker's client gives up on a silent server after 2/5 of the session
/// timeout and must reach another one within the rest, and an election after the
/// leader's death takes the kit's JVMs up to about a second on a loaded machine: with a
/// shorter session, every restart of a server would end the sessions behind it — safe,
/// but the run would test session expiry instead of a hold carried through a fail-over.
/// It also spaces faults as etcd's 2 s does, so the `--quick` run fits four.
const ZOOKEEPER_MIN_TTL: Duration = Duration::from_secs(2);

/// Where the `zookeeper-fenced` kind's locks live in its ensemble (a chroot exercised as
/// users' URLs have them).
const ZOOKEEPER_CHROOT: &str = "/dlock-torture";

/// The `etcd-fenced` kind's least ttl, as memcached's: etcd leases count whole seconds,
/// are raised to at least 1.5 election timeouts (to 2 s at etcd's default settings), and
/// are revoked on the leader's 500 ms tick, so a 1 s lease may last half as long again
/// as its ttl, or twice as long.
const ETCD_MIN_TTL: Duration = Duration::from_secs(2);

impl Kind {
    const ALL: [Kind; 16] = [
        Kind::Dlock,
        Kind::DlockFenced,
        Kind::FairFenced,
        Kind::RwlockFenced,
        Kind::ReentrantFenced,
        Kind::ElectionFenced,
        Kind::Redlock,
        Kind::MemcachedFenced,
        Kind::EtcdFenced,
        Kind::PostgresFenced,
        Kind::ZookeeperFenced,
        Kind::Memory,
        Kind::SetnxExpire,
        Kind::SetnxGetset,
        Kind::GetDel,
        Kind::PlainDel,
    ];

    pub(super) fn id(self) -> &'static str {
        match self {
            Kind::Dlock => "dlock",
            Kind::DlockFenced => "dlock-fenced",
            Kind::FairFenced => "fair-fenced",
            Kind::RwlockFenced => "rwlock-fenced",
            Kind::ReentrantFenced => "reentrant-fenced",
            Kind::ElectionFenced => "election-fenced",
            Kind::Redlock => "redlock",
            Kind::MemcachedFenced => "memcached-fenced",
            Kind::EtcdFenced => "etcd-fenced",
            Kind::PostgresFenced => "postgres-fenced",
            Kind::ZookeeperFenced => "zookeeper-fenced",
            Kind::Memory => "memory",
            Kind::SetnxExpire => "setnx-expire",
            Kind::SetnxGetset => "setnx-getset",
            Kind::GetDel => "get-del",
            Kind::PlainDel => "plain-del",
        }
    }

    fn is_control(self) -> bool {
        matches!(
            self,
            Kind::SetnxExpire | Kind::SetnxGetset | Kind::GetDel | Kind::PlainDel
        )
    }

    /// Whether the workers write the fenced resource (else the unfenced counter).
    fn is_fenced(self) -> bool {
        matches!(
            self,
            Kind::DlockFenced
                | Kind::Memory
                | Kind::FairFenced
                | Kind::RwlockFenced
                | Kind::ReentrantFenced
                | Kind::ElectionFenced
                | Kind::MemcachedFenced
                | Kind::EtcdFenced
                | Kind::PostgresFenced
                | Kind::ZookeeperFenced
        )
    }

    /// Whether the kind runs on lock servers of its own, whatever `--url` says: RedLock
    /// needs several independent masters, and memcached, etcd, PostgreSQL and ZooKeeper
    /// are not Redis.
    fn owns_servers(self) -> bool {
        matches!(
            self,
            Kind::Redlock
                | Kind::MemcachedFenced
                | Kind::EtcdFenced
                | Kind::PostgresFenced
                | Kind::ZookeeperFenced
        )
    }

    /// The kind's lease: memcached's one-second expiry clock needs at least
    /// [`MIN_TTL`](dlock::backend::memcached::MIN_TTL), etcd's whole-second leases
    /// [`ETCD_MIN_TTL`], ZooKeeper's sessions [`ZOOKEEPER_MIN_TTL`].
    fn ttl(self, ttl: Duration) -> Duration {
        match self {
            Kind::MemcachedFenced => ttl.max(dlock::backend::memcached::MIN_TTL),
            Kind::EtcdFenced => ttl.max(ETCD_MIN_TTL),
            Kind::ZookeeperFenced => ttl.max(ZOOKEEPER_MIN_TTL),
            _ => ttl,
        }
    }

    /// How much longer than its ttl a lease may outlive its last renewal on the server:
    /// memcached counts expiry on a clock that ticks once a second; etcd's leader revokes
    /// expired leases on a 500 ms tick, and a new leader extends every lease by an
    /// election timeout (500 ms in the test kit's clusters); ZooKeeper's leader expires
    /// sessions on its tick (100 ms in the kit's ensembles), and a new leader gives every
    /// session a whole timeout again.
    fn expiry_slack(self) -> Duration {
        match self {
            Kind::MemcachedFenced | Kind::EtcdFenced | Kind::ZookeeperFenced => {
                Duration::from_secs(1)
            }
            _ => Duration::ZERO,
        }
    }

    /// Whether `fault` means anything for the kind. The memory kind can only stall a
    /// holder; memcached, etcd and ZooKeeper have no `CLIENT PAUSE` and no scripts, and the
    /// test kit cannot freeze memcached or etcd (it gives no process id of theirs).
    /// ZooKeeper takes etcd's faults (its kit could freeze a server; not done here yet).
    fn applies(self, fault: Fault) -> bool {
        match self {
            Kind::Memory => fault == Fault::Pause,
            Kind::MemcachedFenced | Kind::EtcdFenced | Kind::ZookeeperFenced => !matches!(
                fault,
                Fault::Freeze | Fault::ClientPause | Fault::ScriptFlush
            ),
            Kind::PostgresFenced => !matches!(fault, Fault::ClientPause | Fault::ScriptFlush),
            _ => true,
        }
    }

    /// Under `--quick`, the faults a kind's short run still has room for: the controls
    /// only need the faults that break them; RedLock skips the two that are no different
    /// on a quorum; memcached's, etcd's and ZooKeeper's 2 s ttl spaces faults 6 s apart, so
    /// four fit in their runs (on etcd and ZooKeeper, the one restart is the leader's).
    fn in_quick_run(self, fault: Fault) -> bool {
        match self {
            k if k.is_control() => matches!(fault, Fault::Pause | Fault::Kill),
            Kind::Redlock => !matches!(fault, Fault::ClientPause | Fault::ScriptFlush),
            Kind::MemcachedFenced | Kind::EtcdFenced | Kind::ZookeeperFenced => matches!(
                fault,
                Fault::Pause | Fault::Kill | Fault::Restart | Fault::Blackhole
            ),
            _ => true,
        }
    }

    /// The key prefix of the kind's lock: the library's default for each primitive, and
    /// none for plain locks and controls (which share the standard protocol's key).
    fn lock_prefix(self) -> &'static str {
        match self {
            Kind::FairFenced => dlock::DEFAULT_FAIR_PREFIX,
            Kind::RwlockFenced => dlock::DEFAULT_RWLOCK_PREFIX,
            Kind::ReentrantFenced => dlock::DEFAULT_REENTRANT_PREFIX,
            Kind::ElectionFenced => dlock::DEFAULT_ELECTION_PREFIX,
            _ => "",
        }
    }

    /// The kind's lock keys in the store, for the lock named after `keys`.
    fn lock_keys(self, keys: &ResourceKeys) -> Option<LockKeys> {
        LockKeys::new(self.lock_prefix(), &keys.lock).ok()
    }

    /// The keys that hold a hold or a waiter's place; all must be gone once every lease and
    /// claim has run out. Each primitive's companions are named as its Redis backend names
    /// them. (A reentrant lock's holds all live in its lock key, a hash.)
    fn live_keys(self, lock: &LockKeys) -> Vec<String> {
        let mut keys = vec![lock.lock().to_owned()];
        match self {
            Kind::FairFenced => keys.extend([lock.companion("queue"), lock.companion("claims")]),
            Kind::RwlockFenced => {
                keys.extend([lock.companion("readers"), lock.companion("writers")]);
            }
            _ => {}
        }
        keys
    }

    /// The keys that outlive every hold by design, deleted after the run: the fence
    /// counter, and an election's leader record (neither expires: terms must never go
    /// back).
    fn lasting_keys(self, lock: &LockKeys) -> Vec<String> {
        let mut keys = vec![lock.fence().to_owned()];
        if self == Kind::ElectionFenced {
            keys.push(lock.companion(dlock::raw::RECORD));
        }
        keys
    }

    /// How long a queued waiter's place (fair-fenced) or a waiting writer's claim
    /// (rwlock-fenced) outlives its next expected attempt. Half a ttl rather than the
    /// library's default of seconds: a crashed waiter's entry then lapses soon after the
    /// holder's lease, which keeps the reacquire bound and the orphan audit tight.
    fn waiter_grace(self, ttl: Duration) -> Option<Duration> {
        matches!(self, Kind::FairFenced | Kind::RwlockFenced)
            .then(|| (ttl / 2).clamp(Duration::from_millis(10), Duration::from_secs(60)))
    }

    /// Extra time, past ttl + ε, the next holder may need after a holder's crash: in a fair
    /// lock, up to one waiter grace. Nothing announces a crashed holder's expiry, so the
    /// next in line wakes on its own timer, and a waiter that last tried while the lock was
    /// passing to the head was told to wait out the head's claim (up to ttl + grace); a
    /// waiter that crashed at the head of the queue keeps its place as long. (A read-write
    /// lock's writers do not queue behind each other.)
    fn reacquire_slack(self, ttl: Duration) -> Duration {
        match self {
            Kind::FairFenced => self.waiter_grace(ttl).unwrap_or_default(),
            _ => Duration::ZERO,
        }
    }

    pub(super) fn parse(s: &str) -> Result<Kind, Failure> {
        Kind::ALL
            .into_iter()
            .find(|k| k.id() == s)
            .ok_or_else(|| Failure::usage(format!("unknown lock kind {s:?}")))
    }
}

/// A fault the nemesis can inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(super) enum Fault {
    /// SIGSTOP a holding worker for 2.5 × ttl.
    Pause,
    /// SIGKILL a holding worker (a replacement starts).
    Kill,
    /// SIGSTOP the lock server for 2 × ttl.
    Freeze,
    /// `CLIENT PAUSE` the lock server for 2 × ttl.
    ClientPause,
    /// Kill the lock server and start it empty (no persistence). On RedLock's nodes,
    /// every other restart is a [`DelayedRestart`](Fault::DelayedRestart); on etcd's
    /// members and ZooKeeper's servers, a restart is a
    /// [`LeaderRestart`](Fault::LeaderRestart) or a [`MemberRestart`](Fault::MemberRestart)
    /// (they keep their data).
    Restart,
    /// `SCRIPT FLUSH` on the lock server.
    ScriptFlush,
    /// Delay a worker's lock traffic by 0.6 × ttl for 2 × ttl.
    Delay,
    /// Hold a worker's lock traffic for 2 × ttl.
    Blackhole,
    /// Drop a worker's lock connections.
    Close,
    /// Kill RedLock nodes and start them empty only after 2 × ttl, once every lease they
    /// held has run out (RedLock's delayed restart). Not a fault of its own in `--faults`:
    /// the form every other `restart` of RedLock's nodes takes.
    DelayedRestart,
    /// Kill etcd's or ZooKeeper's leader (as its members' `status`, or its servers'
    /// `srvr`, name it) and start it again from its data after 2 × ttl: the other two
    /// elect a new leader meanwhile. The form of the first, third, … `restart` on etcd and
    /// ZooKeeper (not a fault of its own in `--faults`).
    LeaderRestart,
    /// Kill a follower (or a member when no leader could be found) and start it again
    /// from its data after 2 × ttl. The form of every other `restart` on etcd and
    /// ZooKeeper.
    MemberRestart,
    /// Kill PostgreSQL (every process, SIGKILL) and start it again on its data at once:
    /// a crash of a durable store, which must keep every hold and fence. The form
    /// `restart` takes on postgres-fenced (not a fault of its own in `--faults`).
    CrashRestart,
}

impl Fault {
    const ALL: [Fault; 9] = [
        Fault::Pause,
        Fault::Kill,
        Fault::Freeze,
        Fault::ClientPause,
        Fault::Restart,
        Fault::ScriptFlush,
        Fault::Delay,
        Fault::Blackhole,
        Fault::Close,
    ];

    pub(super) fn id(self) -> &'static str {
        match self {
            Fault::Pause => "pause",
            Fault::Kill => "kill",
            Fault::Freeze => "freeze",
            Fault::ClientPause => "client-pause",
            Fault::Restart => "restart",
            Fault::ScriptFlush => "script-flush",
            Fault::Delay => "delay",
            Fault::Blackhole => "blackhole",
            Fault::Close => "close",
            Fault::DelayedRestart => "delayed-restart",
            Fault::LeaderRestart => "leader-restart",
            Fault::MemberRestart => "member-restart",
            Fault::CrashRestart => "crash-restart",
        }
    }

    fn parse_list(s: &str) -> Result<Vec<Fault>, Failure> {
        if s.trim() == "all" {
            return Ok(Fault::ALL.to_vec());
        }
        s.split(',')
            .map(str::trim)
            .filter(|f| !f.is_empty())
            .map(|f| {
                Fault::ALL
                    .into_iter()
                    .find(|x| x.id() == f)
                    .ok_or_else(|| Failure::usage(format!("unknown fault {f:?}")))
            })
            .collect()
    }

    fn needs_own_server(self) -> bool {
        matches!(self, Fault::Freeze | Fault::Restart)
    }

    /// Whether the fault acts on lock servers (on RedLock: a minority of its nodes; on
    /// etcd and ZooKeeper: one member) or on the links to them, rather than on a worker
    /// process.
    fn hits_nodes(self) -> bool {
        !matches!(self, Fault::Pause | Fault::Kill)
    }
}

/// A fault as it happened.
#[derive(Debug, Clone, Serialize)]
pub(super) struct FaultWindow {
    pub(super) fault: Fault,
    pub(super) start: u64,
    pub(super) end: u64,
    pub(super) worker: Option<usize>,
    /// The RedLock nodes, etcd members or ZooKeeper servers hit (by index), for the faults
    /// that hit nodes or links to them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(super) nodes: Vec<usize>,
}

/// The keys of one kind's run: the lock, and the resources it protects.
pub(super) struct ResourceKeys {
    base: String,
    pub(super) lock: String,
    pub(super) counter: String,
    pub(super) fenced: String,
    pub(super) highest: String,
    pub(super) log: String,
}

impl ResourceKeys {
    pub(super) fn parse(base: &str) -> ResourceKeys {
        ResourceKeys {
            base: base.to_owned(),
            lock: format!("{base}:lock"),
            counter: format!("{base}:counter"),
            fenced: format!("{base}:fenced"),
            highest: format!("{base}:highest-fence"),
            log: format!("{base}:fence-log"),
        }
    }
}

/// splitmix64: the nemesis' reproducible choices.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }
}

struct Config {
    workers: usize,
    ttl: Duration,
    seed: u64,
    faults: Vec<Fault>,
    /// Faults not to inject on a lock server given with `--url` (dlock does not own it);
    /// they still apply to the kinds that run on servers of their own.
    not_on_given: Vec<Fault>,
    /// `--kinds all`: a kind whose server is not installed is skipped, not an error.
    all_kinds: bool,
    quick: bool,
    duration: Duration,
}

/// Where the locks live.
enum LockServer {
    Own(RedisServer),
    Given(String),
}

impl LockServer {
    fn url(&self) -> String {
        match self {
            LockServer::Own(s) => s.url(),
            LockServer::Given(u) => u.clone(),
        }
    }
}

#[derive(Serialize)]
struct Report<'a> {
    seed: u64,
    ttl_ms: u64,
    workers: usize,
    duration_ms: u64,
    lock_server: &'a str,
    kinds: &'a [KindReport],
}

#[derive(Serialize)]
struct KindReport {
    findings: Findings,
    fault_windows: Vec<FaultWindow>,
    kills: Vec<Kill>,
    /// Exclusive holds (a read-write lock's write holds).
    holds: Vec<Hold>,
    /// A read-write lock's read holds.
    read_holds: Vec<Hold>,
}

pub(crate) async fn torture(args: TortureArgs) -> Result<u8, Failure> {
    let kinds: Vec<Kind> = if args.kinds.trim() == "all" {
        Kind::ALL.to_vec()
    } else {
        args.kinds
            .split(',')
            .map(|k| Kind::parse(k.trim()))
            .collect::<Result<_, _>>()?
    };
    let faults = Fault::parse_list(&args.faults)?;
    if args.workers < 2 {
        return Err(Failure::usage("--workers must be at least 2"));
    }
    if args.ttl < dlock::MIN_TTL {
        return Err(Failure::usage(format!(
            "--ttl must be at least {:?}",
            dlock::MIN_TTL
        )));
    }
    let mut not_on_given = Vec::new();
    let mut lock_server = match args.url.as_deref().filter(|u| !u.is_empty()) {
        Some(url) => {
            not_on_given.extend(faults.iter().copied().filter(|f| f.needs_own_server()));
            if !not_on_given.is_empty() {
                eprintln!(
                    "dlock: freeze and restart need a server dlock owns; skipped for {url} \
                     (the redlock, memcached-fenced and etcd-fenced kinds run on servers of \
                     their own)"
                );
            }
            if args.faults.trim() == "all" {
                // They act on every client of a server we do not own: only when named.
                not_on_given.extend([Fault::ClientPause, Fault::ScriptFlush]);
            }
            LockServer::Given(url.to_owned())
        }
        None => LockServer::Own(start_server()?),
    };
    // The protected resources live apart from the lock server, which the nemesis faults.
    let resource_server = start_server()?;
    let config = Config {
        workers: args.workers,
        ttl: args.ttl,
        seed: args.seed,
        faults,
        not_on_given,
        all_kinds: args.kinds.trim() == "all",
        quick: args.quick,
        duration: args.duration,
    };
    std::fs::create_dir_all(&args.out)
        .map_err(|e| Failure::usage(format!("cannot create {}: {e}", args.out.display())))?;
    println!(
        "dlock torture: seed {}, {} workers, ttl {}, lock server {}, resources on {}",
        config.seed,
        config.workers,
        humantime::format_duration(config.ttl),
        lock_server.url(),
        resource_server.url()
    );
    // A signal ends the run cleanly: dropping the run's future kills its workers
    // (kill_on_drop, SIGKILL works on stopped ones too) and returning drops both servers
    // (a frozen one is continued first), so nothing is left behind.
    let mut signals = crate::cmd::Signals::install()?;
    let reports = tokio::select! {
        reports = run_kinds(&config, &kinds, &mut lock_server, &resource_server, &args.out) => reports?,
        sig = signals.recv() => {
            eprintln!("dlock: torture interrupted ({sig}); cleaning up");
            return Ok(128 + sig as u8);
        }
    };
    print_summary(&reports);
    let json = serde_json::to_string_pretty(&Report {
        seed: config.seed,
        ttl_ms: u64::try_from(config.ttl.as_millis()).unwrap_or(u64::MAX),
        workers: config.workers,
        duration_ms: u64::try_from(config.duration.as_millis()).unwrap_or(u64::MAX),
        lock_server: &lock_server.url(),
        kinds: &reports,
    })
    .map_err(|e| Failure::new(exit::UNAVAILABLE, format!("report: {e}")))?;
    write(&args.out.join("report.json"), &json)?;
    println!(
        "\nreport: {}  timelines: {}/timeline-<kind>.svg",
        args.out.join("report.json").display(),
        args.out.display()
    );
    let failed = reports.iter().filter(|r| !r.findings.verdict_ok).count();
    if failed > 0 {
        eprintln!("dlock: torture: {failed} unexpected result(s)");
        return Ok(exit::TORTURE_FAILED);
    }
    Ok(exit::SUCCESS)
}

/// Runs every kind in turn, writing each one's timeline to `out`.
async fn run_kinds(
    config: &Config,
    kinds: &[Kind],
    lock_server: &mut LockServer,
    resource_server: &RedisServer,
    out: &Path,
) -> Result<Vec<KindReport>, Failure> {
    let mut reports = Vec::new();
    for &kind in kinds {
        let (kind_faults, duration) = plan(config, kind);
        let faults = kind_faults
            .iter()
            .map(|f| f.id())
            .collect::<Vec<_>>()
            .join(",");
        let own = match kind {
            Kind::Redlock => format!("  ({REDLOCK_NODES} redis-servers of its own)"),
            Kind::MemcachedFenced => format!(
                "  (a memcached of its own, ttl {})",
                humantime::format_duration(kind.ttl(config.ttl))
            ),
            Kind::PostgresFenced => {
                "  (a PostgreSQL of its own; restarts keep its data)".to_owned()
            }
            Kind::EtcdFenced => format!(
                "  (an etcd cluster of {ETCD_MEMBERS} of its own, ttl {})",
                humantime::format_duration(kind.ttl(config.ttl))
            ),
            Kind::ZookeeperFenced => format!(
                "  (a ZooKeeper ensemble of {ZOOKEEPER_MEMBERS} of its own, ttl = session timeout {})",
                humantime::format_duration(kind.ttl(config.ttl))
            ),
            _ => String::new(),
        };
        let line = format!(
            "  {:<16} {:>5.1} s  faults: {faults}{own}",
            kind.id(),
            duration.as_secs_f64(),
        );
        let report = match kind {
            Kind::Memory => {
                println!("{line}");
                run_memory(config, &kind_faults, duration)?
            }
            Kind::Redlock => {
                println!("{line}");
                let nodes = (0..REDLOCK_NODES)
                    .map(|_| start_server())
                    .collect::<Result<Vec<_>, _>>()?;
                let store = Store::quorum(nodes).await?;
                run_workers(config, kind, &kind_faults, duration, store, resource_server).await?
            }
            Kind::MemcachedFenced => {
                let server = match MemcachedServer::start() {
                    Ok(server) => server,
                    // A user's `dlock torture` need not have memcached installed.
                    Err(e) if config.all_kinds => {
                        println!("  {:<16} skipped: {e}", kind.id());
                        continue;
                    }
                    Err(e) => {
                        return Err(Failure::new(
                            exit::UNAVAILABLE,
                            format!("the memcached-fenced kind needs memcached on PATH: {e}"),
                        ));
                    }
                };
                println!("{line}");
                let store = Store::Memcached(server);
                run_workers(config, kind, &kind_faults, duration, store, resource_server).await?
            }
            Kind::EtcdFenced => {
                let cluster = match EtcdCluster::start(ETCD_MEMBERS) {
                    Ok(cluster) => cluster,
                    // A user's `dlock torture` need not have etcd installed.
                    Err(e) if config.all_kinds => {
                        println!("  {:<16} skipped: {e}", kind.id());
                        continue;
                    }
                    Err(e) => {
                        return Err(Failure::new(
                            exit::UNAVAILABLE,
                            format!("the etcd-fenced kind needs etcd on PATH: {e}"),
                        ));
                    }
                };
                println!("{line}");
                let store = Store::etcd(cluster).await?;
                run_workers(config, kind, &kind_faults, duration, store, resource_server).await?
            }
            Kind::ZookeeperFenced => {
                let ensemble = match start_zookeeper().await {
                    Ok(ensemble) => ensemble,
                    // A user's `dlock torture` need not have ZooKeeper installed.
                    Err(e) if config.all_kinds => {
                        println!("  {:<16} skipped: {e}", kind.id());
                        continue;
                    }
                    Err(e) => {
                        return Err(Failure::new(
                            exit::UNAVAILABLE,
                            format!(
                                "the zookeeper-fenced kind needs ZooKeeper installed (java on \
                                 PATH and Debian's zookeeper package, or $DLOCK_ZOOKEEPER_JAR): {e}"
                            ),
                        ));
                    }
                };
                println!("{line}");
                let store = Store::ZooKeeper {
                    ensemble,
                    session_timeout: kind.ttl(config.ttl),
                };
                run_workers(config, kind, &kind_faults, duration, store, resource_server).await?
            }
            Kind::PostgresFenced => {
                let server = match PostgresServer::start() {
                    Ok(server) => server,
                    // A user's `dlock torture` need not have PostgreSQL installed.
                    Err(e) if config.all_kinds => {
                        println!("  {:<16} skipped: {e}", kind.id());
                        continue;
                    }
                    Err(e) => {
                        return Err(Failure::new(
                            exit::UNAVAILABLE,
                            format!("the postgres-fenced kind needs PostgreSQL installed: {e}"),
                        ));
                    }
                };
                println!("{line}");
                let store = Store::postgres(server).await?;
                run_workers(config, kind, &kind_faults, duration, store, resource_server).await?
            }
            _ => {
                println!("{line}");
                let store = Store::redis(lock_server).await?;
                run_workers(config, kind, &kind_faults, duration, store, resource_server).await?
            }
        };
        let svg = svg::timeline(&report, config.workers);
        write(&out.join(format!("timeline-{}.svg", kind.id())), &svg)?;
        reports.push(report);
    }
    Ok(reports)
}

fn write(path: &Path, text: &str) -> Result<(), Failure> {
    std::fs::write(path, text).map_err(|e| {
        Failure::new(
            exit::UNAVAILABLE,
            format!("writing {}: {e}", path.display()),
        )
    })
}

/// Starts the `zookeeper-fenced` kind's ensemble (JVMs: seconds, so on a blocking thread),
/// once `java` is known to be there: the kit would otherwise wait a minute, three times,
/// for servers that never started.
async fn start_zookeeper() -> Result<ZkEnsemble, String> {
    let on_path = std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join("java").is_file()));
    if !on_path {
        return Err("java not found on PATH".to_owned());
    }
    tokio::task::spawn_blocking(|| ZkEnsemble::start(ZOOKEEPER_MEMBERS))
        .await
        .map_err(|e| format!("starting ZooKeeper: {e}"))?
        .map_err(|e| e.to_string())
}

fn start_server() -> Result<RedisServer, Failure> {
    RedisServer::start().map_err(|e| {
        Failure::new(
            exit::UNAVAILABLE,
            format!("dlock torture needs redis-server on PATH: {e}"),
        )
    })
}

/// The faults and duration of one kind (see [`Kind::applies`], [`Kind::in_quick_run`]).
fn plan(config: &Config, kind: Kind) -> (Vec<Fault>, Duration) {
    let faults: Vec<Fault> = config
        .faults
        .iter()
        .copied()
        .filter(|&f| kind.applies(f))
        .filter(|&f| !config.quick || kind.in_quick_run(f))
        .filter(|f| kind.owns_servers() || !config.not_on_given.contains(f))
        .collect();
    let duration = match kind {
        _ if !config.quick => config.duration,
        Kind::Memory => Duration::from_secs(8),
        k if k.is_control() => Duration::from_secs(12),
        // Room for its seven quick faults, three ttls apart (see `schedule`).
        Kind::Redlock => Duration::from_secs(24),
        // Room for their four quick faults, three of their 2 s ttls apart.
        Kind::MemcachedFenced | Kind::EtcdFenced | Kind::ZookeeperFenced => Duration::from_secs(30),
        _ => Duration::from_secs(30),
    };
    (faults, duration)
}

/// When each fault starts: spread over the run, each fault at least once, in a seeded
/// order, twice over when there is time.
fn schedule(
    config: &Config,
    kind: Kind,
    faults: &[Fault],
    duration: Duration,
) -> Vec<(Duration, Fault)> {
    if faults.is_empty() {
        return Vec::new();
    }
    let mut rng = Rng(config.seed ^ (kind as u64).wrapping_mul(0x9e37_79b9));
    // A fault window lasts up to 2.5 ttl (and the nemesis never starts one while another
    // is open), so windows start three ttls apart.
    let slot = kind.ttl(config.ttl) * 3;
    let room = usize::try_from(duration.as_millis() / slot.as_millis().max(1))
        .unwrap_or(1)
        .saturating_sub(1)
        .max(1);
    let n = room.min(faults.len() * 2).max(faults.len().min(room));
    let mut order: Vec<Fault> = faults.iter().copied().cycle().take(n).collect();
    for i in (1..order.len()).rev() {
        order.swap(i, rng.below(i + 1));
    }
    let step = duration / u32::try_from(n + 1).unwrap_or(1);
    order
        .into_iter()
        .enumerate()
        .map(|(i, f)| (step * u32::try_from(i + 1).unwrap_or(1), f))
        .collect()
}

/// The lock servers of one kind's run, as the nemesis and the audit reach them.
enum Store<'a> {
    /// One Redis server (ours or the one `--url` named), shared by the single-Redis kinds.
    Redis {
        server: &'a mut LockServer,
        admin: redis::aio::ConnectionManager,
    },
    /// RedLock's independent masters, ours, each with an admin connection.
    Quorum {
        nodes: Vec<RedisServer>,
        admins: Vec<redis::aio::ConnectionManager>,
    },
    /// A memcached of our own.
    Memcached(MemcachedServer),
    /// A PostgreSQL of our own, with an admin connection for the audit.
    Postgres {
        server: PostgresServer,
        admin: tokio_postgres::Client,
    },
    /// An etcd cluster of our own, with an admin client per member (straight to it, not
    /// through a proxy) to find the leader and audit the keys.
    Etcd {
        cluster: EtcdCluster,
        admins: Vec<etcd_client::Client>,
    },
    /// A ZooKeeper ensemble of our own; the workers' sessions time out after
    /// `session_timeout` (the kind's ttl).
    ZooKeeper {
        ensemble: ZkEnsemble,
        session_timeout: Duration,
    },
}

/// How long an admin call to one etcd member may take.
const ETCD_ADMIN_TIMEOUT: Duration = Duration::from_secs(2);

/// How long a new etcd cluster may take to elect its first leader.
const ETCD_ELECTION_TIMEOUT: Duration = Duration::from_secs(10);

/// The member etcd's running members name as their leader, if any: the one whose
/// `status` says it leads itself.
async fn etcd_leader(cluster: &EtcdCluster, admins: &[etcd_client::Client]) -> Option<usize> {
    for (i, admin) in admins.iter().enumerate() {
        if !cluster.members.get(i).is_some_and(|m| m.is_running()) {
            continue;
        }
        let mut admin = admin.clone();
        if let Ok(Ok(status)) = tokio::time::timeout(ETCD_ADMIN_TIMEOUT, admin.status()).await
            && status.leader() != 0
            && status.header().map(|h| h.member_id()) == Some(status.leader())
        {
            return Some(i);
        }
    }
    None
}

/// The etcd member a restart kills, and whether it leads: the leader on its turn (waiting
/// up to a second for one, as the last restart may have left an election under way), else
/// a running follower at random.
async fn etcd_victim(
    cluster: &EtcdCluster,
    admins: &[etcd_client::Client],
    leader_turn: bool,
    rng: &mut Rng,
) -> Option<(usize, bool)> {
    let mut leader = etcd_leader(cluster, admins).await;
    for _ in 0..20 {
        if leader.is_some() || !leader_turn {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        leader = etcd_leader(cluster, admins).await;
    }
    if let Some(l) = leader
        && leader_turn
    {
        return Some((l, true));
    }
    let others: Vec<usize> = (0..cluster.members.len())
        .filter(|&i| cluster.members[i].is_running() && Some(i) != leader)
        .collect();
    (!others.is_empty()).then(|| (others[rng.below(others.len())], false))
}

/// How many of `keys` PostgreSQL still holds anything for: a live holder, a live lease or
/// a waiter's live place (each named on stderr). A key it could not be asked about counts
/// as present: an audit that could not look must not pass.
async fn postgres_count(admin: &tokio_postgres::Client, keys: &[String]) -> usize {
    let mut n = 0;
    for key in keys {
        let row = admin
            .query_one(
                "SELECT
                   (SELECT count(*) FROM dlock.locks
                    WHERE key = $1 AND expires_at > clock_timestamp()),
                   (SELECT count(*) FROM dlock.leases
                    WHERE key = $1 AND expires_at > clock_timestamp()),
                   (SELECT count(*) FROM dlock.waiters
                    WHERE key = $1 AND claim_until > clock_timestamp())",
                &[key],
            )
            .await;
        match row {
            Ok(row) => {
                let (held, leases, waiting): (i64, i64, i64) = (row.get(0), row.get(1), row.get(2));
                if held + leases + waiting > 0 {
                    eprintln!(
                        "dlock: torture: postgres still holds {key} after the run: holder {held}, leases {leases}, waiters {waiting}"
                    );
                    n += 1;
                }
            }
            Err(e) => {
                eprintln!("dlock: torture: postgres could not be asked about {key}: {e}");
                n += 1;
            }
        }
    }
    n
}

/// How many keys etcd holds at each of `keys` or under `<key>/`, asked of the first running
/// member that answers (one linearizable transaction per key, so both reads see one
/// revision). The etcd backend queues every holder and waiter at `<lock key>/<token>` and
/// stores nothing at the lock key itself, so after the run any key at either place is an
/// orphan; each is named on stderr. A key no member could be asked about counts as
/// present: an audit that could not look must not pass.
async fn etcd_count(
    cluster: &EtcdCluster,
    admins: &[etcd_client::Client],
    keys: &[String],
) -> usize {
    let mut n = 0;
    for key in keys {
        let txn = etcd_client::Txn::new().and_then([
            etcd_client::TxnOp::get(
                key.as_str(),
                Some(etcd_client::GetOptions::new().with_keys_only()),
            ),
            etcd_client::TxnOp::get(
                format!("{key}/"),
                Some(
                    etcd_client::GetOptions::new()
                        .with_prefix()
                        .with_keys_only(),
                ),
            ),
        ]);
        let mut answer = None;
        for (i, admin) in admins.iter().enumerate() {
            if !cluster.members.get(i).is_some_and(|m| m.is_running()) {
                continue;
            }
            let mut admin = admin.clone();
            if let Ok(Ok(resp)) =
                tokio::time::timeout(ETCD_ADMIN_TIMEOUT, admin.txn(txn.clone())).await
            {
                let left: Vec<String> = resp
                    .op_responses()
                    .into_iter()
                    .filter_map(|op| match op {
                        etcd_client::TxnOpResponse::Get(get) => Some(get),
                        _ => None,
                    })
                    .flat_map(|get| {
                        get.kvs()
                            .iter()
                            .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
                            .collect::<Vec<_>>()
                    })
                    .collect();
                for orphan in &left {
                    eprintln!("dlock: torture: etcd still holds {orphan} after the run");
                }
                answer = Some(left.len());
                break;
            }
        }
        n += answer.unwrap_or_else(|| {
            eprintln!(
                "dlock: torture: no etcd member answered the audit of {key} and {key}/; counted as left"
            );
            1
        });
    }
    n
}

/// The ZooKeeper server that leads now, as the servers' `srvr` answers say (the kit's
/// four-letter words are blocking loopback calls, each bounded by a 2 s read timeout; the
/// torture command runs on the multi-threaded runtime, where a worker thread may block).
fn zookeeper_leader(ensemble: &ZkEnsemble) -> Option<usize> {
    tokio::task::block_in_place(|| ensemble.leader())
}

/// The ZooKeeper server a restart kills, and whether it leads: the leader on its turn
/// (waiting up to a second for one, as the last restart may have left an election under
/// way), else a running follower at random — as [`etcd_victim`].
async fn zookeeper_victim(
    ensemble: &ZkEnsemble,
    leader_turn: bool,
    rng: &mut Rng,
) -> Option<(usize, bool)> {
    let mut leader = zookeeper_leader(ensemble);
    for _ in 0..20 {
        if leader.is_some() || !leader_turn {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        leader = zookeeper_leader(ensemble);
    }
    if let Some(l) = leader
        && leader_turn
    {
        return Some((l, true));
    }
    let others: Vec<usize> = (0..ensemble.members.len())
        .filter(|&i| ensemble.members[i].is_running() && Some(i) != leader)
        .collect();
    (!others.is_empty()).then(|| (others[rng.below(others.len())], false))
}

/// How long the ZooKeeper audit may take to open its session and read.
const ZOOKEEPER_AUDIT_TIMEOUT: Duration = Duration::from_secs(10);

/// How many lock nodes ZooKeeper still holds in the directories of `keys`, read by a new
/// client connected straight to every server (not through a proxy) under the kind's
/// chroot. The backend queues every holder and waiter as an ephemeral sequential node
/// `/<escaped lock key>/<token>-<seq>`; once every worker has ended and every session of
/// theirs has expired, any such node is an orphan (named on stderr, with the holder's
/// token). A key that could not be looked at counts as present: an audit that could not
/// look must not pass.
async fn zookeeper_count(ensemble: &ZkEnsemble, keys: &[String]) -> usize {
    use dlock::raw::RawInspect as _;
    let url = ensemble.url(ZOOKEEPER_CHROOT, "");
    let admin = match tokio::time::timeout(
        ZOOKEEPER_AUDIT_TIMEOUT,
        dlock::backend::ZooKeeper::connect(&url),
    )
    .await
    {
        Ok(Ok(admin)) => admin,
        Ok(Err(e)) => {
            eprintln!(
                "dlock: torture: the ZooKeeper audit could not connect: {e}; every key counted as left"
            );
            return keys.len();
        }
        Err(_) => {
            eprintln!(
                "dlock: torture: the ZooKeeper audit could not connect in time; every key counted as left"
            );
            return keys.len();
        }
    };
    let mut n = 0;
    for key in keys {
        let dir = format!(
            "{ZOOKEEPER_CHROOT}/{}",
            dlock::backend::zookeeper::escape(key)
        );
        let Ok(lock_keys) = LockKeys::new("", key) else {
            eprintln!("dlock: torture: {key:?} is no lock key; counted as left");
            n += 1;
            continue;
        };
        match tokio::time::timeout(ZOOKEEPER_AUDIT_TIMEOUT, admin.inspect(&lock_keys)).await {
            Ok(Ok(state)) => {
                let nodes =
                    usize::from(state.holder.is_some()) + state.queued.map_or(0, |q| q as usize);
                if nodes > 0 {
                    eprintln!(
                        "dlock: torture: ZooKeeper still holds {nodes} lock node(s) in {dir} after the run (holder {:?})",
                        state.holder
                    );
                }
                n += nodes;
            }
            Ok(Err(e)) => {
                eprintln!("dlock: torture: ZooKeeper could not be asked about {dir}: {e}");
                n += 1;
            }
            Err(_) => {
                eprintln!("dlock: torture: ZooKeeper did not answer about {dir} in time");
                n += 1;
            }
        }
    }
    n
}

fn store_err(e: redis::RedisError) -> Failure {
    Failure::new(exit::UNAVAILABLE, format!("torture: {e}"))
}

async fn admin_connection(url: &str) -> Result<redis::aio::ConnectionManager, Failure> {
    redis::Client::open(url)
        .map_err(|e| Failure::usage(e.to_string()))?
        .get_connection_manager()
        .await
        .map_err(store_err)
}

impl<'a> Store<'a> {
    async fn postgres(server: PostgresServer) -> Result<Store<'a>, Failure> {
        let admin = server.try_admin().await.map_err(|e| {
            Failure::new(
                exit::UNAVAILABLE,
                format!("torture: the PostgreSQL admin connection: {e}"),
            )
        })?;
        Ok(Store::Postgres { server, admin })
    }

    async fn redis(server: &'a mut LockServer) -> Result<Store<'a>, Failure> {
        let admin = admin_connection(&server.url()).await?;
        Ok(Store::Redis { server, admin })
    }

    async fn quorum(nodes: Vec<RedisServer>) -> Result<Store<'a>, Failure> {
        let mut admins = Vec::with_capacity(nodes.len());
        for node in &nodes {
            admins.push(admin_connection(&node.url()).await?);
        }
        Ok(Store::Quorum { nodes, admins })
    }

    /// The cluster with an admin client per member, once its members have elected a
    /// leader (the workers' first calls would fail before).
    async fn etcd(cluster: EtcdCluster) -> Result<Store<'a>, Failure> {
        let mut admins = Vec::with_capacity(cluster.members.len());
        for member in &cluster.members {
            let options = etcd_client::ConnectOptions::new()
                .with_connect_timeout(ETCD_ADMIN_TIMEOUT)
                .with_timeout(ETCD_ADMIN_TIMEOUT);
            let admin =
                etcd_client::Client::connect([format!("http://{}", member.addr())], Some(options))
                    .await
                    .map_err(|e| Failure::new(exit::UNAVAILABLE, format!("torture: etcd: {e}")))?;
            admins.push(admin);
        }
        let deadline = tokio::time::Instant::now() + ETCD_ELECTION_TIMEOUT;
        while etcd_leader(&cluster, &admins).await.is_none() {
            if tokio::time::Instant::now() > deadline {
                return Err(Failure::new(
                    exit::UNAVAILABLE,
                    format!(
                        "torture: the etcd cluster elected no leader within {ETCD_ELECTION_TIMEOUT:?}"
                    ),
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(Store::Etcd { cluster, admins })
    }

    /// Whether the store has several servers that faults hit one by one (RedLock's nodes,
    /// etcd's members), whose indexes a fault window records.
    fn has_nodes(&self) -> bool {
        matches!(
            self,
            Store::Quorum { .. } | Store::Etcd { .. } | Store::ZooKeeper { .. }
        )
    }

    /// Where each lock server listens, for the proxies (none for a server given by a URL
    /// a proxy cannot stand in for, e.g. a unix socket).
    fn upstreams(&self) -> Vec<SocketAddr> {
        let loopback = |port| SocketAddr::from(([127, 0, 0, 1], port));
        match self {
            Store::Redis { server, .. } => upstream(&server.url()).into_iter().collect(),
            Store::Quorum { nodes, .. } => nodes.iter().map(|n| loopback(n.port())).collect(),
            Store::Memcached(server) => vec![loopback(server.port())],
            Store::Postgres { server, .. } => vec![loopback(server.port())],
            Store::Etcd { cluster, .. } => cluster
                .members
                .iter()
                .filter_map(|m| m.addr().parse().ok())
                .collect(),
            Store::ZooKeeper { ensemble, .. } => ensemble
                .members
                .iter()
                .filter_map(|m| m.addr().parse().ok())
                .collect(),
        }
    }

    /// The `--lock-url` of a worker whose links to the servers are `proxies` (one per
    /// server; RedLock's nodes, etcd's members and ZooKeeper's servers comma-separated).
    fn worker_url(&self, proxies: &[Proxy]) -> String {
        match self {
            Store::Redis { server, .. } => {
                let url = server.url();
                proxies
                    .first()
                    .and_then(|p| via(&url, p.addr()))
                    .unwrap_or(url)
            }
            Store::Quorum { .. } => proxies
                .iter()
                .map(|p| format!("redis://{}/", p.addr()))
                .collect::<Vec<_>>()
                .join(","),
            Store::Memcached(_) => proxies
                .first()
                .map(|p| format!("memcache://{}", p.addr()))
                .unwrap_or_default(),
            Store::Postgres { server, .. } => proxies
                .first()
                .map(|p| {
                    format!(
                        "postgres://{}:{}@{}/postgres",
                        dlock_test::postgres::SUPERUSER,
                        dlock_test::postgres::PASSWORD,
                        p.addr()
                    )
                })
                .unwrap_or_else(|| server.url()),
            Store::Etcd { .. } => format!(
                "etcd://{}",
                proxies
                    .iter()
                    .map(|p| p.addr().to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            ),
            Store::ZooKeeper {
                session_timeout, ..
            } => format!(
                "zk://{}{ZOOKEEPER_CHROOT}?session_timeout={}ms",
                proxies
                    .iter()
                    .map(|p| p.addr().to_string())
                    .collect::<Vec<_>>()
                    .join(","),
                session_timeout.as_millis()
            ),
        }
    }

    /// How many of `keys` (lock keys, as the kind's Redis backend names them) are still
    /// present: on the server, on any RedLock node (counted per node), in memcached, or in
    /// etcd — there every key at a lock key or in its queue under `<lock key>/` counts.
    async fn count_present(&mut self, keys: &[String]) -> usize {
        // Each key left is named on stderr with its remaining ttl and (for a sorted set,
        // a waiter queue) its members and scores, so that a failed audit says what leaked.
        let exists = |admin: &mut redis::aio::ConnectionManager| {
            let mut admin = admin.clone();
            let keys = keys.to_vec();
            async move {
                let mut n = 0;
                for key in &keys {
                    let (present, pttl, kind): (i64, i64, String) = match redis::pipe()
                        .exists(key)
                        .pttl(key)
                        .cmd("TYPE")
                        .arg(key)
                        .query_async(&mut admin)
                        .await
                    {
                        Ok(r) => r,
                        Err(_) => continue,
                    };
                    if present == 0 {
                        continue;
                    }
                    n += 1;
                    let members: Vec<(String, f64)> = if kind == "zset" {
                        redis::cmd("ZRANGE")
                            .arg(key)
                            .arg(0)
                            .arg(-1)
                            .arg("WITHSCORES")
                            .query_async(&mut admin)
                            .await
                            .unwrap_or_default()
                    } else {
                        Vec::new()
                    };
                    eprintln!(
                        "dlock: torture: {key} ({kind}) still present after the run, pttl {pttl} ms{}",
                        if members.is_empty() {
                            String::new()
                        } else {
                            format!(", members {members:?}")
                        }
                    );
                }
                n
            }
        };
        match self {
            Store::Redis { admin, .. } => exists(admin).await,
            Store::Quorum { admins, .. } => {
                let mut n = 0;
                for admin in admins {
                    n += exists(admin).await;
                }
                n
            }
            // `mg <key>` answers HD for a key it holds, EN for none.
            Store::Memcached(server) => keys
                .iter()
                .filter(|k| {
                    let key = dlock::backend::memcached::memcached_key(k);
                    server
                        .command(&format!("mg {key}\r\n"))
                        .is_ok_and(|r| r.starts_with("HD"))
                })
                .count(),
            Store::Etcd { cluster, admins } => etcd_count(cluster, admins, keys).await,
            Store::ZooKeeper { ensemble, .. } => zookeeper_count(ensemble, keys).await,
            Store::Postgres { server, admin } => {
                // A crash restart closed the first admin connection: open another.
                if admin.is_closed()
                    && let Ok(fresh) = server.try_admin().await
                {
                    *admin = fresh;
                }
                postgres_count(admin, keys).await
            }
        }
    }

    /// Deletes what the run left on a shared server (the lock's keys too, if a control
    /// orphaned them). Servers of a kind's own die with its run.
    async fn remove(&mut self, keys: &[String]) {
        if let Store::Redis { admin, .. } = self {
            let _: Result<(), _> = redis::cmd("DEL").arg(keys).query_async(admin).await;
        }
    }
}

/// A set of lock servers by index (RedLock's nodes; a single server is node 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Nodes(u64);

impl Nodes {
    const FIRST: Nodes = Nodes(1);

    fn one(i: usize) -> Nodes {
        Nodes(1 << i.min(63))
    }

    fn iter(self) -> impl Iterator<Item = usize> {
        (0..64).filter(move |i| self.0 & (1 << i) != 0)
    }

    fn list(self) -> Vec<usize> {
        self.iter().collect()
    }

    /// At least one and at most a minority of `n` nodes, at random (for 5 nodes: 1 or 2,
    /// so that a majority always stays reachable).
    fn minority(n: usize, rng: &mut Rng) -> Nodes {
        let n = n.min(64);
        let most = (n.saturating_sub(1) / 2).max(1);
        let k = (1 + rng.below(most)).min(n);
        let mut left: Vec<usize> = (0..n).collect();
        let mut chosen = 0u64;
        for _ in 0..k {
            chosen |= 1 << left.swap_remove(rng.below(left.len()));
        }
        Nodes(chosen)
    }

    /// At least one and at most all of `n` nodes, at random (for etcd's 3 members: a
    /// worker's links to one or two of them, after which its client fails over, or to all
    /// three, which cuts it off).
    fn some(n: usize, rng: &mut Rng) -> Nodes {
        let n = n.clamp(1, 64);
        let k = 1 + rng.below(n);
        let mut left: Vec<usize> = (0..n).collect();
        let mut chosen = 0u64;
        for _ in 0..k {
            chosen |= 1 << left.swap_remove(rng.below(left.len()));
        }
        Nodes(chosen)
    }
}

struct Running {
    id: usize,
    slot: usize,
    child: Child,
    /// Reads the worker's history lines until EOF.
    reader: Option<tokio::task::JoinHandle<()>>,
    holding: bool,
    alive: bool,
    /// Under a fault now (paused, or its proxy faulted): not a target for another.
    faulted: bool,
    killed: bool,
}

/// Replaces host:port of a redis URL with `addr` (the worker's proxy).
fn via(url: &str, addr: SocketAddr) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    if !scheme.starts_with("redis") || scheme.contains("unix") {
        return None;
    }
    let (auth, hostpath) = match rest.rsplit_once('@') {
        Some((a, h)) => (format!("{a}@"), h),
        None => (String::new(), rest),
    };
    let path = hostpath.find('/').map_or("", |i| &hostpath[i..]);
    Some(format!("{scheme}://{auth}{addr}{path}"))
}

fn upstream(url: &str) -> Option<SocketAddr> {
    let (_, rest) = url.split_once("://")?;
    let hostpath = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
    let hostport = hostpath.split('/').next()?;
    let hostport = if hostport.contains(':') {
        hostport.to_owned()
    } else {
        format!("{hostport}:6379")
    };
    hostport.to_socket_addrs().ok()?.next()
}

/// Starts worker processes for one kind.
struct Spawner {
    kind: Kind,
    urls: Vec<String>,
    resource_url: String,
    keys_base: String,
    ttl_ms: u64,
    until: u64,
    tx: tokio::sync::mpsc::UnboundedSender<(usize, Step)>,
}

impl Spawner {
    fn spawn(&self, id: usize, slot: usize) -> Result<Running, Failure> {
        let args: Vec<String> = [
            "torture-worker",
            "--kind",
            self.kind.id(),
            "--lock-url",
            &self.urls[slot],
            "--resource-url",
            &self.resource_url,
            "--keys",
            &self.keys_base,
            "--ttl-ms",
            &self.ttl_ms.to_string(),
            "--until-ns",
            &self.until.to_string(),
        ]
        .iter()
        .map(|a| (*a).to_owned())
        .collect();
        let tx = self.tx.clone();
        let (child, reader) = crate::cmd::workers::spawn(&args, move |line| {
            if let Ok(step) = serde_json::from_str::<Step>(line) {
                let _ = tx.send((id, step));
            }
        })?;
        Ok(Running {
            id,
            slot,
            child,
            reader,
            holding: false,
            alive: true,
            faulted: false,
            killed: false,
        })
    }
}

/// Everything the nemesis acts on during one kind's run.
struct Nemesis<'a> {
    store: Store<'a>,
    /// Each worker slot's links: a proxy per lock server (per RedLock node).
    proxies: Vec<Vec<Proxy>>,
    spawner: Spawner,
    running: Vec<Running>,
    windows: Vec<FaultWindow>,
    /// Timed ends of fault windows: (when, what to undo, index into `windows`).
    undo: Vec<(u64, Undo, usize)>,
    kills: Vec<Kill>,
    /// A paused worker due to resume at the next acquire by another (or the deadline).
    resume: Option<(u64, Undo, usize)>,
    ttl: Duration,
    /// Chooses the RedLock nodes, etcd members or ZooKeeper servers a fault hits (used by
    /// no other kind, so theirs keep their choices per seed).
    node_rng: Rng,
    /// RedLock, etcd or ZooKeeper restarts so far: on RedLock the first, third, … are
    /// delayed, the others at once; on etcd and ZooKeeper the first, third, … hit the
    /// leader, the others a follower.
    node_restarts: usize,
}

impl Nemesis<'_> {
    fn ttl_ns(&self) -> u64 {
        u64::try_from(self.ttl.as_nanos()).unwrap_or(u64::MAX)
    }

    /// The servers a fault hits: some of RedLock's nodes, the links to some of etcd's
    /// members or ZooKeeper's servers, or the one server. (Which etcd member or ZooKeeper
    /// server restarts depends on who leads when it happens: [`inject`](Self::inject)
    /// chooses it.)
    fn choose_nodes(&mut self, fault: Fault) -> Nodes {
        match &self.store {
            Store::Quorum { nodes, .. } => Nodes::minority(nodes.len(), &mut self.node_rng),
            Store::Etcd { cluster, .. } if fault != Fault::Restart => {
                Nodes::some(cluster.members.len(), &mut self.node_rng)
            }
            Store::ZooKeeper { ensemble, .. } if fault != Fault::Restart => {
                Nodes::some(ensemble.members.len(), &mut self.node_rng)
            }
            _ => Nodes::FIRST,
        }
    }

    /// Injects `fault`, aimed at `running[victim]` where it needs a worker, and records
    /// its window if it took effect.
    async fn inject(&mut self, fault: Fault, victim: Option<usize>) -> Result<(), Failure> {
        let t = monotonic_ns();
        let ttl_ns = self.ttl_ns();
        let half_ttls = move |k: u64| t + k * ttl_ns / 2;
        let admin_timeout = self.ttl * 2;
        let has_nodes = self.store.has_nodes();
        let mut nodes = if fault.hits_nodes() {
            self.choose_nodes(fault)
        } else {
            Nodes::FIRST
        };
        // A RedLock restart may become a delayed one, an etcd restart a leader's or a
        // follower's.
        let mut happened = fault;
        // (took effect, the worker aimed at, how the window ends)
        let (effect, worker, undo): (bool, Option<usize>, Option<(u64, Undo)>) = match fault {
            Fault::Pause => match victim.map(|v| &mut self.running[v]) {
                Some(r) => match r.child.id().and_then(|p| i32::try_from(p).ok()) {
                    Some(pid) if kill(Pid::from_raw(pid), Signal::SIGSTOP).is_ok() => {
                        r.faulted = true;
                        (
                            true,
                            Some(r.id),
                            Some((half_ttls(5), Undo::Continue(r.id, pid))),
                        )
                    }
                    _ => (false, None, None),
                },
                None => (false, None, None),
            },
            Fault::Kill => match victim {
                Some(v) => {
                    let r = &mut self.running[v];
                    let _ = r.child.start_kill();
                    let _ = r.child.wait().await;
                    r.alive = false;
                    r.killed = true;
                    self.kills.push(Kill {
                        worker: r.id,
                        t: monotonic_ns(),
                        was_holding: r.holding,
                    });
                    let (slot, id) = (r.slot, r.id);
                    let next = self.running.iter().map(|r| r.id).max().unwrap_or(0) + 1;
                    let replacement = self.spawner.spawn(next, slot)?;
                    self.running.push(replacement);
                    (true, Some(id), None)
                }
                None => (false, None, None),
            },
            Fault::Freeze => {
                let frozen = match &mut self.store {
                    Store::Redis {
                        server: LockServer::Own(s),
                        ..
                    } => s.freeze().is_ok(),
                    Store::Postgres { server, .. } => {
                        server.freeze();
                        true
                    }
                    // Every node chosen, whether or not another failed.
                    Store::Quorum { nodes: servers, .. } => {
                        nodes
                            .iter()
                            .filter(|&i| servers[i].freeze().is_ok())
                            .count()
                            > 0
                    }
                    _ => false,
                };
                if frozen {
                    (true, None, Some((half_ttls(4), Undo::Thaw(nodes))))
                } else {
                    (false, None, None)
                }
            }
            Fault::ClientPause => {
                let ms = (2 * self.spawner.ttl_ms).to_string();
                let pause = redis::cmd("CLIENT")
                    .arg("PAUSE")
                    .arg(&ms)
                    .arg("ALL")
                    .to_owned();
                let paused = match &mut self.store {
                    Store::Redis { admin: conn, .. } => admin(conn, &pause, admin_timeout).await,
                    Store::Quorum { admins, .. } => {
                        let mut any = false;
                        for i in nodes.iter() {
                            any |= admin(&mut admins[i], &pause, admin_timeout).await;
                        }
                        any
                    }
                    Store::Memcached(_)
                    | Store::Etcd { .. }
                    | Store::Postgres { .. }
                    | Store::ZooKeeper { .. } => false,
                };
                if paused {
                    (true, None, Some((half_ttls(4), Undo::Unpause(nodes))))
                } else {
                    (false, None, None)
                }
            }
            Fault::Restart
            | Fault::DelayedRestart
            | Fault::LeaderRestart
            | Fault::MemberRestart
            | Fault::CrashRestart => match &mut self.store {
                Store::Redis { server, .. } => match server {
                    LockServer::Own(s) => (s.restart().is_ok(), None, None),
                    LockServer::Given(_) => (false, None, None),
                },
                Store::Quorum { nodes: servers, .. } => {
                    self.node_restarts += 1;
                    if self.node_restarts % 2 == 1 {
                        // Down until every lease the nodes held has run out elsewhere too.
                        happened = Fault::DelayedRestart;
                        for i in nodes.iter() {
                            servers[i].kill();
                        }
                        (true, None, Some((half_ttls(4), Undo::Revive(nodes))))
                    } else {
                        happened = Fault::Restart;
                        let restarted = nodes
                            .iter()
                            .filter(|&i| servers[i].restart().is_ok())
                            .count()
                            > 0;
                        (restarted, None, None)
                    }
                }
                Store::Memcached(s) => (s.restart().is_ok(), None, None),
                // A crash: every process killed, then started again on its data at once.
                Store::Postgres { server, .. } => {
                    happened = Fault::CrashRestart;
                    (server.restart().is_ok(), None, None)
                }
                Store::Etcd { cluster, admins } => {
                    self.node_restarts += 1;
                    let leader_turn = self.node_restarts % 2 == 1;
                    match etcd_victim(cluster, admins, leader_turn, &mut self.node_rng).await {
                        Some((i, leads)) => {
                            happened = if leads {
                                Fault::LeaderRestart
                            } else {
                                Fault::MemberRestart
                            };
                            cluster.members[i].kill();
                            nodes = Nodes::one(i);
                            (true, None, Some((half_ttls(4), Undo::Revive(nodes))))
                        }
                        None => (false, None, None),
                    }
                }
                Store::ZooKeeper { ensemble, .. } => {
                    self.node_restarts += 1;
                    let leader_turn = self.node_restarts % 2 == 1;
                    match zookeeper_victim(ensemble, leader_turn, &mut self.node_rng).await {
                        Some((i, leads)) => {
                            happened = if leads {
                                Fault::LeaderRestart
                            } else {
                                Fault::MemberRestart
                            };
                            ensemble.members[i].kill();
                            nodes = Nodes::one(i);
                            (true, None, Some((half_ttls(4), Undo::Revive(nodes))))
                        }
                        None => (false, None, None),
                    }
                }
            },
            Fault::ScriptFlush => {
                let flush = redis::cmd("SCRIPT").arg("FLUSH").to_owned();
                let flushed = match &mut self.store {
                    Store::Redis { admin: conn, .. } => admin(conn, &flush, admin_timeout).await,
                    Store::Quorum { admins, .. } => {
                        let mut any = false;
                        for i in nodes.iter() {
                            any |= admin(&mut admins[i], &flush, admin_timeout).await;
                        }
                        any
                    }
                    Store::Memcached(_)
                    | Store::Etcd { .. }
                    | Store::Postgres { .. }
                    | Store::ZooKeeper { .. } => false,
                };
                (flushed, None, None)
            }
            Fault::Delay | Fault::Blackhole | Fault::Close => match victim {
                Some(v) => {
                    let slot = self.running[v].slot;
                    let links: Vec<&Proxy> = self
                        .proxies
                        .get(slot)
                        .map(|links| nodes.iter().filter_map(|i| links.get(i)).collect())
                        .unwrap_or_default();
                    if links.is_empty() {
                        (false, None, None)
                    } else {
                        let undo = match fault {
                            Fault::Delay => {
                                for proxy in &links {
                                    proxy.set_fault(ProxyFault::Delay(self.ttl * 3 / 5));
                                }
                                Some((half_ttls(4), Undo::Pass(slot, nodes)))
                            }
                            Fault::Blackhole => {
                                for proxy in &links {
                                    proxy.set_fault(ProxyFault::Blackhole);
                                }
                                Some((half_ttls(4), Undo::Pass(slot, nodes)))
                            }
                            _ => {
                                for proxy in &links {
                                    proxy.close_all();
                                }
                                None
                            }
                        };
                        if undo.is_some() {
                            self.running[v].faulted = true;
                        }
                        (true, Some(self.running[v].id), undo)
                    }
                }
                None => (false, None, None),
            },
        };
        if effect {
            let end = undo.as_ref().map_or_else(monotonic_ns, |(at, _)| *at);
            self.windows.push(FaultWindow {
                fault: happened,
                start: t,
                end,
                worker,
                nodes: if has_nodes && fault.hits_nodes() {
                    nodes.list()
                } else {
                    Vec::new()
                },
            });
            if let Some((at, what)) = undo {
                self.undo.push((at, what, self.windows.len() - 1));
            }
        } else {
            eprintln!("dlock: torture: fault {} could not be injected", fault.id());
        }
        Ok(())
    }

    /// Resumes a paused worker waiting for its moment (now, or at its deadline).
    fn resume(&mut self, now: u64, force: bool) {
        if let Some((deadline, what, w)) = self.resume
            && (force || deadline <= now)
        {
            self.resume = None;
            self.undo.push((now, what, w));
            self.heal(now, true);
        }
    }

    /// Ends the fault windows that are due (all of them with `all`).
    fn heal(&mut self, now: u64, all: bool) {
        let mut i = 0;
        while i < self.undo.len() {
            if all || self.undo[i].0 <= now {
                let (_, what, w) = self.undo.swap_remove(i);
                if let (Undo::Continue(..), false) = (what, all) {
                    // Resume the paused holder just after another worker acquired: its
                    // late write and release then meet a live holder, as they would in
                    // production under load.
                    self.resume = Some((now + self.ttl_ns(), what, w));
                    continue;
                }
                what.apply(&mut self.store, &self.proxies);
                match what {
                    Undo::Continue(id, _) => {
                        if let Some(r) = self.running.iter_mut().find(|r| r.id == id) {
                            r.faulted = false;
                        }
                    }
                    Undo::Pass(slot, _) => {
                        for r in self.running.iter_mut().filter(|r| r.slot == slot) {
                            r.faulted = false;
                        }
                    }
                    Undo::Thaw(_) | Undo::Unpause(_) | Undo::Revive(_) => {}
                }
                self.windows[w].end = monotonic_ns();
            } else {
                i += 1;
            }
        }
    }
}

/// One kind's run with worker processes: against `store`, which it owns for the run (a
/// kind's own servers die with it), the resources on `resources`.
async fn run_workers(
    config: &Config,
    kind: Kind,
    faults: &[Fault],
    duration: Duration,
    store: Store<'_>,
    resources: &RedisServer,
) -> Result<KindReport, Failure> {
    let run_id = dlock::Token::random()?.as_str()[..8].to_owned();
    let keys = ResourceKeys::parse(&format!("torture:{run_id}:{}", kind.id()));
    let ttl = kind.ttl(config.ttl);
    let mut res = resources
        .client()
        .get_multiplexed_async_connection()
        .await
        .map_err(store_err)?;
    let _: () = redis::pipe()
        .set(&keys.counter, 0)
        .set(&keys.fenced, 0)
        .del(&keys.highest)
        .del(&keys.log)
        .query_async(&mut res)
        .await
        .map_err(store_err)?;
    // Each worker slot reaches each lock server through its own proxy.
    let mut proxies = Vec::new();
    let mut urls = Vec::new();
    let targets = store.upstreams();
    for _ in 0..config.workers {
        let mut links = Vec::with_capacity(targets.len());
        for &addr in &targets {
            links.push(
                Proxy::start(addr)
                    .await
                    .map_err(|e| Failure::new(exit::UNAVAILABLE, format!("proxy: {e}")))?,
            );
        }
        urls.push(store.worker_url(&links));
        proxies.push(links);
    }
    let start = monotonic_ns();
    let until = start + u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(usize, Step)>();
    let spawner = Spawner {
        kind,
        urls,
        resource_url: resources.url(),
        keys_base: keys.base.clone(),
        ttl_ms: u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
        until,
        tx,
    };
    let running = (0..config.workers)
        .map(|i| spawner.spawn(i, i))
        .collect::<Result<Vec<_>, _>>()?;
    let mut n = Nemesis {
        store,
        proxies,
        spawner,
        running,
        windows: Vec::new(),
        undo: Vec::new(),
        kills: Vec::new(),
        resume: None,
        ttl,
        node_rng: Rng(config.seed ^ 0x6e6f_6465 ^ (kind as u64).wrapping_mul(0x9e37_79b9)),
        node_restarts: 0,
    };
    let mut plan = schedule(config, kind, faults, duration)
        .into_iter()
        .peekable();
    let mut history: Vec<(usize, Step)> = Vec::new();
    let mut rng = Rng(config.seed.wrapping_add(7));
    let ttl_ns = n.ttl_ns();
    // Pause waits for the next worker to report a read (so it lands between a holder's
    // read and its write) and kill for the next acquire (a holder is what they are meant
    // to hit); either falls back to any worker at a deadline.
    let mut armed: Option<(Fault, u64)> = None;
    let mut worker_failures = 0;
    let hard_stop = until + 3 * ttl_ns + 5_000_000_000;
    loop {
        let now = monotonic_ns();
        let next_fault = plan
            .peek()
            .map(|(at, _)| start + u64::try_from(at.as_nanos()).unwrap_or(0));
        let next_undo = n
            .undo
            .iter()
            .map(|(t, _, _)| *t)
            .chain(n.resume.map(|r| r.0))
            .min();
        let wake = [
            next_fault,
            next_undo,
            armed.map(|a| a.1),
            Some(now + 50_000_000),
        ]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(now);
        tokio::select! {
            got = rx.recv() => {
                let Some((id, step)) = got else { break };
                // get-del's bug sits between its release's GET and DEL, the others' between
                // a holder's read and its write.
                let trigger = match (&step, kind) {
                    (Step::Acquired { .. }, _) => Some(Fault::Kill),
                    (Step::Releasing { .. }, Kind::GetDel) => Some(Fault::Pause),
                    (Step::Read { .. }, k) if k != Kind::GetDel => Some(Fault::Pause),
                    _ => None,
                };
                if let Some(r) = n.running.iter_mut().find(|r| r.id == id) {
                    match step {
                        Step::Acquired { .. } => r.holding = true,
                        Step::Releasing { .. } => r.holding = false,
                        _ => {}
                    }
                }
                let resume_now = matches!(step, Step::Acquired { .. })
                    && matches!(n.resume, Some((_, Undo::Continue(paused, _), _)) if paused != id);
                history.push((id, step));
                if resume_now {
                    n.resume(monotonic_ns(), true);
                }
                if let Some((fault, _)) = armed
                    && trigger == Some(fault)
                {
                    armed = None;
                    let victim = n.running.iter().position(|r| r.id == id && r.alive);
                    n.inject(fault, victim).await?;
                }
            }
            () = tokio::time::sleep(Duration::from_nanos(wake.saturating_sub(now))) => {}
        }
        let now = monotonic_ns();
        n.heal(now, false);
        n.resume(now, false);
        if let Some((fault, deadline)) = armed
            && deadline <= now
        {
            armed = None;
            let victim = pick(&n.running, &mut rng);
            n.inject(fault, victim).await?;
        }
        if let Some(at) = next_fault
            && at <= now
            && now < until
            && armed.is_none()
            && n.undo.is_empty()
            && n.resume.is_none()
            && let Some((_, fault)) = plan.next()
        {
            if matches!(fault, Fault::Pause | Fault::Kill) {
                armed = Some((fault, now + 2 * ttl_ns));
            } else {
                let victim = pick(&n.running, &mut rng);
                n.inject(fault, victim).await?;
            }
        }
        for r in n.running.iter_mut().filter(|r| r.alive) {
            if let Ok(Some(status)) = r.child.try_wait() {
                r.alive = false;
                if !status.success() {
                    worker_failures += 1;
                }
            }
        }
        let now = monotonic_ns();
        let finished = n.running.iter().all(|r| !r.alive)
            && n.undo.is_empty()
            && n.resume.is_none()
            && now >= until;
        if finished || now > hard_stop {
            n.resume(now, true);
            n.heal(now, true);
            for r in n.running.iter_mut().filter(|r| r.alive) {
                let _ = r.child.start_kill();
                let _ = r.child.wait().await;
                r.alive = false;
                worker_failures += 1; // still running past the hard stop
            }
            // Every line a worker printed, up to its EOF, belongs in the history.
            for r in &mut n.running {
                if let Some(reader) = r.reader.take() {
                    let _ = tokio::time::timeout(Duration::from_secs(5), reader).await;
                }
            }
            while let Ok((id, step)) = rx.try_recv() {
                history.push((id, step));
            }
            break;
        }
    }
    let end = monotonic_ns();
    // Orphans: after ttl + ε (plus a waiter's grace, for the kinds that queue, and a tick
    // of memcached's clock) every hold and waiter's place must have expired by itself.
    // EXISTS, not GET: a reentrant lock is a hash, readers and waiters live in sorted sets.
    let lock_keys = kind.lock_keys(&keys);
    let live_keys = lock_keys
        .as_ref()
        .map_or_else(|| vec![keys.lock.clone()], |k| kind.live_keys(k));
    let settle = ttl + kind.waiter_grace(ttl).unwrap_or_default() + kind.expiry_slack();
    tokio::time::sleep(settle + Duration::from_millis(1500)).await;
    let orphans = n.store.count_present(&live_keys).await;
    let (counter, fenced, log): (Option<i64>, Option<i64>, Vec<u64>) = redis::pipe()
        .get(&keys.counter)
        .get(&keys.fenced)
        .lrange(&keys.log, 0, -1)
        .query_async(&mut res)
        .await
        .map_err(store_err)?;
    let resources_state = Resources {
        counter: counter.unwrap_or(0),
        fenced: fenced.unwrap_or(0),
        fence_log: log,
        orphans,
        worker_failures,
    };
    // Clean up what the run left (the lock's keys too, if a control orphaned them).
    let lasting = lock_keys
        .as_ref()
        .map(|k| kind.lasting_keys(k))
        .unwrap_or_default();
    n.store.remove(&[live_keys, lasting].concat()).await;
    let _: Result<(), _> = redis::cmd("DEL")
        .arg(&keys.counter)
        .arg(&keys.fenced)
        .arg(&keys.highest)
        .arg(&keys.log)
        .query_async(&mut res)
        .await;
    let (findings, holds) = check::check(&check::Input {
        kind,
        history: &history,
        kills: &n.kills,
        windows: &n.windows,
        resources: &resources_state,
        ttl_ns,
        reacquire_slack_ns: u64::try_from(kind.reacquire_slack(ttl).as_nanos()).unwrap_or(u64::MAX),
        until,
        end,
    });
    Ok(KindReport {
        findings,
        fault_windows: n.windows,
        kills: n.kills,
        holds: holds.writes,
        read_holds: holds.reads,
    })
}

/// Runs an admin command on the lock server, once more if the first try meets a
/// connection a restart broke; bounded in time. Returns whether it succeeded.
async fn admin(
    conn: &mut redis::aio::ConnectionManager,
    cmd: &redis::Cmd,
    limit: Duration,
) -> bool {
    for _ in 0..2 {
        if let Ok(Ok(())) = tokio::time::timeout(limit, cmd.query_async::<()>(conn)).await {
            return true;
        }
    }
    false
}

/// A running worker to aim a fault at: one that holds the lock if any, else any.
fn pick(running: &[Running], rng: &mut Rng) -> Option<usize> {
    let alive: Vec<usize> = (0..running.len())
        .filter(|&i| running[i].alive && !running[i].faulted)
        .collect();
    let holding: Vec<usize> = alive
        .iter()
        .copied()
        .filter(|&i| running[i].holding)
        .collect();
    let pool = if holding.is_empty() { &alive } else { &holding };
    (!pool.is_empty()).then(|| pool[rng.below(pool.len())])
}

/// How a fault window ends.
#[derive(Clone, Copy)]
enum Undo {
    /// SIGCONT worker `id` (process `pid`).
    Continue(usize, i32),
    /// SIGCONT frozen servers.
    Thaw(Nodes),
    /// `CLIENT UNPAUSE` servers.
    Unpause(Nodes),
    /// Let traffic through a worker slot's links to these servers again.
    Pass(usize, Nodes),
    /// Start killed RedLock nodes again, empty, or killed etcd members and ZooKeeper
    /// servers from their data.
    Revive(Nodes),
}

impl Undo {
    fn apply(self, store: &mut Store<'_>, proxies: &[Vec<Proxy>]) {
        match (self, store) {
            (Undo::Continue(_, pid), _) => {
                let _ = kill(Pid::from_raw(pid), Signal::SIGCONT);
            }
            (
                Undo::Thaw(_),
                Store::Redis {
                    server: LockServer::Own(s),
                    ..
                },
            ) => {
                let _ = s.thaw();
            }
            (Undo::Thaw(_), Store::Postgres { server, .. }) => server.thaw(),
            (Undo::Thaw(nodes), Store::Quorum { nodes: servers, .. }) => {
                for i in nodes.iter() {
                    let _ = servers[i].thaw();
                }
            }
            (Undo::Unpause(nodes), store) => {
                let admins: Vec<redis::aio::ConnectionManager> = match store {
                    Store::Redis { admin, .. } => vec![admin.clone()],
                    Store::Quorum { admins, .. } => nodes
                        .iter()
                        .filter_map(|i| admins.get(i).cloned())
                        .collect(),
                    Store::Memcached(_)
                    | Store::Etcd { .. }
                    | Store::Postgres { .. }
                    | Store::ZooKeeper { .. } => Vec::new(),
                };
                // Pipelined after the pause's own expiry at the latest; no need to wait.
                for mut admin in admins {
                    tokio::spawn(async move {
                        let _: Result<(), _> = redis::cmd("CLIENT")
                            .arg("UNPAUSE")
                            .query_async(&mut admin)
                            .await;
                    });
                }
            }
            (Undo::Pass(slot, nodes), _) => {
                if let Some(links) = proxies.get(slot) {
                    for proxy in nodes.iter().filter_map(|i| links.get(i)) {
                        proxy.set_fault(ProxyFault::Pass);
                    }
                }
            }
            (Undo::Revive(nodes), Store::Quorum { nodes: servers, .. }) => {
                for i in nodes.iter() {
                    if let Err(e) = servers[i].restart() {
                        eprintln!("dlock: torture: RedLock node {i} did not start again: {e}");
                    }
                }
            }
            (Undo::Revive(nodes), Store::Etcd { cluster, .. }) => {
                for i in nodes.iter() {
                    if let Some(Err(e)) = cluster.members.get_mut(i).map(|m| m.restart()) {
                        eprintln!("dlock: torture: etcd member {i} did not start again: {e}");
                    }
                }
            }
            (Undo::Revive(nodes), Store::ZooKeeper { ensemble, .. }) => {
                for i in nodes.iter() {
                    if let Some(Err(e)) = ensemble.members.get_mut(i).map(|m| m.restart()) {
                        eprintln!("dlock: torture: ZooKeeper server {i} did not start again: {e}");
                    }
                }
            }
            (Undo::Thaw(_) | Undo::Revive(_), _) => {}
        }
    }
}

/// The memory backend: worker threads in this process, each with its own client of one
/// store and its own current-thread runtime; "pause" blocks a holder's thread (its
/// watchdog with it) between its read and its write.
fn run_memory(
    config: &Config,
    faults: &[Fault],
    duration: Duration,
) -> Result<KindReport, Failure> {
    let store = Memory::new();
    let history: Arc<Mutex<Vec<(usize, Step)>>> = Arc::default();
    let resource: Arc<Mutex<(i64, u64, Vec<u64>)>> = Arc::default(); // value, highest, log
    let holding: Arc<Vec<AtomicBool>> = Arc::new(
        (0..config.workers)
            .map(|_| AtomicBool::new(false))
            .collect(),
    );
    let stall: Arc<Vec<AtomicBool>> = Arc::new(
        (0..config.workers)
            .map(|_| AtomicBool::new(false))
            .collect(),
    );
    let start = monotonic_ns();
    let until = start + u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX);
    let ttl = config.ttl;
    let record = |history: &Mutex<Vec<(usize, Step)>>, w: usize, step: Step| {
        history
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((w, step));
    };
    let stalls: Arc<Mutex<Vec<FaultWindow>>> = Arc::default();
    std::thread::scope(|scope| -> Result<(), Failure> {
        let mut handles = Vec::new();
        for w in 0..config.workers {
            let (client, history, resource, holding, stall, stalls) = (
                store.client(),
                Arc::clone(&history),
                Arc::clone(&resource),
                Arc::clone(&holding),
                Arc::clone(&stall),
                Arc::clone(&stalls),
            );
            handles.push(scope.spawn(move || -> Result<(), Failure> {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| Failure::new(exit::UNAVAILABLE, format!("runtime: {e}")))?;
                rt.block_on(async {
                    let lock = Lock::builder(client, "torture-memory").ttl(ttl).build()?;
                    while monotonic_ns() < until {
                        let left = Duration::from_nanos(until.saturating_sub(monotonic_ns()));
                        let Some(guard) = lock.try_lock_for(left).await? else {
                            continue;
                        };
                        let fence = guard.fencing_token().get();
                        record(
                            &history,
                            w,
                            Step::Acquired {
                                t: monotonic_ns(),
                                token: guard.token().to_string(),
                                fence,
                            },
                        );
                        holding[w].store(true, Ordering::SeqCst);
                        let read = {
                            let mut r = resource.lock().unwrap_or_else(PoisonError::into_inner);
                            (fence >= r.1).then(|| {
                                r.1 = fence;
                                r.0
                            })
                        };
                        tokio::time::sleep(Duration::from_millis(1)).await;
                        if stall[w].swap(false, Ordering::SeqCst) {
                            let t = monotonic_ns();
                            std::thread::sleep(ttl * 5 / 2);
                            stalls.lock().unwrap_or_else(PoisonError::into_inner).push(
                                FaultWindow {
                                    fault: Fault::Pause,
                                    start: t,
                                    end: monotonic_ns(),
                                    worker: Some(w),
                                    nodes: Vec::new(),
                                },
                            );
                        }
                        let ok = read.is_some_and(|v| {
                            let mut r = resource.lock().unwrap_or_else(PoisonError::into_inner);
                            if fence >= r.1 {
                                r.1 = fence;
                                r.0 = v + 1;
                                r.2.push(fence);
                                true
                            } else {
                                false
                            }
                        });
                        record(
                            &history,
                            w,
                            Step::Fenced {
                                t: monotonic_ns(),
                                ok,
                                value: read.unwrap_or(0) + 1,
                            },
                        );
                        holding[w].store(false, Ordering::SeqCst);
                        record(&history, w, Step::Releasing { t: monotonic_ns() });
                        let released = guard.release().await;
                        record(
                            &history,
                            w,
                            Step::Released {
                                t: monotonic_ns(),
                                ok: Some(released.is_ok()),
                            },
                        );
                    }
                    Ok::<(), Failure>(())
                })
            }));
        }
        // The nemesis: stall a holder now and then.
        let mut rng = Rng(config.seed ^ 0x6d65_6d6f);
        let plan = schedule(config, Kind::Memory, faults, duration);
        for (at, _) in plan {
            let due = start + u64::try_from(at.as_nanos()).unwrap_or(0);
            std::thread::sleep(Duration::from_nanos(due.saturating_sub(monotonic_ns())));
            let holders: Vec<usize> = (0..config.workers)
                .filter(|&w| holding[w].load(Ordering::SeqCst))
                .collect();
            let w = if holders.is_empty() {
                rng.below(config.workers)
            } else {
                holders[rng.below(holders.len())]
            };
            // The worker records the window when it actually stalls (at its next hold).
            stall[w].store(true, Ordering::SeqCst);
        }
        for h in handles {
            h.join().map_err(|_| {
                Failure::new(exit::UNAVAILABLE, "a torture worker thread panicked")
            })??;
        }
        Ok(())
    })?;
    let history = std::mem::take(&mut *history.lock().unwrap_or_else(PoisonError::into_inner));
    let windows = std::mem::take(&mut *stalls.lock().unwrap_or_else(PoisonError::into_inner));
    let (value, _, log) =
        std::mem::take(&mut *resource.lock().unwrap_or_else(PoisonError::into_inner));
    let resources = Resources {
        counter: 0,
        fenced: value,
        fence_log: log,
        orphans: 0,
        worker_failures: 0,
    };
    let (findings, holds) = check::check(&check::Input {
        kind: Kind::Memory,
        history: &history,
        kills: &[],
        windows: &windows,
        resources: &resources,
        ttl_ns: u64::try_from(ttl.as_nanos()).unwrap_or(u64::MAX),
        reacquire_slack_ns: 0,
        until,
        end: monotonic_ns(),
    });
    Ok(KindReport {
        findings,
        fault_windows: windows,
        kills: Vec::new(),
        holds: holds.writes,
        read_holds: holds.reads,
    })
}

fn print_summary(reports: &[KindReport]) {
    println!(
        "\n{:<16} {:>6} {:>8} {:>10} {:>8} {:>8} {:>8} {:>10} {:>7}  verdict",
        "kind",
        "holds",
        "overlaps",
        "lost incr",
        "stale ok",
        "refused",
        "f. lost",
        "reacquire",
        "orphans"
    );
    for r in reports {
        let f = &r.findings;
        let reacquire = f
            .reacquire_ms
            .iter()
            .max()
            .map_or_else(|| "-".to_owned(), |ms| format!("{ms} ms"));
        let fenced = f.kind.is_fenced();
        let dash = |fenced_metric: bool, v: u64| {
            if fenced_metric == fenced {
                v.to_string()
            } else {
                "-".to_owned()
            }
        };
        println!(
            "{:<16} {:>6} {:>8} {:>10} {:>8} {:>8} {:>8} {:>10} {:>7}  {}",
            f.kind.id(),
            f.holds,
            f.overlaps,
            dash(false, f.lost_increments),
            dash(true, f.stale_accepted),
            dash(true, f.fenced_refused),
            dash(true, f.fenced_lost),
            reacquire,
            f.orphans,
            f.verdict
        );
        if !f.stall_ms.is_empty() && !f.kind.is_control() {
            println!(
                "{:<16} STALLED {} time(s): nobody got the lock for {:?} ms, no fault or crash explaining it",
                "",
                f.stall_ms.len(),
                f.stall_ms
            );
        }
        // The checks of one primitive only, on a line of their own.
        if f.kind == Kind::RwlockFenced {
            println!(
                "{:<16} read holds {}, overlapping a write hold {} ({} outside pause/restart windows)",
                "", f.read_holds, f.read_overlaps, f.unexcused_read_overlaps
            );
        }
        if f.kind == Kind::ReentrantFenced {
            println!(
                "{:<16} re-entries {}, fence mismatches {} (re-entries after the outer hold lapsed: {})",
                "", f.reentries, f.reentry_mismatches, f.reentries_lapsed
            );
        }
        let windows = |fault: Fault| r.fault_windows.iter().filter(|w| w.fault == fault).count();
        if f.kind == Kind::ElectionFenced {
            println!(
                "{:<16} leaderships {} (each a campaign won, a term-fenced write, a resignation); terms {} out of grant order, {} reused",
                "", f.holds, f.fence_regressions, f.fence_reuse
            );
        }
        if f.kind == Kind::Redlock {
            println!(
                "{:<16} node restarts: {} empty at once (overlaps only they explain: {}), {} empty after 2 × ttl; no fences",
                "",
                windows(Fault::Restart),
                f.restart_overlaps,
                windows(Fault::DelayedRestart)
            );
        }
        if f.kind == Kind::MemcachedFenced {
            println!(
                "{:<16} restarts {} (fences start over at 1), fenced writes refused after one {}, overlaps only a restart explains {}",
                "",
                windows(Fault::Restart),
                f.refused_after_restart,
                f.restart_overlaps
            );
        }
        if matches!(f.kind, Kind::EtcdFenced | Kind::ZookeeperFenced) {
            println!(
                "{:<16} member restarts: {} of the leader, {} of a follower (down 2 × ttl, data kept); fences never start over: {} out of grant order, {} reused",
                "",
                windows(Fault::LeaderRestart),
                windows(Fault::MemberRestart),
                f.fence_regressions,
                f.fence_reuse
            );
        }
        if f.kind == Kind::ZookeeperFenced {
            // A zxid's high 32 bits are the epoch of the leader that made it.
            let mut epochs: Vec<u64> = r.holds.iter().map(|h| h.fence >> 32).collect();
            epochs.sort_unstable();
            epochs.dedup();
            println!(
                "{:<16} grants under {} leader epoch(s) (a fence is its node's creation zxid: epoch << 32 | counter)",
                "",
                epochs.len()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(quick: bool) -> Config {
        Config {
            workers: 4,
            ttl: Duration::from_secs(1),
            seed: 1,
            faults: Fault::ALL.to_vec(),
            not_on_given: Vec::new(),
            all_kinds: true,
            quick,
            duration: Duration::from_secs(20),
        }
    }

    #[test]
    fn every_kind_s_quick_run_has_room_for_each_of_its_faults() {
        let config = config(true);
        for kind in Kind::ALL.into_iter().filter(|&k| k != Kind::Memory) {
            let (faults, duration) = plan(&config, kind);
            let planned = schedule(&config, kind, &faults, duration);
            for fault in &faults {
                assert!(
                    planned.iter().any(|(_, f)| f == fault),
                    "{}: {} not scheduled in {duration:?}",
                    kind.id(),
                    fault.id()
                );
            }
        }
    }

    #[test]
    fn a_given_server_keeps_its_skipped_faults_only_for_the_kinds_on_it() {
        let mut config = config(false);
        config.not_on_given = vec![Fault::Freeze, Fault::Restart];
        let (faults, _) = plan(&config, Kind::Dlock);
        assert!(!faults.contains(&Fault::Freeze) && !faults.contains(&Fault::Restart));
        let (faults, _) = plan(&config, Kind::Redlock);
        assert!(faults.contains(&Fault::Freeze) && faults.contains(&Fault::Restart));
        let (faults, _) = plan(&config, Kind::MemcachedFenced);
        assert!(!faults.contains(&Fault::Freeze) && faults.contains(&Fault::Restart));
        let (faults, _) = plan(&config, Kind::EtcdFenced);
        assert!(!faults.contains(&Fault::Freeze) && faults.contains(&Fault::Restart));
        let (faults, _) = plan(&config, Kind::ZookeeperFenced);
        assert!(!faults.contains(&Fault::Freeze) && faults.contains(&Fault::Restart));
    }

    #[test]
    fn etcd_network_faults_hit_one_two_or_all_three_of_a_worker_s_links() {
        let mut rng = Rng(7);
        let mut sizes = [0usize; 4];
        for _ in 0..300 {
            let links = Nodes::some(ETCD_MEMBERS, &mut rng).list();
            assert!(links.iter().all(|&n| n < ETCD_MEMBERS), "{links:?}");
            sizes[links.len()] += 1;
        }
        assert_eq!(sizes[0], 0);
        assert!(sizes[1..].iter().all(|&n| n > 0), "{sizes:?}");
        assert_eq!(Nodes::one(2).list(), vec![2]);
    }

    #[test]
    fn redlock_faults_hit_a_minority_of_nodes() {
        let mut rng = Rng(7);
        let mut sizes = [0usize; 3];
        for _ in 0..200 {
            let nodes = Nodes::minority(REDLOCK_NODES, &mut rng).list();
            assert!((1..=2).contains(&nodes.len()), "{nodes:?}");
            assert!(nodes.iter().all(|&n| n < REDLOCK_NODES), "{nodes:?}");
            sizes[nodes.len()] += 1;
        }
        assert!(sizes[1] > 0 && sizes[2] > 0, "{sizes:?}");
        assert_eq!(Nodes::minority(1, &mut rng).list(), vec![0]);
    }
}
