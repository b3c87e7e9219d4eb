//! ZooKeeper: Curator's lock recipe — ephemeral sequential nodes, each waiter watching
//! only the node before its own — with the client's session as the lease and the lock
//! node's creation zxid as the fence.
//!
//! # Layout
//!
//! Lock key `K` (prefix + name) is the directory `/<K>` under the URL's chroot (a
//! *container* node: ZooKeeper deletes it once its last child is gone, so directories of
//! unused locks do not pile up). Characters that ZooKeeper paths do not allow, and `/`,
//! `%` and `-`, are written `%XX`. Every client that wants the lock creates an ephemeral
//! sequential child `<token>-<sequence>` holding its token. The child with the lowest
//! sequence holds the lock; the others wait behind it in sequence order.
//!
//! # Operations
//!
//! * **Acquire** (two round trips): create our child (the directory first if the server
//!   removed it), then list the directory. We hold the lock iff ours is the lowest
//!   sequence. A create whose reply was lost is looked for by token before another is
//!   made, so a repeated attempt never queues twice.
//! * **Fence**: our child's creation zxid. zxids are cluster-wide, strictly increasing,
//!   and persisted (transaction log, snapshots); a new leader starts a new epoch (the
//!   high 32 bits), so they survive restarts and elections. Grants go in sequence order,
//!   which is creation order, so fences strictly increase per name.
//! * **Leases are the session.** An ephemeral node lives until it is deleted or its
//!   session expires; the session lives while the client is heard from within the
//!   session timeout. Two rules make the lease safe:
//!   - *Validity*: a grant or renewal counts for `min(ttl, ⅔ session timeout)` from the
//!     moment its request was sent ([`RawLock::lease_validity`]), less the drift allowance.
//!     The leader heard from the session no earlier than a third of a lease before that
//!     moment (see `session_lease`), so the session (and our node) lives at least that
//!     long. A client cut off from the ensemble can no longer renew,
//!     so its guards report `lost()` once that validity runs out — before the session can
//!     have expired and another client been granted the lock. (Curator's users ask for
//!     this rule: a lock is neither kept past a possible expiry, nor dropped at the first
//!     disconnection.)
//!   - *Expiry of a lease that is not renewed*: a guard that stops renewing (the
//!     watchdog is off, or it was forgotten) while its process lives would keep the node
//!     as long as the session. This client deletes such nodes itself when their lease
//!     ends (`min(ttl, ⅔ session timeout)` after the last renewal was sent); a crashed or
//!     cut-off client's nodes go with its session.
//!   - *A crashed holder is freed within the session timeout*, not the ttl: nothing of a
//!     crashed process renews or deletes, and the ensemble deletes its nodes when its
//!     session expires (the session timeout after it was last heard from, plus up to one
//!     server tick). A ttl shorter than the session timeout is honoured only while the
//!     holder lives (the client warns once when asked for one); for the ttl to bound a
//!     crash too, ask for `?session_timeout=` no longer than the ttl — `dlock run` and
//!     `dlock elect` make `--ttl` the session timeout
//!     ([`session_timeout`](ZooKeeper::session_timeout)).
//! * **Renewal**: a `sync` through the leader and one `exists` read of our node, checked
//!   to belong to our session (a server cut off from the leader cannot answer the `sync`,
//!   so it cannot vouch for a node the leader may have deleted). The
//!   watchdog's batch is pipelined on the session's connection.
//! * **Waiting**: one task per waiter lists the directory, watches the node just before
//!   ours (an `exists` watch) and, when it is deleted, looks again: another node still in
//!   front (a waiter that left) — it watches that one; none — the lock is ours. A release
//!   or an expired holder's session therefore wakes exactly the next waiter. When the
//!   watched node was the only one in front, its deletion makes ours the lowest (no node
//!   created later can have a lower sequence), and the task hands the grant over after
//!   one read that finds our own node still there (an operator's `deleteall` takes it
//!   with the one in front). A waiter whose node, or whole directory, an operator
//!   deleted queues again: its next attempt makes the directory and a node anew, at the
//!   back of the line.
//! * **Sessions**: one per client. When the ensemble reports it expired, the next call
//!   opens a new one; every hold of the old one has ended (its renewals fail).
//! * **Operators**: [`inspect`](RawInspect::inspect) lists the directory (holder token,
//!   its creation zxid as the last fence, the number queued; the remaining lease is not
//!   stored — `None`); [`force_unlock`](RawInspect::force_unlock) deletes the lowest node,
//!   which wakes the next in line and makes its holder's next renewal fail;
//!   [`list`](RawInspect::list) names every directory with a lock node in it.
//!
//! # Elections
//!
//! An [`Election`](crate::Election)'s record lives in a persistent node *beside* its
//! lock's directory, `/<K>-leader`, not in it: a persistent child would keep the
//! container directory from ever being removed. `escape` never writes `-`, so no lock
//! directory can have that name, the queue listings never see the node, and
//! [`list`](RawInspect::list) passes over it. Its data is `<term>\n<data>`.
//! [`publish`](crate::raw::RawElection::publish) lists the lock's directory for the
//! token's node at the head of the line (none: the token does not hold the lock, nothing
//! is written), then writes the record in one multi-op with a check that this node still
//! exists (`check` + `setData`, or `create` when the record is missing): the hold and the
//! write are one atomic step. Terms are not compared.
//! Observers hold an `exists` watch on the node (fired by its creation, a write, its
//! deletion), armed before [`watch_record`](crate::raw::RawElection::watch_record)
//! returns and armed again by a task after each event, before it wakes the observer.
//! Like the fence, the record is never deleted: one small node per election name.
//!
//! The fair lock is this recipe (it is first come, first served already); the reentrant
//! lock, the read-write lock and the semaphore follow Curator's recipes for them in the
//! same directory layout (see `family.rs`), with these rules for sessions, fences, waiting
//! and cleanup.
//!
//! The server must be ZooKeeper 3.5.3 or later (container nodes); it checks for empty
//! containers every `znode.container.checkIntervalMs` (60 s by default). A semaphore's
//! permit count lives in its directory's data: a count set by `set_permits` or
//! `add_permits` is forgotten with the directory once the semaphore has had no holder or
//! waiter for that long (the next client's count applies then).

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock, Weak};
use std::time::Duration;

use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;
use zookeeper_client as zk;

use crate::engine::background::{self, Repeat};
use crate::engine::follow::{self, Fired, Look, Recipe};
use crate::engine::wake::{Registration, Wakes, Watches};
use crate::engine::{Engine, Renewal};
use crate::error::{Error, ErrorKind, Result};
use crate::keys::LockKeys;
use crate::raw::{Acquire, Kind, LockState, RawFencing, RawInspect, RawLock, ReleaseWatch};
use crate::token::Token;

mod election;
mod family;

/// The session timeout asked for when the URL names none.
pub const DEFAULT_SESSION_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest wait for one request's reply.
const CALL_TIMEOUT: Duration = Duration::from_secs(2);
/// Pause before a waiter's task looks again after ZooKeeper failed it.
const FOLLOW_RETRY: Duration = Duration::from_millis(200);

/// A ZooKeeper client for locks. Cheap to clone; clones share the session, the watchdog
/// and the waiters' tasks.
///
/// ```no_run
/// # async fn demo() -> fencelock::Result<()> {
/// let zk = fencelock::backend::ZooKeeper::connect("zk://127.0.0.1:2181/dlock").await?;
/// let guard = fencelock::Lock::new(zk, "leader")?.lock().await?;
/// println!("fence {} (the lock node's creation zxid)", guard.fencing_token());
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct ZooKeeper {
    inner: Arc<Inner>,
}

