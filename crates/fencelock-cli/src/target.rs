//! From `--url` to a connected store, and which command each store can run.
//!
//! Every command is one function below with one arm per store: the store's own command,
//! or a usage error that says why the store cannot do it. Keep these arms, `dlock --help`
//! and the README's CLI section in step.

#[cfg(feature = "etcd")]
use fencelock::backend::Etcd;
use fencelock::backend::{
    ConfigHazard, Memcached, Memory, PgAdvisory, Postgres, Quorum, Redis, ZooKeeper,
};
use fencelock::raw::RawFencing;
use fencelock::{ErrorKind, LockGuard, MIN_TTL};

#[cfg(feature = "etcd")]
use crate::args::Kind;
use crate::args::{
    AcquireArgs, ExtendArgs, ForceUnlockArgs, HoldArgs, ListArgs, RunArgs, SetPermitsArgs,
    StatusArgs, Store, TokenArgs, TopArgs,
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
    /// Memcached: every kind (fenced where the kind has fences); no `list` (no key
    /// iteration).
    Memcached(Memcached),
    /// etcd: every primitive, fenced, every command.
    #[cfg(feature = "etcd")]
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

impl Target {
    /// What the store's configuration can do to locks and fences, as its client read it
    /// on connect: Redis (every node of a RedLock) and memcached. etcd and ZooKeeper have
    /// no such setting; PostgreSQL's session timeouts cannot drop a lease-mode lock (a row
    /// with an expiry), and advisory-mode sessions turn the idle ones off for themselves.
    fn config_hazards(&self) -> Vec<ConfigHazard> {
        match self {
            Target::Redis(r) => r.config_hazards(),
            Target::Quorum(q) => q.nodes().iter().flat_map(Redis::config_hazards).collect(),
            Target::Memcached(m) => m.config_hazards(),
            #[cfg(feature = "etcd")]
            Target::Etcd(_) => Vec::new(),
            Target::Memory(_)
            | Target::Postgres(_)
            | Target::PgAdvisory(_)
            | Target::ZooKeeper(_) => Vec::new(),
        }
    }
}

/// Connects for a command that takes locks (`run`, `elect`, `acquire`) and checks what
/// the store's configuration can do to them: a store that can drop a held lock (evict
/// it) is refused with [`exit::UNAVAILABLE`](crate::exit::UNAVAILABLE) and the setting,
/// unless `--allow-unsafe-store`; every other hazard (and, with that flag, those too) is
/// a warning on stderr. `holding`: the `--ttl` of a command that holds while it runs
/// (`run`, `elect`), which on `zk://` is the session timeout ([`connect_holding`]).
pub(crate) async fn connect_to_lock(
    store: &Store,
    holding: Option<std::time::Duration>,
) -> Result<Target, Failure> {
    let target = match holding {
        Some(ttl) => connect_holding(store, ttl).await?,
        None => connect(store, false).await?,
    };
    let (unsafe_, rest): (Vec<ConfigHazard>, Vec<ConfigHazard>) = target
        .config_hazards()
        .into_iter()
        .partition(ConfigHazard::can_give_two_holders);
    if !unsafe_.is_empty() && !store.allow_unsafe_store {
        let found: Vec<String> = unsafe_.iter().map(ToString::to_string).collect();
        return Err(Failure::new(
            crate::exit::UNAVAILABLE,
            format!(
                "refusing to lock on a store configured to drop held locks: {} (pass \
                 --allow-unsafe-store to lock there anyway)",
                found.join("; ")
            ),
        ));
    }
    for hazard in unsafe_.iter().chain(&rest) {
        eprintln!("dlock: warning: {hazard}");
    }
    Ok(target)
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
            #[cfg(feature = "etcd")]
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
            let shortest = fencelock::backend::memcached::MIN_TTL;
            cmd::run(m, args, shortest).await
        }
        #[cfg(feature = "etcd")]
        Target::Etcd(e) => cmd::run(e, args, MIN_TTL).await,
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
        #[cfg(feature = "etcd")]
        Target::Etcd(b) => cmd::acquire_cmd(b, args, fence).await,
        // No fencing token on a quorum of independent counters: `TOKEN -`.
        Target::Quorum(q) => cmd::acquire_cmd(q, args, |_| None).await,
        Target::ZooKeeper(_) => Err(Failure::usage(ZK_SESSION)),
        Target::PgAdvisory(_) => Err(Failure::usage(ADVISORY_SESSION)),
    }
}

