//! The vocabulary of a torture run, at the bottom of the crate: the lock kinds under test,
//! the faults, the windows they leave in the history, the keys of the protected resources,
//! the run's configuration, the seeded choices, and the one clock every process reads.

use std::time::Duration;

use fencelock::keys::LockKeys;
use serde::Serialize;

use crate::exit::Failure;

/// Now on CLOCK_MONOTONIC, in nanoseconds: one clock for every process on the host.
pub(crate) fn monotonic_ns() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .map(|ts| {
            u64::try_from(ts.tv_sec()).unwrap_or(0) * 1_000_000_000
                + u64::try_from(ts.tv_nsec()).unwrap_or(0)
        })
        .unwrap_or(0)
}

/// A lock kind under test: one of dlock's primitives, or one of the known-broken locks
/// (controls: SETNX+EXPIRE, SETNX+GETSET, GET+DEL, plain DEL). See the module docs for what each must show.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Kind {
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
    SentinelFenced,
    SentinelWaitFenced,
    ClusterFenced,
    RedlockImmediateRestart,
    RedlockDelayedRestart,
    RunSupervised,
    RunSupervisedZookeeper,
    RunUnsupervised,
    EtcdFamilyFenced,
    MemcachedFamilyFenced,
}

/// How many independent masters the `redlock` kinds run over.
pub(crate) const REDLOCK_NODES: usize = 5;

/// In the `redlock-*-restart` kinds, the node both halves of the workers reach: the even
/// worker slots reach nodes 0, 1 and this one, the odd slots this one, 3 and 4, so every
/// majority either half can form includes it (it is what keeps the halves apart).
pub(crate) const REDLOCK_BRIDGE: usize = 2;

/// The `redlock-*-restart` kinds' least ttl: the hazard lives between the bridge node's
/// restart and the holder's next renewal (a third of the ttl later), and the other half's
/// clients must reconnect to the restarted node within it, as they would in production
/// with leases of seconds.
pub(crate) const REDLOCK_RESTART_MIN_TTL: Duration = Duration::from_secs(3);

/// The master name the `sentinel-*` kinds' sentinels monitor.
pub(crate) const SENTINEL_MASTER: &str = "dlock-torture";

/// How many sentinels the `sentinel-*` kinds run (two must agree the master is down).
pub(crate) const SENTINELS: usize = 3;

/// The `cluster-fenced` kind's masters (each with one replica).
pub(crate) const CLUSTER_MASTERS: usize = 3;

/// How many members the `etcd-fenced` kind's cluster has: one may be down, and raft still
/// has a majority.
pub(crate) const ETCD_MEMBERS: usize = 3;

/// How many servers the `zookeeper-fenced` kind's ensemble has: one may be down, and the
/// other two are still a quorum.
pub(crate) const ZOOKEEPER_MEMBERS: usize = 3;

/// The `zookeeper-fenced` kind's least ttl, which is also its workers' session timeout
/// (their lease). A worker's client gives up on a silent server after 2/5 of the session
/// timeout and must reach another one within the rest, and an election after the
/// leader's death takes the kit's JVMs up to about a second on a loaded machine: with a
/// shorter session, every restart of a server would end the sessions behind it — safe,
/// but the run would test session expiry instead of a hold carried through a fail-over.
/// It also spaces faults as etcd's 2 s does, so the `--quick` run fits four.
pub(crate) const ZOOKEEPER_MIN_TTL: Duration = Duration::from_secs(2);

/// The least ttl of the command kinds (`run-supervised`, `run-supervised-zookeeper`,
/// `run-unsupervised`): the reported reproduction, `dlock run --ttl 3s` with the default
/// `--kill-grace` of 10 s; each `dlock` process and every write of its command is a
/// process start, which a shorter lease would make the subject of the run.
pub(crate) const RUN_MIN_TTL: Duration = Duration::from_secs(3);

/// Where the `zookeeper-fenced` kind's locks live in its ensemble (a chroot exercised as
/// users' URLs have them).
pub(crate) const ZOOKEEPER_CHROOT: &str = "/dlock-torture";