struct Inner {
    /// `host:port,…` as ZooKeeper's connect string.
    hosts: String,
    /// The chroot (`""` for none), created when missing.
    chroot: String,
    /// `user:password` for the digest scheme.
    auth: Option<String>,
    /// The session timeout asked for.
    requested: Duration,
    /// The URL with its password hidden, for messages.
    shown: String,
    session: RwLock<Session>,
    renewing: tokio::sync::Mutex<()>,
    /// Our nodes (waiting or holding), by node prefix `/<K>/<token>-`.
    places: Mutex<HashMap<String, Place>>,
    /// Node prefixes whose create may have happened without our seeing the reply.
    unsure: Mutex<HashSet<String>>,
    /// The waiting nodes (the engine's wake registry): where each one's task leaves the
    /// grant (the fence), by node prefix.
    wakes: Wakes,
    /// The record watches of elections, shared by this client's observers of each.
    records: Watches,
    /// Granted nodes and when their lease ends unless renewed.
    reaper: Arc<Reaper>,
    /// Node watches that fired for waiters (deletions of the node in front).
    watches_fired: AtomicU64,
    /// Whether a ttl shorter than the session timeout was reported (once per client).
    told_short_ttl: AtomicBool,
    engine: Engine,
}

/// One session of this client.
#[derive(Clone)]
struct Session {
    client: zk::Client,
    id: i64,
    timeout: Duration,
}

/// One of our nodes.
#[derive(Clone)]
struct Place {
    /// Its full path.
    node: String,
    /// What it stands for.
    kind: NodeKind,
    seq: i64,
    czxid: i64,
    /// The session that created it.
    session: i64,
    /// The lease asked for with it.
    ttl: Duration,
    /// Told when the node changes (created anew, withdrawn).
    moved: Arc<Notify>,
}

impl std::fmt::Debug for ZooKeeper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZooKeeper")
            .field("url", &self.inner.shown)
            .finish_non_exhaustive()
    }
}

/// Granted nodes whose lease ends unless renewed: path → (session, deadline).
#[derive(Default)]
struct Reaper {
    due: Mutex<HashMap<String, (i64, Instant)>>,
    /// When the reaping task means to look next (`None`: no deadline known to it).
    planned: Mutex<Option<Instant>>,
    changed: Notify,
}

impl Reaper {
    fn due(&self) -> std::sync::MutexGuard<'_, HashMap<String, (i64, Instant)>> {
        self.due.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn set(&self, node: &str, session: i64, until: Instant) {
        let mut due = self.due();
        let until = match due.get(node) {
            // A node shared by several holds (a reentrant owner's) keeps the latest.
            Some((same, old)) if *same == session => (*old).max(until),
            _ => until,
        };
        due.insert(node.to_owned(), (session, until));
        // Wake the task only if this deadline comes before the one it sleeps until (read
        // under the same lock the task plans under).
        let planned = *self.planned.lock().unwrap_or_else(PoisonError::into_inner);
        drop(due);
        if planned.is_none_or(|p| until < p) {
            self.changed.notify_one();
        }
    }

    /// Pushes the deadline of a node still under watch; `false` if it was reaped (or never
    /// granted).
    fn push(&self, node: &str, until: Instant) -> bool {
        match self.due().get_mut(node) {
            Some((_, end)) => {
                *end = (*end).max(until);
                true
            }
            None => false,
        }
    }

    fn remove(&self, node: &str) {
        self.due().remove(node);
    }
}

fn map_err(e: zk::Error, doing: &str) -> Error {
    use zk::Error as E;
    let (kind, retryable) = match &e {
        E::ConnectionLoss | E::Timeout | E::NoHosts | E::SessionMoved | E::Throttled => {
            (ErrorKind::Unavailable, true)
        }
        E::SessionExpired | E::ClientClosed => (ErrorKind::Unavailable, true),
        // The client's own connection-level failures ("no response from connection in
        // …"): the outcome is unknown.
        E::Custom(_) | E::UnexpectedError(_) => (ErrorKind::Unavailable, true),
        E::BadArguments(_) | E::InvalidAcl => (ErrorKind::InvalidArgument, false),
        _ => (ErrorKind::Backend, false),
    };
    let hint = match &e {
        E::NoAuth => " (the session's identity lacks a permission on the lock's nodes)",
        E::AuthFailed => " (wrong user or password for the digest scheme)",
        _ => "",
    };
    Error::new(kind, format!("{doing}: {e}{hint}"))
        .retryable(retryable)
        .with_source(e)
}

/// Whether `e` came from ZooKeeper's `code`.
fn is(e: &Error, code: &zk::Error) -> bool {
    std::error::Error::source(e)
        .and_then(|s| s.downcast_ref::<zk::Error>())
        .is_some_and(|z| z == code)
}

/// Whether `b` may stand for itself in a node name.
fn plain(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b".:_~@=,".contains(&b)
}

/// `s` as one ZooKeeper path component (how lock keys and tokens are named in nodes): other bytes as `%XX`; a leading `.` too, so that `.` and
/// `..` cannot come out.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for (i, b) in s.bytes().enumerate() {
        if plain(b) && !(i == 0 && b == b'.') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The inverse of [`escape`]; `None` for a name it cannot have made.
pub fn unescape(s: &str) -> Option<String> {
    crate::holder::decode(s)
}

/// The directory of a lock: `/<K>`.
fn dir_path(keys: &LockKeys) -> String {
    format!("/{}", escape(keys.lock()))
}

/// Every node path lock `keys` of `primitive` uses, as `node <path>` (under the URL's
/// chroot): its directory, a child of each kind for a sample token and sequence (the
/// children are in the directory), and an election's record.
#[cfg(test)]
pub(crate) fn key_set(primitive: &str, keys: &LockKeys) -> Vec<String> {
    let dir = dir_path(keys);
    let token = Token::from_string("0123456789abcdef").expect("a valid token");
    let mut all = vec![
        dir.clone(),
        format!("{}0000000001", node_prefix(&dir, &token)),
    ];
    let kinds = match primitive {
        "reentrant" => vec![NodeKind::Holds],
        "rwlock" => vec![NodeKind::Read, NodeKind::Write],
        "semaphore" => vec![NodeKind::Permits(2)],
        _ => Vec::new(),
    };
    for kind in kinds {
        all.push(format!("{dir}/{}0000000002", kind.name(token.as_str())));
    }
    if primitive == "election" {
        all.push(election::record_path(keys));
    }
    all.into_iter().map(|p| format!("node {p}")).collect()
}

/// The prefix of `token`'s node in `dir`: `<dir>/<token>-`.
fn node_prefix(dir: &str, token: &Token) -> String {
    format!("{dir}/{}-", escape(token.as_str()))
}

/// What a lock node stands for, by the start of its name (`<kind>+`; none for the plain
/// and fair lock's `<token>-<seq>`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum NodeKind {
    /// A plain (or fair) lock's holder or waiter: `<token>-<seq>`.
    Plain,
    /// A reentrant lock owner's node: `h+<owner>-<seq>`, its data the owner's holds.
    Holds,
    /// A read-write lock's reader: `r+<token>-<seq>`.
    Read,
    /// A read-write lock's writer: `w+<token>-<seq>` (its data `r` once downgraded).
    Write,
    /// A semaphore holder or waiter of N permits: `<N>+<token>-<seq>`.
    Permits(u32),
}

impl NodeKind {
    /// The name prefix of a node of this kind for `who` (a token, or an owner).
    fn name(self, who: &str) -> String {
        let who = escape(who);
        match self {
            NodeKind::Plain => format!("{who}-"),
            NodeKind::Holds => format!("h+{who}-"),
            NodeKind::Read => format!("r+{who}-"),
            NodeKind::Write => format!("w+{who}-"),
            NodeKind::Permits(n) => format!("{n}+{who}-"),
        }
    }

    /// The kind and the escaped token (or owner) of a node name's first part.
    fn of(part: &str) -> (NodeKind, &str) {
        match part.split_once('+') {
            None => (NodeKind::Plain, part),
            Some(("h", rest)) => (NodeKind::Holds, rest),
            Some(("r", rest)) => (NodeKind::Read, rest),
            Some(("w", rest)) => (NodeKind::Write, rest),
            Some((n, rest)) => match n.parse() {
                Ok(n) => (NodeKind::Permits(n), rest),
                Err(_) => (NodeKind::Plain, part),
            },
        }
    }
}

/// A lock node's escaped token and sequence, from its name.
fn parse_child(name: &str) -> Option<(&str, i64)> {
    let (token, seq) = name.rsplit_once('-')?;
    if token.is_empty() || seq.is_empty() || !seq.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((token, seq.parse().ok()?))
}

/// A lock node's kind, escaped token (or owner) and sequence.
fn parse_node(name: &str) -> Option<(NodeKind, &str, i64)> {
    let (part, seq) = parse_child(name)?;
    let (kind, who) = NodeKind::of(part);
    Some((kind, who, seq))
}

