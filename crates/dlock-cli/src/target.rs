//! From `--url` to a connected store, and which command each store can run.
//!
//! Every command is one function below with one arm per store: the store's own command,
//! or a usage error that says why the store cannot do it. Keep these arms, `dlock --help`
//! and the README's CLI section in step.

use dlock::backend::{Etcd, Memcached, Memory, PgAdvisory, Postgres, Quorum, Redis, ZooKeeper};
use dlock::raw::RawFencing;
use dlock::{LockGuard, MIN_TTL};

use crate::args::{
    AcquireArgs, ExtendArgs, ForceUnlockArgs, ListArgs, RunArgs, StatusArgs, Store, TokenArgs,
    TopArgs,
};
use crate::cmd::{self, Layout};
use crate::exit::Failure;

/// A connected store of any supported kind.
pub(crate) enum Target {
    /// Redis (single, sentinel, cluster): every primitive, every command.
    Redis(Redis),
    /// In-process: never reached from the command line (see [`connect`]).
    Memory(Memory),
    /// RedLock over independent masters: the plain lock without fence; status, list and
    /// force-unlock ask every node.
    Quorum(Quorum<Redis>),
    /// Memcached: the plain lock (fenced); no `list` (no key iteration).
    Memcached(Memcached),
    /// etcd: the plain lock (fenced).
    Etcd(Etcd),
    /// PostgreSQL: every primitive, every command.
    Postgres(Postgres),
    /// PostgreSQL's session advisory locks (`postgres://…?mode=advisory`): `dlock run`,
    /// status and force-unlock, no fence; holds end with the session that took them.
    PgAdvisory(PgAdvisory),
    /// ZooKeeper: every primitive, fenced; holds live in the client's session, so only
    /// commands that hold while they run (not acquire/release/extend).
    ZooKeeper(ZooKeeper),
}

/// Why memcached cannot `list` (nor `top`).
const MEMCACHED_NO_LIST: &str = "memcache:// cannot list locks: memcached has no key \
     iteration (only a debug dump of its whole cache); ask for a lock by name with `dlock \
     status NAME`";
/// Why advisory mode cannot `list` (nor `top`).
const ADVISORY_NO_LIST: &str = "postgres://…?mode=advisory cannot list locks: PostgreSQL keeps \
     only a 64-bit hash of each lock's name; ask for a lock by name with `dlock status NAME`";
/// Why `zk://` has no acquire/release/extend.
const ZK_SESSION: &str = "zk:// holds a lock in the ZooKeeper session of the process that took \
     it (an ephemeral node), so a hold cannot outlive that process and no other process can \
     release or extend it: use `dlock run` (any primitive); status, list and force-unlock work";
/// Why advisory mode has no acquire/release/extend.
const ADVISORY_SESSION: &str = "postgres://…?mode=advisory holds a lock in the database session \
     of the process that took it (pg_advisory_lock), so a hold cannot outlive that process and \
     no other process can release or extend it: use `dlock run`, or lease mode (drop \
     mode=advisory) for acquire/release/extend";

/// Runs `$body` with `$b` bound to the concrete backend of `$target`, on every store that
/// has leader election (every one with a fence: not RedLock, not advisory mode).
macro_rules! with_election_backend {
    ($target:expr, |$b:ident| $body:expr) => {
        match $target {
            $crate::target::Target::Redis($b) => $body,
            $crate::target::Target::Memory($b) => $body,
            $crate::target::Target::Postgres($b) => $body,
            $crate::target::Target::Memcached($b) => $body,
            $crate::target::Target::Etcd($b) => $body,
            $crate::target::Target::ZooKeeper($b) => $body,
            $crate::target::Target::Quorum(_) => Err($crate::exit::Failure::usage(
                "redlock:// has no fencing token, so it cannot number terms: elect on one \
                 store (redis://, etcd://, postgres://, zk://, memcache://)",
            )),
            $crate::target::Target::PgAdvisory(_) => Err($crate::exit::Failure::usage(
                "postgres://…?mode=advisory has no fencing token, so it cannot number terms: \
                 drop mode=advisory to elect in lease mode",
            )),
        }
    };
}
pub(crate) use with_election_backend;