/// The `etcd-fenced` kind's least ttl, as memcached's: etcd leases count whole seconds,
/// are raised to at least 1.5 election timeouts (to 2 s at etcd's default settings), and
/// are revoked on the leader's 500 ms tick, so a 1 s lease may last half as long again
/// as its ttl, or twice as long.
pub(crate) const ETCD_MIN_TTL: Duration = Duration::from_secs(2);

/// Why the `etcd-fenced` kind does not run in a harness built without the `etcd` feature.
pub(crate) const NO_ETCD: &str = "this dlock-torture was built without etcd support: rebuild \
     it with `--features etcd` (e.g. `cargo install --path crates/dlock-torture --features \
     etcd`), which needs protoc, the Protocol Buffers compiler, on PATH";

impl Kind {
    pub(crate) const ALL: [Kind; 26] = [
        Kind::Dlock,
        Kind::DlockFenced,
        Kind::FairFenced,
        Kind::RwlockFenced,
        Kind::ReentrantFenced,
        Kind::ElectionFenced,
        Kind::Redlock,
        Kind::RedlockDelayedRestart,
        Kind::SentinelFenced,
        Kind::SentinelWaitFenced,
        Kind::ClusterFenced,
        Kind::MemcachedFenced,
        Kind::MemcachedFamilyFenced,
        Kind::EtcdFenced,
        Kind::EtcdFamilyFenced,
        Kind::PostgresFenced,
        Kind::ZookeeperFenced,
        Kind::RunSupervised,
        Kind::RunSupervisedZookeeper,
        Kind::Memory,
        Kind::SetnxExpire,
        Kind::SetnxGetset,
        Kind::GetDel,
        Kind::PlainDel,
        Kind::RedlockImmediateRestart,
        Kind::RunUnsupervised,
    ];