/// The lock nodes of a directory listing, lowest sequence (the holder) first.
fn in_line(children: &[String]) -> Vec<(i64, &str)> {
    let mut line: Vec<(i64, &str)> = children
        .iter()
        .filter_map(|c| parse_child(c).map(|(_, seq)| (seq, c.as_str())))
        .collect();
    line.sort_unstable();
    line
}

/// Parses `10s`, `1500ms`, `2m` or a bare number of milliseconds.
fn parse_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    let (num, unit) = match s.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => s.split_at(i),
        None => (s, "ms"),
    };
    let n: u64 = num.parse().ok()?;
    match unit {
        "ms" => Some(Duration::from_millis(n)),
        "s" => Some(Duration::from_secs(n)),
        "m" => Some(Duration::from_secs(n.checked_mul(60)?)),
        _ => None,
    }
}

/// `zk://user:password@…` with the password hidden.
pub fn redact(url: &str) -> String {
    crate::backend::redact_url(url)
}

/// What a `zk://` URL says.
#[derive(Debug, PartialEq, Eq)]
struct Url {
    hosts: String,
    chroot: String,
    auth: Option<String>,
    session_timeout: Duration,
}

fn parse_url(url: &str) -> Result<Url> {
    let bad = |why: &str| {
        Error::invalid(format!(
            "bad ZooKeeper URL {:?}: {why}; expected \
             zk://[user:password@]host:port[,host:port…][/chroot][?session_timeout=10s]",
            redact(url)
        ))
    };
    let rest = url.strip_prefix("zk://").ok_or_else(|| bad("not zk://"))?;
    let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
    let (authority, chroot) = match rest.find('/') {
        Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
        None => (rest, ""),
    };
    let (auth, hosts) = match authority.rsplit_once('@') {
        Some((auth, hosts)) => {
            if !auth.contains(':') {
                return Err(bad("the user needs a password (user:password@)"));
            }
            (Some(auth.to_owned()), hosts)
        }
        None => (None, authority),
    };
    if hosts.is_empty()
        || hosts.split(',').any(|h| {
            h.rsplit_once(':')
                .is_none_or(|(host, port)| host.is_empty() || port.parse::<u16>().is_err())
        })
    {
        return Err(bad("every host needs a port"));
    }
    if chroot
        .split('/')
        .skip(1)
        .any(|c| c.is_empty() || c == "." || c == "..")
    {
        return Err(bad("the chroot must be a plain absolute path"));
    }
    let mut session_timeout = DEFAULT_SESSION_TIMEOUT;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("session_timeout", v)) => {
                session_timeout = parse_duration(v)
                    .filter(|d| !d.is_zero() && *d <= Duration::from_secs(600))
                    .ok_or_else(|| bad("session_timeout must be 1ms..10m, e.g. 10s"))?;
            }
            // The parameter's name only: its value could be a secret.
            _ => {
                let name = pair.split_once('=').map_or(pair, |(name, _)| name);
                return Err(bad(&format!("unknown parameter {name:?}")));
            }
        }
    }
    Ok(Url {
        hosts: hosts.to_owned(),
        chroot: chroot.to_owned(),
        auth,
        session_timeout,
    })
}

impl ZooKeeper {
    /// Connects to `zk://[user:password@]host:port[,host:port…][/chroot][?session_timeout=D]`
    /// and opens a session (asking for `session_timeout`, 10 s by default; the ensemble
    /// may grant another within its `minSessionTimeout..maxSessionTimeout`). The chroot is
    /// created when missing. With `user:password`, the session adds that digest identity
    /// and creates nodes readable and writable only by it.
    ///
    /// # Errors
    /// `InvalidArgument` for a malformed URL; `Unavailable` if no server answers; `Backend`
    /// for a refused identity or chroot.
    pub async fn connect(url: &str) -> Result<ZooKeeper> {
        let parsed = parse_url(url)?;
        let session = open_session(&parsed, &redact(url)).await?;
        let reaper = Arc::new(Reaper::default());
        let zk = ZooKeeper {
            inner: Arc::new(Inner {
                hosts: parsed.hosts,
                chroot: parsed.chroot,
                auth: parsed.auth,
                requested: parsed.session_timeout,
                shown: redact(url),
                session: RwLock::new(session),
                renewing: tokio::sync::Mutex::new(()),
                places: Mutex::default(),
                unsure: Mutex::default(),
                wakes: Wakes::default(),
                records: Watches::default(),
                reaper,
                watches_fired: AtomicU64::new(0),
                told_short_ttl: AtomicBool::new(false),
                engine: Engine::new(),
            }),
        };
        tokio::spawn(reap(Arc::downgrade(&zk.inner)));
        Ok(zk)
    }

    /// The session timeout the ensemble granted. It bounds every hold of this client two
    /// ways, whatever the ttl asked for:
    ///
    /// * a hold counts on at most two thirds of it from each renewal
    ///   ([`LockGuard::lease`](crate::LockGuard::lease) is `min(ttl, ⅔ session timeout)`);
    /// * a holder that crashes, is killed or loses the ensemble keeps its locks until its
    ///   session expires: **this long** after it was last heard from (plus up to one
    ///   server tick), not `ttl`. A ttl shorter than the session timeout is honoured
    ///   while the holder lives (a guard forgotten or left without its watchdog is
    ///   deleted by this client when its lease ends), but not by a crashed holder: the
    ///   client logs a warning (once) when asked for one. For the ttl to be the crash bound
    ///   too, connect with `?session_timeout=` no longer than the ttl (`dlock run` and
    ///   `dlock elect` do: their `--ttl` is the session timeout).
    pub fn session_timeout(&self) -> Duration {
        self.current().timeout
    }