/// The fence of a grant on a store that mints one.
fn fence<B: RawFencing>(guard: &LockGuard<B>) -> Option<u64> {
    Some(guard.fencing_token().get())
}

/// `--min-hold` keeps the lock after dlock exits: not where a hold is dlock's session.
fn outlives_dlock(args: &RunArgs, store: &str) -> Result<(), Failure> {
    if args.min_hold.is_some() {
        return Err(Failure::usage(format!(
            "--min-hold keeps the lock after dlock exits, but {store} holds a lock in the \
             session of the process that took it, which ends when dlock does"
        )));
    }
    Ok(())
}

/// `dlock run`.
pub(crate) async fn run(target: Target, args: RunArgs) -> Result<u8, Failure> {
    match target {
        Target::Redis(b) => cmd::run(b, args, MIN_TTL).await,
        Target::Memory(b) => cmd::run(b, args, MIN_TTL).await,
        Target::Postgres(b) => cmd::run(b, args, MIN_TTL).await,
        Target::ZooKeeper(z) => {
            outlives_dlock(&args, "zk://")?;
            cmd::run(z, args, MIN_TTL).await
        }
        Target::Quorum(q) => cmd::run_plain(q, args, |_| None, MIN_TTL).await,
        // A shorter lease than its one-second clock can hold is refused by memcached.
        Target::Memcached(m) => {
            let shortest = dlock::backend::memcached::MIN_TTL;
            cmd::run_plain(m, args, fence, shortest).await
        }
        Target::Etcd(e) => cmd::run_plain(e, args, fence, MIN_TTL).await,
        Target::PgAdvisory(p) => {
            outlives_dlock(&args, "postgres://…?mode=advisory")?;
            cmd::run_plain(p, args, |_| None, MIN_TTL).await
        }
    }
}

/// `dlock acquire`.
pub(crate) async fn acquire(target: Target, args: AcquireArgs) -> Result<u8, Failure> {
    match target {
        Target::Redis(b) => cmd::acquire_cmd(b, args, fence).await,
        Target::Memory(b) => cmd::acquire_cmd(b, args, fence).await,
        Target::Postgres(b) => cmd::acquire_cmd(b, args, fence).await,
        Target::Memcached(b) => cmd::acquire_cmd(b, args, fence).await,
        Target::Etcd(b) => cmd::acquire_cmd(b, args, fence).await,
        // No fencing token on a quorum of independent counters: `TOKEN -`.
        Target::Quorum(q) => cmd::acquire_cmd(q, args, |_| None).await,
        Target::ZooKeeper(_) => Err(Failure::usage(ZK_SESSION)),
        Target::PgAdvisory(_) => Err(Failure::usage(ADVISORY_SESSION)),
    }
}

/// Runs `$body` with `$b` bound to the backend of `$target` on every store whose holds
/// outlive their process (release and extend by token from another one).
macro_rules! with_token_holds {
    ($target:expr, |$b:ident| $body:expr) => {
        match $target {
            Target::Redis($b) => $body,
            Target::Memory($b) => $body,
            Target::Postgres($b) => $body,
            Target::Memcached($b) => $body,
            Target::Etcd($b) => $body,
            Target::Quorum($b) => $body,
            Target::ZooKeeper(_) => Err(Failure::usage(ZK_SESSION)),
            Target::PgAdvisory(_) => Err(Failure::usage(ADVISORY_SESSION)),
        }
    };
}

/// `dlock release`.
pub(crate) async fn release(target: Target, args: TokenArgs) -> Result<u8, Failure> {
    with_token_holds!(target, |b| cmd::release_cmd(b, args).await)
}

/// `dlock extend`.
pub(crate) async fn extend(target: Target, args: ExtendArgs) -> Result<u8, Failure> {
    with_token_holds!(target, |b| cmd::extend_cmd(b, args).await)
}