    pub(crate) fn id(self) -> &'static str {
        match self {
            Kind::Dlock => "dlock",
            Kind::DlockFenced => "dlock-fenced",
            Kind::FairFenced => "fair-fenced",
            Kind::RwlockFenced => "rwlock-fenced",
            Kind::ReentrantFenced => "reentrant-fenced",
            Kind::ElectionFenced => "election-fenced",
            Kind::Redlock => "redlock",
            Kind::RedlockImmediateRestart => "redlock-immediate-restart",
            Kind::RedlockDelayedRestart => "redlock-delayed-restart",
            Kind::SentinelFenced => "sentinel-fenced",
            Kind::SentinelWaitFenced => "sentinel-wait-fenced",
            Kind::ClusterFenced => "cluster-fenced",
            Kind::MemcachedFenced => "memcached-fenced",
            Kind::MemcachedFamilyFenced => "memcached-family-fenced",
            Kind::EtcdFenced => "etcd-fenced",
            Kind::EtcdFamilyFenced => "etcd-family-fenced",
            Kind::PostgresFenced => "postgres-fenced",
            Kind::ZookeeperFenced => "zookeeper-fenced",
            Kind::Memory => "memory",
            Kind::SetnxExpire => "setnx-expire",
            Kind::SetnxGetset => "setnx-getset",
            Kind::GetDel => "get-del",
            Kind::PlainDel => "plain-del",
            Kind::RunSupervised => "run-supervised",
            Kind::RunSupervisedZookeeper => "run-supervised-zookeeper",
            Kind::RunUnsupervised => "run-unsupervised",
        }
    }

    /// Whether the workers are `dlock` processes running a shell command (see
    /// `crate::command`), rather than this crate's worker loop: `run-supervised` and
    /// `run-supervised-zookeeper` (`dlock run`), and their control `run-unsupervised`
    /// (`dlock acquire`, the command, `dlock release`).
    pub(crate) fn runs_commands(self) -> bool {
        matches!(
            self,
            Kind::RunSupervised | Kind::RunSupervisedZookeeper | Kind::RunUnsupervised
        )
    }

    pub(crate) fn is_control(self) -> bool {
        matches!(
            self,
            Kind::SetnxExpire
                | Kind::SetnxGetset
                | Kind::GetDel
                | Kind::PlainDel
                | Kind::RedlockImmediateRestart
                | Kind::RunUnsupervised
        )
    }

    /// Whether the kind runs on an etcd cluster (only in a harness built with etcd
    /// support).
    pub(crate) fn is_etcd(self) -> bool {
        matches!(self, Kind::EtcdFenced | Kind::EtcdFamilyFenced)
    }

    /// Whether the workers write the fenced resource (else the unfenced counter).
    pub(crate) fn is_fenced(self) -> bool {
        matches!(
            self,
            Kind::DlockFenced
                | Kind::Memory
                | Kind::FairFenced
                | Kind::RwlockFenced
                | Kind::ReentrantFenced
                | Kind::ElectionFenced
                | Kind::MemcachedFenced
                | Kind::MemcachedFamilyFenced
                | Kind::EtcdFenced
                | Kind::EtcdFamilyFenced
                | Kind::PostgresFenced
                | Kind::ZookeeperFenced
                | Kind::SentinelFenced
                | Kind::SentinelWaitFenced
                | Kind::ClusterFenced
        )
    }

    /// Whether the kind runs on lock servers of its own, whatever `--url` says: RedLock
    /// needs several independent masters, and memcached, etcd, PostgreSQL and ZooKeeper
    /// are not Redis.
    pub(crate) fn owns_servers(self) -> bool {
        matches!(
            self,
            Kind::Redlock
                | Kind::RedlockImmediateRestart
                | Kind::RedlockDelayedRestart
                | Kind::SentinelFenced
                | Kind::SentinelWaitFenced
                | Kind::ClusterFenced
                | Kind::MemcachedFenced
                | Kind::MemcachedFamilyFenced
                | Kind::EtcdFenced
                | Kind::EtcdFamilyFenced
                | Kind::PostgresFenced
                | Kind::ZookeeperFenced
                | Kind::RunSupervisedZookeeper
        )
    }

    /// The kind's lease: memcached's one-second expiry clock needs at least
    /// [`MIN_TTL`](fencelock::backend::memcached::MIN_TTL), etcd's whole-second leases
    /// [`ETCD_MIN_TTL`], ZooKeeper's sessions [`ZOOKEEPER_MIN_TTL`], the `dlock`
    /// processes of the command kinds [`RUN_MIN_TTL`].
    pub(crate) fn ttl(self, ttl: Duration) -> Duration {
        match self {
            k if k.runs_commands() => ttl.max(RUN_MIN_TTL),
            Kind::MemcachedFenced | Kind::MemcachedFamilyFenced => {
                ttl.max(fencelock::backend::memcached::MIN_TTL)
            }
            Kind::EtcdFenced | Kind::EtcdFamilyFenced => ttl.max(ETCD_MIN_TTL),
            Kind::ZookeeperFenced => ttl.max(ZOOKEEPER_MIN_TTL),
            Kind::RedlockImmediateRestart | Kind::RedlockDelayedRestart => {
                ttl.max(REDLOCK_RESTART_MIN_TTL)
            }
            _ => ttl,
        }
    }

    /// How much longer than its ttl a lease may outlive its last renewal on the server:
    /// memcached counts expiry on a clock that ticks once a second; etcd's leader revokes
    /// expired leases on a 500 ms tick, and a new leader extends every lease by an
    /// election timeout (500 ms in the test kit's clusters); ZooKeeper's leader expires
    /// sessions on its tick (100 ms in the kit's ensembles), and a new leader gives every
    /// session a whole timeout again.
    pub(crate) fn expiry_slack(self) -> Duration {
        match self {
            Kind::MemcachedFenced
            | Kind::MemcachedFamilyFenced
            | Kind::EtcdFenced
            | Kind::EtcdFamilyFenced
            | Kind::ZookeeperFenced
            | Kind::RunSupervisedZookeeper => Duration::from_secs(1),
            _ => Duration::ZERO,
        }
    }

    /// Whether `fault` means anything for the kind. The memory kind can only stall a
    /// holder; memcached, etcd and ZooKeeper have no `CLIENT PAUSE` and no scripts, and the
    /// test kit cannot freeze memcached or etcd (it gives no process id of theirs).
    /// ZooKeeper takes etcd's faults (its kit could freeze a server; not done here yet).
    pub(crate) fn applies(self, fault: Fault) -> bool {
        match self {
            Kind::Memory => fault == Fault::Pause,
            // The `dlock` process paused (not its command), or cut off from the store.
            k if k.runs_commands() => matches!(fault, Fault::Pause | Fault::Blackhole),
            Kind::MemcachedFenced | Kind::MemcachedFamilyFenced => !matches!(
                fault,
                Fault::Freeze | Fault::ClientPause | Fault::ScriptFlush | Fault::Failover
            ),
            // No store clock faults (the workers' clock still jumps): etcd's Go runtime
            // reads its clocks through the vDSO, which no preloaded library reaches, and
            // the JVM calls the clock so often that libfaketime (which looks at its control
            // file on every call) slows a ZooKeeper ensemble past its 2 s sessions. The
            // test kit's clock tests show what each does with a moved clock.
            Kind::EtcdFenced | Kind::EtcdFamilyFenced | Kind::ZookeeperFenced => {
                !matches!(
                    fault,
                    Fault::Freeze | Fault::ClientPause | Fault::ScriptFlush | Fault::Failover
                ) && !fault.moves_store_clock()
            }
            Kind::PostgresFenced => !matches!(
                fault,
                Fault::ClientPause | Fault::ScriptFlush | Fault::Failover
            ),
            // The one Redis kind whose server's clock moves (the others share the server).
            Kind::DlockFenced => fault != Fault::Failover,
            // Workers reach the servers straight (the sentinels hand out the master's
            // address, which no proxy stands in for): worker faults and failovers.
            Kind::SentinelFenced | Kind::SentinelWaitFenced | Kind::ClusterFenced => {
                matches!(fault, Fault::Pause | Fault::Kill | Fault::Failover)
            }
            // The partition between the halves is set for the whole run; the one fault
            // is the bridge node's restart, on a holder's grant.
            Kind::RedlockImmediateRestart | Kind::RedlockDelayedRestart => fault == Fault::Restart,
            // The control that expires locks by the client's wall clock: a worker whose
            // clock jumps ahead takes over a lock it thinks expired (the positive control
            // that proves the workers' fake clock moves).
            Kind::SetnxGetset => {
                fault != Fault::Failover && (!fault.moves_a_clock() || fault == Fault::ClientClock)
            }
            _ => fault != Fault::Failover && !fault.moves_a_clock(),
        }
    }

    /// Under `--quick`, the faults a kind's short run still has room for: the controls
    /// only need the faults that break them; RedLock skips the two that are no different
    /// on a quorum; memcached's, etcd's and ZooKeeper's 2 s ttl spaces faults 6 s apart, so
    /// four fit in their runs (on etcd and ZooKeeper, the one restart is the leader's).
    pub(crate) fn in_quick_run(self, fault: Fault) -> bool {
        match self {
            Kind::RedlockImmediateRestart | Kind::RedlockDelayedRestart => true,
            // The control's short run has room for one: the partition of the reproduction
            // (it is caught whatever the fault).
            Kind::RunUnsupervised => fault == Fault::Blackhole,
            Kind::RunSupervised | Kind::RunSupervisedZookeeper => true,
            // setnx-getset also under the workers' clock jump, which must catch it.
            k if k.is_control() => {
                matches!(fault, Fault::Pause | Fault::Kill)
                    || (k == Kind::SetnxGetset && fault == Fault::ClientClock)
            }
            Kind::Redlock => !matches!(fault, Fault::ClientPause | Fault::ScriptFlush),
            // Room for the four clock faults: the faults `dlock` runs quick already go.
            Kind::DlockFenced => !matches!(
                fault,
                Fault::ClientPause | Fault::ScriptFlush | Fault::Close | Fault::Delay
            ),
            Kind::PostgresFenced => !matches!(fault, Fault::Close | Fault::Delay),
            Kind::MemcachedFenced
            | Kind::MemcachedFamilyFenced
            | Kind::EtcdFenced
            | Kind::EtcdFamilyFenced
            | Kind::ZookeeperFenced => matches!(
                fault,
                Fault::Pause | Fault::Kill | Fault::Restart | Fault::Blackhole
            ),
            _ => true,
        }
    }

    /// The faults the kind exists to be run under (any one of them will do): a control's
    /// bug shows only under them, the RedLock restart kinds are about the bridge node's
    /// restart, the failover kinds about a failover. A run of the kind in which none took
    /// effect proves nothing, and fails. setnx-getset's bug (expiry by the client's wall
    /// clock) shows under a pause (a stale holder's release frees another's lock) and
    /// under a jump of the workers' wall clock (a worker takes over a held lock it thinks
    /// expired); the first of them planned comes first in its run.
    pub(crate) fn required_faults(self) -> &'static [Fault] {
        match self {
            Kind::SetnxExpire => &[Fault::Kill],
            Kind::SetnxGetset => &[Fault::Pause, Fault::ClientClock],
            Kind::GetDel | Kind::PlainDel => &[Fault::Pause],
            Kind::RedlockImmediateRestart | Kind::RedlockDelayedRestart => &[Fault::Restart],
            Kind::SentinelFenced | Kind::SentinelWaitFenced | Kind::ClusterFenced => {
                &[Fault::Failover]
            }
            _ => &[],
        }
    }

    /// [`required_faults`](Self::required_faults) in words: "pause or client-clock".
    pub(crate) fn required_words(self) -> String {
        let ids: Vec<&str> = self.required_faults().iter().map(|f| f.id()).collect();
        ids.join(" or ")
    }

    /// Whether a failover before replication excuses an overlap, a fence that repeats or
    /// goes back, and a stale write the fenced resource accepted: so SAFETY.md says of
    /// Sentinel and Cluster without `WAIT` (the grant, and the fence counter's `INCR`,
    /// can die with the master). With `min_replicas` a grant the replica has not
    /// acknowledged is never returned, so nothing is excused.
    pub(crate) fn failover_excuses(self) -> bool {
        matches!(self, Kind::SentinelFenced | Kind::ClusterFenced)
    }

    /// Whether an overlap that `fault` explains is excused for this kind: a pause or a
    /// restart without persistence always (no lease lock survives them unfenced), a
    /// failover or a clock fault where SAFETY.md says the store gives way to it.
    pub(crate) fn excuses(self, fault: Fault) -> bool {
        match fault {
            // A pause of a `dlock run` worker stops the supervisor, not the command: its
            // reaper process must still kill the command before the lease ends.
            Fault::Pause if self.runs_commands() => false,
            Fault::Pause | Fault::Restart => true,
            Fault::Failover => self.failover_excuses(),
            Fault::ClockJump | Fault::ClockBack | Fault::ClockFast => self.clock_excuses(),
            _ => false,
        }
    }

    /// Whether a jump or a fast run of the lock server's wall clock excuses an overlap: on
    /// the stores that expire leases by it (Redis's key expiry, PostgreSQL's
    /// `clock_timestamp()`), a forward step ends a lease early (SAFETY.md; fencing keeps
    /// the resource safe). memcached's and ZooKeeper's expiry follow their monotonic
    /// clocks, so there it excuses nothing.
    pub(crate) fn clock_excuses(self) -> bool {
        matches!(self, Kind::DlockFenced | Kind::PostgresFenced)
    }

    /// Whether a holder keeps the lock for half a ttl, without renewing it, before its
    /// write: the `redlock-*-restart` kinds, whose hazard needs a hold that lasts while
    /// the bridge node restarts and the other half forms its majority.
    pub(crate) fn holds_long(self) -> bool {
        matches!(
            self,
            Kind::RedlockImmediateRestart | Kind::RedlockDelayedRestart
        )
    }

    /// The key prefix of the kind's lock: the library's default for each primitive, and
    /// none for plain locks and controls (which share the standard protocol's key).
    pub(crate) fn lock_prefix(self) -> &'static str {
        match self {
            Kind::FairFenced => fencelock::DEFAULT_FAIR_PREFIX,
            Kind::RwlockFenced | Kind::EtcdFamilyFenced | Kind::MemcachedFamilyFenced => {
                fencelock::DEFAULT_RWLOCK_PREFIX
            }
            Kind::ReentrantFenced => fencelock::DEFAULT_REENTRANT_PREFIX,
            Kind::ElectionFenced => fencelock::DEFAULT_ELECTION_PREFIX,
            _ => "",
        }
    }

    /// The kind's lock keys in the store, for the lock named after `keys`.
    pub(crate) fn lock_keys(self, keys: &ResourceKeys) -> Option<LockKeys> {
        LockKeys::new(self.lock_prefix(), &keys.lock).ok()
    }

    /// The keys that hold a hold or a waiter's place; all must be gone once every lease and
    /// claim has run out. Each primitive's companions are named as its Redis backend names
    /// them. (A reentrant lock's holds all live in its lock key, a hash.)
    pub(crate) fn live_keys(self, lock: &LockKeys) -> Vec<String> {
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
    pub(crate) fn lasting_keys(self, lock: &LockKeys) -> Vec<String> {
        let mut keys = vec![lock.fence().to_owned()];
        if self == Kind::ElectionFenced {
            keys.push(lock.companion(fencelock::raw::RECORD));
        }
        keys
    }

    /// How long a queued waiter's place (fair-fenced) or a waiting writer's claim
    /// (rwlock-fenced) outlives its next expected attempt. Half a ttl rather than the
    /// library's default of seconds: a crashed waiter's entry then lapses soon after the
    /// holder's lease, which keeps the reacquire bound and the orphan audit tight.
    pub(crate) fn waiter_grace(self, ttl: Duration) -> Option<Duration> {
        matches!(self, Kind::FairFenced | Kind::RwlockFenced)
            .then(|| (ttl / 2).clamp(Duration::from_millis(10), Duration::from_secs(60)))
    }

    /// Extra time, past ttl + ε, the next holder may need after a holder's crash: in a fair
    /// lock, up to one waiter grace. Nothing announces a crashed holder's expiry, so the
    /// next in line wakes on its own timer, and a waiter that last tried while the lock was
    /// passing to the head was told to wait out the head's claim (up to ttl + grace); a
    /// waiter that crashed at the head of the queue keeps its place as long. (A read-write
    /// lock's writers do not queue behind each other.)
    pub(crate) fn reacquire_slack(self, ttl: Duration) -> Duration {
        match self {
            Kind::FairFenced => self.waiter_grace(ttl).unwrap_or_default(),
            _ => Duration::ZERO,
        }
    }

    /// The kind named `s`; a usage error for an unknown one, and for the etcd kinds in a
    /// harness built without etcd support ([`NO_ETCD`]).
    pub(crate) fn parse(s: &str) -> Result<Kind, Failure> {
        let kind = Kind::ALL
            .into_iter()
            .find(|k| k.id() == s)
            .ok_or_else(|| Failure::usage(format!("unknown lock kind {s:?}")))?;
        if kind.is_etcd() && !cfg!(feature = "etcd") {
            return Err(Failure::usage(format!("the {} kind: {NO_ETCD}", kind.id())));
        }
        Ok(kind)
    }
}