/// `dlock hold`: the plain lock on every store (a hold that is dlock's session — ZooKeeper,
/// PostgreSQL advisory locks — lives exactly as long as dlock hold does).
pub(crate) async fn hold(target: Target, args: HoldArgs) -> Result<u8, Failure> {
    match target {
        Target::Redis(b) => cmd::hold::hold(b, args, fence).await,
        Target::Memory(b) => cmd::hold::hold(b, args, fence).await,
        Target::Postgres(b) => cmd::hold::hold(b, args, fence).await,
        Target::Memcached(b) => cmd::hold::hold(b, args, fence).await,
        #[cfg(feature = "etcd")]
        Target::Etcd(b) => cmd::hold::hold(b, args, fence).await,
        Target::ZooKeeper(b) => cmd::hold::hold(b, args, fence).await,
        // No fencing token on a quorum of independent counters, nor on a session lock.
        Target::Quorum(q) => cmd::hold::hold(q, args, |_| None).await,
        Target::PgAdvisory(p) => cmd::hold::hold(p, args, |_| None).await,
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
            #[cfg(feature = "etcd")]
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
        Target::Memcached(m) => cmd::status_cmd(m, args).await,
        #[cfg(feature = "etcd")]
        // The plain lock shows its queue's prefix as its key; the other kinds as Redis's.
        Target::Etcd(e) if args.kind == Kind::Lock => {
            cmd::lock_status_cmd(e, Layout::QueueUnder, "etcd://", args).await
        }
        #[cfg(feature = "etcd")]
        Target::Etcd(e) => cmd::status_cmd(e, args).await,
        Target::PgAdvisory(p) => {
            cmd::lock_status_cmd(p, Layout::Session, "postgres://…?mode=advisory", args).await
        }
        Target::Quorum(q) => cmd::quorum::status_cmd(q, args).await,
    }
}

/// `dlock list`.
pub(crate) async fn list(target: Target, args: ListArgs) -> Result<u8, Failure> {
    match target {
        Target::Redis(b) => cmd::list_every_kind(b, Layout::AtKey, true, args).await,
        Target::Memory(b) => cmd::list_every_kind(b, Layout::AtKey, false, args).await,
        Target::Postgres(b) => cmd::list_every_kind(b, Layout::AtKey, false, args).await,
        Target::ZooKeeper(z) => cmd::list_every_kind(z, Layout::Znodes, false, args).await,
        #[cfg(feature = "etcd")]
        Target::Etcd(e) => cmd::list_every_kind(e, Layout::QueueUnder, false, args).await,
        Target::Quorum(q) => {
            cmd::only_locks(&args.kind, "redlock://")?;
            cmd::quorum::list_cmd(q, args).await
        }
        Target::Memcached(_) => Err(Failure::usage(MEMCACHED_NO_LIST)),
        Target::PgAdvisory(_) => Err(Failure::usage(ADVISORY_NO_LIST)),
    }
}

/// `dlock set-permits`.
pub(crate) async fn set_permits(target: Target, args: SetPermitsArgs) -> Result<u8, Failure> {
    let plain_only = |store: &str| {
        Err(Failure::usage(format!(
            "{store} has the plain lock only: no semaphore to set the permits of"
        )))
    };
    match target {
        Target::Redis(b) => cmd::set_permits_cmd(b, args).await,
        Target::Memory(b) => cmd::set_permits_cmd(b, args).await,
        Target::Postgres(b) => cmd::set_permits_cmd(b, args).await,
        Target::ZooKeeper(b) => cmd::set_permits_cmd(b, args).await,
        Target::Memcached(b) => cmd::set_permits_cmd(b, args).await,
        #[cfg(feature = "etcd")]
        Target::Etcd(b) => cmd::set_permits_cmd(b, args).await,
        Target::Quorum(_) => plain_only("redlock://"),
        Target::PgAdvisory(_) => plain_only("postgres://…?mode=advisory"),
    }
}

