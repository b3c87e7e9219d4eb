//! Command-line flags of `dlock-torture` (clap): `torture`, `demo`, and the hidden worker
//! subcommands the two start as processes of this same binary.

use std::time::Duration;

use clap::{Args, Parser, Subcommand};

/// dlock-torture: dlock's safety harness (`dlock torture`) and the oversell demo
/// (`dlock demo`). The `dlock` command runs this binary for those two subcommands, so that
/// the lock tool users install does not carry the test kit.
#[derive(Debug, Parser)]
#[command(name = "dlock-torture", version, about, propagate_version = true)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// The oversell demo: worker processes deduct stock four ways.
    Demo(DemoArgs),
    /// Jepsen-style safety check: worker processes, a fault-injecting nemesis, checkers.
    ///
    /// For each lock kind, W worker processes loop acquire → read-modify-write a
    /// protected resource (an unfenced counter, and a fenced one that refuses fences
    /// below the highest it has seen) → release, while a nemesis injects faults on a
    /// schedule drawn from --seed. Every operation is recorded on CLOCK_MONOTONIC; the
    /// checkers then count overlapping holders, lost increments, stale writes accepted,
    /// fence order and reuse, time to reacquire after a crash, and orphan keys. The
    /// known-broken locks (SETNX+EXPIRE, SETNX+GETSET, GET+DEL, a plain DEL) run as
    /// controls and must be caught. The run-* kinds' workers
    /// are dlock processes instead, whose commands (and what they leave behind) write to
    /// a file: a write after the next holder's grant is two holders at once. Writes report.json and an
    /// SVG timeline per kind to --out; exits 1 on any unexpected result.
    Torture(TortureArgs),
    /// One worker process of `dlock demo` (internal).
    #[command(hide = true)]
    DemoWorker(DemoWorkerArgs),
    /// One worker process of `dlock torture` (internal).
    #[command(hide = true)]
    TortureWorker(TortureWorkerArgs),
    /// The lease-holding client of `dlock torture --soak` (internal).
    #[command(hide = true)]
    SoakHolder(SoakHolderArgs),
    /// One write of a command kind's command to its resource (internal).
    #[command(hide = true)]
    TortureAppend(AppendArgs),
}

#[derive(Debug, Args)]
pub(crate) struct DemoArgs {
    /// Where the stock and the locks live: redis://… (also rediss://, redis+unix://,
    /// redis+sentinel://, redis+cluster://), postgres://… (the fenced stock in a table), or
    /// memory:// (worker threads in this process). Default: a private redis-server (the
    /// memory backend if redis-server is not installed).
    #[arg(long, env = "DLOCK_URL", hide_env_values = true)]
    pub(crate) url: Option<String>,
    /// Worker processes per scenario.
    #[arg(long, default_value_t = 8)]
    pub(crate) workers: usize,
    /// Orders each worker places.
    #[arg(long, default_value_t = 6)]
    pub(crate) orders: usize,
    /// Initial stock.
    #[arg(long, default_value_t = 24)]
    pub(crate) stock: i64,
    /// No progress bars (for logs and tests).
    #[arg(long)]
    pub(crate) plain: bool,
}

/// The environment variable that hands a demo worker its store's URL: in its
/// environment, not on its command line, which any user of the machine can read (`ps`).
pub(crate) const DEMO_WORKER_URL: &str = "DLOCK_DEMO_WORKER_URL";

/// The environment variable that hands a torture worker its lock server's URL (see
/// [`DEMO_WORKER_URL`]).
pub(crate) const TORTURE_WORKER_LOCK_URL: &str = "DLOCK_TORTURE_WORKER_LOCK_URL";

#[derive(Debug, Clone, Args)]
pub(crate) struct DemoWorkerArgs {
    #[arg(long, env = DEMO_WORKER_URL, hide_env_values = true)]
    pub(crate) url: String,
    #[arg(long)]
    pub(crate) scenario: String,
    #[arg(long)]
    pub(crate) run_id: String,
    #[arg(long)]
    pub(crate) worker: usize,
    #[arg(long)]
    pub(crate) orders: usize,
}