/// `dlock status`.
pub(crate) async fn status(target: Target, args: StatusArgs) -> Result<u8, Failure> {
    match target {
        Target::Redis(b) => cmd::status_cmd(b, args).await,
        Target::Memory(b) => cmd::status_cmd(b, args).await,
        Target::Postgres(b) => cmd::status_cmd(b, args).await,
        Target::ZooKeeper(b) => cmd::status_cmd(b, args).await,
        Target::Memcached(m) => cmd::lock_status_cmd(m, Layout::AtKey, "memcache://", args).await,
        Target::Etcd(e) => cmd::lock_status_cmd(e, Layout::QueueUnder, "etcd://", args).await,
        Target::PgAdvisory(p) => {
            cmd::lock_status_cmd(p, Layout::Session, "postgres://…?mode=advisory", args).await
        }
        Target::Quorum(q) => cmd::quorum::status_cmd(q, args).await,
    }
}

/// `dlock list`.
pub(crate) async fn list(target: Target, args: ListArgs) -> Result<u8, Failure> {
    match target {
        Target::Redis(b) => cmd::list_cmd(b, Layout::AtKey, args).await,
        Target::Memory(b) => cmd::list_cmd(b, Layout::AtKey, args).await,
        Target::Postgres(b) => cmd::list_cmd(b, Layout::AtKey, args).await,
        Target::Etcd(e) => cmd::list_cmd(e, Layout::QueueUnder, args).await,
        Target::ZooKeeper(z) => cmd::list_cmd(z, Layout::Znodes, args).await,
        Target::Quorum(q) => cmd::quorum::list_cmd(q, args).await,
        Target::Memcached(_) => Err(Failure::usage(MEMCACHED_NO_LIST)),
        Target::PgAdvisory(_) => Err(Failure::usage(ADVISORY_NO_LIST)),
    }
}

/// `dlock force-unlock`.
pub(crate) async fn force_unlock(target: Target, args: ForceUnlockArgs) -> Result<u8, Failure> {
    match target {
        Target::Redis(b) => cmd::force_unlock_cmd(b, args).await,
        Target::Memory(b) => cmd::force_unlock_cmd(b, args).await,
        Target::Postgres(b) => cmd::force_unlock_cmd(b, args).await,
        Target::ZooKeeper(b) => cmd::force_unlock_cmd(b, args).await,
        Target::Memcached(m) => {
            cmd::lock_force_unlock_cmd(m, Layout::AtKey, "memcache://", args).await
        }
        Target::Etcd(e) => cmd::lock_force_unlock_cmd(e, Layout::QueueUnder, "etcd://", args).await,
        // Terminates the holding sessions (pg_terminate_backend).
        Target::PgAdvisory(p) => {
            cmd::lock_force_unlock_cmd(p, Layout::Session, "postgres://…?mode=advisory", args).await
        }
        Target::Quorum(q) => cmd::quorum::force_unlock_cmd(q, args).await,
    }
}

/// The URL schemes `--url` accepts.
const SCHEMES: &str = "redis://, rediss://, redis+unix://, redis+sentinel://, \
                       redis+cluster://, redlock://, memcache://, etcd://, postgres://, zk://";

/// `dlock top`, one arm per store.
pub(crate) async fn top(target: Target, args: TopArgs) -> Result<u8, Failure> {
    match target {
        Target::Redis(b) => cmd::top::every_kind(b, true, args).await,
        Target::Memory(b) => cmd::top::every_kind(b, false, args).await,
        Target::Postgres(b) => cmd::top::every_kind(b, false, args).await,
        Target::ZooKeeper(z) => cmd::top::every_kind(z, false, args).await,
        Target::Etcd(e) => cmd::top::plain_only(e, "etcd://", args).await,
        Target::Quorum(_) => Err(Failure::usage(
            "redlock:// is several independent stores, and dlock top watches one: watch each \
             node (redis://host:port), or ask them all with `dlock list` / `dlock status`",
        )),
        Target::Memcached(_) => Err(Failure::usage(MEMCACHED_NO_LIST)),
        Target::PgAdvisory(_) => Err(Failure::usage(ADVISORY_NO_LIST)),
    }
}