    /// Reports, once per client, a ttl its session cannot honour for a crashed holder.
    fn note_ttl(&self, ttl: Duration) {
        let session = self.current().timeout;
        if ttl < session && !self.inner.told_short_ttl.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                url = %self.inner.shown,
                ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
                session_timeout_ms = u64::try_from(session.as_millis()).unwrap_or(u64::MAX),
                "a ttl shorter than the zookeeper session timeout: a holder that crashes \
                 keeps its locks until its session expires (the session timeout), not the \
                 ttl; connect with ?session_timeout= no longer than the ttl"
            );
        }
    }

    /// The current session's id.
    pub fn session_id(&self) -> i64 {
        self.current().id
    }

    /// How many node watches fired for this client's waiters (each a deletion of the node
    /// in front of one): with one waiter woken per release, one per hand-over.
    pub fn watches_fired(&self) -> u64 {
        self.inner.watches_fired.load(Ordering::Relaxed)
    }

    /// How many elections' records this client watches: one store watch per election,
    /// however many of its observers are on this client.
    pub fn records_watched(&self) -> usize {
        self.inner.records.open()
    }

    /// The client of the current session (for tests and tools: reads, faults).
    pub fn client(&self) -> zk::Client {
        self.current().client
    }

    /// One release attempt (see [`RawLock::release`]).
    async fn release_once(&self, keys: &LockKeys, token: &Token) -> Result<bool> {
        let s = self.live().await?;
        let prefix = node_prefix(&dir_path(keys), token);
        let node = self.our_node(&s, keys, token).await?;
        self.unsure().remove(&prefix);
        if let Some(p) = self.places().remove(&prefix) {
            p.moved.notify_one();
        }
        let Some(node) = node else {
            return Ok(false);
        };
        if node.kind == NodeKind::Holds {
            // A reentrant owner's node: this token's hold only.
            return self.release_hold(&s, &node, token).await;
        }
        match self
            .call("releasing", s.client.delete(&node.node, None))
            .await
        {
            Ok(()) => {
                self.inner.reaper.remove(&node.node);
                Ok(true)
            }
            Err(e) if is(&e, &zk::Error::NoNode) => {
                self.inner.reaper.remove(&node.node);
                Ok(false)
            }
            // Outcome unknown: the node stays due for deletion by this client at its
            // lease's end at the latest (and the release is tried again meanwhile).
            Err(e) => Err(e),
        }
    }

    /// Forgets `place`, this client's node for `prefix`, whose session ZooKeeper said
    /// expired (the current one, or an earlier one this client replaced because it had
    /// ended): the ensemble deleted it with its session.
    fn forget_expired(&self, prefix: &str, place: Option<Place>) {
        self.unsure().remove(prefix);
        let removed = self.places().remove(prefix);
        if let Some(place) = removed.or(place) {
            self.inner.reaper.remove(&place.node);
            place.moved.notify_one();
        }
    }

    /// Tries a failed release again in the background, every 200 ms for two session
    /// timeouts, until ZooKeeper answers: `attempt` is one release (its node found by
    /// token or owner), made anew for each try.
    fn retry_release<F, Fut>(&self, attempt: F)
    where
        F: Fn(ZooKeeper) -> Fut + Send + 'static,
        Fut: Future<Output = Result<bool>> + Send,
    {
        let zk = self.clone();
        let policy = Repeat::every(FOLLOW_RETRY, self.current().timeout * 2);
        background::retry(policy, move || attempt(zk.clone()));
    }

    fn current(&self) -> Session {
        self.inner
            .session
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The current session, a new one if the ensemble said it expired.
    async fn live(&self) -> Result<Session> {
        let s = self.current();
        if !s.client.state().is_terminated() {
            return Ok(s);
        }
        let _one = self.inner.renewing.lock().await;
        let now = self.current();
        if now.id != s.id && !now.client.state().is_terminated() {
            return Ok(now);
        }
        let url = Url {
            hosts: self.inner.hosts.clone(),
            chroot: self.inner.chroot.clone(),
            auth: self.inner.auth.clone(),
            session_timeout: self.inner.requested,
        };
        let fresh = open_session(&url, &self.inner.shown).await?;
        tracing::debug!(
            old = s.id,
            new = fresh.id,
            "zookeeper session expired; new session"
        );
        *self
            .inner
            .session
            .write()
            .unwrap_or_else(PoisonError::into_inner) = fresh.clone();
        // Holds and places of the old session ended with it.
        let old: Vec<Place> = {
            let mut places = self.places();
            let gone: Vec<String> = places
                .iter()
                .filter(|(_, p)| p.session == s.id)
                .map(|(k, _)| k.clone())
                .collect();
            gone.iter().filter_map(|k| places.remove(k)).collect()
        };
        for p in old {
            self.inner.reaper.remove(&p.node);
            p.moved.notify_one();
        }
        Ok(fresh)
    }

    /// Runs one request, bounded in time; an expired session is noted for the next call.
    async fn call<T>(
        &self,
        doing: &str,
        request: impl Future<Output = std::result::Result<T, zk::Error>>,
    ) -> Result<T> {
        match tokio::time::timeout(CALL_TIMEOUT, request).await {
            Ok(r) => r.map_err(|e| map_err(e, doing)),
            Err(_) => Err(Error::new(
                ErrorKind::TimedOut,
                format!("{doing}: ZooKeeper did not answer in time"),
            )
            .retryable(true)),
        }
    }

    fn places(&self) -> std::sync::MutexGuard<'_, HashMap<String, Place>> {
        self.inner
            .places
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn unsure(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.inner
            .unsure
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn place(&self, prefix: &str) -> Option<Place> {
        self.places().get(prefix).cloned()
    }

    /// Records our node for `prefix`, telling its waiter's task if it changed.
    fn placed(&self, prefix: &str, place: Place) -> Place {
        let mut places = self.places();
        let moved = places
            .get(prefix)
            .map_or_else(|| Arc::new(Notify::new()), |p| Arc::clone(&p.moved));
        let changed = places.get(prefix).is_none_or(|p| p.node != place.node);
        let place = Place { moved, ..place };
        places.insert(prefix.to_owned(), place.clone());
        if changed {
            place.moved.notify_one();
        }
        place
    }

    /// The directory's children (none if it is missing).
    async fn children(&self, s: &Session, dir: &str) -> Result<Vec<String>> {
        match self
            .call("reading a lock's queue", s.client.list_children(dir))
            .await
        {
            Err(e) if is(&e, &zk::Error::NoNode) => Ok(Vec::new()),
            other => other,
        }
    }

    /// Our node for `token` in `dir` as the server has it, looked up by name (a create
    /// whose reply was lost, a holder in another process): its path, sequence, creation
    /// zxid and session.
    async fn find(&self, s: &Session, dir: &str, token: &Token) -> Result<Option<Place>> {
        let children = self.children(s, dir).await?;
        let want = escape(token.as_str());
        let Some((seq, name)) = in_line(&children).into_iter().find(|(_, name)| {
            parse_node(name).is_some_and(|(k, t, _)| t == want && k != NodeKind::Holds)
        }) else {
            return Ok(None);
        };
        let kind = parse_node(name).map_or(NodeKind::Plain, |(k, _, _)| k);
        let node = format!("{dir}/{name}");
        let Some(stat) = self
            .call("reading a lock node", s.client.check_stat(&node))
            .await?
        else {
            return Ok(None);
        };
        Ok(Some(Place {
            node,
            kind,
            seq,
            czxid: stat.czxid,
            session: stat.ephemeral_owner,
            ttl: Duration::ZERO,
            moved: Arc::new(Notify::new()),
        }))
    }

    /// Creates a node `<dir>/<name><seq>` holding `data` (and `dir` first if it is
    /// missing).
    async fn create(
        &self,
        s: &Session,
        dir: &str,
        name: &str,
        data: &str,
    ) -> Result<(String, i64, i64)> {
        let prefix = format!("{dir}/{name}");
        let acls = self.acls();
        let node_options = zk::CreateMode::EphemeralSequential.with_acls(acls);
        let dir_options = zk::CreateMode::Container.with_acls(acls);
        for _ in 0..3 {
            self.unsure().insert(prefix.clone());
            let created = self
                .call(
                    "creating a lock node",
                    s.client.create(&prefix, data.as_bytes(), &node_options),
                )
                .await;
            match created {
                Ok((stat, seq)) => {
                    self.unsure().remove(&prefix);
                    return Ok((format!("{prefix}{seq}"), seq.into_i64(), stat.czxid));
                }
                Err(e) if is(&e, &zk::Error::NoNode) => {
                    self.unsure().remove(&prefix);
                    match self
                        .call(
                            "creating a lock's directory",
                            s.client.create(dir, &[], &dir_options),
                        )
                        .await
                    {
                        Ok(_) => {}
                        Err(e) if is(&e, &zk::Error::NodeExists) => {}
                        Err(e) => return Err(e),
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Err(Error::new(
            ErrorKind::Unavailable,
            "creating a lock node: its directory kept vanishing",
        )
        .retryable(true))
    }

    fn acls(&self) -> zk::Acls<'static> {
        if self.inner.auth.is_some() {
            zk::Acls::creator_all()
        } else {
            zk::Acls::anyone_all()
        }
    }

    /// Our node for `token`: the one this session made, else one found by name.
    async fn our_node(&self, s: &Session, keys: &LockKeys, token: &Token) -> Result<Option<Place>> {
        let dir = dir_path(keys);
        let prefix = node_prefix(&dir, token);
        match self.place(&prefix) {
            Some(p) if p.session == s.id => Ok(Some(p)),
            _ => self.find(s, &dir, token).await,
        }
    }

    /// An attempt found `place` waiting: a turn found for an older node of this waiter
    /// (one that went with a session, or was deleted by an operator, and was replaced by
    /// `place`) is void — its fence is below `place`'s creation zxid.
    fn void_older_grants(&self, prefix: &str, place: &Place) {
        self.inner.wakes.raise_floor(
            &prefix.to_owned(),
            u64::try_from(place.czxid - 1).unwrap_or(0),
        );
    }

    /// Deletes, in the background, nodes in `line` (of `dir`) that carry our token `who`
    /// but are not `keep`: a create whose reply was lost may have been applied after we
    /// looked for it, leaving a second node of ours that nobody would delete.
    fn drop_ghosts(&self, s: &Session, dir: &str, line: &[(i64, &str)], who: &str, keep: i64) {
        let ghosts: Vec<String> = line
            .iter()
            .filter(|(seq, name)| {
                *seq != keep
                    && parse_node(name).is_some_and(|(k, w, _)| w == who && k != NodeKind::Holds)
            })
            .map(|(_, name)| format!("{dir}/{name}"))
            .collect();
        if ghosts.is_empty() {
            return;
        }
        let client = s.client.clone();
        background::spawn(async move {
            for node in ghosts {
                tracing::debug!(node, "deleting a second node of one request (a lost reply)");
                let _ = tokio::time::timeout(CALL_TIMEOUT, client.delete(&node, None)).await;
            }
        });
    }

    /// Hands the waiter of `prefix` the grant: its turn came.
    fn grant_turn(&self, prefix: &str, place: &Place) {
        if place.session != self.current().id {
            return; // the node went with an old session
        }
        let prefix = prefix.to_owned();
        if self.inner.wakes.contains(&prefix) {
            let ttl = self.lease(place.ttl, place.session);
            self.inner
                .reaper
                .set(&place.node, place.session, Instant::now() + ttl);
            self.inner
                .wakes
                .offer(&prefix, u64::try_from(place.czxid).unwrap_or(0));
        }
    }

    /// The lease of a hold asked for `ttl` in a session: the shorter of the two.
    fn lease(&self, ttl: Duration, _session: i64) -> Duration {
        ttl.min(session_lease(self.current().timeout))
    }

    /// Whether our node `node` still exists (one read). The node in front of a waiter
    /// goes either by itself (a release, its session's end) or with the waiter's own — an
    /// operator's `deleteall`, one multi-op — and only in the first case is it the
    /// waiter's turn; in the second it queues again. A failed read says no: the waiter's
    /// task looks again.
    async fn still_there(&self, s: &Session, node: &str) -> bool {
        matches!(
            self.call("reading our lock node", s.client.check_stat(node))
                .await,
            Ok(Some(_))
        )
    }
}

/// A waiter's node as the engine's follower sees it: the node in front is watched (a
/// reader: the nearest writer's, for its deletion or its downgrade; a semaphore's waiter:
/// the directory's children and data), our node kept from this client's reaper while it
/// waits.
struct Follow {
    zk: ZooKeeper,
    /// The lock's directory.
    dir: String,
    /// Our node's prefix.
    prefix: String,
    /// The session of the last look.
    session: Option<Session>,
    /// A semaphore waiter's last look at its directory: (children version, data version).
    seen: Option<Option<(i32, i32)>>,
}

impl Recipe for Follow {
    type Place = Place;
    /// The node's path.
    type Id = String;

    fn place(&self) -> Option<Place> {
        self.zk.place(&self.prefix)
    }

    fn id(place: &Place) -> String {
        place.node.clone()
    }

    fn moved(place: &Place) -> Arc<Notify> {
        Arc::clone(&place.moved)
    }

    /// A third of the node's lease.
    fn keep_period(&self) -> Duration {
        self.place().map_or(Duration::from_secs(1), |p| {
            self.zk.lease(p.ttl, p.session) / 3
        })
    }

    async fn look(&mut self, place: &Place) -> Look {
        let s = self.zk.current();
        self.session = Some(s.clone());
        if place.session != s.id {
            // Our node went with an old session: the waiter's next attempt queues anew.
            return Look::Gone;
        }
        // A missing directory (an operator's `deleteall`) lists as empty: our node is
        // gone, and the waiter queues again.
        let Ok(children) = self.zk.children(&s, &self.dir).await else {
            return Look::Failed;
        };
        let line = in_line(&children);
        if !line.iter().any(|(seq, _)| *seq == place.seq) {
            // Our node is gone (deleted by an operator): requeue.
            return Look::Gone;
        }
        let fired = self.zk.clone();
        match blocker(&line, place) {
            Blocker::Turn => Look::Turn { ours: true },
            Blocker::Node { name, only } if place.kind == NodeKind::Read => {
                // A reader waits for a writer's node: its deletion, or its writer
                // downgrading (the node's data becomes `r`).
                let node = format!("{}/{name}", self.dir);
                match self
                    .zk
                    .call(
                        "watching the writer ahead",
                        s.client.get_and_watch_data(&node),
                    )
                    .await
                {
                    Ok((data, _, w)) => Look::Ahead {
                        watch: Box::pin(async move { fired.heard(w.changed().await, true) }),
                        only,
                        // Downgraded already: the reader may come in.
                        wake: data == b"r",
                    },
                    Err(e) if is(&e, &zk::Error::NoNode) => Look::Again,
                    Err(_) => Look::Failed,
                }
            }
            Blocker::Node { name, only } => {
                let node = format!("{}/{name}", self.dir);
                match self
                    .zk
                    .call(
                        "watching the waiter ahead",
                        s.client.check_and_watch_stat(&node),
                    )
                    .await
                {
                    Ok((Some(_), w)) => Look::Ahead {
                        watch: Box::pin(async move { fired.heard(w.changed().await, false) }),
                        only,
                        wake: false,
                    },
                    // Gone already: look again.
                    Ok((None, _)) => Look::Again,
                    Err(_) => Look::Failed,
                }
            }
            Blocker::Any => {
                // A semaphore waiter: any release below, or a new permit count, may let
                // it in — it watches the directory's children and data and attempts when
                // either changes.
                let kids = s.client.list_and_watch_children(&self.dir);
                let data = s.client.check_and_watch_stat(&self.dir);
                match (
                    self.zk.call("watching a semaphore", kids).await,
                    self.zk.call("watching a semaphore", data).await,
                ) {
                    (Ok((_, a)), Ok((stat, b))) => {
                        // A change since the last watches fired (between the event and
                        // these watches) wakes the waiter again: its attempt may have
                        // come before it.
                        let now = Some(stat.map(|st| (st.cversion, st.version)));
                        let changed = self.seen.is_some() && self.seen != now;
                        self.seen = now;
                        Look::Ahead {
                            watch: Box::pin(async move {
                                let event = tokio::select! {
                                    e = a.changed() => e,
                                    e = b.changed() => e,
                                };
                                if event.event_type != zk::EventType::Session {
                                    fired.inner.watches_fired.fetch_add(1, Ordering::Relaxed);
                                }
                                Fired::Wake
                            }),
                            only: false,
                            wake: changed,
                        }
                    }
                    _ => Look::Failed,
                }
            }
        }
    }

    /// Our node is still the waiter's, in this session.
    async fn confirm(&self, place: &Place) -> bool {
        let Some(s) = &self.session else {
            return false;
        };
        self.zk
            .place(&self.prefix)
            .is_some_and(|p| p.node == place.node)
            && self.zk.still_there(s, &place.node).await
    }

    fn grant(&self, place: &Place) {
        self.zk.grant_turn(&self.prefix, place);
    }

    /// Still waiting: our node stays (see `acquire`). Once handed over, the hold's own
    /// renewals keep it, or its lease ends.
    async fn keep(&self, place: &Place, told: bool) -> bool {
        if !told {
            let until = Instant::now() + self.zk.lease(place.ttl, place.session);
            self.zk.inner.reaper.push(&place.node, until);
        }
        true
    }
}

impl ZooKeeper {
    /// What a node watch's `event` means to a waiter (`reader`: one waiting for a writer's
    /// node, which also lets it in by downgrading).
    fn heard(&self, event: zk::WatchedEvent, reader: bool) -> Fired {
        match event.event_type {
            zk::EventType::NodeDeleted => {
                self.inner.watches_fired.fetch_add(1, Ordering::Relaxed);
                Fired::Deleted
            }
            // The writer in front downgraded to a reader: try again.
            zk::EventType::NodeDataChanged if reader => Fired::Wake,
            // Session expired or closed: the waiter's next attempt tells.
            zk::EventType::Session => Fired::Lost { wake: true },
            _ => Fired::Other,
        }
    }
}

/// What a waiting node waits for.
enum Blocker<'a> {
    /// Nothing: its turn came.
    Turn,
    /// The deletion of this node (the one just before it, or a reader's nearest writer
    /// before it); `only`: no other node before it blocks it.
    Node { name: &'a str, only: bool },
    /// Any change below it (a semaphore's waiter).
    Any,
}

/// What `place` waits for in `line`: a plain lock's, a reentrant owner's or a writer's
/// node the node just before it; a reader's the nearest writer's node before it; a
/// semaphore's waiter any change.
fn blocker<'a>(line: &[(i64, &'a str)], place: &Place) -> Blocker<'a> {
    let lower = line.iter().filter(|(seq, _)| *seq < place.seq);
    let ahead: Vec<&'a str> = match place.kind {
        NodeKind::Permits(_) => return Blocker::Any,
        NodeKind::Read => lower
            .filter(|(_, name)| parse_node(name).is_some_and(|(k, _, _)| k == NodeKind::Write))
            .map(|(_, name)| *name)
            .collect(),
        NodeKind::Plain | NodeKind::Holds | NodeKind::Write => {
            lower.map(|(_, name)| *name).collect()
        }
    };
    match ahead.last() {
        None => Blocker::Turn,
        Some(name) => Blocker::Node {
            name,
            only: ahead.len() == 1,
        },
    }
}

