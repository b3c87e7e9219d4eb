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

/// `dlock hold`'s example, after its options in `--help` (kept as written: a doc comment
/// would be reflowed into one paragraph).
const HOLD_EXAMPLE: &str = "Example (bash; `exec`, so that $HOLD_PID is dlock hold itself and the \
script its parent: without it bash puts a subshell in between, which outlives the script and is \
what `kill` would stop):
  coproc HOLD { exec dlock hold --wait 5m migrate; }
  read -r token fence <&\"${HOLD[0]}\" || exit 75   # nothing read: not held
  ./migrate --fence \"$fence\"
  kill \"$HOLD_PID\"; wait \"$HOLD_PID\"";

/// Examples, exit codes and environment, after the options in `--help`.
const AFTER_HELP: &str = "Examples:
  # cron job de-duplication: run at most one copy fleet-wide, skip if one is running
  dlock run --no-wait nightly-report -- ./report.sh

  # the same cron entry on every machine, clocks a little apart: the first to start runs
  # it, the others are skipped for at least 5 minutes even if the job is quick
  dlock run --no-wait --min-hold 5m nightly-report -- ./report.sh

  # serialise deploys: wait up to 10 minutes for the previous one to finish
  dlock run --wait 10m deploy-prod -- ./deploy.sh v1.2.3

  # shell scripts that cannot wrap a command
  read token fence < <(dlock acquire --ttl 5m migrate)
  ...; dlock release migrate --token \"$token\"

  # see what is held, by whom (host, pid, command, since)
  dlock list 'deploy-*'
  dlock status deploy-prod --json

  # one scheduler fleet-wide; the others stand by and take over when it stops
  dlock elect --value \"$(hostname)\" scheduler -- ./scheduler
  dlock leader scheduler --watch

Exit codes:
  0      success (dlock run, dlock elect: the command's own status; 128+N if signal N
         killed it)
  64     usage error: bad flag, duration, URL or backend; dlock run --semaphore N whose N
         differs from the semaphore's stored count (see dlock set-permits)
  69     backend unavailable or failed
  75     conflict: the lock is held, or another candidate leads (--no-wait, or --wait ran
         out), or (dlock run --refuse-other-kinds) NAME is held as another kind of lock;
         see --conflict-exit-code. The message says who holds it (host, pid, command,
         since)
  76     lock or leadership lost while held (the command was terminated)
  77     dlock release / extend: another token holds NAME, not --token (a mistyped token,
         or its lease ran out and another holder took the lock)
  79     nobody holds NAME: dlock force-unlock found nothing to unlock; dlock release /
         extend found it held under no token (for a token that held it: its lease ran out,
         or it was force-unlocked)
  1      dlock torture: an unexpected result (see its report)
  126    the command could not be executed
  127    the command was not found