#[derive(Debug, Args)]
pub(crate) struct TortureArgs {
    /// The lock server to torture. Default: a private redis-server, which also allows the
    /// server faults (freeze, restart). A Redis URL (redis://, rediss://, …): the
    /// single-Redis kinds run on it. A PostgreSQL URL (postgres://, postgresql://, as
    /// libpq takes them, ?sslmode= and ?schema= included): the postgres-fenced kind runs
    /// on it (--kinds all then means postgres-fenced alone; the Redis kinds need a Redis
    /// server), its locks under the run's own names, audited and removed afterwards.
    /// Faults that need to own the server (freeze, restart, the server clock faults) are
    /// skipped for a server given here. A password in the URL is never printed, and
    /// reaches the worker processes in their environment, not on their command line.
    #[arg(long, env = "DLOCK_URL", hide_env_values = true)]
    pub(crate) url: Option<String>,
    /// How long each lock kind runs.
    #[arg(long, value_parser = parse_duration, default_value = "20s")]
    pub(crate) duration: Duration,
    /// Worker processes per kind.
    #[arg(long, default_value_t = 4)]
    pub(crate) workers: usize,
    /// Lease length of every lock kind.
    #[arg(long, value_parser = parse_duration, default_value = "1s")]
    pub(crate) ttl: Duration,
    /// Seed of the fault schedule (a run is reproducible from it).
    #[arg(long, default_value_t = 1)]
    pub(crate) seed: u64,
    /// Faults, comma-separated, or `all`: pause (on the run-* kinds: the dlock process, not
    /// its command), kill, freeze, client-pause, restart,
    /// script-flush, delay, blackhole, close, failover (the sentinel and cluster kinds
    /// only: the replica frozen, a grant to the master alone, the master killed), and the
    /// clock faults clock-jump, clock-back, clock-fast (the lock server's wall clock, on
    /// servers of the run's own) and client-clock (the workers'). The clock faults need
    /// libfaketime (Debian's faketime) and, for redis-server, a C compiler: a clock fault
    /// named here that cannot run fails the run at once; under `all` it is skipped with a
    /// note, except in the CI profile (--quick with --kinds named), where it fails the run
    /// too. A fault named here that never takes effect in a kind's run fails that kind (it
    /// was not tested under it; under `all` such a fault is printed under the kind), and so
    /// does a kind that exists for one fault
    /// (the controls, the failover kinds, the RedLock restart kinds) when it never took
    /// effect; such a kind named in --kinds without its fault in --faults is a usage error.
    /// Faults named here all apply under --quick too (`all` gives each kind the faults its
    /// quick run has room for); a kind that none of them applies to is skipped, with a
    /// note. Under client-clock the workers report their wall clock's offset, and a kind
    /// none of whose workers saw the jump fails.
    #[arg(long, default_value = "all")]
    pub(crate) faults: String,
    /// Lock kinds, comma-separated, or `all`: dlock, dlock-fenced, fair-fenced,
    /// rwlock-fenced, reentrant-fenced, election-fenced (leader election: each worker
    /// campaigns, writes as leader with its term as the fence, then resigns), redlock (a
    /// RedLock quorum over 5 redis-servers of its own, unfenced; 24 s under --quick),
    /// memcached-fenced (a memcached of its own,
    /// ttl at least 2 s; 30 s under --quick; skipped by `all` if memcached is missing),
    /// memcached-family-fenced (the same server and faults, the read-write lock: writers
    /// fenced, readers beside them),
    /// etcd-fenced (a 3-member etcd cluster of its own whose leader is killed and
    /// restarted, ttl at least 2 s; 30 s under --quick; skipped by `all` if etcd is
    /// missing; only in a harness built with `--features etcd`), etcd-family-fenced (the
    /// same cluster and faults, the read-write lock: writers fenced, readers beside them),
    /// postgres-fenced (a PostgreSQL of its own, restarted as a crash; skipped by
    /// `all` if PostgreSQL is missing), zookeeper-fenced (a 3-server ZooKeeper ensemble of
    /// its own whose leader is killed and restarted, ttl = session timeout at least 2 s;
    /// 30 s under --quick; skipped by `all` if java or ZooKeeper is missing),
    /// sentinel-fenced and sentinel-wait-fenced (a master, a replica and 3 sentinels of
    /// their own, failed over before replication; the second with min_replicas 1),
    /// cluster-fenced (a 3-master Redis Cluster of its own; the lock slot's master fails
    /// over), redlock-delayed-restart (RedLock with the workers split in two halves that
    /// share one node, which restarts empty only after 2 × ttl; ttl at least 3 s),
    /// run-supervised and run-supervised-zookeeper (workers are `dlock run --ttl 3s`
    /// processes of the dlock binary beside this one, their command ignoring SIGTERM and
    /// leaving a writer in the background; the second on a ZooKeeper ensemble of its own
    /// whose 3 s session makes a 2 s lease; skipped by `all` if dlock is missing), memory,
    /// and the controls setnx-expire, setnx-getset, get-del, plain-del,
    /// redlock-immediate-restart (the same split, the shared node restarting empty at once
    /// on a grant: RedLock's restart hazard, which must be caught) and run-unsupervised (the
    /// run-supervised command under `dlock acquire`'s lease, no supervisor).
    #[arg(long, default_value = "all")]
    pub(crate) kinds: String,
    /// Where report.json and the timelines go.
    #[arg(long, default_value = "dlock-torture")]
    pub(crate) out: std::path::PathBuf,
    /// The CI profile: about 30 s per dlock kind (the shortest run that injects each
    /// kind's faults; 24 s for redlock, 40 s for run-supervised and
    /// run-supervised-zookeeper), 12 s per control, 8 s for memory. With --kinds
    /// named (or $CI set), a clock fault that cannot run here fails the run.
    #[arg(long)]
    pub(crate) quick: bool,
    /// The soak profile: run the kinds round after round for this long (e.g. 30m; each
    /// kind for its usual --duration, or its --quick one; the kind running at the end
    /// finishes, none starts after it), while one client process holds --soak-leases
    /// leases on a redis-server of its own that is never faulted. Reports that client's
    /// RSS and open file descriptors over time (with the RSS slope over the second half)
    /// and its lost leases, which must be 0; writes them to report.json (`soak`) and
    /// soak.svg, each round's timelines to round-<n>/.
    #[arg(long, value_parser = parse_duration)]
    pub(crate) soak: Option<Duration>,
    /// How many leases the soak's client holds.
    #[arg(
        long,
        default_value_t = 10_000,
        requires = "soak",
        value_parser = clap::value_parser!(u64).range(1..=1_000_000)
    )]
    pub(crate) soak_leases: u64,
}