/// A fault the nemesis can inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Fault {
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
    /// The `sentinel-*` and `cluster-fenced` kinds' failover before replication: the
    /// replica (of the lock's slot, in a cluster) is frozen, the next grant goes to the
    /// master alone (with `min_replicas`, none can), the master is killed and the replica
    /// thawed, and it is promoted; the old master comes back empty as its replica.
    Failover,
    /// The lock server's wall clock steps 2 × ttl forward (an NTP step), and back after
    /// 2 × ttl. Only on servers of the run's own, started under a fake clock.
    ClockJump,
    /// The lock server's wall clock steps 2 × ttl back, and forward again after 2 × ttl.
    ClockBack,
    /// The lock server's wall clock runs four times as fast for 2 × ttl (a broken time
    /// source), then is set right.
    ClockFast,
    /// The workers' wall clock steps an hour forward (every other time back) for 2 × ttl:
    /// dlock reads only the monotonic clock, so nothing may change.
    ClientClock,
    /// Kill PostgreSQL (every process, SIGKILL) and start it again on its data at once:
    /// a crash of a durable store, which must keep every hold and fence. The form
    /// `restart` takes on postgres-fenced (not a fault of its own in `--faults`).
    CrashRestart,
}

impl Fault {
    pub(crate) const ALL: [Fault; 14] = [
        Fault::Pause,
        Fault::Kill,
        Fault::Freeze,
        Fault::ClientPause,
        Fault::Restart,
        Fault::ScriptFlush,
        Fault::Delay,
        Fault::Blackhole,
        Fault::Close,
        Fault::Failover,
        Fault::ClockJump,
        Fault::ClockBack,
        Fault::ClockFast,
        Fault::ClientClock,
    ];

