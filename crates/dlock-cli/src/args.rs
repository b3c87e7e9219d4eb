//! Raw command-line flags (clap). Resolved into settings by the commands.

use std::ffi::OsString;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

/// dlock: distributed locks for a fleet of machines (flock(1), across hosts).
#[derive(Debug, Parser)]
#[command(
    name = "dlock",
    version,
    about,
    after_help = AFTER_HELP,
    propagate_version = true
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// Examples, exit codes and environment, after the options in `--help`.
const AFTER_HELP: &str = "Examples:
  # cron job de-duplication: run at most one copy fleet-wide, skip if one is running
  dlock run --no-wait nightly-report -- ./report.sh

  # serialise deploys: wait up to 10 minutes for the previous one to finish
  dlock run --wait 10m deploy-prod -- ./deploy.sh v1.2.3

  # shell scripts that cannot wrap a command
  read token fence < <(dlock acquire --ttl 5m migrate)
  ...; dlock release migrate --token \"$token\"

  # see what is held
  dlock list 'deploy-*' --json

  # one scheduler fleet-wide; the others stand by and take over when it stops
  dlock elect --value \"$(hostname)\" scheduler -- ./scheduler
  dlock leader scheduler --watch

Exit codes:
  0      success (dlock run, dlock elect: the command's own status; 128+N if signal N
         killed it)
  64     usage error: bad flag, duration, URL or backend
  69     backend unavailable or failed
  75     conflict: the lock is held, or another candidate leads (--no-wait, or --wait ran
         out); see --conflict-exit-code
  76     lock or leadership lost while held (the command was terminated), or not ours at
         release
  1      dlock torture: an unexpected result (see its report)
  126    the command could not be executed
  127    the command was not found