/// `dlock force-unlock`.
pub(crate) async fn force_unlock(target: Target, args: ForceUnlockArgs) -> Result<u8, Failure> {
    match target {
        Target::Redis(b) => cmd::force_unlock_cmd(b, args).await,
        Target::Memory(b) => cmd::force_unlock_cmd(b, args).await,
        Target::Postgres(b) => cmd::force_unlock_cmd(b, args).await,
        Target::ZooKeeper(b) => cmd::force_unlock_cmd(b, args).await,
        Target::Memcached(m) => cmd::force_unlock_cmd(m, args).await,
        #[cfg(feature = "etcd")]
        Target::Etcd(e) if args.kind == Kind::Lock => {
            cmd::lock_force_unlock_cmd(e, Layout::QueueUnder, "etcd://", args).await
        }
        #[cfg(feature = "etcd")]
        Target::Etcd(e) => cmd::force_unlock_cmd(e, args).await,
        // Terminates the holding sessions (pg_terminate_backend).
        Target::PgAdvisory(p) => {
            cmd::lock_force_unlock_cmd(p, Layout::Session, "postgres://…?mode=advisory", args).await
        }
        Target::Quorum(q) => cmd::quorum::force_unlock_cmd(q, args).await,
    }
}

/// Why `etcd://` is refused by a dlock built without the `etcd` feature.
#[cfg(not(feature = "etcd"))]
pub(crate) const NO_ETCD: &str = "this dlock was built without etcd support: rebuild it with \
     `--features etcd` (e.g. `cargo install --path crates/fencelock-cli --features etcd`), which \
     needs protoc, the Protocol Buffers compiler, on PATH";

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
        #[cfg(feature = "etcd")]
        Target::Etcd(e) => cmd::top::every_kind(e, false, args).await,
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
    let connected = connect_to(store.url.as_deref(), allow_memory).await;
    match connected {
        Err(failure) if store.url.is_none() => Err(Failure::new(
            failure.code,
            format!(
                "no store named (neither --url nor DLOCK_URL is set), and the default, \
                 {DEFAULT_URL}, failed: {}; start Redis there, or name the store with --url \
                 or DLOCK_URL (e.g. --url redis://host:6379, etcd://host:2379)",
                failure.message
            ),
        )),
        connected => connected,
    }
}

/// The store when neither `--url` nor `DLOCK_URL` names one: a Redis server on this
/// machine, at its default port (as `etcdctl` and `consul` default to the local agent).
pub(crate) const DEFAULT_URL: &str = "redis://127.0.0.1:6379";

/// [`connect`] to `url`, [`DEFAULT_URL`] if none is given.
async fn connect_to(url: Option<&str>, allow_memory: bool) -> Result<Target, Failure> {
    let named = named(url, allow_memory)?;
    let url = url.unwrap_or(DEFAULT_URL);
    let connected = match named {
        Named::Redis(url) => Redis::connect(url).await.map(Target::Redis),
        Named::Redlock(nodes) => redlock(nodes).await.map(Target::Quorum),
        Named::Memcached(url) => Memcached::connect(url).await.map(Target::Memcached),
        #[cfg(feature = "etcd")]
        Named::Etcd(url) => Etcd::connect(url).await.map(Target::Etcd),
        Named::Postgres(url) => Postgres::connect(url).await.map(Target::Postgres),
        Named::PgAdvisory(url) => PgAdvisory::connect(&url).await.map(Target::PgAdvisory),
        Named::ZooKeeper(url) => ZooKeeper::connect(url).await.map(Target::ZooKeeper),
        Named::Memory => Ok(Target::Memory(Memory::new())),
    };
    connected.map_err(|e| not_connected(url, e))
}

/// A failure to connect to the store at `url`: what dlock was doing (connecting, to
/// which store), what the store's client said and its cause, and a hint at what to check
/// where the error says enough to give one.
fn not_connected(url: &str, err: fencelock::Error) -> Failure {
    // A bad URL, or a store refused for its configuration: the message says what to change.
    let wrapped = matches!(
        err.kind(),
        ErrorKind::Unavailable | ErrorKind::TimedOut | ErrorKind::Backend
    );
    let failure = Failure::from(err);
    if !wrapped {
        return failure;
    }
    let message = failure.message.trim_end();
    let hint = connect_hint(scheme(url).unwrap_or_default(), message);
    let hint = hint.map(|h| format!(": {h}")).unwrap_or_default();
    // Most store clients say what they were connecting to; where one does not, dlock does.
    let doing = if message.contains("connecting to") {
        String::new()
    } else {
        format!("connecting to {}: ", redact(url))
    };
    Failure::new(failure.code, format!("{doing}{message}{hint}"))
}