    pub(crate) fn id(self) -> &'static str {
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
            Fault::Failover => "failover",
            Fault::ClockJump => "clock-jump",
            Fault::ClockBack => "clock-back",
            Fault::ClockFast => "clock-fast",
            Fault::ClientClock => "client-clock",
        }
    }

    pub(crate) fn parse_list(s: &str) -> Result<Vec<Fault>, Failure> {
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

    pub(crate) fn needs_own_server(self) -> bool {
        matches!(self, Fault::Freeze | Fault::Restart | Fault::Failover) || self.moves_store_clock()
    }

    /// Whether a window of `happened` shows that this fault, as planned, took effect: a
    /// `restart` takes effect as one of its forms (delayed, a leader's or a member's, a
    /// crash).
    pub(crate) fn took_effect_as(self, happened: Fault) -> bool {
        happened == self
            || (self == Fault::Restart
                && matches!(
                    happened,
                    Fault::DelayedRestart
                        | Fault::LeaderRestart
                        | Fault::MemberRestart
                        | Fault::CrashRestart
                ))
    }

    /// Whether the fault moves the lock server's clock.
    pub(crate) fn moves_store_clock(self) -> bool {
        matches!(self, Fault::ClockJump | Fault::ClockBack | Fault::ClockFast)
    }

    /// Whether the fault moves a clock (the lock server's or the workers').
    pub(crate) fn moves_a_clock(self) -> bool {
        self.moves_store_clock() || self == Fault::ClientClock
    }

    /// Whether the fault acts on lock servers (on RedLock: a minority of its nodes; on
    /// etcd and ZooKeeper: one member) or on the links to them, rather than on a worker
    /// process.
    pub(crate) fn hits_nodes(self) -> bool {
        !matches!(self, Fault::Pause | Fault::Kill | Fault::ClientClock)
    }
}

