//! From `--url` to a connected store.

use dlock::backend::{Etcd, Memcached, Memory, PgAdvisory, Postgres, Quorum, Redis, ZooKeeper};

use crate::args::Store;
use crate::exit::Failure;

/// A connected store of any supported kind.
pub(crate) enum Target {
    Redis(Redis),
    Memory(Memory),
    /// RedLock over independent masters: only `dlock run` (a plain lock, no fence).
    Quorum(Quorum<Redis>),
    /// Memcached: the plain lock (fenced) only.
    Memcached(Memcached),
    /// etcd: the plain lock (fenced) only.
    Etcd(Etcd),
    /// PostgreSQL: every primitive.
    Postgres(Postgres),
    /// PostgreSQL's session advisory locks (`postgres://…?mode=advisory`): `dlock run`,
    /// status and force-unlock, no fence.
    PgAdvisory(PgAdvisory),
    /// ZooKeeper: every primitive, fenced; holds live in the client's session, so only
    /// commands that hold while they run (not acquire/release/extend).
    ZooKeeper(ZooKeeper),
}

/// Runs `$body` with `$b` bound to the concrete backend of `$target`.
macro_rules! with_backend {
    ($target:expr, |$b:ident| $body:expr) => {
        match $target {
            $crate::target::Target::Redis($b) => $body,
            $crate::target::Target::Memory($b) => $body,
            $crate::target::Target::Postgres($b) => $body,
            $crate::target::Target::Quorum(_) => Err($crate::exit::Failure::usage(
                "redlock:// (a quorum of independent masters) works with `dlock run` only: \
                 it has no fencing token and no single store to inspect",
            )),
            $crate::target::Target::Memcached(_) | $crate::target::Target::Etcd(_) => {
                Err($crate::exit::Failure::usage(
                    "memcache:// and etcd:// have the plain lock only: `dlock run` (without \
                     --semaphore/--shared/--exclusive/--fair), status, list, force-unlock",
                ))
            }
            $crate::target::Target::ZooKeeper(_) => Err($crate::exit::Failure::usage(
                "zk:// holds the lock in the client's session (an ephemeral node), so a lock \
                 cannot outlive the process that took it: use `dlock run` (any primitive), \
                 status, list, force-unlock",
            )),
            $crate::target::Target::PgAdvisory(_) => Err($crate::exit::Failure::usage(
                "postgres://…?mode=advisory (session advisory locks) works with `dlock run` \
                 (no DLOCK_FENCE), status and force-unlock only",
            )),
        }
    };
}
pub(crate) use with_backend;

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

/// The URL schemes `--url` accepts.
const SCHEMES: &str = "redis://, rediss://, redis+unix://, redis+sentinel://, \
                       redis+cluster://, redlock://, memcache://, etcd://, postgres://, zk://";

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