Environment:
  DLOCK_URL    the store, as for --url (redis://host:port/db, rediss://, redis+unix://)";

/// Where the locks live.
#[derive(Debug, Clone, Args)]
pub(crate) struct Store {
    /// The store: redis://[user:pass@]host:port/db, rediss://… (TLS), redis+unix:///path,
    /// redis+sentinel://host:port,…/master-name, redis+cluster://host:port,…, or
    /// redlock://host:port,host:port,host:port (RedLock; `dlock run` only, no fence),
    /// memcache://host:port (`dlock run` only).
    #[arg(long, env = "DLOCK_URL", hide_env_values = true)]
    pub(crate) url: Option<String>,

    /// Key prefix of the locks.
    #[arg(long, default_value = dlock::keys::DEFAULT_PREFIX)]
    pub(crate) prefix: String,
}

/// How long to wait for a held lock.
#[derive(Debug, Clone, Args)]
pub(crate) struct Wait {
    /// Wait at most this long for the lock (e.g. 30s, 5m); default: wait forever.
    #[arg(long, value_parser = parse_duration, conflicts_with = "no_wait")]
    pub(crate) wait: Option<Duration>,

    /// Do not wait: if the lock is held, exit with the conflict code (like flock -n).
    #[arg(long, short = 'n')]
    pub(crate) no_wait: bool,

    /// Exit code when the lock is held (with --no-wait or after --wait).
    #[arg(long, default_value_t = crate::exit::CONFLICT, value_name = "N")]
    pub(crate) conflict_exit_code: u8,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Run a command while holding the lock NAME; exit with its status.
    ///
    /// The lease is renewed while the command runs. If the lock is lost meanwhile (the
    /// store lost it, or an operator force-unlocked it), or renewals keep failing until the
    /// remaining validity is down to --kill-grace (at most ttl/3), the command gets
    /// SIGTERM, then SIGKILL after the grace, and dlock exits 76. SIGTERM and SIGHUP sent to
    /// dlock are forwarded to the command, SIGINT too unless stdin is a terminal (Ctrl-C
    /// reaches the command itself there); a second one sends SIGKILL. Without a terminal
    /// the command gets its own process group, so its children are signalled too. The lock
    /// is released after the command exits. The command
    /// sees DLOCK_NAME, DLOCK_TOKEN and DLOCK_FENCE (the fencing token: pass it to the
    /// resource, which must reject writes with a smaller one).
    Run(RunArgs),
    /// Campaign in the election NAME and run a command only while leading.
    ///
    /// Candidates wait in arrival order where the store queues waiters (Redis, etcd,
    /// PostgreSQL, ZooKeeper). Once this one leads, it advertises --value and runs the
    /// command with DLOCK_NAME, DLOCK_TOKEN, DLOCK_TERM (the term: a fencing token that
    /// strictly increases with every leader; DLOCK_FENCE has the same number) and
    /// DLOCK_VALUE. When the command exits, dlock resigns at once (the next candidate
    /// leads without waiting for the lease) and exits with the command's status. If
    /// leadership is lost meanwhile, the command gets SIGTERM, SIGKILL after --kill-grace,
    /// and dlock exits 76. SIGTERM, SIGHUP (and SIGINT off a terminal) sent to dlock are
    /// forwarded to the command; dlock resigns once it has exited, so a standby takes
    /// over well before the lease could run out.
    Elect(ElectArgs),
    /// Show who leads the election NAME: its term and value (`no leader` if nobody).
    ///
    /// With --watch, keep printing every change of leader or advertised value, as it
    /// happens, until interrupted.
    Leader(LeaderArgs),
    /// Acquire NAME and print its token and fence; the lease lasts --ttl (no renewal).
    Acquire(AcquireArgs),
    /// Release NAME held under --token.
    Release(TokenArgs),
    /// Reset the lease of NAME held under --token to --ttl from now.
    Extend(ExtendArgs),
    /// Show who holds NAME: token (abbreviated), remaining ttl, last fence, waiting clients.
    Status(StatusArgs),
    /// List held locks (SCAN, never KEYS), optionally matching a glob PATTERN.
    List(ListArgs),
    /// Delete NAME whoever holds it. Dangerous: the holder keeps working until it notices.
    ForceUnlock(ForceUnlockArgs),
    /// Seed 003's oversell demo: worker processes deduct stock four ways.
    Demo(DemoArgs),
    /// Jepsen-style safety check: worker processes, a fault-injecting nemesis, checkers.
    ///
    /// For each lock kind, W worker processes loop acquire → read-modify-write a
    /// protected resource (an unfenced counter, and a fenced one that refuses fences
    /// below the highest it has seen) → release, while a nemesis injects faults on a
    /// schedule drawn from --seed. Every operation is recorded on CLOCK_MONOTONIC; the
    /// checkers then count overlapping holders, lost increments, stale writes accepted,
    /// fence order and reuse, time to reacquire after a crash, and orphan keys. The
    /// seeds' broken locks run as controls and must be caught. Writes report.json and an
    /// SVG timeline per kind to --out; exits 1 on any unexpected result.
    Torture(TortureArgs),
    /// Print shell completions.
    Completions(CompletionsArgs),
    /// One worker process of `dlock demo` (internal).
    #[command(hide = true)]
    DemoWorker(DemoWorkerArgs),
    /// One worker process of `dlock torture` (internal).
    #[command(hide = true)]
    TortureWorker(TortureWorkerArgs),
}

/// The kinds of primitive, for `status` and `force-unlock`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Kind {
    /// A plain lock (`dlock run`, `acquire`).
    Lock,
    /// A semaphore (`dlock run --semaphore N`).
    Semaphore,
    /// A reentrant lock (library only).
    Reentrant,
    /// A read-write lock (`dlock run --shared` / `--exclusive`).
    Rwlock,
    /// A fair lock (`dlock run --fair`).
    Fair,
}