/// How far the workers' wall clock steps under `client-clock`.
pub(crate) const CLIENT_JUMP: Duration = Duration::from_secs(3600);

/// The real wall clock minus CLOCK_MONOTONIC, in nanoseconds, as this process reads them:
/// a worker under a fake wall clock, given it by the harness (which runs under none),
/// tells how far its own wall clock is off.
pub(crate) fn wall_minus_monotonic_ns() -> i64 {
    let wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX));
    wall.saturating_sub(i64::try_from(monotonic_ns()).unwrap_or(i64::MAX))
}

/// A fault as it happened.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct FaultWindow {
    pub(crate) fault: Fault,
    pub(crate) start: u64,
    pub(crate) end: u64,
    pub(crate) worker: Option<usize>,
    /// The RedLock nodes, etcd members or ZooKeeper servers hit (by index), for the faults
    /// that hit nodes or links to them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) nodes: Vec<usize>,
}

/// The keys of one kind's run: the lock, and the resources it protects.
pub(crate) struct ResourceKeys {
    pub(crate) base: String,
    pub(crate) lock: String,
    pub(crate) counter: String,
    pub(crate) fenced: String,
    pub(crate) highest: String,
    pub(crate) log: String,
}

impl ResourceKeys {
    pub(crate) fn parse(base: &str) -> ResourceKeys {
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
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub(crate) fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }
}