Environment:
  DLOCK_URL    the store, as for --url (redis://host:port/db, redlock://, memcache://,
               etcd://, postgres://, zk://); without it and --url: redis://127.0.0.1:6379";

/// `--prefix` of the commands on a plain lock.
pub(crate) const PREFIX_LOCK: &str = "Key prefix of the lock, used as given [default: dlock:]";
/// `--prefix` of `dlock run`: each kind of lock has its own default.
pub(crate) const PREFIX_RUN: &str = "Key prefix of the lock, used as given [default: dlock:, \
     or the kind's own: dlock-sem: (--semaphore), dlock-rw: (--shared, --exclusive), \
     dlock-fair: (--fair)]";
/// `--prefix` of `dlock elect` and `dlock leader`.
pub(crate) const PREFIX_ELECTION: &str =
    "Key prefix of the election, used as given [default: dlock-election:]";
/// `--prefix` of the commands that name a `--kind`.
pub(crate) const PREFIX_KIND: &str = "Key prefix of NAME, used as given [default: the \
     --kind's own: dlock: (lock), dlock-sem: (semaphore), dlock-re: (reentrant), dlock-rw: \
     (rwlock), dlock-fair: (fair)]";
/// `--prefix` of `dlock list` and `dlock top`.
pub(crate) const PREFIX_LIST: &str = "Key prefix of the kind listed, used as given (one kind: \
     the plain lock, or the one --kind names) [default: each kind's own: dlock: (lock), \
     dlock-sem: (semaphore), dlock-re: (reentrant), dlock-rw: (rwlock), dlock-fair: (fair)]";
/// `--prefix` of `dlock set-permits`.
pub(crate) const PREFIX_SEMAPHORE: &str =
    "Key prefix of the semaphore, used as given [default: dlock-sem:]";

/// Where the locks live.
#[derive(Debug, Clone, Args)]
pub(crate) struct Store {
    /// The store: redis://[user:pass@]host:port/db, rediss://… (TLS), redis+unix:///path,
    /// redis+sentinel://host:port,…/master-name, redis+cluster://host:port,…,
    /// redlock://host:port,host:port,host:port (RedLock: the plain lock, no fence),
    /// memcache://host:port (every kind), etcd://host:port,… (every kind; in a dlock
    /// built with `--features etcd`), postgres://… (every kind; ?mode=advisory: session
    /// locks), zk://host:port,…/chroot. What a store cannot
    /// do is a usage error that says why. redis:// and redis+sentinel:// (and
    /// rediss://, redis+unix://, redis+cluster://) take ?min_replicas=N: every grant and
    /// renewal waits (WAIT) for N replicas to acknowledge it, and is refused (exit 69)
    /// with fewer. A query parameter a store does not know is refused (exit 64), never
    /// ignored. Without --url and DLOCK_URL: redis://127.0.0.1:6379, a Redis server on
    /// this machine (an empty one is refused).
    #[arg(long, env = "DLOCK_URL", hide_env_values = true)]
    pub(crate) url: Option<String>,

    /// Key prefix of the locks, used as given (each command's --help says its default).
    #[arg(long, value_name = "PREFIX")]
    pub(crate) prefix: Option<String>,

    /// Take locks (run, elect, acquire) on a store configured so that it can drop a held
    /// lock — Redis with maxmemory and an allkeys-* or volatile-* eviction policy,
    /// memcached started without -M (it evicts when full) — which is otherwise refused
    /// (exit 69, naming the setting): another holder could be granted while the first
    /// still runs, and (allkeys-*, memcached) fences could start again at 1. Hazards that
    /// cannot give two holders (Redis without AOF: fences restart after a restart) are
    /// warnings on stderr.
    #[arg(long)]
    pub(crate) allow_unsafe_store: bool,
}

impl Store {
    /// The key prefix of a plain lock: `--prefix`, else [`fencelock::keys::DEFAULT_PREFIX`].
    pub(crate) fn lock_prefix(&self) -> &str {
        self.prefix_or(fencelock::keys::DEFAULT_PREFIX)
    }

    /// `--prefix`, else `default` (the primitive's own default prefix).
    pub(crate) fn prefix_or<'a>(&'a self, default: &'a str) -> &'a str {
        self.prefix.as_deref().unwrap_or(default)
    }
}

/// How long to wait for a held lock.
#[derive(Debug, Clone, Args)]
pub(crate) struct Wait {
    /// Wait at most this long for the lock (e.g. 30s, 5m); default: wait forever.
    #[arg(long, value_parser = parse_wait, conflicts_with = "no_wait")]
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
    /// The lease is renewed while the command runs. The command gets a process group of
    /// its own, and every signal below goes to the whole group; run from a terminal's
    /// foreground, that group gets the terminal's foreground while the command runs, as a
    /// shell's job does (Ctrl-C reaches it; Ctrl-Z stops it and dlock) — from the start
    /// if stdout is the terminal too, else (`dlock run … | less`) once the command reads
    /// the terminal. If renewals keep failing until the remaining validity is down to
    /// --kill-grace + a margin (100ms; a sixth of leases under 600ms), the group gets
    /// SIGTERM, then SIGKILL after the grace — at the latest the margin before the
    /// validity ends, by the lease's own clock, so nothing of the command runs when
    /// another holder can be granted the lock; a separate reaper process keeps that
    /// deadline even if dlock itself is paused or killed. If the store says the lock is
    /// gone (an operator force-unlocked it), the group gets SIGKILL at once. Then dlock
    /// exits 76. SIGTERM, SIGHUP and SIGINT sent to dlock are forwarded to the command's
    /// group; a second SIGTERM or SIGINT sends SIGKILL. Like flock(1), the lock is held (renewed) until the command, every
    /// process of its group and every process that inherited the descriptor named in
    /// DLOCK_HOLD_FD have exited (--release-on-exit: when the command itself exits), and
    /// each SIGKILL above reaches those holders too, in the group or not; with
    /// --min-hold D, it is kept until D after that. A store that can evict a held lock
    /// (Redis maxmemory with allkeys-*/volatile-*, memcached without -M) is refused unless
    /// --allow-unsafe-store. The command
    /// sees DLOCK_NAME, DLOCK_TOKEN and DLOCK_FENCE (the fencing token: pass it to the
    /// resource, which must reject writes with a smaller one). `dlock status` and `list`
    /// show this host, dlock's pid, the command's program name (or --info: its arguments
    /// are not shown, as they may carry secrets) and since when.
    ///
    /// Without --semaphore, --shared, --exclusive or --fair this takes the plain lock NAME.
    /// Each kind of lock is a separate lock, even under the same NAME: a plain run, a
    /// --fair run, a --semaphore run and an --exclusive run of one NAME do not exclude each
    /// other. Once it holds its lock, dlock checks the other kinds of NAME and warns on
    /// stderr if one is held (--refuse-other-kinds: refuses instead, exit 75); `dlock
    /// list` shows each held lock with its kind. Under a --prefix of yours every kind of
    /// NAME has the same key, and the check looks there (on zk:// it is not made, and a
    /// note says so).
    #[command(mut_arg("prefix", |a| a.help(PREFIX_RUN)))]
    Run(RunArgs),
    /// Campaign in the election NAME and run a command only while leading.
    ///
    /// Candidates wait in arrival order where the store queues waiters (Redis, etcd,
    /// PostgreSQL, ZooKeeper). Once this one leads, it advertises --value and runs the
    /// command with DLOCK_NAME, DLOCK_TOKEN, DLOCK_TERM (the term: a fencing token that
    /// strictly increases with every leader; DLOCK_FENCE has the same number) and
    /// DLOCK_VALUE. When the command and every process of its group have exited, dlock
    /// resigns at once (the next candidate leads without waiting for the lease) and exits
    /// with the command's status. If leadership is lost meanwhile, the command's group is
    /// killed exactly as `dlock run` kills it (SIGTERM, SIGKILL after --kill-grace, before
    /// the lease can end), and dlock exits 76. The command's group and the terminal are
    /// handled as by `dlock run`. SIGTERM, SIGHUP and SIGINT sent to dlock are
    /// forwarded to the command's group; dlock resigns once it has exited, so a standby takes
    /// over well before the lease could run out.
    #[command(mut_arg("prefix", |a| a.help(PREFIX_ELECTION)))]
    Elect(ElectArgs),
    /// Show who leads the election NAME: its term and value (`no leader` if nobody).
    ///
    /// With --watch, print the state now, then every change as it happens, until
    /// interrupted: `term T: VALUE` for a leader (a new one, or a new value), and `no
    /// leader (last term T, since TIME)` when the seat empties — at once when the leader
    /// resigns (`since` is when it did), at the latest a lease's length (on ZooKeeper: the
    /// session timeout) after a leader that crashed or was cut off (then without `since`). `no leader` alone: nobody ever
    /// led. With --json, one object per line: {"name","leader":true,"term","value"} or
    /// {"name","leader":false,"last_term","since","since_ms"} (absent keys: not known).
    #[command(mut_arg("prefix", |a| a.help(PREFIX_ELECTION)))]
    Leader(LeaderArgs),
    /// Hold the lock NAME, renewed, until dlock is killed or its parent exits: for a shell
    /// script that holds a lock across many commands (as `etcdctl lock NAME` does).
    ///
    /// Prints `TOKEN FENCE` on one line as soon as the lock is held (FENCE is `-` on a
    /// store without fences; --json: one object), then renews the lease until dlock gets
    /// SIGTERM, SIGINT or SIGHUP, or the process that started it exits (the script
    /// ended, or was killed); then releases the lock and exits 0. If the lock is lost
    /// while held (deleted, force-unlocked, or renewals failed until the lease ran out),
    /// dlock exits 76 at once: nothing kills the script, so a script that must stop then
    /// waits on dlock (or wraps its work in `dlock run`, which kills it in time). Held by
    /// another process: exit 75 (--no-wait, or --wait ran out); a signal while waiting:
    /// 128+N, nothing held. `dlock status` shows this host, dlock hold's pid (kill it to
    /// release) and --info. The example below runs it in bash as a coprocess.
    #[command(mut_arg("prefix", |a| a.help(PREFIX_LOCK)), after_help = HOLD_EXAMPLE)]
    Hold(HoldArgs),
    /// Acquire NAME and print `TOKEN FENCE`; the lease lasts --ttl (no renewal).
    ///
    /// On redlock:// (no fencing token) the output is `TOKEN -`, and JSON has "fence": null.
    /// `dlock status` and `list` show this host, the pid of the process that called dlock
    /// acquire (the script that holds the lock) and --info as its command. Not on zk://
    /// or postgres://…?mode=advisory: their holds end with the process that took them.
    #[command(mut_arg("prefix", |a| a.help(PREFIX_LOCK)))]
    Acquire(AcquireArgs),
    /// Release NAME held under --token.
    ///
    /// Exit 77 if another token holds NAME, 79 if none does (the message says which, and
    /// who holds it).
    #[command(mut_arg("prefix", |a| a.help(PREFIX_LOCK)))]
    Release(TokenArgs),
    /// Reset the lease of NAME held under --token to --ttl from now.
    ///
    /// Exit 77 if another token holds NAME, 79 if none does (the message says which, and
    /// who holds it).
    #[command(mut_arg("prefix", |a| a.help(PREFIX_LOCK)))]
    Extend(ExtendArgs),
    /// Show who holds NAME: token (abbreviated), host, pid, command and since when (as the
    /// holder told), remaining ttl, last fence, waiting clients.
    ///
    /// With --kind semaphore: also the permits in use, the holders and the stored permit
    /// count (`permits`; `-` if none is stored). On redlock:// it shows every node's view
    /// and the majority's. On postgres://…?mode=advisory the holder is a PostgreSQL
    /// session, shown by its backend pid (a server process, not a process of the holder's;
    /// JSON: `backend_pid`). NAME and the key are shown as `dlock list` shows names.
    #[command(mut_arg("prefix", |a| a.help(PREFIX_KIND)))]
    Status(StatusArgs),
    /// List held locks of every kind (SCAN, never KEYS), optionally matching a glob PATTERN.
    ///
    /// One line per lock: NAME HOLDER REMAINING FENCE HOST PID SINCE KIND COMMAND, `-`
    /// where unknown; no cell but COMMAND (the last) has spaces. KIND is lock, semaphore,
    /// reentrant, rwlock or fair: each kind is a separate lock, so one NAME may have a
    /// line per kind; where holders share a lock (semaphore, readers) HOLDER is `-` and
    /// JSON has `holders`. Not on memcache:// (no key iteration) or
    /// postgres://…?mode=advisory (only hashes of names are stored).
    ///
    /// NAME pastes back into a shell (bash, zsh, ksh) as the name itself: as it is when
    /// made of letters, digits and `-_.:/@+,%`; else in single quotes ('a*b'); or, if it
    /// has blanks, control or invisible characters, `'`, `\` or `!`, as $'…' with those
    /// escaped (\n, \t, \r, \', \\, \xHH, \uHHHH; a space is \x20): "my job" shows as
    /// $'my\x20job'. JSON has names as they are.
    #[command(mut_arg("prefix", |a| a.help(PREFIX_LIST)))]
    List(ListArgs),
    /// Watch every held lock of every kind, refreshed in place (like top(1)).
    ///
    /// One row per lock matching PATTERN: kind, name (as `dlock list` shows it, pasteable
    /// into a shell), holder (abbreviated token), its host,
    /// pid and since when, remaining ttl, last fence, holds (hold count, permits in use,
    /// readers), waiters, command. On a terminal: q or Ctrl-C quits, s changes the order.
    /// Otherwise, or with --json, one JSON object per refresh per line. Not on memcache://
    /// or postgres://…?mode=advisory (they cannot list locks), nor redlock:// (watch each
    /// node).
    #[command(mut_arg("prefix", |a| a.help(PREFIX_LIST)))]
    Top(TopArgs),
    /// Delete NAME whoever holds it. Dangerous: the holder keeps working until it notices.
    ///
    /// Exit 79 if nobody holds NAME (as that kind): check the name (`dlock list` shows
    /// each as it pastes back into a shell).
    #[command(mut_arg("prefix", |a| a.help(PREFIX_KIND)))]
    ForceUnlock(ForceUnlockArgs),
    /// Set the permit count of the semaphore NAME (`dlock run --semaphore N`) for every
    /// client.
    ///
    /// The count is stored with the semaphore: the first `dlock run --semaphore N` stores
    /// its N, and a run whose N differs from the stored count is refused (exit 64) until
    /// the count is changed here (or by a run with --set-permits). Holders above a lowered
    /// count keep their permits until they exit; runs waiting with another N are refused
    /// at their next attempt. On zk:// the count lives while the semaphore has holders or
    /// waiters (ZooKeeper reaps its empty directory; the next run stores its own N).
    #[command(mut_arg("prefix", |a| a.help(PREFIX_SEMAPHORE)))]
    SetPermits(SetPermitsArgs),
    /// The oversell demo: worker processes deduct stock four ways.
    ///
    /// Runs the dlock-torture binary (see `dlock demo --help`).
    #[command(disable_help_flag = true)]
    Demo(HarnessArgs),
    /// Jepsen-style safety check: worker processes, a fault-injecting nemesis, checkers.
    ///
    /// Runs the dlock-torture binary, which carries the test kit this command does not
    /// link (see `dlock torture --help`).
    #[command(disable_help_flag = true)]
    Torture(HarnessArgs),
    /// Print shell completions.
    Completions(CompletionsArgs),
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
    /// Lease length, renewed every third of it while the command runs: a crashed dlock's
    /// lock is freed within it. On zk:// it is dlock's session timeout (a URL's
    /// ?session_timeout= wins, and must not be longer).
    #[arg(long, value_parser = parse_renewed_ttl, default_value = "30s")]
    pub(crate) ttl: Duration,
    /// How long the command has between SIGTERM and SIGKILL when renewals keep failing
    /// (default 10s, or less where the lease needs it). SIGKILL lands at the latest 100ms
    /// (a sixth of leases under 600ms) before the lease's validity ends, so the grace is at
    /// most ttl/3 - that margin; a larger value is refused.
    #[arg(long, value_parser = parse_duration, value_name = "D")]
    pub(crate) kill_grace: Option<Duration>,
    /// Release the lock as soon as the command itself exits, even if processes it
    /// started still run (by default the lock is held until the whole process group,
    /// and every process holding DLOCK_HOLD_FD, has exited).
    #[arg(long)]
    pub(crate) release_on_exit: bool,
    /// At most N concurrent runs fleet-wide: take one of N permits of the semaphore NAME
    /// instead of the lock (the command then gets no DLOCK_FENCE: permit holders do not
    /// exclude each other). N is stored by the first run; a run whose N differs from the
    /// stored count is refused (exit 64, naming it): change it with `dlock set-permits
    /// NAME N` or --set-permits. A separate lock from the plain, fair and read-write locks
    /// NAME: it does not exclude them.
    #[arg(long, value_name = "N", conflicts_with_all = ["shared", "exclusive", "fair"])]
    pub(crate) semaphore: Option<u32>,
    /// With --semaphore N: set the stored permit count to N for every client (as `dlock
    /// set-permits`) instead of refusing another count; holders above a lowered count keep
    /// their permits until they exit.
    #[arg(long, requires = "semaphore")]
    pub(crate) set_permits: bool,
    /// Take the read-write lock NAME for reading: shared with other --shared runs,
    /// excluded by --exclusive runs (writers first: a waiting writer holds new readers
    /// back). No DLOCK_FENCE. A separate lock from the plain, fair and semaphore NAME: it
    /// does not exclude them.
    #[arg(long, conflicts_with_all = ["exclusive", "fair"])]
    pub(crate) shared: bool,
    /// Take the read-write lock NAME for writing: alone, excluding --shared runs. A
    /// separate lock from the plain, fair and semaphore NAME: a plain run (without this
    /// flag) does not exclude it.
    #[arg(long, conflicts_with = "fair")]
    pub(crate) exclusive: bool,
    /// Take the fair lock NAME: waiting --fair runs get it in arrival order. A separate
    /// lock from the plain, semaphore and read-write NAME: it does not exclude them.
    #[arg(long)]
    pub(crate) fair: bool,
    /// Once holding, if NAME is also held as another kind of lock (a separate lock that
    /// does not exclude this one), refuse: give the lock back without running the command
    /// and exit with the conflict code (75, or --conflict-exit-code). Default: run, with a
    /// warning on stderr. Checked under each kind's default prefix only (not with
    /// --prefix), on stores with every kind.
    #[arg(long)]
    pub(crate) refuse_other_kinds: bool,
    /// Print nothing on a conflict.
    #[arg(long, short)]
    pub(crate) quiet: bool,
    /// Keep the lock at least D after the command ends (ShedLock's lockAtLeastFor), so
    /// that the same job started a little later elsewhere is skipped: when the command
    /// exits, whatever its status, the lease is set to end D from then (plus the store's
    /// clock-drift allowance) and left to expire (not released, no longer renewed), and
    /// dlock exits at once with the command's status. If the store cannot set it, dlock
    /// keeps holding (renewing) the lock until D has passed. At most 24h. Not on zk:// or
    /// postgres://…?mode=advisory, whose holds end with dlock's session.
    #[arg(long, value_name = "D", value_parser = parse_min_hold)]
    pub(crate) min_hold: Option<Duration>,
    #[command(flatten)]
    pub(crate) holder: HolderArgs,
    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub(crate) command: Vec<OsString>,
}

/// What a holder tells `dlock status` and `list` about itself (carried in its token).
#[derive(Debug, Clone, Args)]
pub(crate) struct HolderArgs {
    /// Shown as the holder's command (a job id, a build URL); default: the name of the
    /// program `dlock run` runs (not its arguments, which may carry secrets), none for
    /// `dlock acquire`. Whoever can read the store can read it: no secrets.
    #[arg(long, value_name = "VALUE", conflicts_with = "no_info")]
    pub(crate) info: Option<String>,
    /// Attach no holder metadata (host, pid, command, since): the token is then 32 random
    /// hex digits.
    #[arg(long)]
    pub(crate) no_info: bool,
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
    /// replaced within it. On zk:// it is dlock's session timeout (a URL's
    /// ?session_timeout= wins, and must not be longer).
    #[arg(long, value_parser = parse_renewed_ttl, default_value = "30s")]
    pub(crate) ttl: Duration,
    /// How long the command has between SIGTERM and SIGKILL when renewals keep failing
    /// (default 10s, or less where the lease needs it; at most ttl/3 - 100ms, ttl/6 under a
    /// 600ms ttl).
    #[arg(long, value_parser = parse_duration, value_name = "D")]
    pub(crate) kill_grace: Option<Duration>,
    /// Resign as soon as the command itself exits, even if processes it started still
    /// run (by default dlock leads until its whole process group has exited).
    #[arg(long)]
    pub(crate) release_on_exit: bool,
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
    #[arg(long, value_parser = parse_lease, default_value = "30s")]
    pub(crate) ttl: Duration,
    #[command(flatten)]
    pub(crate) holder: HolderArgs,
    /// Print JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Debug, Args)]
pub(crate) struct HoldArgs {
    /// The lock's name.
    pub(crate) name: String,
    #[command(flatten)]
    pub(crate) store: Store,
    #[command(flatten)]
    pub(crate) wait: Wait,
    /// Lease length; renewed at a third of it while dlock holds the lock, so another
    /// client can have it at most this long after dlock stops renewing (killed with
    /// SIGKILL, its machine down).
    #[arg(long, value_parser = parse_held_ttl, default_value = "30s")]
    pub(crate) ttl: Duration,
    #[command(flatten)]
    pub(crate) holder: HolderArgs,
    /// Print JSON: {"name","key","token","fence","ttl_ms"}.
    #[arg(long)]
    pub(crate) json: bool,
    /// No message when the lock is held by another process (only the exit code).
    #[arg(long, short)]
    pub(crate) quiet: bool,
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
    #[arg(long, value_parser = parse_lease)]
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
pub(crate) struct SetPermitsArgs {
    /// The semaphore's name (as given to `dlock run --semaphore N NAME`).
    pub(crate) name: String,
    /// The new permit count, 1 to 1000000.
    #[arg(value_name = "N")]
    pub(crate) permits: u32,
    #[command(flatten)]
    pub(crate) store: Store,
}

#[derive(Debug, Args)]
pub(crate) struct ListArgs {
    /// Glob over lock names (* and ?).
    #[arg(default_value = "*")]
    pub(crate) pattern: String,
    #[command(flatten)]
    pub(crate) store: Store,
    /// Only these kinds of lock (repeat, or separate with commas); default: every kind the
    /// store has (with a --prefix of your own: lock, unless named here).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub(crate) kind: Vec<Kind>,
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

/// The arguments of `dlock torture` and `dlock demo`, passed to the harness as they are.
#[derive(Debug, Args)]
pub(crate) struct HarnessArgs {
    /// Options of the subcommand (see its --help).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, num_args = 0..)]
    pub(crate) args: Vec<OsString>,
}

#[derive(Debug, Args)]
pub(crate) struct CompletionsArgs {
    /// The shell.
    pub(crate) shell: clap_complete::Shell,
}

/// Durations like `30s`, `1m30s`, `500ms`, `2h` (humantime's syntax).
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    let d =
        sum_of_spans(s.trim()).map_err(|e| format!("{e} (expected e.g. 500ms, 30s, 5m, 2h)"))?;
    if d.is_zero() {
        return Err("must be greater than zero".into());
    }
    Ok(d)
}

/// `--wait`: a duration above zero; `0` points to `--no-wait`.
fn parse_wait(s: &str) -> Result<Duration, String> {
    match sum_of_spans(s.trim()) {
        Ok(d) if d.is_zero() => Err(
            "0 does not wait: use --no-wait (-n) to give up at once when the lock is held".into(),
        ),
        _ => parse_duration(s),
    }
}

/// `--ttl` of the commands that renew their lease while their command runs (`run`,
/// `elect`): up to the longest lease, and a longer one is never needed.
fn parse_renewed_ttl(s: &str) -> Result<Duration, String> {
    capped(
        s,
        "the lease is renewed every third of --ttl for as long as the command runs, \
        so the lock is held however long that takes: --ttl is only how long the lock \
        outlives a dlock that crashed (default 30s)",
    )
}

/// `--ttl` of `acquire` and `extend`, whose lease nothing renews.
/// `dlock hold`'s lease: renewed while it runs, as `run`'s.
fn parse_held_ttl(s: &str) -> Result<Duration, String> {
    capped(
        s,
        "the lease is renewed every third of --ttl for as long as dlock hold runs, so the \
        lock is held however long that takes: --ttl is only how long the lock outlives a \
        dlock that crashed (default 30s)",
    )
}

fn parse_lease(s: &str) -> Result<Duration, String> {
    capped(
        s,
        "nothing renews this lease: extend it before it ends (dlock extend NAME --token \
        TOKEN --ttl D), or hold the lock with dlock run, which renews it while its command runs",
    )
}

/// A lease length up to [`fencelock::MAX_TTL`]; above it, an error that says `why` no longer
/// one is needed.
fn capped(s: &str, why: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d > fencelock::MAX_TTL {
        return Err(format!(
            "at most {}h (the longest lease); {why}",
            fencelock::MAX_TTL.as_secs() / 3600
        ));
    }
    Ok(d)
}

/// `humantime::parse_duration`, one span (`1m`, `30 s`, `1.5h`) at a time, the spans
/// added without overflow: humantime 2.4 adds them itself with a carry it does not check,
/// and panics (`overflow in Duration::new`) where their seconds reach `u64::MAX` with a
/// whole second of nanoseconds (`18446744073709551615s 1000ms`); a single span cannot
/// get there. The same syntax and errors (offsets in the whole of `s`), but a sum that
/// fits a `Duration` is exact where humantime's `u64` of nanoseconds overflowed.
fn sum_of_spans(s: &str) -> Result<Duration, humantime::DurationError> {
    use humantime::DurationError;

    let mut total = Duration::ZERO;
    let mut spans = span_starts(s).peekable();
    if spans.peek().is_none() {
        // Empty or blank: humantime's own error.
        return humantime::parse_duration(s);
    }
    while let Some(start) = spans.next() {
        let end = spans.peek().copied().unwrap_or(s.len());
        let span = match &s[start..end] {
            // Blanks after the last unit.
            blank if blank.trim().is_empty() => continue,
            // humantime takes a lone "0" for zero; after another span, it lacks a unit.
            "0" if start > 0 => Err(DurationError::UnknownUnit {
                start: 1,
                end: 1,
                unit: String::new(),
                value: 0,
            }),
            span => humantime::parse_duration(span),
        };
        let span = span.map_err(|e| match e {
            DurationError::InvalidCharacter(at) => DurationError::InvalidCharacter(start + at),
            DurationError::NumberExpected(at) => DurationError::NumberExpected(start + at),
            DurationError::UnknownUnit {
                start: from,
                end: to,
                unit,
                value,
            } => DurationError::UnknownUnit {
                start: start + from,
                end: start + to,
                unit,
                value,
            },
            other => other,
        })?;
        total = total
            .checked_add(span)
            .ok_or(DurationError::NumberOverflow)?;
    }
    Ok(total)
}

/// Where the spans of a duration start, as humantime reads them: at the start, at a digit
/// right after a unit's letters, and after the blank that ends a unit (where humantime's
/// offsets count from). A span may be blank at the end.
fn span_starts(s: &str) -> impl Iterator<Item = usize> + '_ {
    let is_unit = |c: char| c.is_ascii_alphabetic() || c == 'µ';
    let mut in_unit = false;
    let first = (!s.trim().is_empty()).then_some(0);
    first
        .into_iter()
        .chain(s.char_indices().filter_map(move |(i, c)| {
            let start = match in_unit {
                true if c.is_ascii_digit() => Some(i),
                true if c.is_whitespace() => Some(i + c.len_utf8()),
                _ => None,
            };
            in_unit = is_unit(c);
            start
        }))
}

/// `--min-hold`: a duration up to the longest lease, [`fencelock::MAX_TTL`].
fn parse_min_hold(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d > fencelock::MAX_TTL {
        return Err(format!(
            "at most {} (the longest lease)",
            humantime::format_duration(fencelock::MAX_TTL)
        ));
    }
    Ok(d)
}

/// `dlock top`'s arguments.
#[derive(Debug, Args)]
pub(crate) struct TopArgs {
    /// Glob over lock names (* and ?).
    #[arg(default_value = "*")]
    pub(crate) pattern: String,
    #[command(flatten)]
    pub(crate) store: Store,
    /// Only these kinds of primitive (repeat, or separate with commas); default: every kind
    /// the store has (with a --prefix of your own: lock, unless named here).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub(crate) kind: Vec<Kind>,
    /// Refresh every this long (e.g. 500ms, 2s).
    #[arg(long, value_parser = parse_duration, default_value = "1s")]
    pub(crate) interval: Duration,
    /// Order of the rows (on a terminal, `s` switches to the next).
    #[arg(long, value_enum, default_value_t = SortBy::Name)]
    pub(crate) sort: SortBy,
    /// At most this many locks per refresh (the header says when there were more).
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) limit: u64,
    /// Stop after N refreshes (default: until q, Ctrl-C or SIGTERM).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) iterations: Option<u64>,
    /// One JSON object per refresh, one per line ({"t": …, "locks": […]}); also what is
    /// printed when stdout is not a terminal.
    #[arg(long)]
    pub(crate) json: bool,
}

/// The orders `--sort` offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum SortBy {
    /// By name (then kind).
    Name,
    /// Soonest to expire first.
    Ttl,
    /// Highest last fence first (the most often granted).
    Fence,
    /// Most waiters first.
    Waiters,
    /// Held longest first (by the holder's `since`).
    Since,
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use proptest::prelude::*;

    use super::*;
    use crate::hostile::cases;

    /// The units humantime reads, by spelling, with their length: in nanoseconds below a
    /// second, else in seconds (`true`).
    const UNITS: &[(&str, u64, bool)] = &[
        ("ns", 1, false),
        ("nsec", 1, false),
        ("us", 1_000, false),
        ("µs", 1_000, false),
        ("ms", 1_000_000, false),
        ("millis", 1_000_000, false),
        ("s", 1, true),
        ("sec", 1, true),
        ("seconds", 1, true),
        ("m", 60, true),
        ("min", 60, true),
        ("h", 3_600, true),
        ("hours", 3_600, true),
        ("d", 86_400, true),
        ("w", 604_800, true),
        ("M", 2_630_016, true),
        ("y", 31_557_600, true),
    ];

    /// `n` of `unit`, exactly, or `None` past what humantime computes without overflow
    /// (below a second it counts in `u64` nanoseconds).
    fn exactly(n: u64, factor: u64, in_seconds: bool) -> Option<Duration> {
        let units = n.checked_mul(factor)?;
        Some(if in_seconds {
            Duration::from_secs(units)
        } else {
            Duration::from_nanos(units)
        })
    }

    /// The longest lease, in milliseconds.
    const MAX_TTL_MS: u64 = fencelock::MAX_TTL.as_millis() as u64;

    /// Counts: small, any, and near `u64::MAX` (where overflow starts).
    fn count() -> impl Strategy<Value = u64> {
        prop_oneof![
            1..10_000u64,
            any::<u64>(),
            (u64::MAX - 1_000)..=u64::MAX,
            (0..64u32).prop_map(|bits| 1u64 << bits),
        ]
    }

    /// Pieces of durations, good and bad: digits, units, signs, blanks, controls,
    /// non-ASCII digits and letters, `u64::MAX`.
    fn duration_garbage() -> impl Strategy<Value = String> {
        const PIECES: &[&str] = &[
            "0",
            "1",
            "9",
            "42",
            "1000",
            "999999999",
            "18446744073709551615",
            "18446744073709551616",
            "-",
            "+",
            ".",
            "e",
            "s",
            "ms",
            "m",
            "h",
            "d",
            "y",
            "M",
            "ns",
            "us",
            "µs",
            " ",
            "\t",
            "\n",
            "\u{1}",
            "\u{1b}[31m",
            "é",
            "٣",
            "½",
            "∞",
            "\u{202e}",
            "🔒",
            ":",
            "/",
        ];
        prop::collection::vec(prop::sample::select(PIECES), 0..10).prop_map(|p| p.concat())
    }

    /// A span humantime reads (`<n><unit>`, blanks around the unit), or garbage.
    fn span() -> impl Strategy<Value = String> {
        prop_oneof![
            3 => (count(), prop::sample::select(UNITS), "[ \t]{0,2}")
                .prop_map(|(n, (unit, _, _), blank)| format!("{n}{blank}{unit}")),
            1 => (0..1_000u64, 0..1_000_000u64, prop::sample::select(UNITS))
                .prop_map(|(n, frac, (unit, _, _))| format!("{n}.{frac}{unit}")),
            1 => duration_garbage(),
        ]
    }

    proptest! {
        #![proptest_config(cases(256))]

        /// Whatever the text: a duration above zero, or an error with a message.
        #[test]
        fn any_text_is_a_duration_or_an_error(
            s in prop_oneof![any::<String>(), duration_garbage()],
        ) {
            match parse_duration(&s) {
                Ok(d) => prop_assert!(!d.is_zero()),
                Err(e) => prop_assert!(!e.is_empty()),
            }
            match parse_min_hold(&s) {
                Ok(d) => prop_assert!(!d.is_zero() && d <= fencelock::MAX_TTL),
                Err(e) => prop_assert!(!e.is_empty()),
            }
        }

        /// `<n><unit>` is exactly n units (blanks around it ignored); past what the
        /// arithmetic holds it is an error, never a wrapped value; `0<unit>` is refused.
        #[test]
        fn n_units_are_exactly_n_units_or_an_overflow(
            n in count(),
            (unit, factor, in_seconds) in prop::sample::select(UNITS),
            pad in "[ \t]{0,2}",
        ) {
            let text = format!("{pad}{n}{unit}{pad}");
            match exactly(n, factor, in_seconds) {
                Some(d) if n > 0 => prop_assert_eq!(parse_duration(&text), Ok(d)),
                Some(_) => prop_assert_eq!(
                    parse_duration(&text),
                    Err("must be greater than zero".to_owned())
                ),
                None => {
                    let err = parse_duration(&text).expect_err("an overflow");
                    prop_assert!(err.contains("too large"), "{}", err);
                }
            }
        }

        /// Numbers past `u64::MAX`, negative numbers and numbers without a unit are
        /// errors, whatever the unit.
        #[test]
        fn huge_negative_and_bare_numbers_are_errors(
            n in any::<u64>(),
            extra in 1..=u64::MAX,
            (unit, _, _) in prop::sample::select(UNITS),
        ) {
            let huge = u128::from(u64::MAX) + u128::from(extra);
            let texts = [
                format!("{huge}{unit}"),
                format!("-{n}{unit}"),
                format!("+{n}{unit}"),
                n.to_string(),
            ];
            for text in texts {
                prop_assert!(parse_duration(&text).is_err(), "{:?} parsed", text);
            }
        }

        /// `<a><unit> <b><unit> …` is the exact sum, or an overflow error (never a
        /// panic: humantime's own sum panics on `18446744073709551615s 1000ms`).
        #[test]
        fn spans_add_up_exactly_or_overflow(
            spans in prop::collection::vec((count(), prop::sample::select(UNITS)), 1..5),
            joined in any::<bool>(),
        ) {
            let text: Vec<String> = spans
                .iter()
                .map(|(n, (unit, _, _))| format!("{n}{unit}"))
                .collect();
            let text = text.join(if joined { "" } else { " " });
            let sum = spans.iter().try_fold(Duration::ZERO, |sum, &(n, (_, factor, secs))| {
                sum.checked_add(exactly(n, factor, secs)?)
            });
            match sum {
                Some(d) if !d.is_zero() => prop_assert_eq!(parse_duration(&text), Ok(d)),
                _ => prop_assert!(parse_duration(&text).is_err()),
            }
        }

        /// Seconds near `u64::MAX`, then quarters of a second in any sub-second unit:
        /// the exact sum, or an overflow error where the quarters carry past the last
        /// second (humantime's own sum panics there).
        #[test]
        fn a_carry_into_the_last_second_is_exact_or_an_overflow(
            secs in (u64::MAX - 2)..=u64::MAX,
            quarters in prop::collection::vec((1..=4u64, 0..3usize), 1..5),
            joined in any::<bool>(),
        ) {
            let mut text = format!("{secs}s");
            let mut sum = Some(Duration::from_secs(secs));
            for &(q, unit) in &quarters {
                let ms = 250 * q;
                let span = [
                    format!("{ms}ms"),
                    format!("{}us", ms * 1_000),
                    format!("{}ns", ms * 1_000_000),
                ];
                if !joined {
                    text.push(' ');
                }
                text.push_str(&span[unit]);
                sum = sum.and_then(|d| d.checked_add(Duration::from_millis(ms)));
            }
            match sum {
                Some(d) => prop_assert_eq!(parse_duration(&text), Ok(d)),
                None => {
                    let err = parse_duration(&text).expect_err("an overflow");
                    prop_assert!(err.contains("too large"), "{}", err);
                }
            }
        }

        /// The spans read one at a time agree with humantime: the same duration, or the
        /// same error (offsets included), wherever humantime neither overflows nor panics.
        /// There, the sum is exact or an overflow (see the properties above), or a syntax
        /// error past where humantime stopped: it also overflows on nanoseconds past
        /// `u64` (`0.11ms18446744073709550615ns` is 5 hours).
        #[test]
        fn spans_agree_with_humantime(
            spans in prop::collection::vec(span(), 0..4),
            blank in "[ ]{0,2}",
        ) {
            let text = spans.join(&blank);
            let ours = sum_of_spans(&text);
            match std::panic::catch_unwind(|| humantime::parse_duration(&text)) {
                Ok(Err(humantime::DurationError::NumberOverflow)) | Err(_) => {}
                Ok(theirs) => prop_assert_eq!(ours, theirs, "{:?}", text),
            }
        }

        /// What `humantime` writes (as dlock prints durations) reads back exactly.
        #[test]
        fn printed_durations_read_back(secs in any::<u64>(), nanos in 0..1_000_000_000u32) {
            let d = Duration::new(secs, nanos);
            prop_assume!(!d.is_zero());
            let text = humantime::format_duration(d).to_string();
            prop_assert_eq!(parse_duration(&text), Ok(d));
        }

        /// `--min-hold`: up to the longest lease, exactly; above it, an error that says so.
        #[test]
        fn min_hold_is_capped_at_the_longest_lease(ms in 1..2 * MAX_TTL_MS) {
            let d = Duration::from_millis(ms);
            let parsed = parse_min_hold(&format!("{ms}ms"));
            if d <= fencelock::MAX_TTL {
                prop_assert_eq!(parsed, Ok(d));
            } else {
                let err = parsed.expect_err("over the cap");
                prop_assert!(err.contains("at most"), "{}", err);
            }
        }
    }

    /// Regression: humantime 2.4 panics (`overflow in Duration::new`) on these, and
    /// `dlock run --wait '18446744073709551615s 1000ms'` exited 101.
    #[test]
    fn a_sum_that_carries_past_u64_seconds_is_an_overflow() {
        for text in [
            "18446744073709551615s 1000ms",
            "18446744073709551615s1000ms",
            "18446744073709551615s 500ms 500ms",
            "18446744073709551615s 1000000000ns",
            "18446744073709551614s 999ms 1001ms",
        ] {
            let err = parse_duration(text).expect_err(text);
            assert!(err.contains("too large"), "{text}: {err}");
        }
        assert_eq!(
            parse_duration("18446744073709551615s 999ms"),
            Ok(Duration::new(u64::MAX, 999_000_000))
        );
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration(" 1m 30 s "), Ok(Duration::from_secs(90)));
    }

    /// Error offsets point into the whole text, as humantime's own did.
    #[test]
    fn errors_point_into_the_whole_text() {
        assert_eq!(
            sum_of_spans("1m 30x"),
            Err(humantime::DurationError::UnknownUnit {
                start: 5,
                end: 6,
                unit: "x".into(),
                value: 30,
            })
        );
        assert_eq!(
            sum_of_spans("1m 3é"),
            Err(humantime::DurationError::InvalidCharacter(4))
        );
        assert_eq!(sum_of_spans(""), Err(humantime::DurationError::Empty));
    }
}