#[derive(Debug, Clone, Args)]
pub(crate) struct TortureWorkerArgs {
    #[arg(long)]
    pub(crate) kind: String,
    #[arg(long, env = TORTURE_WORKER_LOCK_URL, hide_env_values = true)]
    pub(crate) lock_url: String,
    #[arg(long)]
    pub(crate) resource_url: String,
    #[arg(long)]
    pub(crate) keys: String,
    #[arg(long)]
    pub(crate) ttl_ms: u64,
    #[arg(long)]
    pub(crate) until_ns: u64,
    /// The real wall clock minus CLOCK_MONOTONIC, in nanoseconds, as the harness (under
    /// no fake clock) read them: given, the worker reports how far its own wall clock is
    /// off the real one, at its start and whenever that moves by a second or more.
    #[arg(long, allow_hyphen_values = true)]
    pub(crate) real_wall_minus_monotonic_ns: Option<i64>,
}

/// `torture-append`: see `crate::command::append`.
#[derive(Debug, Clone, Args)]
pub(crate) struct AppendArgs {
    /// What the write is: the command's first (the grant), its own, or its background
    /// process's.
    #[arg(value_enum)]
    pub(crate) event: crate::command::Event,
    /// Wait this long before the first write.
    #[arg(long, default_value_t = 0)]
    pub(crate) after_ms: u64,
    /// Write again every 50 ms for this long (0: once).
    #[arg(long, default_value_t = 0)]
    pub(crate) for_ms: u64,
}

#[derive(Debug, Clone, Args)]
pub(crate) struct SoakHolderArgs {
    /// The holder's redis-server.
    #[arg(long)]
    pub(crate) url: String,
    /// Distinct locks to acquire and hold.
    #[arg(long)]
    pub(crate) leases: u64,
    /// Their ttl (the watchdog renews them).
    #[arg(long, value_parser = parse_duration)]
    pub(crate) ttl: Duration,
    /// Lock names are `soak:<run>:<i>`.
    #[arg(long)]
    pub(crate) run: String,
    /// The soak's start on CLOCK_MONOTONIC: samples' `t_ms` count from it.
    #[arg(long)]
    pub(crate) start_ns: u64,
    /// Release everything at this CLOCK_MONOTONIC time at the latest (SIGTERM: now).
    #[arg(long)]
    pub(crate) until_ns: u64,
    /// Time between samples.
    #[arg(long, value_parser = parse_duration)]
    pub(crate) every: Duration,
}

/// Durations like `30s`, `1m30s`, `500ms`, `2h`.
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s.trim())
        .map_err(|e| format!("{e} (expected e.g. 500ms, 30s, 5m, 2h)"))?;
    if d.is_zero() {
        return Err("must be greater than zero".into());
    }
    Ok(d)
}