/// Opens a session as `url` says, creating its chroot if missing.
async fn open_session(url: &Url, shown: &str) -> Result<Session> {
    let mut connector = zk::Client::connector()
        .with_session_timeout(url.session_timeout)
        .with_connection_timeout(CALL_TIMEOUT)
        .with_fail_eagerly();
    if let Some(auth) = &url.auth {
        connector = connector.with_auth("digest", auth.as_bytes());
    }
    let connecting = connector.connect(&url.hosts);
    let client = tokio::time::timeout(CALL_TIMEOUT + url.session_timeout, connecting)
        .await
        .map_err(|_| {
            Error::new(
                ErrorKind::Unavailable,
                format!("no ZooKeeper server of {shown} answered in time"),
            )
            .retryable(true)
        })?
        .map_err(|e| map_err(e, &format!("connecting to ZooKeeper at {shown}")))?;
    let client = if url.chroot.is_empty() {
        client
    } else {
        let acls = if url.auth.is_some() {
            zk::Acls::creator_all()
        } else {
            zk::Acls::anyone_all()
        };
        let options = zk::CreateMode::Persistent.with_acls(acls);
        tokio::time::timeout(CALL_TIMEOUT, client.mkdir(&url.chroot, &options))
            .await
            .map_err(|_| Error::new(ErrorKind::TimedOut, "creating the chroot: no answer"))?
            .map_err(|e| map_err(e, &format!("creating the chroot {:?}", url.chroot)))?;
        client
            .chroot(url.chroot.clone())
            .map_err(|_| Error::invalid(format!("bad chroot {:?}", url.chroot)))?
    };
    Ok(Session {
        id: client.session_id().0,
        timeout: client.session_timeout(),
        client,
    })
}