#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    /// The lock's name.
    pub(crate) name: String,
    #[command(flatten)]
    pub(crate) store: Store,
    #[command(flatten)]
    pub(crate) wait: Wait,
    /// Lease length, renewed every third of it while the command runs.
    #[arg(long, value_parser = parse_duration, default_value = "30s")]
    pub(crate) ttl: Duration,
    /// After SIGTERM on a lost lock, how long before SIGKILL.
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    pub(crate) kill_grace: Duration,
    /// At most N concurrent runs fleet-wide: take one of N permits instead of the lock (the
    /// command then gets no DLOCK_FENCE: permit holders do not exclude each other).
    #[arg(long, value_name = "N", conflicts_with_all = ["shared", "exclusive", "fair"])]
    pub(crate) semaphore: Option<u32>,
    /// Take the read-write lock NAME for reading: shared with other --shared runs,
    /// excluded by --exclusive runs (writers first: a waiting writer holds new readers
    /// back). No DLOCK_FENCE.
    #[arg(long, conflicts_with_all = ["exclusive", "fair"])]
    pub(crate) shared: bool,
    /// Take the read-write lock NAME for writing: alone, excluding --shared runs. (A plain
    /// run without this flag uses a separate, plain lock.)
    #[arg(long, conflicts_with = "fair")]
    pub(crate) exclusive: bool,
    /// Take the fair lock NAME: waiting --fair runs get it in arrival order.
    #[arg(long)]
    pub(crate) fair: bool,
    /// Print nothing on a conflict.
    #[arg(long, short)]
    pub(crate) quiet: bool,
    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub(crate) command: Vec<OsString>,
}

#[derive(Debug, Args)]
pub(crate) struct ElectArgs {
    /// The election's name (its key prefix defaults to `dlock-election:`).
    pub(crate) name: String,
    #[command(flatten)]
    pub(crate) store: Store,
    #[command(flatten)]
    pub(crate) wait: Wait,
    /// What this candidate advertises while it leads (`dlock leader` shows it); default
    /// HOST:PID. At most 4096 bytes.
    #[arg(long)]
    pub(crate) value: Option<String>,
    /// Lease length, renewed every third of it while leading: a crashed leader is
    /// replaced within it.
    #[arg(long, value_parser = parse_duration, default_value = "30s")]
    pub(crate) ttl: Duration,
    /// After SIGTERM on lost leadership, how long before SIGKILL.
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    pub(crate) kill_grace: Duration,
    /// Print nothing when another candidate leads (--no-wait, --wait).
    #[arg(long, short)]
    pub(crate) quiet: bool,
    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub(crate) command: Vec<OsString>,
}

#[derive(Debug, Args)]
pub(crate) struct LeaderArgs {
    /// The election's name.
    pub(crate) name: String,
    #[command(flatten)]
    pub(crate) store: Store,
    /// Print JSON (one object per line with --watch).
    #[arg(long)]
    pub(crate) json: bool,
    /// Keep printing every change as it happens, until interrupted.
    #[arg(long)]
    pub(crate) watch: bool,
}