/// What to check, for the error `message` of a connection to a store of `scheme`; `None`
/// where the message says it all.
fn connect_hint(scheme: &str, message: &str) -> Option<&'static str> {
    let says = |words: &[&str]| words.iter().any(|w| message.contains(w));
    let redis = matches!(
        scheme,
        "redis" | "rediss" | "redis+unix" | "unix" | "redis+sentinel" | "redis+cluster" | "redlock"
    );
    let tls = scheme == "rediss";
    if redis
        && says(&[
            "Parse error",
            "Incompatible type",
            "invalid type",
            "Protocol",
        ])
    {
        return Some(
            "the server there does not answer as Redis does: check that the host and port \
             are a Redis server's (not memcached's, an HTTP server's or another service's)",
        );
    }
    if tls
        && says(&[
            "within",
            "timed out",
            "TLS",
            "tls",
            "handshake",
            "certificate",
            "corrupt",
            "InvalidContentType",
        ])
    {
        return Some(
            "rediss:// connects with TLS: check that the port is one where the server takes \
             TLS (Redis's tls-port); a server without TLS is redis://",
        );
    }
    if says(&["Connection refused", "connection refused"]) {
        return Some(
            "nothing listens there: is the server running, and are the host and port right?",
        );
    }
    if redis && says(&["within"]) {
        return Some(
            "no answer in time: is it a Redis server, reachable from here? One that takes TLS \
             only is rediss://",
        );
    }
    match scheme {
        "postgres" | "postgresql" if says(&["password authentication failed", "no password"]) => {
            Some("check the user name and password in the URL")
        }
        "postgres" | "postgresql" if says(&["does not exist"]) => {
            Some("check the user and the database (the URL's path) on the server")
        }
        "postgres" | "postgresql" if says(&["in time"]) => {
            Some("no answer in time: is it a PostgreSQL server, reachable from here?")
        }
        "etcd" if says(&["protocol error", "h2 ", "connection closed"]) => Some(
            "the server there does not answer as etcd does: check that the port is an etcd \
             client port (2379 by default)",
        ),
        "etcd" if says(&["in time", "timed out", "cancel", "Cancel"]) => Some(
            "is it an etcd client port (2379 by default), and is a majority of the \
             cluster's members up? Without one, etcd answers nothing",
        ),
        "zk" if says(&["no available hosts"]) => {
            Some("is ZooKeeper running there, and is the port its client port (2181 by default)?")
        }
        _ => None,
    }
}

/// Connects for a command that holds while it runs (`dlock run`, `dlock elect`): every
/// store as [`connect`], except `zk://`. There the hold lives in dlock's ZooKeeper
/// session, which a crashed or killed dlock keeps until it expires, so `--ttl` is the
/// session timeout asked for — unless the URL's `?session_timeout=` sets one, which wins
/// — and a session longer than `--ttl` (the URL's, or the shortest the ensemble grants)
/// is refused: a crashed dlock's lock would outlive `--ttl`.
pub(crate) async fn connect_holding(
    store: &Store,
    ttl: std::time::Duration,
) -> Result<Target, Failure> {
    let Named::ZooKeeper(url) = named(store.url.as_deref(), false)? else {
        return connect(store, false).await;
    };
    let set_in_url = url.split_once('?').is_some_and(|(_, query)| {
        query
            .split('&')
            .any(|p| p.split_once('=').map_or(p, |(name, _)| name) == "session_timeout")
    });
    let asked = if set_in_url {
        url.to_owned()
    } else {
        // At most the 10 minutes a URL may ask for: shorter than --ttl is no harm. (A
        // --ttl under MIN_TTL is refused by the command, saying so.)
        let ms = ttl
            .clamp(MIN_TTL, std::time::Duration::from_secs(600))
            .as_millis();
        let sep = if url.contains('?') { '&' } else { '?' };
        format!("{url}{sep}session_timeout={ms}ms")
    };
    let zk = ZooKeeper::connect(&asked)
        .await
        .map_err(|e| not_connected(url, e))?;
    let session = zk.session_timeout();
    if session > ttl && ttl >= MIN_TTL {
        let (why, fix) = if set_in_url {
            (
                "the URL's ?session_timeout=",
                ", or drop ?session_timeout= from the URL (--ttl then sets it)",
            )
        } else {
            (
                "the shortest the ensemble grants: its minSessionTimeout",
                "",
            )
        };
        return Err(Failure::usage(format!(
            "--ttl {ttl:?} is shorter than dlock's ZooKeeper session ({session:?}, {why}): a \
             dlock that crashes keeps its lock until its session expires, so --ttl would not \
             bound it; use --ttl {session:?} or longer{fix}"
        )));
    }
    Ok(Target::ZooKeeper(zk))
}