/// The kind of lock server `--url` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Given {
    /// A Redis server (any `redis…://` URL): the single-Redis kinds run on it.
    Redis,
    /// A PostgreSQL server (`postgres://`, `postgresql://`): the `postgres-fenced` kind
    /// runs on it instead of a PostgreSQL of its own.
    Postgres,
}

impl Given {
    /// What `url` names, by its scheme.
    pub(crate) fn of(url: &str) -> Given {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Given::Postgres
        } else {
            Given::Redis
        }
    }

    /// Whether `kind` runs on the server given: on a Redis, every kind but those with
    /// servers of their own; on a PostgreSQL, `postgres-fenced`.
    pub(crate) fn runs(self, kind: Kind) -> bool {
        match self {
            Given::Redis => !kind.owns_servers(),
            Given::Postgres => kind == Kind::PostgresFenced,
        }
    }
}

pub(crate) struct Config {
    pub(crate) workers: usize,
    pub(crate) ttl: Duration,
    pub(crate) seed: u64,
    pub(crate) faults: Vec<Fault>,
    /// `--faults` named the faults (not `all`): under `--quick` each kind gets every one
    /// of them that applies to it, not only those its quick run has room for by default.
    pub(crate) faults_named: bool,
    /// The lock server `--url` names, if any.
    pub(crate) given: Option<Given>,
    /// Faults not to inject on a lock server given with `--url` (dlock does not own it);
    /// they still apply to the kinds that run on servers of their own.
    pub(crate) not_on_given: Vec<Fault>,
    /// `--kinds all`: a kind whose server is not installed is skipped, not an error.
    pub(crate) all_kinds: bool,
    pub(crate) quick: bool,
    pub(crate) duration: Duration,
    /// The lock servers' clock (their wall clock, under libfaketime or the kit's shim),
    /// if clock faults can run here.
    pub(crate) store_clock: Option<dlock_test::clock::FakeClock>,
    /// The workers' wall clock, likewise.
    pub(crate) client_clock: Option<dlock_test::clock::FakeClock>,
}

