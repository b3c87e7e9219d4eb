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

Exit codes:
  0      success (dlock run: the command's own status; 128+N if signal N killed it)
  64     usage error: bad flag, duration, URL or backend
  69     backend unavailable or failed
  75     conflict: the lock is held (--no-wait, or --wait ran out); see --conflict-exit-code
  76     lock lost while held (the command was terminated), or not ours at release
  126    the command could not be executed
  127    the command was not found

Environment:
  DLOCK_URL    the store, as for --url (redis://host:port/db, rediss://, redis+unix://)";

/// Where the locks live.
#[derive(Debug, Clone, Args)]
pub(crate) struct Store {
    /// The store: redis://[user:pass@]host:port/db, rediss://… (TLS), redis+unix:///path.
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
    /// store lost it, or an operator force-unlocked it), the command gets SIGTERM, then
    /// SIGKILL after --kill-grace, and dlock exits 76. SIGINT, SIGTERM and SIGHUP sent to
    /// dlock are forwarded to the command; the lock is released after it exits. The command
    /// sees DLOCK_NAME, DLOCK_TOKEN and DLOCK_FENCE (the fencing token: pass it to the
    /// resource, which must reject writes with a smaller one).
    Run(RunArgs),
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
    /// Print shell completions.
    Completions(CompletionsArgs),
    /// One worker process of `dlock demo` (internal).
    #[command(hide = true)]
    DemoWorker(DemoWorkerArgs),
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
    /// At most N concurrent runs (needs the semaphore, not implemented yet).
    #[arg(long, value_name = "N")]
    pub(crate) semaphore: Option<u32>,
    /// Take a shared (read) lock (needs the read-write lock, not implemented yet).
    #[arg(long)]
    pub(crate) shared: bool,
    /// Print nothing on a conflict.
    #[arg(long, short)]
    pub(crate) quiet: bool,
    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub(crate) command: Vec<OsString>,
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