#[derive(Debug, Args)]
pub(crate) struct AcquireArgs {
    /// The lock's name.
    pub(crate) name: String,
    #[command(flatten)]
    pub(crate) store: Store,
    #[command(flatten)]
    pub(crate) wait: Wait,
    /// Lease length (nothing renews it: extend or release before it runs out).
    #[arg(long, value_parser = parse_duration, default_value = "30s")]
    pub(crate) ttl: Duration,
    /// Print JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Debug, Args)]
pub(crate) struct TokenArgs {
    /// The lock's name.
    pub(crate) name: String,
    #[command(flatten)]
    pub(crate) store: Store,
    /// The token printed by `dlock acquire`.
    #[arg(long, env = "DLOCK_TOKEN", hide_env_values = true)]
    pub(crate) token: String,
    /// Print JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Debug, Args)]
pub(crate) struct ExtendArgs {
    #[command(flatten)]
    pub(crate) held: TokenArgs,
    /// The new lease length, from now.
    #[arg(long, value_parser = parse_duration)]
    pub(crate) ttl: Duration,
}

#[derive(Debug, Args)]
pub(crate) struct StatusArgs {
    /// The lock's name.
    pub(crate) name: String,
    #[command(flatten)]
    pub(crate) store: Store,
    /// Which kind of primitive NAME is (each kind has its own default key prefix).
    #[arg(long, value_enum, default_value_t = Kind::Lock)]
    pub(crate) kind: Kind,
    /// Print JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Debug, Args)]
pub(crate) struct ListArgs {
    /// Glob over lock names (* and ?).
    #[arg(default_value = "*")]
    pub(crate) pattern: String,
    #[command(flatten)]
    pub(crate) store: Store,
    /// At most this many locks.
    #[arg(long, default_value_t = 1000)]
    pub(crate) limit: usize,
    /// Print JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Debug, Args)]
pub(crate) struct ForceUnlockArgs {
    /// The lock's name.
    pub(crate) name: String,
    #[command(flatten)]
    pub(crate) store: Store,
    /// Which kind of primitive NAME is; every hold of it is deleted.
    #[arg(long, value_enum, default_value_t = Kind::Lock)]
    pub(crate) kind: Kind,
    /// Do not ask for confirmation.
    #[arg(long, short)]
    pub(crate) yes: bool,
}

#[derive(Debug, Args)]
pub(crate) struct DemoArgs {
    #[command(flatten)]
    pub(crate) store: Store,
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

#[derive(Debug, Clone, Args)]
pub(crate) struct DemoWorkerArgs {
    #[arg(long)]
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
    /// server faults (freeze, restart). Faults that need to own the server are skipped for
    /// a server given here.
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
    /// Faults, comma-separated, or `all`: pause, kill, freeze, client-pause, restart,
    /// script-flush, delay, blackhole, close.
    #[arg(long, default_value = "all")]
    pub(crate) faults: String,
    /// Lock kinds, comma-separated, or `all`: dlock, dlock-fenced, fair-fenced,
    /// rwlock-fenced, reentrant-fenced, election-fenced (leader election: each worker
    /// campaigns, writes as leader with its term as the fence, then resigns), redlock (a
    /// RedLock quorum over 5 redis-servers of its own, unfenced; 24 s under --quick),
    /// memcached-fenced (a memcached of its own,
    /// ttl at least 2 s; 30 s under --quick; skipped by `all` if memcached is missing),
    /// etcd-fenced (a 3-member etcd cluster of its own whose leader is killed and
    /// restarted, ttl at least 2 s; 30 s under --quick; skipped by `all` if etcd is
    /// missing), postgres-fenced (a PostgreSQL of its own, restarted as a crash; skipped by
    /// `all` if PostgreSQL is missing), zookeeper-fenced (a 3-server ZooKeeper ensemble of
    /// its own whose leader is killed and restarted, ttl = session timeout at least 2 s;
    /// 30 s under --quick; skipped by `all` if java or ZooKeeper is missing), memory, and
    /// the controls setnx-expire, setnx-getset, get-del, plain-del.
    #[arg(long, default_value = "all")]
    pub(crate) kinds: String,
    /// Where report.json and the timelines go.
    #[arg(long, default_value = "dlock-torture")]
    pub(crate) out: std::path::PathBuf,
    /// The CI profile: about 30 s per dlock kind (the shortest run that injects each
    /// kind's faults; 24 s for redlock), 12 s per control, 8 s for memory.
    #[arg(long)]
    pub(crate) quick: bool,
}

#[derive(Debug, Clone, Args)]
pub(crate) struct TortureWorkerArgs {
    #[arg(long)]
    pub(crate) kind: String,
    #[arg(long)]
    pub(crate) lock_url: String,
    #[arg(long)]
    pub(crate) resource_url: String,
    #[arg(long)]
    pub(crate) keys: String,
    #[arg(long)]
    pub(crate) ttl_ms: u64,
    #[arg(long)]
    pub(crate) until_ns: u64,
}

#[derive(Debug, Args)]
pub(crate) struct CompletionsArgs {
    /// The shell.
    pub(crate) shell: clap_complete::Shell,
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