/// Connects to the store named by `--url` / `DLOCK_URL`. `memory://` (in-process) is
/// accepted only where `allow_memory` says so: a lock in one process's memory excludes
/// nobody else.
pub(crate) async fn connect(store: &Store, allow_memory: bool) -> Result<Target, Failure> {
    let Some(url) = store.url.as_deref().filter(|u| !u.is_empty()) else {
        return Err(Failure::usage(format!(
            "no store given: pass --url or set DLOCK_URL ({SCHEMES})"
        )));
    };
    // Only a scheme's characters count as one: text before a later "://" (in a query,
    // after a password) is no scheme, and is never printed.
    let scheme = url.split_once("://").map(|(s, _)| s).filter(|s| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
    });
    match scheme {
        Some("redis" | "rediss" | "redis+unix" | "unix" | "redis+sentinel" | "redis+cluster") => {
            Ok(Target::Redis(Redis::connect(url).await?))
        }
        Some("redlock") => Ok(Target::Quorum(redlock(url).await?)),
        Some("memcache" | "memcached") => Ok(Target::Memcached(Memcached::connect(url).await?)),
        Some("etcd") => Ok(Target::Etcd(Etcd::connect(url).await?)),
        Some("postgres" | "postgresql") => match advisory_url(url) {
            Some(url) => Ok(Target::PgAdvisory(PgAdvisory::connect(&url).await?)),
            None => Ok(Target::Postgres(Postgres::connect(url).await?)),
        },
        Some("zk") => Ok(Target::ZooKeeper(ZooKeeper::connect(url).await?)),
        Some("memory") if allow_memory => Ok(Target::Memory(Memory::new())),
        Some("memory") => Err(Failure::usage(
            "memory:// is in-process only and would exclude no other process; use redis://",
        )),
        Some(other) => Err(Failure::usage(format!(
            "unknown backend {other:?} in --url (supported: {SCHEMES})"
        ))),
        None => Err(Failure::usage(format!(
            "--url {:?} is not a URL (expected {SCHEMES})",
            dlock::backend::redact_url(url)
        ))),
    }
}

/// A `postgres://` URL that asks for advisory-lock mode (`mode=advisory` among its query
/// parameters), without that parameter; `None` for lease mode (the default).
fn advisory_url(url: &str) -> Option<String> {
    let (base, query) = url.split_once('?')?;
    let mut advisory = false;
    let rest: Vec<&str> = query
        .split('&')
        .filter(|p| {
            let mode = p.strip_prefix("mode=");
            advisory |= mode == Some("advisory");
            mode.is_none()
        })
        .collect();
    advisory.then(|| {
        if rest.is_empty() {
            base.to_owned()
        } else {
            format!("{base}?{}", rest.join("&"))
        }
    })
}

/// `redlock://[user:pass@]host:port,host:port,…[/db]`: one independent master per host.
async fn redlock(url: &str) -> Result<Quorum<Redis>, Failure> {
    let rest = url.strip_prefix("redlock://").unwrap_or_default();
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    let (auth, hosts) = match authority.rsplit_once('@') {
        Some((auth, hosts)) => (format!("{auth}@"), hosts),
        None => (String::new(), authority),
    };
    let hosts: Vec<&str> = hosts.split(',').filter(|h| !h.is_empty()).collect();
    if hosts.len() < 3 {
        return Err(Failure::usage(
            "redlock:// needs at least 3 independent masters (host:port,host:port,host:port)",
        ));
    }
    let mut nodes = Vec::with_capacity(hosts.len());
    for host in hosts {
        nodes.push(Redis::connect(format!("redis://{auth}{host}/{path}")).await?);
    }
    Ok(Quorum::new(nodes)?)
}