/// Deletes granted nodes whose lease ran out without a renewal (a guard forgotten, or
/// held without the watchdog, in a process that keeps the session).
async fn reap(inner: Weak<Inner>) {
    loop {
        let (reaper, next) = {
            let Some(inner) = inner.upgrade() else { return };
            let reaper = Arc::clone(&inner.reaper);
            let due = reaper.due();
            let next = due.values().map(|(_, at)| *at).min();
            *reaper
                .planned
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = next;
            drop(due);
            (reaper, next)
        };
        let wait = async {
            match next {
                Some(at) => tokio::time::sleep_until(at).await,
                // Wake now and then to notice the client is gone.
                None => tokio::time::sleep(Duration::from_secs(1)).await,
            }
        };
        tokio::select! {
            () = wait => {}
            () = reaper.changed.notified() => continue,
        }
        let Some(inner) = inner.upgrade() else { return };
        let zk = ZooKeeper { inner };
        let now = Instant::now();
        let due: Vec<(String, i64)> = reaper
            .due()
            .iter()
            .filter(|(_, (_, at))| *at <= now)
            .map(|(node, (session, _))| (node.clone(), *session))
            .collect();
        let s = zk.current();
        for (node, session) in due {
            {
                // Renewed meanwhile?
                let mut map = reaper.due();
                match map.get(&node) {
                    Some((_, at)) if *at <= Instant::now() => {
                        map.remove(&node);
                    }
                    _ => continue,
                }
            }
            if session != s.id {
                continue; // went with its session
            }
            tracing::debug!(
                node,
                "lease ran out without a renewal; deleting the lock node"
            );
            zk.places().retain(|_, p| {
                let keep = p.node != node;
                if !keep {
                    p.moved.notify_one();
                }
                keep
            });
            match zk
                .call("deleting a lapsed lock node", s.client.delete(&node, None))
                .await
            {
                Ok(()) => {}
                Err(e) if is(&e, &zk::Error::NoNode) => {}
                // Try again soon (the session may be cut off; then it expires anyway).
                Err(_) => reaper.set(&node, session, Instant::now() + FOLLOW_RETRY),
            }
        }
    }
}

impl RawLock for ZooKeeper {
    const QUEUES_WAITERS: bool = true;

    async fn acquire(&self, keys: &LockKeys, token: &Token, ttl: Duration) -> Result<Acquire> {
        let started = Instant::now();
        let s = self.live().await?;
        self.note_ttl(ttl);
        let dir = dir_path(keys);
        let prefix = node_prefix(&dir, token);
        let known = self.place(&prefix).filter(|p| p.session == s.id);
        let mut place = match known {
            Some(p) => p,
            None => {
                let found = if self.unsure().contains(&prefix) {
                    let found = self
                        .find(&s, &dir, token)
                        .await?
                        .filter(|p| p.session == s.id);
                    self.unsure().remove(&prefix);
                    found
                } else {
                    None
                };
                match found {
                    Some(p) => p,
                    None => {
                        let name = NodeKind::Plain.name(token.as_str());
                        let (node, seq, czxid) =
                            self.create(&s, &dir, &name, token.as_str()).await?;
                        Place {
                            node,
                            kind: NodeKind::Plain,
                            seq,
                            czxid,
                            session: s.id,
                            ttl,
                            moved: Arc::new(Notify::new()),
                        }
                    }
                }
            }
        };
        place.ttl = ttl;
        let mut place = self.placed(&prefix, place);
        let mut children = self.children(&s, &dir).await?;
        if !in_line(&children).iter().any(|(seq, _)| *seq == place.seq) {
            // Our waiting node is gone: deleted by an operator (`deleteall` takes the
            // directory too). Queue again, at the back of the line (`create` makes the
            // directory anew).
            let name = NodeKind::Plain.name(token.as_str());
            let (node, seq, czxid) = self.create(&s, &dir, &name, token.as_str()).await?;
            let again = Place {
                node,
                kind: NodeKind::Plain,
                seq,
                czxid,
                session: s.id,
                ttl,
                moved: Arc::new(Notify::new()),
            };
            place = self.placed(&prefix, again);
            children = self.children(&s, &dir).await?;
        }
        let line = in_line(&children);
        self.drop_ghosts(&s, &dir, &line, &escape(token.as_str()), place.seq);
        match line.first() {
            Some((seq, _)) if *seq == place.seq => {
                self.inner
                    .reaper
                    .set(&place.node, s.id, started + self.lease(ttl, s.id));
                Ok(Acquire::Acquired {
                    fence: u64::try_from(place.czxid).unwrap_or(0),
                })
            }
            _ if !line.iter().any(|(seq, _)| *seq == place.seq) => {
                // Our node vanished between create and list (an operator, or the session
                // expired): forget it; the next attempt creates another.
                self.places().remove(&prefix);
                Err(Error::new(
                    ErrorKind::Unavailable,
                    "acquiring: our lock node vanished as it was made",
                )
                .retryable(true))
            }
            _ => {
                self.void_older_grants(&prefix, &place);
                // A waiter's node lasts one lease past its latest attempt unless its
                // waiting task keeps it (every third of the lease): a waiter that stopped
                // waiting without withdrawing holds the queue up for one lease at most.
                self.inner
                    .reaper
                    .set(&place.node, s.id, started + self.lease(ttl, s.id));
                Ok(Acquire::Held {
                    // The holder's lease is not stored: its session's end is the
                    // fallback.
                    remaining: Some(s.timeout),
                })
            }
        }
    }