impl Config {
    /// Whether `kind` runs on the lock server `--url` named (which dlock does not own).
    pub(crate) fn on_given(&self, kind: Kind) -> bool {
        self.given.is_some_and(|g| g.runs(kind))
    }
}

/// A set of lock servers by index (RedLock's nodes; a single server is node 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Nodes(pub(crate) u64);

impl Nodes {
    pub(crate) const FIRST: Nodes = Nodes(1);

    pub(crate) fn one(i: usize) -> Nodes {
        Nodes(1 << i.min(63))
    }

    /// All of `n` nodes (at most 64).
    pub(crate) fn all(n: usize) -> Nodes {
        Nodes(if n >= 64 { u64::MAX } else { (1 << n) - 1 })
    }

    pub(crate) fn iter(self) -> impl Iterator<Item = usize> {
        (0..64).filter(move |i| self.0 & (1 << i) != 0)
    }

    pub(crate) fn list(self) -> Vec<usize> {
        self.iter().collect()
    }

    /// At least one and at most a minority of `n` nodes, at random (for 5 nodes: 1 or 2,
    /// so that a majority always stays reachable).
    pub(crate) fn minority(n: usize, rng: &mut Rng) -> Nodes {
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
    pub(crate) fn some(n: usize, rng: &mut Rng) -> Nodes {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// `etcd-fenced` is a kind of a harness built with etcd support; without it, naming it
    /// is a usage error that says how to get it. Every other kind parses either way.
    #[test]
    fn etcd_fenced_needs_a_harness_built_with_the_etcd_feature() {
        let parsed = Kind::parse("etcd-fenced");
        #[cfg(feature = "etcd")]
        assert_eq!(parsed.expect("etcd-fenced"), Kind::EtcdFenced);
        #[cfg(not(feature = "etcd"))]
        {
            let f = parsed.expect_err("no etcd support");
            assert_eq!(f.code, crate::exit::USAGE);
            assert!(
                f.message.contains("--features etcd") && f.message.contains("protoc"),
                "{}",
                f.message
            );
        }
        for kind in Kind::ALL.into_iter().filter(|&k| !k.is_etcd()) {
            assert_eq!(Kind::parse(kind.id()).expect("parses"), kind);
        }
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