/// The store a `--url` names, before anything connects: which connector gets which URL.
#[derive(Debug, PartialEq, Eq)]
enum Named<'a> {
    /// `redis://`, `rediss://`, `redis+unix://` (`unix://`), `redis+sentinel://`,
    /// `redis+cluster://`: the URL as given.
    Redis(&'a str),
    /// `redlock://`: one `redis://` URL per independent master.
    Redlock(Vec<String>),
    Memcached(&'a str),
    #[cfg(feature = "etcd")]
    Etcd(&'a str),
    /// `postgres://` in lease mode (the default).
    Postgres(&'a str),
    /// `postgres://…?mode=advisory`: the URL without `mode=advisory`.
    PgAdvisory(String),
    ZooKeeper(&'a str),
    Memory,
}

/// Which store `url` names (`--url`, else `DLOCK_URL`, else [`DEFAULT_URL`]), by its
/// scheme; a usage error for an empty one, an unknown scheme or text that is no URL, which
/// never shows a secret of it.
fn named(url: Option<&str>, allow_memory: bool) -> Result<Named<'_>, Failure> {
    let url = match url {
        None => DEFAULT_URL,
        Some("") => {
            return Err(Failure::usage(format!(
                "empty --url or DLOCK_URL: name a store, or leave both unset for the default, \
                 {DEFAULT_URL}"
            )));
        }
        Some(url) => url,
    };
    match scheme(url) {
        Some("redis" | "rediss" | "redis+unix" | "unix" | "redis+sentinel" | "redis+cluster") => {
            Ok(Named::Redis(url))
        }
        Some("redlock") => Ok(Named::Redlock(redlock_nodes(url)?)),
        Some("memcache" | "memcached") => Ok(Named::Memcached(url)),
        #[cfg(feature = "etcd")]
        Some("etcd") => Ok(Named::Etcd(url)),
        #[cfg(not(feature = "etcd"))]
        Some("etcd") => Err(Failure::usage(NO_ETCD)),
        Some("postgres" | "postgresql") => {
            pg_mode(url)?;
            Ok(match advisory_url(url) {
                Some(url) => Named::PgAdvisory(url),
                None => Named::Postgres(url),
            })
        }
        Some("zk") => Ok(Named::ZooKeeper(url)),
        Some("memory") if allow_memory => Ok(Named::Memory),
        Some("memory") => Err(Failure::usage(
            "memory:// is in-process only and would exclude no other process; use redis://",
        )),
        Some(other) => Err(Failure::usage(format!(
            "unknown backend {other:?} in --url (supported: {SCHEMES})"
        ))),
        None => Err(Failure::usage(format!(
            "--url {:?} is not a URL (expected {SCHEMES})",
            redact(url)
        ))),
    }
}

/// The scheme of `url`, if it starts with one and `://`. Only a scheme's characters count
/// as one: text before a later "://" (in a query, in a password) is no scheme.
fn scheme(url: &str) -> Option<&str> {
    url.split_once("://").map(|(s, _)| s).filter(|s| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
    })
}

/// `text` (a URL, or user input quoted in a message) fit to print: as
/// [`fencelock::backend::redact_url`] shows it (the user info, from the scheme or the start to
/// the last `@`, and secret query parameters hidden), except that only a scheme counts as
/// one: `redact_url` keeps whatever comes before the first `://`, which in a mangled URL
/// (`redis:/:pa://ss@host`) is part of the password.
pub(crate) fn redact(text: &str) -> String {
    let Some(at) = text.rfind('@') else {
        // No user info: only the query's secrets to hide.
        return fencelock::backend::redact_url(text);
    };
    let start = scheme(text)
        .map(|s| s.len() + "://".len())
        .filter(|&end| end <= at)
        .unwrap_or(0);
    let user = match text[start..at].split_once(':') {
        // A user name is kept only where it is unambiguous: right after `://`.
        Some((user, _)) if start > 0 && !user.contains(['/', '?', '#', '@']) => user,
        _ => "",
    };
    let hidden = if user.is_empty() { "***@" } else { ":***@" };
    format!(
        "{}{user}{hidden}{}",
        &text[..start],
        fencelock::backend::redact_url(&text[at + 1..])
    )
}

/// Every `mode=` of a `postgres://` URL is `advisory` or `lease` (the default): any
/// other would be dropped by [`advisory_url`] and do nothing.
fn pg_mode(url: &str) -> Result<(), Failure> {
    let Some((_, query)) = url.split_once('?') else {
        return Ok(());
    };
    for mode in query.split('&').filter_map(|p| p.strip_prefix("mode=")) {
        if !matches!(mode, "advisory" | "lease") {
            return Err(Failure::usage(
                "postgres:// takes mode=advisory (session locks) or mode=lease (the \
                 default), no other mode",
            ));
        }
    }
    Ok(())
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

/// `redlock://[user:pass@]host:port,host:port,…[/db][?query]`: one `redis://` URL per
/// independent master, each with the user info, database and query of the whole.
fn redlock_nodes(url: &str) -> Result<Vec<String>, Failure> {
    let rest = url.strip_prefix("redlock://").unwrap_or_default();
    // The hosts end at the path or, without one, at the query (which every node gets).
    let (authority, tail) = rest
        .find(['/', '?'])
        .map_or((rest, ""), |i| rest.split_at(i));
    let tail = tail.strip_prefix('/').unwrap_or(tail);
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
    Ok(hosts
        .into_iter()
        .map(|host| format!("redis://{auth}{host}/{tail}"))
        .collect())
}

/// RedLock over the masters at `nodes` (`redis://` URLs).
async fn redlock(nodes: Vec<String>) -> fencelock::Result<Quorum<Redis>> {
    let mut connected = Vec::with_capacity(nodes.len());
    for node in nodes {
        connected.push(Redis::connect(node).await?);
    }
    Quorum::new(connected)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::exit;
    use crate::hostile::{
        SCHEMES as ANY_SCHEMES, any_url, cases, url_with_password, usage_without,
    };

    /// The schemes `--url` takes, and the connector each goes to.
    const KNOWN: &[(&str, &str)] = &[
        ("redis", "redis"),
        ("rediss", "redis"),
        ("redis+unix", "redis"),
        ("unix", "redis"),
        ("redis+sentinel", "redis"),
        ("redis+cluster", "redis"),
        ("redlock", "redlock"),
        ("memcache", "memcached"),
        ("memcached", "memcached"),
        ("etcd", "etcd"),
        ("postgres", "postgres"),
        ("postgresql", "postgres"),
        ("zk", "zk"),
        ("memory", "memory"),
    ];

    /// Which connector `named` chose.
    fn connector(named: &Named<'_>) -> &'static str {
        match named {
            Named::Redis(_) => "redis",
            Named::Redlock(_) => "redlock",
            Named::Memcached(_) => "memcached",
            #[cfg(feature = "etcd")]
            Named::Etcd(_) => "etcd",
            Named::Postgres(_) | Named::PgAdvisory(_) => "postgres",
            Named::ZooKeeper(_) => "zk",
            Named::Memory => "memory",
        }
    }

    /// A host of a RedLock URL: no `,`, `/`, `?` or `@`.
    fn host() -> impl Strategy<Value = String> {
        prop_oneof![
            "[a-z0-9.-]{1,12}(:[0-9]{1,5})?",
            "\\[::1\\](:[0-9]{1,5})?",
            "[^,/?@]{1,8}",
        ]
    }

    proptest! {
        #![proptest_config(cases(256))]

        /// Any `--url`: a store to connect to, or a usage error with a message; nothing
        /// connects here.
        #[test]
        fn any_url_names_a_store_or_is_a_usage_error(url in any_url(), memory in any::<bool>()) {
            match named(Some(&url), memory) {
                Ok(Named::Memory) => prop_assert!(memory && url.starts_with("memory://")),
                Ok(Named::Redlock(nodes)) => prop_assert!(nodes.len() >= 3),
                Ok(_) => {}
                Err(f) => usage_without(&f, "")?,
            }
        }

        /// The scheme alone picks the connector, which gets the URL as given (advisory
        /// mode: without `mode=advisory`; RedLock: one `redis://` URL per node).
        #[test]
        fn the_scheme_picks_the_connector(
            (scheme, expected) in prop::sample::select(KNOWN),
            rest in prop_oneof![any::<String>(), "[ -~]{0,40}"],
        ) {
            let url = format!("{scheme}://{rest}");
            match named(Some(&url), true) {
                Ok(named) => {
                    prop_assert_eq!(connector(&named), expected);
                    match named {
                        #[cfg(feature = "etcd")]
                        Named::Etcd(u) => prop_assert_eq!(u, url.as_str()),
                        Named::Redis(u)
                        | Named::Memcached(u)
                        | Named::Postgres(u)
                        | Named::ZooKeeper(u) => prop_assert_eq!(u, url.as_str()),
                        Named::PgAdvisory(u) => prop_assert_eq!(Some(u), advisory_url(&url)),
                        Named::Redlock(nodes) => {
                            prop_assert!(nodes.iter().all(|n| n.starts_with("redis://")));
                        }
                        Named::Memory => {}
                    }
                }
                // Only RedLock (its hosts) and PostgreSQL (its `mode=`) check more than
                // the scheme; a build without etcd support refuses every etcd URL.
                Err(f) => {
                    prop_assert!(
                        expected == "redlock"
                            || (expected == "postgres" && url.contains("mode="))
                            || (expected == "etcd" && cfg!(not(feature = "etcd"))),
                        "{}", f.message
                    );
                    usage_without(&f, "")?;
                }
            }
        }

        /// A scheme dlock does not know, made of a scheme's characters, is named in the
        /// usage error; anything else before `://` is no scheme and is not shown.
        #[test]
        fn unknown_schemes_are_usage_errors(
            scheme in "[a-z][a-z0-9+.-]{0,12}",
            rest in "[ -~]{0,30}",
        ) {
            prop_assume!(!KNOWN.iter().any(|(k, _)| *k == scheme));
            let f = named(Some(&format!("{scheme}://{rest}")), true).expect_err("unknown");
            usage_without(&f, "")?;
            prop_assert!(f.message.contains(&format!("{scheme:?}")), "{}", f.message);
        }

        /// A password in a `--url` of any scheme, well-formed or not, never shows in the
        /// usage error (its line or its `Debug`).
        #[test]
        fn a_password_never_shows_in_url_errors((url, secret) in url_with_password(ANY_SCHEMES)) {
            if let Err(f) = named(Some(&url), false) {
                usage_without(&f, &secret)?;
            }
        }

        /// A password in any text, URL or not, never survives [`redact`].
        #[test]
        fn redact_hides_every_password(
            (url, secret) in url_with_password(ANY_SCHEMES),
            after in "[ -?A-~]{0,12}",
        ) {
            crate::hostile::hidden(&redact(&url), &secret)?;
            // Quoted in a message, as clap quotes what it refuses.
            crate::hostile::hidden(&redact(&format!("{url}' for '--ttl': {after}")), &secret)?;
        }

        /// `redlock://[auth@]h1,h2,…[/db][?query]`: one `redis://[auth@]host/db?query` per
        /// host, in order, for 3 or more hosts; a usage error for fewer.
        #[test]
        fn redlock_urls_split_into_their_nodes(
            auth in prop_oneof![
                Just(String::new()),
                "[a-z]{0,5}:[A-Za-z0-9_.~-]{1,10}@",
                "[A-Za-z0-9]{1,8}@",
            ],
            hosts in prop::collection::vec(host(), 0..7),
            empty in 0..3usize,
            db in prop_oneof![Just(String::new()), Just("/".to_owned()), "/[0-9]{1,2}"],
            query in prop_oneof![
                Just(String::new()),
                "\\?[a-z_]{1,10}=[a-z0-9]{0,5}(&[a-z]{1,5}=[a-z0-9]{0,3})?",
            ],
        ) {
            // Empty entries (`h1,,h2`) are skipped.
            let mut list = hosts.clone();
            for i in 0..empty.min(list.len()) {
                list.insert(i * 2, String::new());
            }
            let url = format!("redlock://{auth}{}{db}{query}", list.join(","));
            let result = redlock_nodes(&url);
            if hosts.len() < 3 {
                let f = result.expect_err("fewer than 3 masters");
                usage_without(&f, "")?;
                prop_assert!(f.message.contains("at least 3"));
            } else {
                let db = db.strip_prefix('/').unwrap_or(&db);
                let expected: Vec<String> = hosts
                    .iter()
                    .map(|h| format!("redis://{auth}{h}/{db}{query}"))
                    .collect();
                prop_assert_eq!(result.expect("nodes"), expected);
            }
        }

        /// `mode=advisory` among a `postgres://` URL's parameters picks advisory mode and
        /// is dropped (with any other `mode=`), the other parameters kept in order;
        /// without it, lease mode.
        #[test]
        fn advisory_mode_is_one_query_parameter(
            base in "postgres://[a-z:@0-9./]{0,20}",
            params in prop::collection::vec(
                prop_oneof![
                    "[a-z_]{1,8}=[a-z0-9]{0,5}",
                    Just("mode=advisory".to_owned()),
                    Just("mode=lease".to_owned()),
                    Just(String::new()),
                    "[^&]{0,6}",
                ],
                0..5,
            ),
        ) {
            let with_query = |params: &[&str]| {
                if params.is_empty() {
                    base.clone()
                } else {
                    format!("{base}?{}", params.join("&"))
                }
            };
            let all: Vec<&str> = params.iter().map(String::as_str).collect();
            let url = with_query(&all);
            let kept: Vec<&str> = all.iter().copied().filter(|p| !p.starts_with("mode=")).collect();
            let advisory = params.iter().any(|p| p == "mode=advisory");
            match advisory_url(&url) {
                Some(u) => {
                    prop_assert!(advisory);
                    prop_assert_eq!(u, with_query(&kept));
                }
                None => prop_assert!(!advisory),
            }
        }
    }

    /// A `mode=` that is neither `advisory` nor `lease` is refused, not dropped.
    #[test]
    fn an_unknown_postgres_mode_is_a_usage_error() {
        for url in ["postgres://h/db?mode=advisroy", "postgres://h/db?x=1&mode="] {
            let f = named(Some(url), false).expect_err(url);
            assert_eq!(f.code, exit::USAGE);
            assert!(f.message.contains("mode=advisory"), "{}", f.message);
        }
        for url in [
            "postgres://h/db?mode=lease",
            "postgres://h/db?mode=advisory",
        ] {
            assert!(named(Some(url), false).is_ok(), "{url}");
        }
    }

    /// No URL: the default store; an empty one: a usage error that names the default.
    #[test]
    fn no_url_is_the_default_and_an_empty_one_a_usage_error() {
        assert_eq!(
            named(None, false).expect("default"),
            Named::Redis(DEFAULT_URL)
        );
        let f = named(Some(""), true).expect_err("empty");
        assert_eq!(f.code, exit::USAGE);
        assert!(f.message.contains("DLOCK_URL"), "{}", f.message);
        assert!(f.message.contains(DEFAULT_URL), "{}", f.message);
        let f = named(Some("memory://"), false).expect_err("not in-process");
        assert_eq!(f.code, exit::USAGE);
    }

    /// Regression: `fencelock::backend::redact_url` keeps what precedes the first `://`, in a
    /// mangled URL part of the password; the CLI's messages redact with [`redact`].
    #[test]
    fn a_password_with_a_scheme_separator_is_hidden() {
        let url = "redis:/:Zqa00://x@127.0.0.1";
        let f = named(Some(url), false).expect_err("not a URL");
        assert!(!f.message.contains("Zqa00"), "{}", f.message);
        assert_eq!(redact(url), "***@127.0.0.1");
        assert_eq!(
            redact("redis://app:s3cret@db:6379/0"),
            "redis://app:***@db:6379/0"
        );
        assert_eq!(redact("redis://s3cret@db"), "redis://***@db");
        assert_eq!(
            redact("postgres://db/x?password=s3cret"),
            "postgres://db/x?password=***"
        );
        assert_eq!(redact("no secret here"), "no secret here");
    }

    /// Regression: a query without a path went to the last node only, with a `/` after
    /// it (`redis://c:3?protocol=resp3/`).
    #[test]
    fn a_redlock_query_goes_to_every_node() {
        assert_eq!(
            redlock_nodes("redlock://a:1,b:2,c:3?protocol=resp3").expect("nodes"),
            [
                "redis://a:1/?protocol=resp3",
                "redis://b:2/?protocol=resp3",
                "redis://c:3/?protocol=resp3",
            ]
        );
        assert_eq!(
            redlock_nodes("redlock://u:p@a,b,c/2").expect("nodes"),
            ["redis://u:p@a/2", "redis://u:p@b/2", "redis://u:p@c/2"]
        );
    }

    /// `etcd://` connects where dlock is built with etcd support, and is otherwise a usage
    /// error that says how to get it (and never shows the URL's secrets).
    #[test]
    fn etcd_urls_need_the_etcd_feature() {
        let named = named(Some("etcd://root:s3cret@127.0.0.1:2379"), false);
        #[cfg(feature = "etcd")]
        assert!(
            matches!(named, Ok(Named::Etcd("etcd://root:s3cret@127.0.0.1:2379"))),
            "{named:?}"
        );
        #[cfg(not(feature = "etcd"))]
        {
            let f = named.expect_err("no etcd support");
            assert_eq!(f.code, crate::exit::USAGE);
            assert!(
                f.message.contains("--features etcd") && f.message.contains("protoc"),
                "{}",
                f.message
            );
            assert!(!f.message.contains("s3cret"));
        }
    }
}