    /// Deletes our node for `token` (or takes its hold out of a reentrant owner's node).
    /// A failed release is tried again in the background: a node left behind would hold
    /// the lock for as long as our session lives. A release that finds the session of a
    /// node this client made expired reports it not held, and tries nothing again:
    /// ZooKeeper deleted the session's nodes with it.
    async fn release(&self, keys: &LockKeys, token: &Token) -> Result<bool> {
        let prefix = node_prefix(&dir_path(keys), token);
        let made_here = self.place(&prefix);
        match self.release_once(keys, token).await {
            Ok(released) => Ok(released),
            Err(err) if is(&err, &zk::Error::SessionExpired) && made_here.is_some() => {
                self.forget_expired(&prefix, made_here);
                tracing::debug!(
                    lock = keys.name(),
                    "releasing: the session that held the lock has expired; its node is gone"
                );
                Ok(false)
            }
            Err(err) => {
                let (keys, token) = (keys.clone(), token.clone());
                self.retry_release(move |zk| {
                    let (keys, token) = (keys.clone(), token.clone());
                    async move { zk.release_once(&keys, &token).await }
                });
                Err(err)
            }
        }
    }

    async fn extend(&self, keys: &LockKeys, token: &Token, ttl: Duration) -> Result<bool> {
        let s = self.live().await?;
        let Some(place) = self.our_node(&s, keys, token).await? else {
            return Ok(false);
        };
        if place.session != s.id {
            // Held, by another client's session: its lease is that session, which only
            // that client keeps alive.
            return Err(Error::invalid(format!(
                "lock {:?} is held by another ZooKeeper session; on ZooKeeper only the \
                 client that holds a lock can extend it (its session is the lease)",
                keys.name()
            )));
        }
        renew(self, &s, &place.node, ttl).await
    }

    fn extend_many(&self, renewals: &[Renewal]) -> impl Future<Output = Vec<Result<bool>>> + Send {
        let zk = self.clone();
        let renewals = renewals.to_vec();
        async move {
            let s = match zk.live().await {
                Ok(s) => s,
                Err(e) => {
                    return renewals
                        .iter()
                        .map(|_| Err(Error::new(e.kind(), e.to_string()).retryable(true)))
                        .collect();
                }
            };
            // Sent one after the other without waiting (the client writes each request
            // as it is made): one round trip for the batch, behind one `sync` through the
            // leader (see `session_lease`).
            let synced = s.client.sync("/");
            let mut pending = Vec::with_capacity(renewals.len());
            for r in &renewals {
                let prefix = node_prefix(&dir_path(&r.keys), &r.token);
                match zk.place(&prefix).filter(|p| p.session == s.id) {
                    Some(p) => {
                        let until = Instant::now() + zk.lease(r.ttl, s.id);
                        let live = zk.inner.reaper.push(&p.node, until);
                        pending.push(Some((live, s.client.check_stat(&p.node))));
                    }
                    None => pending.push(None),
                }
            }
            if let Err(e) = zk
                .call("renewing locks (sync with the leader)", synced)
                .await
            {
                return renewals
                    .iter()
                    .map(|_| Err(Error::new(e.kind(), e.to_string()).retryable(true)))
                    .collect();
            }
            let mut out = Vec::with_capacity(renewals.len());
            for (r, p) in renewals.iter().zip(pending) {
                out.push(match p {
                    Some((live, check)) => zk
                        .call("renewing a lock", check)
                        .await
                        .map(|stat| live && stat.is_some_and(|st| st.ephemeral_owner == s.id)),
                    // Not ours in this session: the one-by-one path finds out.
                    None => zk.extend(&r.keys, &r.token, r.ttl).await,
                });
            }
            out
        }
    }

    async fn watch_for(&self, keys: &LockKeys, token: &Token) -> Result<ReleaseWatch> {
        let (ready, first_look) = oneshot::channel();
        let dir = dir_path(keys);
        let prefix = node_prefix(&dir, token);
        let registration: Registration = self.inner.wakes.register(prefix.clone());
        let follow = Follow {
            zk: self.clone(),
            dir,
            prefix,
            session: None,
            seen: None,
        };
        let task = Following(tokio::spawn(follow::follow(
            follow,
            Arc::clone(registration.notify()),
            ready,
            FOLLOW_RETRY,
        )));
        let watch = registration.into_watch(Some(Box::new(task)));
        let _ = tokio::time::timeout(CALL_TIMEOUT, first_look).await;
        Ok(watch)
    }

    async fn abandon(&self, keys: &LockKeys, token: &Token, _ttl: Duration) -> Result<()> {
        self.release(keys, token).await.map(|_| ())
    }

    fn lease_validity(&self, ttl: Duration) -> Duration {
        ttl.min(session_lease(self.current().timeout))
    }

    fn store_id(&self) -> String {
        format!("zk:{}{}", self.inner.hosts, self.inner.chroot)
    }

    fn store_label(&self) -> &'static str {
        "zookeeper"
    }

    fn engine(&self) -> &Engine {
        &self.inner.engine
    }
}

/// Renews the lease of our node `node`: pushes its deadline first (so this client does
/// not delete it while the renewal is under way), then checks it is still there in our
/// session.
async fn renew(zk: &ZooKeeper, s: &Session, node: &str, ttl: Duration) -> Result<bool> {
    let live = zk
        .inner
        .reaper
        .push(node, Instant::now() + zk.lease(ttl, s.id));
    // Through the leader first (see `session_lease`), then the read, pipelined.
    let synced = s.client.sync("/");
    let check = s.client.check_stat(node);
    zk.call("renewing a lock (sync with the leader)", synced)
        .await?;
    let stat = zk.call("renewing a lock", check).await?;
    Ok(live && stat.is_some_and(|st| st.ephemeral_owner == s.id))
}

/// The part of a session timeout a hold may count on from a renewal's send time: two
/// thirds of it.
///
/// A renewal is a `sync` (answered only through the leader, so a server cut off from the
/// leader cannot vouch for a node the leader may already have deleted) and an `exists`
/// read. The leader learns that the session is alive from its server's pings, which
/// carry the session's requests every half tick; if the link between them breaks just
/// after a renewal's `sync`, the leader may have heard only of the renewal before it,
/// sent a third of a lease earlier. The session then lives until at least that send time
/// plus the session timeout, which a lease of two thirds of the timeout leaves room for
/// (with the watchdog renewing every third of it, and ticks shorter than half a lease).
fn session_lease(timeout: Duration) -> Duration {
    timeout * 2 / 3
}

/// The task behind a watch (a waiter's, or a record observer's), ended with the watch
/// (a waiter's registration goes with it too).
pub(super) struct Following(pub(super) tokio::task::JoinHandle<()>);

impl Drop for Following {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The fence is the holder node's creation zxid: cluster-wide, strictly increasing and
/// persisted, with the epoch of the leader that made it in its high half, so it survives
/// restarts and elections; the queue grants in creation order.
impl RawFencing for ZooKeeper {}

impl RawInspect for ZooKeeper {
    async fn inspect(&self, kind: Kind, keys: &LockKeys) -> Result<LockState> {
        match kind {
            Kind::Lock | Kind::Fair => self.inspect_plain(keys).await,
            Kind::Semaphore => self.inspect_permits(keys).await,
            Kind::Reentrant => self.inspect_reentrant(keys).await,
            Kind::RwLock => self.inspect_rw(keys).await,
        }
    }

    async fn force_unlock(&self, kind: Kind, keys: &LockKeys) -> Result<bool> {
        match kind {
            Kind::Lock | Kind::Fair => self.force_unlock_plain(keys).await,
            Kind::Semaphore => self.force_unlock_permits(keys).await,
            Kind::Reentrant => self.force_unlock_reentrant(keys).await,
            Kind::RwLock => self.force_unlock_rw(keys).await,
        }
    }

    async fn list(&self, prefix: &str, pattern: &str, limit: usize) -> Result<Vec<String>> {
        crate::observe::listed(self.store_label(), pattern, async move {
            if limit == 0 {
                return Ok(Vec::new());
            }
            let s = self.live().await?;
            let dirs = self
                .call("listing locks", s.client.list_children("/"))
                .await?;
            let candidates: Vec<(String, String)> = dirs
                .into_iter()
                // A name with a `-` is no lock's directory (`escape` never writes one): an
                // election's record, beside its lock's directory.
                .filter(|d| !d.contains('-'))
                .filter_map(|d| {
                    let key = unescape(&d)?;
                    let name = key.strip_prefix(prefix)?.to_owned();
                    (!name.is_empty()
                        && crate::backend::glob_match(pattern.as_bytes(), name.as_bytes()))
                    .then_some((d, name))
                })
                .collect();
            // One pipelined read per candidate: held while it has a lock node.
            let reads: Vec<_> = candidates
                .iter()
                .map(|(d, _)| s.client.list_children(&format!("/{d}")))
                .collect();
            let mut names = Vec::new();
            for ((_, name), read) in candidates.into_iter().zip(reads) {
                if let Ok(Ok(children)) = tokio::time::timeout(CALL_TIMEOUT, read).await
                    && !in_line(&children).is_empty()
                {
                    names.push(name);
                    if names.len() >= limit {
                        break;
                    }
                }
            }
            Ok(names)
        })
        .await
    }
}

/// The plain lock's inspection, for [`RawInspect`].
impl ZooKeeper {
    pub(crate) async fn inspect_plain(&self, keys: &LockKeys) -> Result<LockState> {
        let s = self.live().await?;
        let dir = dir_path(keys);
        let children = self.children(&s, &dir).await?;
        let line = in_line(&children);
        let Some((_, head)) = line.first() else {
            return Ok(LockState::new(None, None, None)
                .with_queued(0)
                .with_waiting_clients(0));
        };
        let fence = self
            .call(
                "reading a lock node",
                s.client.check_stat(&format!("{dir}/{head}")),
            )
            .await?
            .map(|st| u64::try_from(st.czxid).unwrap_or(0));
        let holder = parse_child(head).and_then(|(t, _)| unescape(t));
        let waiting = line.len() - 1;
        Ok(LockState::new(holder, None, fence)
            .with_queued(u32::try_from(waiting).unwrap_or(u32::MAX))
            .with_waiting_clients(waiting as u64))
    }

    pub(crate) async fn force_unlock_plain(&self, keys: &LockKeys) -> Result<bool> {
        let s = self.live().await?;
        let dir = dir_path(keys);
        for _ in 0..3 {
            let children = self.children(&s, &dir).await?;
            let Some((_, head)) = in_line(&children).first().copied() else {
                return Ok(false);
            };
            match self
                .call(
                    "force-unlocking",
                    s.client.delete(&format!("{dir}/{head}"), None),
                )
                .await
            {
                Ok(()) => return Ok(true),
                // Released meanwhile: look again.
                Err(e) if is(&e, &zk::Error::NoNode) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_escape_and_come_back() {
        for s in ["dlock:a", "a/b", "..", ".", "x-y%z", "ünï", "a b\u{1}"] {
            let e = escape(s);
            assert!(
                !e.contains('/') && !e.contains('-') && e != "." && e != "..",
                "{e}"
            );
            assert_eq!(unescape(&e).as_deref(), Some(s));
        }
        assert_eq!(escape("dlock:orders"), "dlock:orders");
    }

    #[test]
    fn children_parse_and_line_up() {
        assert_eq!(parse_child("abc-0000000012"), Some(("abc", 12)));
        assert_eq!(parse_child("abc-"), None);
        assert_eq!(parse_child("quota"), None);
        let kids = vec![
            "b-0000000010".to_owned(),
            "zookeeper".to_owned(),
            "a-0000000002".to_owned(),
        ];
        assert_eq!(
            in_line(&kids),
            vec![(2, "a-0000000002"), (10, "b-0000000010")]
        );
    }

    #[test]
    fn urls_parse_and_hide_passwords() {
        let u =
            parse_url("zk://u:secret@127.0.0.1:2181,127.0.0.1:2182/apps/locks?session_timeout=3s")
                .expect("valid");
        assert_eq!(u.hosts, "127.0.0.1:2181,127.0.0.1:2182");
        assert_eq!(u.chroot, "/apps/locks");
        assert_eq!(u.auth.as_deref(), Some("u:secret"));
        assert_eq!(u.session_timeout, Duration::from_secs(3));
        let plain = parse_url("zk://h:1").expect("valid");
        assert_eq!(
            (plain.chroot.as_str(), plain.session_timeout),
            ("", DEFAULT_SESSION_TIMEOUT)
        );
        for bad in [
            "zk://",
            "zk://h",
            "zk://u:pw@h",
            "zk://h:1/a//b",
            "zk://h:1?session_timeout=0s",
            "zk://h:1?ttl=1",
            "redis://h:1",
        ] {
            let err = parse_url(bad).expect_err(bad);
            assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{bad}");
        }
        let err = parse_url("zk://u:secret@h?x=1").expect_err("no port");
        assert!(!err.to_string().contains("secret"), "{err}");
        assert_eq!(redact("zk://u:secret@h:1/x"), "zk://u:***@h:1/x");
    }
}

/// Hostile input: URLs, and whatever node names a lock's directory holds.
#[cfg(test)]
mod props {
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(crate::backend::hostile::cases(48))]
        /// No name reaches another lock's nodes (DESIGN.md principle 9).
        #[test]
        fn distinct_locks_share_no_node(
            names in proptest::collection::vec(crate::keys::namespace::hostile_name(), 1..3)
        ) {
            let primitives = crate::keys::namespace::PRIMITIVES;
            crate::keys::namespace::check_disjoint(primitives, &names, super::key_set)?;
        }
    }

    use super::*;
    use crate::backend::hostile::{any_url, cases, check, url_with_password};

    #[test]
    fn odd_passwords_and_parameters_stay_hidden() {
        for (url, secret) in [
            ("zk://u:pa/ss!w@h:1", "pa/ss!w"),
            ("zk://u:pa?ss!w@h", "pa?ss!w"),
            ("zk://h:1?password=s3cret!", "s3cret!"),
            ("zk://h:1?digest=u:s3cret!", "s3cret!"),
        ] {
            let err = parse_url(url).expect_err(url);
            assert!(!format!("{err} {err:?}").contains(secret), "{err:?}");
        }
    }

    proptest! {
        #![proptest_config(cases(256))]

        #[test]
        fn any_string_parses_or_is_invalid(url in any_url(&["zk"])) {
            let parsed = parse_url(&url);
            check(&parsed, "")?;
            if let Ok(u) = parsed {
                prop_assert!(!u.hosts.is_empty());
                prop_assert!(u.chroot.is_empty() || u.chroot.starts_with('/'));
                prop_assert!(!u.session_timeout.is_zero());
            }
        }

        #[test]
        fn passwords_never_reach_errors((url, secret) in url_with_password(&["zk"])) {
            check(&parse_url(&url), &secret)?;
        }

        #[test]
        fn session_timeouts_parse_or_are_refused(text in prop_oneof![any::<String>(), "[0-9]{0,22}(ms|s|m|h|)"]) {
            // Never panics (overflowing minutes included); digits alone are milliseconds
            // (a sign is not a digit: `+5` is refused, though Rust's own parser takes it).
            let parsed = parse_duration(&text);
            let digits = text.trim();
            if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
                match digits.parse::<u64>() {
                    Ok(ms) => prop_assert_eq!(parsed, Some(Duration::from_millis(ms))),
                    Err(_) => prop_assert_eq!(parsed, None),
                }
            } else if digits.starts_with(['+', '-']) {
                prop_assert_eq!(parsed, None);
            }
        }

        #[test]
        fn names_round_trip(s in any::<String>()) {
            let e = escape(&s);
            prop_assert!(!e.contains(['/', '-']) && e != "." && e != "..", "{}", e);
            prop_assert_eq!(unescape(&e), Some(s));
        }

        #[test]
        fn any_node_name_parses_or_is_skipped(
            name in prop_oneof![any::<String>(), "([0-9]{1,12}|h|r|w|x)?\\+?[a-z%0-9]{0,6}-[0-9]{0,20}"],
        ) {
            let _ = unescape(&name);
            if let Some((kind, who, seq)) = parse_node(&name) {
                prop_assert!(seq >= 0);
                // A name dlock makes of the same kind and holder comes back the same.
                let made = format!("{}{:010}", kind.name(&unescape(who).unwrap_or_default()), seq);
                if unescape(who).is_some_and(|w| escape(&w) == who) {
                    prop_assert_eq!(parse_node(&made), Some((kind, who, seq)));
                }
            }
            let children = vec![name.clone(), "zookeeper".to_owned()];
            let line = in_line(&children);
            prop_assert!(line.len() <= 1);
        }
    }
}
