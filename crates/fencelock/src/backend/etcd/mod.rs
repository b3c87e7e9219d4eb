//! etcd: a linearizable lock whose waiters queue in revision order (etcd's own concurrency
//! recipe), with the holder's queue position as the fence; and the whole lock family
//! (semaphore, reentrant, read-write and fair lock) as recipes over the same queue (see
//! `family.rs`).
//!
//! # Layout
//!
//! Every client that wants the lock at key `K` (prefix + name) puts a key of its own,
//! `K/<token>`, holding its token and attached to its client's session lease (below). The
//! live key under
//! `K/` with the lowest create revision holds the lock; the others wait behind it in
//! create-revision order. Keys whose rest after `K/` contains another `/` belong to other
//! locks (the queue of `K/x`) and are ignored. Nothing is stored at `K` itself. etcd's own
//! lock recipe (`concurrency.Mutex`, behind `etcdctl lock K` and etcd's lock service)
//! queues keys `K/<lease id in hex>` under the same rule, so it and dlock exclude each other
//! on one name and share one queue (tested against etcd's lock service).
//! Older dlock versions held the lock at `K` itself: the two layouts do not exclude each
//! other, so every client of a name must move to this version together.
//!
//! # Session leases
//!
//! Like etcd's own `concurrency.Session`, a client ([`Etcd`] and its clones) puts every
//! key it writes — holders' and waiters' keys of every lock and primitive — on ONE lease
//! per ttl (in whole seconds): its session lease of that ttl, granted by the first
//! attempt that needs it and kept alive by every attempt, every renewal of a hold (the
//! engine's one renewal batch sends one keep-alive per session lease) and every waiter's
//! task. So an acquisition puts a key and a release deletes one: no lease is granted or
//! revoked per acquisition. Keys of different ttls are on different leases, so a key never
//! lives longer than its own ttl after its client stops renewing: a crashed client's keys
//! go with its session leases, each at its ttl. A client that holds and waits for nothing
//! stops renewing its session leases, and they run out at their ttl (the next attempt
//! grants a new one). A key the client no longer renews (a hold whose guard was
//! forgotten) would live on while its other keys keep the lease alive: before each
//! keep-alive of a session lease the client deletes its keys on it whose ttl ran out since
//! their last attempt or renewal (each compared on the mod revision of its last write, so
//! never a key written since), so such a key goes within about one ttl after it was due.
//! A session lease that lapses (its client cut off from etcd for its
//! ttl, an operator revoking it) takes every key of that client on it: each of those holds
//! is lost (`lost()` fires on each, at its next renewal at the latest) and each waiter
//! re-queues at the back — correct, since etcd deleted every one of those keys. A write
//! that got no answer (an attempt cut off, a release whose outcome is unknown) may still
//! put its key back later: its lease is then retired — no new key goes on it — and revoked
//! once no other key this client knows of is on it, which takes whatever such a write
//! left with it.
//!
//! # Operations
//!
//! * **Acquire** (one attempt, one round trip of etcd's time, two calls sent together):
//!   (1) a keep-alive of the client's session lease of the ttl (whole seconds, rounded up),
//!   which restarts its whole ttl — a lease is granted (`LeaseGrant`) only when the client
//!   has none of that ttl or it ran out; (2) ONE transaction that puts our key with our
//!   token on that lease and reads the queue at the same revision. If the transaction
//!   finds the lease gone, or the keep-alive does (the key then went with it), the attempt
//!   tries again on a new lease. A key that exists keeps its create revision (its place); a
//!   key that vanished (its lease ran out while the waiter was cut off, an operator deleted
//!   it) is created anew, at the back. We hold the lock iff our key is the first of that
//!   snapshot; otherwise the attempt reports the first key's remaining lease.
//! * **Never granted on a vanished key** (etcd issue 11456, where etcd's lock API told a
//!   waiter whose lease had expired that it held the lock): the grant is read from the same
//!   transaction that wrote our key with our token, so at that revision our key exists and
//!   is the lowest. No key created later can have a lower create revision, so it stays the
//!   holder until it is deleted.
//! * **Validity**: [`Lock`](crate::Lock) counts a grant's validity from the moment the
//!   attempt was sent, for the requested ttl. Step (1) is sent after that moment and
//!   restarts the lease for at least the ttl (rounded up to whole seconds) on the leader's
//!   clock, and step (2) attaches our key to exactly that lease; the grant counts only if
//!   both succeeded (the keep-alive found the lease alive, so the key is still on it), so
//!   the key cannot expire before `sent + ttl` (less the drift allowance; a new leader
//!   extends leases, never shortens them), whichever of the two etcd served first.
//!   Whatever the lease went through before does not count.
//! * **Fence**: the holder key's create revision. The holder is always the lowest live key,
//!   keys created later get higher revisions and a deleted key never returns with its old
//!   revision, so grants go in create-revision order and fences strictly increase per name —
//!   through restarts and leader changes, because revisions are persisted by raft.
//! * **Repeats**: the key is a function of the token, so an attempt repeated after a lost
//!   reply finds the same key (same place, same fence) and never queues twice. Release,
//!   extend and withdrawal compare the token stored at the key (the family's keys, named
//!   after a token too, are compared on their existence).
//! * **Waiting**: [`RawLock::watch_for`] starts one task per waiter. It finds the key just
//!   before ours (by create revision) and watches it for deletion from the revision it was
//!   read at, so a deletion in between is not missed. When it is deleted the task looks
//!   again: another key still in front (a waiter that left) — it watches that one; none —
//!   the lock is its waiter's. A release therefore wakes one waiter, the next in line, and
//!   no other waiter sends anything. The holder's remaining ttl stays the fallback timer of
//!   [`Lock`](crate::Lock).
//! * **Taking the turn without an attempt**: when the watched key was the only one in
//!   front at the task's last read, its deletion alone makes ours the first key (no key
//!   can be created before ours later: revisions only grow), so the task hands its waiter
//!   the grant at once — the fence is our key's create revision — without another read or
//!   attempt; otherwise the read that finds nothing in front (and our key still there) does.
//!   The waiter's lease runs for at least its ttl from the send time of its latest attempt
//!   (each attempt restarts the lease after that moment; renewals only push its end later),
//!   so the grant's validity counts from there, as an attempt's would. A grant the task
//!   found for a key that a later attempt re-created at the back is void (its create
//!   revision is older than the new key's).
//! * **Waiters' leases**: a waiter's key is on its client's session lease of the lock's
//!   ttl (whole seconds, at least etcd's minimum); its task renews that lease every third
//!   of that and each attempt renews it too. A live waiter thus loses its place only if it
//!   cannot reach etcd for two thirds of the lease — the rule that ends a holder's lease
//!   too. The task then wakes it, and its next attempt queues it at the back under a new
//!   session lease. A crashed waiter's key goes with its lease: it holds up the waiters
//!   behind it for at most one lease.
//! * **Leaving**: a waiter that stops waiting (`try_lock` on a held lock, a deadline, a
//!   cancellation, through [`RawLock::abandon`]) deletes its key (compared on its token);
//!   the next in line is watching that key and moves up. Release does the same for the
//!   holder. The session lease stays for the client's other keys (see above).
//! * **Extend**: a keep-alive of the key's session lease, confirmed by reading our token on
//!   that lease at our key (the engine's renewal batch does this for all of a client's
//!   holds at once: a keep-alive per session lease and one transaction reading every key);
//!   another ttl moves the key to the session lease of that ttl, restarted now, in a
//!   transaction that requires the key (named after our token; its value and create
//!   revision, hence the fence, stay), so a shorter ttl shortens the hold (a keep-alive
//!   would restart the old, longer one). A holder in another process that was handed the
//!   token (`dlock extend`) finds the lease on the key and its granted ttl by reading them,
//!   and keeps that lease alive — with it, the other keys the original client has on it.
//! * **Operators**: [`inspect`](RawInspect::inspect) reads the queue (holder, its lease's
//!   remaining ttl, its create revision as the last fence, the number queued behind it);
//!   [`force_unlock`](RawInspect::force_unlock) deletes the first key (compared on its create
//!   revision), which wakes the next in line (its lease stays: a session lease may hold its
//!   client's other keys); [`list`](RawInspect::list) names every lock
//!   whose queue has a key.
//! * **Elections** ([`RawElection`]): the leader's record is one key, `{K}:leader/` (its
//!   companion key plus `/`), with no lease: it outlives its leader, as the term does, and
//!   readers compare its holder with the queue's first key. The trailing `/` keeps it out
//!   of every lock's queue. A publish is one transaction that puts the record only if the
//!   publisher's queue key is the first of the queue (it has the create revision it was
//!   granted with, and no key under `K/` is older); terms are not compared. Observers
//!   watch the key's puts.
//!
//! Costs: an attempt is a keep-alive and a transaction sent together (plus a lease read
//! when the lock is held, and a lease grant when the client has no live session lease of
//! that ttl); a release is one transaction; a waiter keeps one watch stream open and
//! sends a keep-alive every third of its ttl; reading the queue costs one key per waiter.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, KeyValue, PutOptions,
    SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse, WatchFilterType, WatchOptions, WatchStream,
};
use tokio::sync::{Notify, oneshot};

use crate::engine::Engine;
use crate::engine::follow::{self, Fired, Look, Recipe};
use crate::engine::wake::{Registration, Wakes, Watches};
use crate::error::{Error, ErrorKind, Result};
use crate::keys::LockKeys;
use crate::raw::{
    Acquire, Kind as Primitive, LeaseKind, LockState, RECORD, RawElection, RawFencing, RawInspect,
    RawLock, RawReentrant, ReleaseWatch, Renewal,
};
use crate::token::Token;

mod family;

const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);
/// Keys read by one transaction of a renewal batch (etcd takes 128 operations at most).
const BATCH_READS: usize = 100;
/// Pause before a waiter's task looks at the queue again after etcd failed it.
const FOLLOW_RETRY: Duration = Duration::from_millis(200);

/// An etcd client for locks. Cheap to clone; clones share the gRPC channel and the
/// watchdog.
///
/// ```no_run
/// # async fn demo() -> fencelock::Result<()> {
/// let etcd = fencelock::backend::Etcd::connect("etcd://127.0.0.1:2379").await?;
/// let guard = fencelock::Lock::new(etcd, "leader")?.lock().await?;
/// println!("fence {} (the create revision of our queue key)", guard.fencing_token());
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Etcd {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    endpoints: Vec<String>,
    timeout: Duration,
    /// Our queue keys (waiting or holding), by key.
    places: Mutex<HashMap<String, Place>>,
    /// This client's session leases: the one every key of a ttl is put on.
    sessions: Mutex<Sessions>,
    /// The reentrant holds waiting or held through this client: the queue key a hold's
    /// token would have (`K/<token>`, what its waiter follows) to its owner's key.
    aliases: Mutex<HashMap<String, String>>,
    /// The waiting keys (the engine's wake registry): where each key's task leaves the
    /// grant when the key's turn came (its fence: the key's create revision), kept while
    /// the waiter watches, whatever happens to the key meanwhile (a key re-created at the
    /// back reports its new place here, which voids a grant found for the old one).
    wakes: Wakes,
    /// The watches of records and of locks' releases, shared by this client's listeners
    /// of each key.
    watches: Watches,
    engine: Engine,
}

/// This client's session leases (see the module docs).
#[derive(Default)]
struct Sessions {
    /// The session lease of each ttl (whole seconds) that new writes go on.
    current: HashMap<i64, i64>,
    /// Leases no new write goes on, because a write of ours on them may still arrive (an
    /// attempt cut off, a release whose outcome is unknown): each is revoked once no key
    /// this client knows of is on it, so whatever such a write left goes with it.
    retired: HashSet<i64>,
}

/// What this client knows about one of its queue keys.
#[derive(Clone)]
struct Place {
    /// The lease the key is (or is being) attached to; 0 for none yet.
    lease: i64,
    /// Leases a write of this key was sent on without an answer (cut off, failed): such
    /// a write may still put the key back after it left, so they are retired then.
    doubts: Vec<i64>,
    /// Until when the key is owed life: its last attempt's or renewal's send time plus
    /// its ttl. A keep-alive of the session lease after that moment would keep it longer
    /// than its ttl (a hold whose guard was forgotten): it is deleted first.
    owed: Option<Instant>,
    /// The mod revision of our last write of the key (0: none known): the deletion of an
    /// overdue key compares it, so it never takes a key an attempt wrote since.
    written: i64,
    /// That lease's requested ttl in seconds.
    secs: i64,
    /// The key's create revision as last seen (0: not yet).
    rev: i64,
    /// Told when `rev` changes (the key was created anew at the back).
    moved: Arc<Notify>,
    /// What the key stands for (set by the attempt that wrote it): how its waiter's task
    /// tells that its turn came.
    kind: Kind,
}

impl Place {
    fn new() -> Place {
        Place {
            lease: 0,
            doubts: Vec::new(),
            owed: None,
            written: 0,
            secs: 0,
            rev: 0,
            moved: Arc::new(Notify::new()),
            kind: Kind::Plain,
        }
    }
}

/// What a queue key stands for. A plain (or fair) lock's key holds its token; a key of
/// the family holds `<tag> <token>` (see [`Kind::value`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// A plain or fair lock's holder or waiter: it holds while its key is the first.
    Plain,
    /// A semaphore's holder or waiter of `n` permits, whose attempt saw `count` permits
    /// stored: it holds while the permits of the keys up to its own fit in the count.
    Permits {
        /// Permits taken.
        n: u32,
        /// The stored count the attempt went by.
        count: u32,
    },
    /// A read-write lock's reader: it holds while no writer's key is before its own.
    Read,
    /// A read-write lock's writer: it holds while its key is the first.
    Write,
    /// A reentrant lock's owner (its key named after the owner, its value the holds): it
    /// holds while its key is the first.
    Holds,
}

impl Kind {
    /// The value stored at the queue key of `token`: the token for a plain lock's key,
    /// `<tag> <token>` for the family's (`p<n>`: a semaphore's n permits).
    fn value(self, token: &Token) -> String {
        match self {
            Kind::Plain => token.as_str().to_owned(),
            Kind::Permits { n, .. } => format!("p{n} {}", token.as_str()),
            Kind::Read => format!("r {}", token.as_str()),
            Kind::Write => format!("w {}", token.as_str()),
            Kind::Holds => format!("h\n{}", token.as_str()),
        }
    }
}

/// The permits a queue key of a semaphore takes (its `p<n>` tag; 1 for a key without one).
fn permits_of(value: &[u8]) -> u32 {
    value
        .strip_prefix(b"p")
        .and_then(|rest| rest.split(|b| *b == b' ').next())
        .and_then(|n| std::str::from_utf8(n).ok())
        .and_then(|n| n.parse().ok())
        .unwrap_or(1)
}

/// Whether `value`, read at the queue key of `token`, is that token's: the token itself,
/// or a family tag and the token.
fn holds_token(value: &[u8], token: &Token) -> bool {
    let token = token.as_str().as_bytes();
    value == token
        || value
            .strip_suffix(token)
            .and_then(|head| head.strip_suffix(b" "))
            .is_some_and(is_tag)
}

/// Whether `tag` is one of the family's value tags (`p<n>`, `r`, `w`).
fn is_tag(tag: &[u8]) -> bool {
    tag == b"r"
        || tag == b"w"
        || tag
            .strip_prefix(b"p")
            .is_some_and(|n| !n.is_empty() && n.iter().all(u8::is_ascii_digit))
}

/// One key of a lock's queue.
struct Queued {
    key: Vec<u8>,
    value: Vec<u8>,
    created: i64,
    lease: i64,
}

impl Queued {
    /// Who this key says holds or waits: its token, or for a key of etcd's lock service
    /// (empty value) the rest of its key (the session's lease id).
    fn owner(&self, prefix: &str) -> String {
        if self.value.is_empty() {
            String::from_utf8_lossy(&self.key[prefix.len()..]).into_owned()
        } else {
            String::from_utf8_lossy(untagged(&self.value)).into_owned()
        }
    }
}

impl std::fmt::Debug for Etcd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Etcd")
            .field("endpoints", &self.inner.endpoints)
            .finish_non_exhaustive()
    }
}

fn map_err(e: etcd_client::Error, doing: &str) -> Error {
    use etcd_client::Error as E;
    let (kind, retryable) = match &e {
        E::GRpcStatus(s) => match s.code() {
            tonic::Code::Unavailable => (ErrorKind::Unavailable, true),
            tonic::Code::DeadlineExceeded => (ErrorKind::TimedOut, true),
            // A request cut off by the client's timeout, or a broken connection that
            // tonic reports without a status of its own: the outcome is unknown.
            tonic::Code::Cancelled => (ErrorKind::TimedOut, true),
            tonic::Code::Unknown => (ErrorKind::Unavailable, true),
            _ => (ErrorKind::Backend, false),
        },
        E::TransportError(_) | E::IoError(_) => (ErrorKind::Unavailable, true),
        E::InvalidArgs(_) | E::InvalidUri(_) => (ErrorKind::InvalidArgument, false),
        _ => (ErrorKind::Backend, false),
    };
    Error::new(kind, format!("{doing}: {}", etcd_said(&e)))
        .retryable(retryable)
        .with_source(e)
}

/// What etcd's client said, in words: a gRPC status as its code's description, its
/// message and the innermost cause (tonic's own `Display` shows the causes' `Debug` dumps),
/// a timeout as one; anything else as the client shows it.
fn etcd_said(e: &etcd_client::Error) -> String {
    let etcd_client::Error::GRpcStatus(status) = e else {
        return e.to_string();
    };
    // The client's own timeout, as dlock's bound on a call says it.
    let timeout = status.code() == tonic::Code::Cancelled && status.message() == "Timeout expired";
    if timeout || status.code() == tonic::Code::DeadlineExceeded {
        return "etcd did not answer in time".to_owned();
    }
    let mut said = status.code().description().to_owned();
    if !status.message().is_empty() {
        said.push_str(": ");
        said.push_str(status.message());
    }
    let mut cause = std::error::Error::source(status);
    let mut innermost = None;
    while let Some(c) = cause {
        innermost = Some(c);
        cause = c.source();
    }
    if let Some(c) = innermost.map(ToString::to_string)
        && !said.contains(&c)
    {
        said.push_str(": ");
        said.push_str(&c);
    }
    said
}

/// Lease seconds for `ttl`: rounded up, at least 1.
fn lease_seconds(ttl: Duration) -> i64 {
    let whole = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    i64::try_from(whole.max(1)).unwrap_or(i64::MAX)
}

/// A key's value without its family tag: the token.
fn untagged(value: &[u8]) -> &[u8] {
    match value.iter().position(|b| *b == b' ') {
        Some(at) if is_tag(&value[..at]) => &value[at + 1..],
        _ => value,
    }
}

/// The prefix of a lock's queue: `K/`.
fn queue_prefix(keys: &LockKeys) -> String {
    format!("{}/", keys.lock())
}

/// The queue key of `token`: `K/<token>`.
fn queue_key(keys: &LockKeys, token: &Token) -> String {
    format!("{}/{}", keys.lock(), token.as_str())
}

/// Whether `key` is in the queue under `prefix` (not in the queue of a lock named below it).
fn in_queue(prefix: &[u8], key: &[u8]) -> bool {
    key.strip_prefix(prefix)
        .is_some_and(|rest| !rest.is_empty() && !rest.contains(&b'/'))
}

/// The keys of `kvs` that are in the queue under `prefix`, in the order given.
fn queued(kvs: &[KeyValue], prefix: &str) -> Vec<Queued> {
    kvs.iter()
        .filter(|kv| in_queue(prefix.as_bytes(), kv.key()))
        .map(|kv| Queued {
            key: kv.key().to_vec(),
            value: kv.value().to_vec(),
            created: kv.create_revision(),
            lease: kv.lease(),
        })
        .collect()
}

/// The endpoints (`http://host:port`) of an `etcd://host:port[,host:port…]` URL. Each
/// member must be a plain `host:port`: no credentials (messages show the URL redacted),
/// no path, nothing the gRPC client would take for something else.
fn parse_url(url: &str) -> Result<Vec<String>> {
    let bad = |why: &str| {
        Error::invalid(format!(
            "bad etcd URL {:?}: {why}; expected etcd://host:port[,host:port…]",
            super::redact_url(url)
        ))
    };
    let hosts = url
        .strip_prefix("etcd://")
        .ok_or_else(|| bad("not etcd://"))?;
    // etcd:// takes no parameter: one would do nothing, so none is accepted (the
    // parameter's name only: its value could be a secret).
    let hosts = match hosts.split_once('?').filter(|_| !url.contains('@')) {
        Some((hosts, query)) => {
            if let Some(pair) = query.split('&').find(|p| !p.is_empty()) {
                let name = pair.split_once('=').map_or(pair, |(name, _)| name);
                return Err(bad(&format!(
                    "unknown parameter {name:?} (etcd:// takes none)"
                )));
            }
            hosts
        }
        None => hosts,
    };
    let hosts = hosts.strip_suffix('/').unwrap_or(hosts);
    let mut endpoints = Vec::new();
    for host in hosts.split(',').filter(|h| !h.is_empty()) {
        let plain = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_');
        let ok = match host.rsplit_once(':') {
            Some((name, port)) => {
                port.parse::<u16>().is_ok()
                    && match name.strip_prefix('[').and_then(|n| n.strip_suffix(']')) {
                        Some(v6) => v6.parse::<std::net::Ipv6Addr>().is_ok(),
                        None => !name.is_empty() && name.chars().all(plain),
                    }
            }
            None => false,
        };
        if !ok {
            return Err(bad("every member is host:port"));
        }
        endpoints.push(format!("http://{host}"));
    }
    if endpoints.is_empty() {
        return Err(bad("no member"));
    }
    Ok(endpoints)
}

/// Reads a queue in line order (create revision, lowest first).
fn queue_read() -> GetOptions {
    GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend)
}

impl Etcd {
    /// Connects to `etcd://host:port[,host:port…]` (every member as an endpoint).
    ///
    /// # Errors
    /// `InvalidArgument` for a malformed URL; `Unavailable` if no endpoint answers within
    /// 2 s.
    pub async fn connect(url: &str) -> Result<Etcd> {
        let endpoints = parse_url(url)?;
        let options = ConnectOptions::new()
            .with_connect_timeout(DEFAULT_TIMEOUT)
            .with_timeout(DEFAULT_TIMEOUT)
            .with_require_leader(true);
        let client = tokio::time::timeout(
            DEFAULT_TIMEOUT,
            Client::connect(endpoints.clone(), Some(options)),
        )
        .await
        .map_err(|_| {
            Error::new(
                ErrorKind::Unavailable,
                format!("no etcd endpoint of {endpoints:?} answered within {DEFAULT_TIMEOUT:?}"),
            )
        })?
        .map_err(|e| map_err(e, "connecting to etcd"))?;
        let etcd = Etcd {
            inner: Arc::new(Inner {
                client,
                endpoints,
                timeout: DEFAULT_TIMEOUT,
                places: Mutex::new(HashMap::new()),
                sessions: Mutex::new(Sessions::default()),
                aliases: Mutex::new(HashMap::new()),
                wakes: Wakes::default(),
                watches: Watches::default(),
                engine: Engine::new(),
            }),
        };
        // One read proves a member answers.
        etcd.call("reaching etcd", |mut c| async move {
            c.get("dlock", None).await
        })
        .await?;
        Ok(etcd)
    }

    /// The endpoints.
    pub fn endpoints(&self) -> &[String] {
        &self.inner.endpoints
    }

    /// Runs one etcd call on a clone of the client, bounded in time.
    async fn call<T, F, Fut>(&self, doing: &str, f: F) -> Result<T>
    where
        F: FnOnce(Client) -> Fut,
        Fut: Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        match tokio::time::timeout(self.inner.timeout, f(self.inner.client.clone())).await {
            Ok(r) => r.map_err(|e| map_err(e, doing)),
            Err(_) => Err(Error::new(
                ErrorKind::TimedOut,
                format!("{doing}: etcd did not answer in time"),
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

    fn place(&self, key: &str) -> Option<Place> {
        self.places().get(key).cloned()
    }

    /// Records that `key` is (being) attached to `lease` (of `secs`).
    fn set_lease(&self, key: &str, lease: i64, secs: i64) {
        let mut places = self.places();
        let place = places.entry(key.to_owned()).or_insert_with(Place::new);
        let old = place.lease;
        place.lease = lease;
        place.secs = secs;
        drop(places);
        if old != 0 && old != lease {
            self.sweep();
        }
    }

    fn sessions(&self) -> std::sync::MutexGuard<'_, Sessions> {
        self.inner
            .sessions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// This client's session lease of `secs`: the current one, or a new one granted now.
    async fn session(&self, secs: i64) -> Result<i64> {
        if let Some(lease) = self.sessions().current.get(&secs) {
            return Ok(*lease);
        }
        let lease = self.grant(secs).await?;
        let mut sessions = self.sessions();
        match sessions.current.get(&secs) {
            // Another call granted one meanwhile: use that one.
            Some(&other) => {
                drop(sessions);
                self.revoke_later(lease);
                Ok(other)
            }
            None => {
                sessions.current.insert(secs, lease);
                Ok(lease)
            }
        }
    }

    /// `lease` ran out (or was revoked): no write goes on it any more.
    fn lapsed(&self, lease: i64) {
        let mut sessions = self.sessions();
        sessions.current.retain(|_, l| *l != lease);
        sessions.retired.remove(&lease);
    }

    /// Puts no new write on `lease` and revokes it once no key we know is on it.
    fn retire(&self, lease: i64) {
        if lease == 0 {
            return;
        }
        {
            let mut sessions = self.sessions();
            sessions.current.retain(|_, l| *l != lease);
            sessions.retired.insert(lease);
        }
        self.sweep();
    }

    /// Revokes the retired leases that no key we know is on.
    fn sweep(&self) {
        let used: HashSet<i64> = self.places().values().map(|p| p.lease).collect();
        let unused: Vec<i64> = {
            let mut sessions = self.sessions();
            let unused: Vec<i64> = sessions
                .retired
                .iter()
                .filter(|l| !used.contains(l))
                .copied()
                .collect();
            for lease in &unused {
                sessions.retired.remove(lease);
            }
            unused
        };
        for lease in unused {
            self.revoke_later(lease);
        }
    }

    /// Records that our key `key` is owed life until `from + secs` (an attempt or renewal
    /// sent at `from` succeeded), and the mod revision of our write of it, if any.
    fn owe(&self, key: &str, from: Instant, secs: i64, written: Option<i64>) {
        if let Some(place) = self.places().get_mut(key) {
            let until = from + Duration::from_secs(u64::try_from(secs).unwrap_or(0));
            place.owed = Some(place.owed.map_or(until, |o| o.max(until)));
            if let Some(rev) = written {
                place.written = rev;
            }
        }
    }

    /// Deletes, in the background, our keys on `lease` that are overdue (no attempt or
    /// renewal owes them life any more: a hold whose guard was forgotten), each only if
    /// we have not written it since; called before each keep-alive of the lease, which
    /// alone would keep them longer than their ttl.
    fn reap(&self, lease: i64) {
        let now = Instant::now();
        let due: Vec<(String, i64)> = self
            .places()
            .iter_mut()
            .filter(|(_, p)| p.lease == lease && p.written > 0 && p.owed.is_some_and(|o| o <= now))
            .map(|(key, p)| {
                p.owed = None;
                (key.clone(), p.written)
            })
            .collect();
        if due.is_empty() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        for (key, written) in due {
            let etcd = self.clone();
            runtime.spawn(async move {
                let txn = Txn::new()
                    .when([Compare::mod_revision(
                        key.as_str(),
                        CompareOp::Equal,
                        written,
                    )])
                    .and_then([TxnOp::delete(key.as_str(), None)]);
                let _ = etcd
                    .call("deleting an overdue key", |mut c| async move {
                        c.txn(txn).await
                    })
                    .await;
            });
        }
    }

    /// Records that a write of `key` on `lease` got no answer.
    fn doubt(&self, key: &str, lease: i64) {
        let known = match self.places().get_mut(key) {
            Some(place) => {
                place.doubts.push(lease);
                true
            }
            None => false,
        };
        if !known {
            // The key already left: what that write puts back goes with its lease.
            self.retire(lease);
        }
    }

    /// Runs `txn`, which puts our key `key` on the session lease `lease`, beside one
    /// keep-alive of that lease, which restarts its whole ttl after the caller took its
    /// send time. `None`: the lease ran out (before the write, which then wrote nothing,
    /// or after it, which took the key with it): try again on a new one.
    async fn txn_on(
        &self,
        key: &str,
        lease: i64,
        secs: i64,
        txn: Txn,
        doing: &'static str,
    ) -> Result<Option<etcd_client::TxnResponse>> {
        let started = Instant::now();
        // Owed from now on, so that no overdue deletion races this write.
        self.owe(key, started, secs, None);
        // A write cut off here (the caller's future dropped) may still arrive.
        let mut pending = Pending {
            etcd: self,
            key,
            lease,
            answered: false,
        };
        let (alive, resp) = tokio::join!(
            self.keep_alive(lease),
            self.call(doing, |mut c| async move { c.txn(txn).await })
        );
        let resp = match resp {
            Ok(resp) => resp,
            Err(err) if err.to_string().contains("requested lease not found") => {
                pending.answered = true;
                self.lapsed(lease);
                return Ok(None);
            }
            // Outcome unknown: the caller repeats the attempt under the same token (same
            // key) or gives it back with a release.
            Err(err) => return Err(err),
        };
        pending.answered = true;
        match alive? {
            true => {
                let written = resp.succeeded().then(|| {
                    resp.header()
                        .map_or(0, etcd_client::ResponseHeader::revision)
                });
                self.owe(key, started, secs, written);
                Ok(Some(resp))
            }
            false => {
                self.lapsed(lease);
                Ok(None)
            }
        }
    }

    /// Records `key`'s create revision and kind, telling its waiter's task if the key
    /// changed.
    fn placed(&self, key: &str, rev: i64, kind: Kind) {
        let mut places = self.places();
        let place = places.entry(key.to_owned()).or_insert_with(Place::new);
        place.kind = kind;
        if place.rev != rev {
            place.rev = rev;
            place.moved.notify_one();
        }
    }

    /// Hands the waiter of `key` (create revision `rev`) the grant: its turn came.
    fn grant_turn(&self, key: &str, rev: i64) {
        self.inner
            .wakes
            .offer(&key.to_owned(), u64::try_from(rev).unwrap_or(0));
    }

    /// The owner's key a reentrant hold's queue key `key` stands for, if any.
    fn alias(&self, key: &str) -> Option<String> {
        self.inner
            .aliases
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(key)
            .cloned()
    }

    /// `key`, or the owner's key it stands for.
    fn key_of(&self, key: &str) -> String {
        self.alias(key).unwrap_or_else(|| key.to_owned())
    }

    /// Records that the reentrant hold at queue key `key` is in its owner's key `owner_key`.
    fn set_alias(&self, key: String, owner_key: String) {
        self.inner
            .aliases
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key, owner_key);
    }

    fn unalias(&self, key: &str) {
        self.inner
            .aliases
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(key);
    }

    fn forget(&self, key: &str) -> Option<Place> {
        self.places().remove(key)
    }

    /// Revokes `lease` in the background (it expires by itself if that fails).
    fn revoke_later(&self, lease: i64) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let etcd = self.clone();
        runtime.spawn(async move {
            let _ = etcd
                .call("revoking a lease", |mut c| async move {
                    c.lease_revoke(lease).await
                })
                .await;
        });
    }

    /// The key, if it exists.
    pub(super) async fn read_kv(&self, key: &str) -> Result<Option<KeyValue>> {
        let key = key.to_owned();
        let resp = self
            .call(
                "reading a lock",
                |mut c| async move { c.get(key, None).await },
            )
            .await?;
        Ok(resp.kvs().first().cloned())
    }

    /// The key's value, create revision and lease, if it exists.
    async fn read(&self, key: &str) -> Result<Option<(Vec<u8>, i64, i64)>> {
        Ok(self
            .read_kv(key)
            .await?
            .map(|kv| (kv.value().to_vec(), kv.create_revision(), kv.lease())))
    }

    /// The queue of `keys`, first (the holder) first.
    async fn queue(&self, keys: &LockKeys) -> Result<(String, Vec<Queued>)> {
        let prefix = queue_prefix(keys);
        let from = prefix.clone();
        let resp = self
            .call("reading a lock's queue", |mut c| async move {
                c.get(from, Some(queue_read())).await
            })
            .await?;
        let queue = queued(resp.kvs(), &prefix);
        Ok((prefix, queue))
    }

    /// Puts `value` at `record` in one transaction if every compare holds. Returns
    /// whether it did.
    async fn put_if(&self, compares: Vec<Compare>, record: &str, value: &str) -> Result<bool> {
        let txn = Txn::new()
            .when(compares)
            .and_then([TxnOp::put(record, value, None)]);
        let resp = self
            .call("publishing an election record", |mut c| async move {
                c.txn(txn).await
            })
            .await?;
        Ok(resp.succeeded())
    }

    /// The remaining ttl of `lease`, if it is alive (`None` for 0: a key without lease).
    async fn lease_remaining(&self, lease: i64) -> Result<Option<Duration>> {
        if lease == 0 {
            return Ok(None);
        }
        let resp = self
            .call("reading a lease", |mut c| async move {
                c.lease_time_to_live(lease, None).await
            })
            .await?;
        Ok(u64::try_from(resp.ttl()).ok().map(Duration::from_secs))
    }

    /// Grants a lease of `secs`.
    async fn grant(&self, secs: i64) -> Result<i64> {
        Ok(self
            .call("granting a lease", |mut c| async move {
                c.lease_grant(secs, None).await
            })
            .await?
            .id())
    }

    /// Sends one keep-alive for `lease`, which restarts its whole ttl on the leader.
    /// Returns whether the lease was alive (and is renewed).
    async fn keep_alive(&self, lease: i64) -> Result<bool> {
        self.reap(lease);
        self.call("renewing a lease", |mut c| async move {
            // Opening the stream sends the keep-alive and waits for its answer; the client
            // reports a lease the leader does not know as this error.
            match c.lease_keep_alive(lease).await {
                Ok(_) => Ok(true),
                Err(etcd_client::Error::LeaseKeepAliveError(e)) if e == "lease not found" => {
                    Ok(false)
                }
                Err(e) => Err(e),
            }
        })
        .await
    }

    /// Moves the key held under `token` to our session lease of `secs`, restarted now
    /// (keeping its create revision, so the fence stays, and its value). Returns whether
    /// the key held our token (the key is named after it, so it is ours while it exists).
    async fn move_to_lease(&self, key: &str, secs: i64) -> Result<bool> {
        for _ in 0..3 {
            let lease = self.session(secs).await?;
            let txn = Txn::new()
                .when([Compare::version(key, CompareOp::Greater, 0)])
                .and_then([TxnOp::put(
                    key,
                    "",
                    Some(PutOptions::new().with_lease(lease).with_ignore_value()),
                )]);
            let Some(resp) =
                Box::pin(self.txn_on(key, lease, secs, txn, "extending a lock")).await?
            else {
                continue;
            };
            let moved = resp.succeeded();
            if moved {
                self.set_lease(key, lease, secs);
            }
            return Ok(moved);
        }
        Err(Error::new(
            ErrorKind::Unavailable,
            "extending a lock: leases kept running out",
        )
        .retryable(true))
    }

    /// What is in front of our queue key `key` (create revision `rev`) under `prefix`.
    async fn predecessor(&self, prefix: &str, key: &str, rev: i64) -> Result<Ahead> {
        let from = prefix.to_owned();
        // Every key created up to ours, latest first.
        let options = GetOptions::new()
            .with_prefix()
            .with_keys_only()
            .with_max_create_revision(rev.max(1))
            .with_sort(SortTarget::Create, SortOrder::Descend);
        let resp = self
            .call("reading a lock's queue", |mut c| async move {
                c.get(from, Some(options)).await
            })
            .await?;
        let read_at = resp
            .header()
            .map_or(0, etcd_client::ResponseHeader::revision);
        let mut ahead = resp
            .kvs()
            .iter()
            .filter(|kv| kv.create_revision() < rev && in_queue(prefix.as_bytes(), kv.key()));
        let first = ahead.next().map(|kv| kv.key().to_vec());
        Ok(Ahead {
            only: first.is_some() && ahead.next().is_none(),
            key: first,
            read_at,
            ours: resp
                .kvs()
                .iter()
                .any(|kv| kv.create_revision() == rev && kv.key() == key.as_bytes()),
        })
    }

    /// Watches `key` for its deletion, from revision `from` on; returns once etcd confirmed
    /// the watch.
    async fn watch_deletion(&self, key: Vec<u8>, from: i64) -> Result<WatchStream> {
        let options = WatchOptions::new()
            .with_start_revision(from)
            .with_filters([WatchFilterType::NoPut]);
        self.open_watch(&key, options, "watching the waiter ahead")
            .await?
            .ok_or_else(|| Error::new(ErrorKind::Backend, "etcd refused a watch"))
    }

    /// Opens a watch of `key` and waits for etcd to confirm it (its first response), so
    /// that every event from then on is delivered; `None` if etcd refused it.
    async fn open_watch(
        &self,
        key: &[u8],
        options: WatchOptions,
        doing: &'static str,
    ) -> Result<Option<WatchStream>> {
        let key = key.to_vec();
        let mut stream = self
            .call(
                doing,
                |mut c| async move { c.watch(key, Some(options)).await },
            )
            .await?;
        let created = tokio::time::timeout(self.inner.timeout, stream.message())
            .await
            .map_err(|_| Error::new(ErrorKind::TimedOut, "etcd did not confirm a watch"))?
            .map_err(|e| map_err(e, doing))?
            .is_some_and(|r| r.created());
        Ok(created.then_some(stream))
    }

    /// A watch woken at every event of `kind` on `key` (watched with `options`), in effect
    /// when this returns ([`ReleaseWatch::none`] if etcd refused it); one etcd watch per key
    /// for all of this client's listeners, each event waking one of them (who passes it
    /// on). When etcd ends the stream (connection lost, member restarted) the task wakes a
    /// listener at once and opens a new watch, waking one again once that one is in
    /// effect: a listener that reads after each wake-up misses no event, and the watch
    /// keeps working for as long as any listener holds it.
    async fn wake_on(
        &self,
        key: String,
        options: WatchOptions,
        kind: EventType,
        doing: &'static str,
    ) -> Result<ReleaseWatch> {
        // Shared by the listeners of the same events on the same key.
        let shared = format!("{kind:?} {key}");
        let registration = match self.inner.watches.join(&shared) {
            Ok(watch) => return Ok(watch),
            Err(registration) => registration,
        };
        let Some(mut stream) = self
            .open_watch(key.as_bytes(), options.clone(), doing)
            .await?
        else {
            return Ok(ReleaseWatch::none());
        };
        let wake = self.inner.watches.waker(&shared);
        let etcd = self.clone();
        let watched = key;
        let task = async move {
            loop {
                while heard(Some(&mut stream), kind).await {
                    wake();
                }
                // The watch ended: let the listener look now (a waiter retries), and again
                // once a new watch is in effect, in case something happened in between.
                wake();
                stream = loop {
                    tokio::time::sleep(FOLLOW_RETRY).await;
                    if let Ok(Some(s)) = etcd
                        .open_watch(watched.as_bytes(), options.clone(), doing)
                        .await
                    {
                        break s;
                    }
                };
                wake();
            }
        };
        Ok(self.inner.watches.start(&shared, registration, task))
    }

    /// How many etcd watches of records and releases this client keeps open: one per
    /// key, however many of its observers or waiters listen to it.
    pub fn watches_open(&self) -> usize {
        self.inner.watches.open()
    }

    /// Renews our queue key `key` for `ttl` if its value passes `ours` (see
    /// [`RawLock::extend`] on this backend).
    async fn extend_at(
        &self,
        key: &str,
        ttl: Duration,
        ours: impl Fn(&[u8]) -> bool,
    ) -> Result<bool> {
        let secs = lease_seconds(ttl);
        let known = match self.place(key).filter(|p| p.lease != 0) {
            Some(p) => Some((p.lease, p.secs)),
            // A holder in another process handed us its token.
            None => match self.read(key).await? {
                Some((value, _, lease)) if ours(&value) && lease != 0 => {
                    let granted = self
                        .call("reading a lease", |mut c| async move {
                            c.lease_time_to_live(lease, None).await
                        })
                        .await?
                        .granted_ttl();
                    Some((lease, granted))
                }
                _ => None,
            },
        };
        let Some((lease, granted)) = known else {
            return Ok(false);
        };
        // A keep-alive restarts the lease's own ttl: another ttl needs another lease.
        if secs != granted {
            return self.move_to_lease(key, secs).await;
        }
        // Keep the key's lease alive (a session lease: every key of ours of this ttl),
        // and check the key is still ours on it. Our key, while it exists, is the lowest
        // of the queue: the holder.
        let started = Instant::now();
        let (alive, holder) = tokio::join!(self.keep_alive(lease), self.read(key));
        let alive = alive?;
        if !alive {
            self.lapsed(lease);
        }
        let still = holder?.is_some_and(|(value, _, l)| ours(&value) && l == lease);
        if alive && still {
            self.owe(key, started, granted, None);
        }
        Ok(alive && still)
    }

    /// Deletes our queue key `key` if `own` holds (it is ours); its session lease stays
    /// for our other keys. Returns whether it was there.
    async fn leave(&self, key: &str, own: Compare) -> Result<bool> {
        let txn = Txn::new().when([own]).and_then([TxnOp::delete(key, None)]);
        let resp = self
            .call("releasing", |mut c| async move { c.txn(txn).await })
            .await;
        let place = self.forget(key);
        if let Some(place) = place {
            // A write of the key that got no answer may still put it back; and after a
            // release whose outcome is unknown the key may still be there: either goes
            // with its lease, which no new write uses from now on (the caller may still
            // repeat the release).
            let unknown = resp.is_err().then_some(place.lease);
            for lease in place.doubts.into_iter().chain(unknown) {
                self.retire(lease);
            }
            self.sweep();
        }
        Ok(resp?.succeeded())
    }

    /// One attempt's write (two round trips, see the module docs): (1) a lease whose whole
    /// ttl starts now, after the caller took its send time; (2) if every compare of
    /// `guard` holds, ONE transaction that puts `token`'s key with its value for `kind` on
    /// that lease (an existing key keeps its place, a vanished one goes to the back) and
    /// reads the queue at the same revision; else it writes nothing and answers
    /// `otherwise`.
    async fn enter(
        &self,
        keys: &LockKeys,
        token: &Token,
        kind: Kind,
        ttl: Duration,
        guard: Vec<Compare>,
        otherwise: Vec<TxnOp>,
    ) -> Result<Entered> {
        let secs = lease_seconds(ttl);
        let key = queue_key(keys, token);
        let prefix = queue_prefix(keys);
        // The family's values tell a key's kind; the plain lock needs only the keys.
        let read = if kind == Kind::Plain {
            queue_read().with_keys_only()
        } else {
            queue_read()
        };
        let mut answer = None;
        // A session lease that ran out (the client held nothing for a ttl, or was cut off
        // that long): the next try grants a new one.
        for _ in 0..3 {
            let lease = self.session(secs).await?;
            self.set_lease(&key, lease, secs);
            let ops = [
                TxnOp::put(
                    key.as_str(),
                    kind.value(token),
                    Some(PutOptions::new().with_lease(lease)),
                ),
                TxnOp::get(prefix.as_str(), Some(read.clone())),
            ];
            let txn = Txn::new()
                .when(guard.clone())
                .and_then(ops)
                .or_else(otherwise.clone());
            answer = Box::pin(self.txn_on(&key, lease, secs, txn, "acquiring")).await?;
            if answer.is_some() {
                break;
            }
        }
        let Some(resp) = answer else {
            return Err(Error::new(
                ErrorKind::Unavailable,
                "acquiring: the client's leases kept running out",
            )
            .retryable(true));
        };
        let succeeded = resp.succeeded();
        let answers = resp.op_responses();
        if !succeeded {
            return Ok(Entered::Refused(answers));
        }
        let queue = answers
            .into_iter()
            .find_map(|op| match op {
                TxnOpResponse::Get(get) => Some(queued(get.kvs(), &prefix)),
                _ => None,
            })
            .unwrap_or_default();
        let Some(at) = queue.iter().position(|q| q.key == key.as_bytes()) else {
            return Err(Error::new(
                ErrorKind::Backend,
                "etcd did not list the queue key it had just written",
            ));
        };
        self.placed(&key, queue[at].created, kind);
        Ok(Entered::Queued { queue, at })
    }

    /// The outcome of an attempt that put `token`'s key at `at` of `queue`: granted (the
    /// fence: the key's create revision), or waiting behind the first key.
    async fn settle(
        &self,
        keys: &LockKeys,
        token: &Token,
        queue: &[Queued],
        at: usize,
        granted: bool,
    ) -> Result<Acquire> {
        let created = queue[at].created;
        if granted {
            return Ok(Acquire::Acquired {
                fence: u64::try_from(created).unwrap_or(0),
            });
        }
        // A turn found for an older key of ours (re-created since) is void.
        self.inner.wakes.raise_floor(
            &queue_key(keys, token),
            u64::try_from(created - 1).unwrap_or(0),
        );
        tracing::debug!(lock = keys.name(), place = at, "waiting in the queue");
        let first = queue.first().map_or(0, |q| q.lease);
        Ok(Acquire::Held {
            remaining: self.lease_remaining(first).await.ok().flatten(),
        })
    }

    /// Renews the lease of our queue key `key`: `Some(false)` if it is gone (and with it our
    /// place), `None` if etcd did not say.
    async fn renew_place(&self, key: &str) -> Option<bool> {
        let place = self.place(key)?;
        let lease = place.lease;
        if lease == 0 {
            return None;
        }
        let started = Instant::now();
        match self.keep_alive(lease).await {
            Ok(true) => {
                self.owe(key, started, place.secs, None);
                Some(true)
            }
            // Gone, unless an attempt moved the key to a new lease meanwhile.
            Ok(false) => {
                self.lapsed(lease);
                Some(self.place(key)?.lease != lease)
            }
            Err(_) => None,
        }
    }
}

/// A waiter's queue key as the engine's follower sees it: the key just before ours is
/// watched for its deletion, our key's lease kept alive (see the module docs).
struct Follow {
    etcd: Etcd,
    /// The lock's queue prefix.
    prefix: String,
    /// Our queue key.
    key: String,
    /// Where a semaphore of these keys stores its permit count.
    count_key: String,
}

impl Recipe for Follow {
    type Place = Place;
    /// The key's create revision.
    type Id = i64;

    fn place(&self) -> Option<Place> {
        self.etcd.place(&self.etcd.key_of(&self.key))
    }

    fn id(place: &Place) -> i64 {
        place.rev
    }

    fn moved(place: &Place) -> Arc<Notify> {
        Arc::clone(&place.moved)
    }

    /// A third of the key's lease.
    fn keep_period(&self) -> Duration {
        let secs = self.place().map_or(1, |p| p.secs);
        Duration::from_millis(u64::try_from(secs).unwrap_or(1).max(1).saturating_mul(1000) / 3)
    }

    async fn look(&mut self, place: &Place) -> Look {
        let key = self.etcd.key_of(&self.key);
        match place.kind {
            Kind::Permits { count, .. } => {
                return self
                    .etcd
                    .look_permits(&self.prefix, &self.count_key, &key, place.rev, count)
                    .await;
            }
            Kind::Read => return self.etcd.look_read(&self.prefix, &key, place.rev).await,
            Kind::Plain | Kind::Write | Kind::Holds => {}
        }
        match self.etcd.predecessor(&self.prefix, &key, place.rev).await {
            Ok(Ahead {
                key: Some(ahead),
                read_at,
                only,
                ..
            }) => match self.etcd.watch_deletion(ahead, read_at + 1).await {
                Ok(mut stream) => Look::Ahead {
                    watch: Box::pin(async move {
                        if heard(Some(&mut stream), EventType::Delete).await {
                            Fired::Deleted
                        } else {
                            Fired::Lost { wake: false }
                        }
                    }),
                    only,
                    wake: false,
                },
                Err(_) => Look::Failed,
            },
            // Our turn: hand the grant over if our key is still there (else the waiter's
            // attempt finds out).
            Ok(Ahead {
                key: None, ours, ..
            }) if place.rev > 0 => Look::Turn { ours },
            Ok(_) | Err(_) => Look::Failed,
        }
    }

    async fn confirm(&self, _place: &Place) -> bool {
        true
    }

    fn grant(&self, place: &Place) {
        self.etcd.grant_turn(&self.key, place.rev);
    }

    async fn keep(&self, _place: &Place, _told: bool) -> bool {
        self.etcd.renew_place(&self.etcd.key_of(&self.key)).await != Some(false)
    }
}

/// What an attempt's transaction did.
enum Entered {
    /// Our key is written: the queue at that revision, in line order, and our place in it.
    Queued {
        /// The queue.
        queue: Vec<Queued>,
        /// Where our key is in it.
        at: usize,
    },
    /// A compare of the guard failed: nothing was written; the answers of the other branch.
    Refused(Vec<TxnOpResponse>),
}

/// What a waiter's task read in front of its key.
struct Ahead {
    /// The key just before ours, if any.
    key: Option<Vec<u8>>,
    /// Whether it is the only one before ours.
    only: bool,
    /// The revision of the read.
    read_at: i64,
    /// Whether our key was there, with the create revision we know.
    ours: bool,
}

/// Resolves when an event of `kind` (a deletion, a put) is heard (`true`) or the watch
/// ends (`false`: cancelled, compacted, connection lost); never without a watch.
async fn heard(stream: Option<&mut WatchStream>, kind: EventType) -> bool {
    let Some(stream) = stream else {
        return std::future::pending().await;
    };
    loop {
        match stream.message().await {
            Ok(Some(resp)) => {
                if resp.events().iter().any(|e| e.event_type() == kind) {
                    return true;
                }
                if resp.canceled() {
                    return false;
                }
            }
            Ok(None) | Err(_) => return false,
        }
    }
}

impl RawLock for Etcd {
    const QUEUES_WAITERS: bool = true;

    async fn acquire(&self, keys: &LockKeys, token: &Token, ttl: Duration) -> Result<Acquire> {
        match self
            .enter(keys, token, Kind::Plain, ttl, Vec::new(), Vec::new())
            .await?
        {
            Entered::Queued { queue, at } => {
                // First in the snapshot that wrote our key: ours.
                let granted = at == 0;
                self.settle(keys, token, &queue, at, granted).await
            }
            Entered::Refused(_) => Err(Error::new(
                ErrorKind::Backend,
                "etcd refused an attempt without a condition",
            )),
        }
    }

    async fn release(&self, keys: &LockKeys, token: &Token) -> Result<bool> {
        let key = queue_key(keys, token);
        let own = Compare::value(key.as_str(), CompareOp::Equal, token.as_str());
        self.leave(&key, own).await
    }

    async fn extend(&self, keys: &LockKeys, token: &Token, ttl: Duration) -> Result<bool> {
        let key = queue_key(keys, token);
        self.extend_at(&key, ttl, |value| holds_token(value, token))
            .await
    }

    /// Renews each lease by its kind: a reentrant hold renews its owner's key, every other
    /// kind its own queue key. The keys this client put on its session lease of their ttl
    /// are renewed together: one keep-alive per session lease, and one read of all those
    /// keys (a transaction of reads) to confirm each is still ours on it; the others one by
    /// one, as [`extend`](RawLock::extend) does.
    async fn extend_many(&self, renewals: &[Renewal]) -> Vec<Result<bool>> {
        let mut out: Vec<Option<Result<bool>>> = std::iter::repeat_with(|| None)
            .take(renewals.len())
            .collect();
        // (renewal, key, lease) of the keys on a session lease of their ttl.
        let mut batch = Vec::new();
        for (i, r) in renewals.iter().enumerate() {
            let key = match r.kind {
                LeaseKind::Reentrant => self.alias(&queue_key(&r.keys, &r.token)),
                _ => Some(queue_key(&r.keys, &r.token)),
            };
            if let Some(key) = key
                && let Some(place) = self.place(&key)
                && place.lease != 0
                && place.secs == lease_seconds(r.ttl)
            {
                batch.push((i, key, place.lease));
            }
        }
        for chunk in batch.chunks(BATCH_READS) {
            let leases: BTreeSet<i64> = chunk.iter().map(|(_, _, lease)| *lease).collect();
            let txn = Txn::new().and_then(
                chunk
                    .iter()
                    .map(|(_, key, _)| TxnOp::get(key.as_str(), None))
                    .collect::<Vec<_>>(),
            );
            let started = Instant::now();
            let keep = async {
                let mut alive = HashMap::new();
                for lease in &leases {
                    alive.insert(*lease, self.keep_alive(*lease).await);
                }
                alive
            };
            let (alive, read) = tokio::join!(
                keep,
                self.call("renewing locks", |mut c| async move { c.txn(txn).await })
            );
            let read = read.map(|resp| resp.op_responses());
            let again = |e: &Error| {
                Error::new(e.kind(), e.message().to_owned()).retryable(e.is_retryable())
            };
            for (at, (i, _, lease)) in chunk.iter().enumerate() {
                let r = &renewals[*i];
                let result = match (&alive[lease], &read) {
                    (Err(e), _) | (_, Err(e)) => Err(again(e)),
                    (Ok(false), _) => Ok(false),
                    (Ok(true), Ok(answers)) => {
                        let kv = match answers.get(at) {
                            Some(TxnOpResponse::Get(get)) => get.kvs().first(),
                            _ => None,
                        };
                        Ok(kv.is_some_and(|kv| {
                            let value = kv.value();
                            let ours = match r.kind {
                                LeaseKind::Reentrant => {
                                    family::holds(value).iter().any(|t| t == r.token.as_str())
                                }
                                _ => holds_token(value, &r.token),
                            };
                            ours && kv.lease() == *lease
                        }))
                    }
                };
                if matches!(result, Ok(true)) {
                    self.owe(&chunk[at].1, started, lease_seconds(r.ttl), None);
                }
                out[*i] = Some(result);
            }
            for (lease, alive) in &alive {
                if matches!(alive, Ok(false)) {
                    self.lapsed(*lease);
                }
            }
        }
        for (i, r) in renewals.iter().enumerate() {
            if out[i].is_none() {
                out[i] = Some(match r.kind {
                    LeaseKind::Reentrant => self.extend_reentrant(&r.keys, &r.token, r.ttl).await,
                    _ => self.extend(&r.keys, &r.token, r.ttl).await,
                });
            }
        }
        out.into_iter().map(|r| r.unwrap_or(Ok(false))).collect()
    }

    /// Any release of the lock (a deletion in its queue): for callers without a token.
    async fn watch(&self, keys: &LockKeys) -> Result<ReleaseWatch> {
        let options = WatchOptions::new()
            .with_prefix()
            .with_filters([WatchFilterType::NoPut]);
        self.wake_on(
            queue_prefix(keys),
            options,
            EventType::Delete,
            "watching a lock",
        )
        .await
    }

    /// Wakes `token`'s waiter when no key is left before its own; keeps its lease alive
    /// meanwhile. See the module docs.
    async fn watch_for(&self, keys: &LockKeys, token: &Token) -> Result<ReleaseWatch> {
        let (ready, first_look) = oneshot::channel();
        let key = queue_key(keys, token);
        let registration: Registration = self.inner.wakes.register(key.clone());
        // Owned at once: if this call is cancelled (a deadline), the task ends with it and
        // renews nothing, and the registration goes.
        let follow = Follow {
            etcd: self.clone(),
            prefix: queue_prefix(keys),
            key,
            count_key: family::permits_key(keys),
        };
        let task = AbortOnDrop(tokio::spawn(follow::follow(
            follow,
            Arc::clone(registration.notify()),
            ready,
            FOLLOW_RETRY,
        )));
        let watch = registration.into_watch(Some(Box::new(task)));
        // Once the task watches the key ahead, a release from then on is heard. If etcd
        // fails it, the task keeps trying, and wakes us when it finds our turn came.
        let _ = tokio::time::timeout(self.inner.timeout, first_look).await;
        Ok(watch)
    }

    /// Deletes the waiter's key (compared on its token; its session lease stays); a
    /// reentrant hold's waiter takes its hold out of its owner's key.
    async fn abandon(&self, keys: &LockKeys, token: &Token, _ttl: Duration) -> Result<()> {
        let key = queue_key(keys, token);
        match self.alias(&key) {
            Some(owner_key) => {
                self.unalias(&key);
                self.release_hold(&owner_key, token).await.map(|_| ())
            }
            None => self.release(keys, token).await.map(|_| ()),
        }
    }

    fn store_id(&self) -> String {
        format!("etcd:{}", self.inner.endpoints.join(","))
    }

    fn store_label(&self) -> &'static str {
        "etcd"
    }

    fn engine(&self) -> &Engine {
        &self.inner.engine
    }
}

/// A write on a session lease under way: if it is dropped before its answer (or got
/// none), the write may still arrive, so the key's place records the lease as doubtful.
struct Pending<'a> {
    etcd: &'a Etcd,
    key: &'a str,
    lease: i64,
    answered: bool,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if !self.answered {
            self.etcd.doubt(self.key, self.lease);
        }
    }
}

/// Ends a waiter's watch task with the waiter.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The fence is the create revision of the holder's queue key: etcd's revision counter is
/// cluster-wide, strictly increasing and persisted (raft log and snapshots), so it survives
/// restarts and leader changes, and the queue grants in create-revision order.
impl RawFencing for Etcd {}

/// The record is one key without a lease (`{K}:leader/`), so it outlives its leader as
/// revisions do. [`publish`](RawElection::publish) is one transaction that puts the record
/// if the publisher's queue key `K/<token>` has the create revision `term` and no key
/// under `K/` was created before it: then that key is the first of the queue, the
/// holder. The term is normally the holder's fence, that key's create revision, so this
/// is one round trip. Otherwise (the key is gone, the caller passed a term of its own, or
/// a key of a lock named below this one, `K/x/…`, is older) the publish reads the queue
/// and, if the token's key is its first, puts the record if that key still has the create
/// revision it was first with: no key created later can come before it, so it is still
/// the holder. The stored record's term is not compared (etcd's revisions never go back,
/// but the contract lets a reset store's elections go on). The write itself is the
/// announcement: [`watch_record`](RawElection::watch_record) is an etcd watch of puts on
/// the key.
impl RawElection for Etcd {
    async fn publish(&self, keys: &LockKeys, token: &Token, term: u64, data: &str) -> Result<bool> {
        let holder = queue_key(keys, token);
        let record = record_key(keys);
        let value = super::record_text(term, data);
        // Revision 0 would match an absent key; no key is created at it.
        if let Some(rev) = i64::try_from(term).ok().filter(|rev| *rev > 0) {
            let first = vec![
                Compare::create_revision(holder.as_str(), CompareOp::Equal, rev),
                Compare::create_revision(queue_prefix(keys), CompareOp::Greater, rev - 1)
                    .with_prefix(),
            ];
            if self.put_if(first, &record, &value).await? {
                return Ok(true);
            }
        }
        let (_, queue) = self.queue(keys).await?;
        match queue.first() {
            Some(head) if head.key == holder.as_bytes() => {
                let still = vec![Compare::create_revision(
                    holder.as_str(),
                    CompareOp::Equal,
                    head.created,
                )];
                self.put_if(still, &record, &value).await
            }
            _ => Ok(false),
        }
    }

    async fn record(&self, keys: &LockKeys) -> Result<Option<(u64, String)>> {
        let key = record_key(keys);
        let resp = self
            .call("reading an election record", |mut c| async move {
                c.get(key, None).await
            })
            .await?;
        resp.kvs()
            .first()
            .map(|kv| super::parse_record(kv.value(), "in etcd"))
            .transpose()
    }

    /// Wakes at every write of the record (an etcd watch of puts on its key).
    async fn watch_record(&self, keys: &LockKeys) -> Result<ReleaseWatch> {
        let options = WatchOptions::new().with_filters([WatchFilterType::NoDelete]);
        self.wake_on(
            record_key(keys),
            options,
            EventType::Put,
            "watching an election record",
        )
        .await
    }
}

/// The key of an election's record: the companion key [`RECORD`] plus a `/`
/// (`{K}:leader/`). A key that ends in `/` is in no lock's queue (a queue key has a
/// non-empty rest after `K/`, without `/`), so no lock's waiters, holder or
/// [`list`](RawInspect::list) can take it for theirs.
fn record_key(keys: &LockKeys) -> String {
    format!("{}/", keys.companion(RECORD))
}

/// Every key lock `keys` of `primitive` (a plain or fair lock, a semaphore, a reentrant or
/// read-write lock, or an election: the lock and its record) uses, as `key <key>`, named
/// by the functions the backend calls: its queue keys (for sample tokens: dlock's, and
/// etcd's own lock recipe's lease ids; for sample owners, a reentrant lock's owners'
/// keys), a semaphore's permit count and an election's record; and,
/// as `queue <prefix>`, the queue whose range read ([`in_queue`]) takes each key for one of
/// its own, so that a key of one lock in another's queue is a shared entry.
#[cfg(test)]
pub(crate) fn key_set(primitive: &str, keys: &LockKeys) -> Vec<String> {
    let mut all = Vec::new();
    for token in ["0123456789abcdef0123456789abcdef", "694d7a1c2b3e4f50"] {
        let token = Token::from_string(token).expect("a valid token");
        all.push(queue_key(keys, &token));
    }
    match primitive {
        "election" => all.push(record_key(keys)),
        "semaphore" => all.push(family::permits_key(keys)),
        // Owners' keys: the owner of a task, and owners with the escapes' characters.
        "reentrant" => {
            for owner in ["4242/task-7", "a%2Fb/c", "%/"] {
                all.push(family::owner_key(keys, owner));
            }
        }
        _ => {}
    }
    let mut out = Vec::new();
    for key in all {
        let cut = key.rfind('/').map_or(0, |i| i + 1);
        if in_queue(&key.as_bytes()[..cut], key.as_bytes()) {
            assert!(key.starts_with(&queue_prefix(keys)));
            out.push(format!("queue {}", &key[..cut]));
        }
        out.push(format!("key {key}"));
    }
    out
}

impl RawInspect for Etcd {
    async fn inspect(&self, kind: Primitive, keys: &LockKeys) -> Result<LockState> {
        match kind {
            Primitive::Lock | Primitive::Fair => self.inspect_plain(keys).await,
            Primitive::Semaphore => self.inspect_permits(keys).await,
            Primitive::Reentrant => self.inspect_reentrant(keys).await,
            Primitive::RwLock => self.inspect_rw(keys).await,
        }
    }

    async fn force_unlock(&self, kind: Primitive, keys: &LockKeys) -> Result<bool> {
        match kind {
            Primitive::Lock | Primitive::Fair => self.force_unlock_plain(keys).await,
            Primitive::Semaphore => self.force_unlock_permits(keys).await,
            Primitive::Reentrant => self.force_unlock_reentrant(keys).await,
            Primitive::RwLock => self.force_unlock_rw(keys).await,
        }
    }

    async fn list(&self, prefix: &str, pattern: &str, limit: usize) -> Result<Vec<String>> {
        crate::observe::listed(self.store_label(), pattern, async move {
            if limit == 0 {
                return Ok(Vec::new());
            }
            let from = prefix.to_owned();
            let resp = self
                .call("listing locks", |mut c| async move {
                    c.get(from, Some(GetOptions::new().with_prefix().with_keys_only()))
                        .await
                })
                .await?;
            // A lock is held while its queue has a key: name it once.
            let mut names = BTreeSet::new();
            for kv in resp.kvs().iter().filter(|kv| kv.lease() != 0) {
                let Some(name) = std::str::from_utf8(kv.key())
                    .ok()
                    .and_then(|k| k.strip_prefix(prefix))
                    .and_then(|k| k.rsplit_once('/'))
                    .and_then(|(name, rest)| {
                        (!name.is_empty() && !rest.is_empty()).then_some(name)
                    })
                else {
                    continue;
                };
                if crate::backend::glob_match(pattern.as_bytes(), name.as_bytes()) {
                    names.insert(name.to_owned());
                    if names.len() >= limit {
                        break;
                    }
                }
            }
            Ok(names.into_iter().collect())
        })
        .await
    }
}

/// The plain lock's inspection, for [`RawInspect`].
impl Etcd {
    pub(crate) async fn inspect_plain(&self, keys: &LockKeys) -> Result<LockState> {
        let (prefix, queue) = self.queue(keys).await?;
        let Some(head) = queue.first() else {
            return Ok(LockState::new(None, None, None)
                .with_queued(0)
                .with_waiting_clients(0));
        };
        // Every queued key is a waiting client (each waiter has its own).
        let waiting = queue.len() - 1;
        Ok(LockState::new(
            Some(head.owner(&prefix)),
            self.lease_remaining(head.lease).await?,
            u64::try_from(head.created).ok(),
        )
        .with_queued(u32::try_from(waiting).unwrap_or(u32::MAX))
        .with_waiting_clients(waiting as u64))
    }

    pub(crate) async fn force_unlock_plain(&self, keys: &LockKeys) -> Result<bool> {
        // The holder may release (and the next take over) between our read and the delete:
        // then read again.
        for _ in 0..3 {
            let (_, queue) = self.queue(keys).await?;
            let Some(head) = queue.into_iter().next() else {
                return Ok(false);
            };
            let txn = Txn::new()
                .when([Compare::create_revision(
                    head.key.clone(),
                    CompareOp::Equal,
                    head.created,
                )])
                .and_then([TxnOp::delete(head.key.clone(), None)]);
            let resp = self
                .call("force-unlocking", |mut c| async move { c.txn(txn).await })
                .await?;
            // The key's lease stays: it is its client's session lease (dlock's or etcd's
            // lock service's), which its other keys may be on.
            if resp.succeeded() {
                return Ok(true);
            }
        }
        Ok(false)
    }
}

#[cfg(test)]
mod tests {
    use super::{in_queue, lease_seconds, record_key};
    use crate::backend::parse_record;
    use crate::keys::LockKeys;
    use std::time::Duration;

    #[test]
    fn an_election_record_is_in_no_queue_and_reads_back() {
        for (prefix, name) in [("dlock-election:", "a"), ("p:", "{o}x"), ("", "a/b")] {
            let keys = LockKeys::new(prefix, name).expect("valid");
            let key = record_key(&keys);
            for cut in 0..key.len() {
                assert!(!in_queue(&key.as_bytes()[..cut], key.as_bytes()), "{key}");
            }
        }
        let data = "token\nline one\nünïcödé\n";
        assert_eq!(
            parse_record(format!("42\n{data}").as_bytes(), "").ok(),
            Some((42, data.to_owned()))
        );
        assert!(parse_record(b"x\ny", "").is_err());
        assert!(parse_record(b"42", "").is_err());
    }

    #[test]
    fn family_values_name_their_token_and_permits() {
        use super::{Kind, holds_token, permits_of, untagged};
        let token = crate::Token::from_string("0123abcd").expect("token");
        let plain = Kind::Plain.value(&token);
        let three = Kind::Permits { n: 3, count: 5 }.value(&token);
        assert_eq!(three, "p3 0123abcd");
        for value in [&plain, &three] {
            assert!(holds_token(value.as_bytes(), &token), "{value}");
            assert_eq!(untagged(value.as_bytes()), b"0123abcd");
        }
        assert_eq!(permits_of(three.as_bytes()), 3);
        assert_eq!(permits_of(plain.as_bytes()), 1);
        let other = crate::Token::from_string("abcd").expect("token");
        assert!(!holds_token(three.as_bytes(), &other));
        assert!(!holds_token(b"x 0123abcd", &token));
        // A semaphore's count is in no queue.
        for (prefix, name) in [("dlock-sem:", "a"), ("", "a/b"), ("p:", "{o}x")] {
            let keys = LockKeys::new(prefix, name).expect("valid");
            let key = super::family::permits_key(&keys);
            for cut in 0..key.len() {
                assert!(!in_queue(&key.as_bytes()[..cut], key.as_bytes()), "{key}");
            }
        }
    }

    #[test]
    fn lease_seconds_round_up() {
        assert_eq!(lease_seconds(Duration::from_millis(100)), 1);
        assert_eq!(lease_seconds(Duration::from_millis(1001)), 2);
        assert_eq!(lease_seconds(Duration::from_secs(30)), 30);
    }

    proptest::proptest! {
        #![proptest_config(crate::backend::hostile::cases(48))]
        /// No name reaches another lock's keys or queue (DESIGN.md principle 9).
        #[test]
        fn distinct_locks_share_no_key_or_queue(
            names in proptest::collection::vec(crate::keys::namespace::hostile_name(), 1..3)
        ) {
            // Every primitive: etcd offers the whole family.
            let primitives = crate::keys::namespace::PRIMITIVES;
            crate::keys::namespace::check_disjoint(primitives, &names, super::key_set)?;
        }
    }

    #[test]
    fn the_queue_leaves_out_locks_named_below_it() {
        assert!(in_queue(b"dlock:a/", b"dlock:a/0123abcd"));
        assert!(in_queue(b"dlock:a/", b"dlock:a/694d7a1c2b3e4f50"));
        assert!(!in_queue(b"dlock:a/", b"dlock:a/b/0123abcd"));
        assert!(!in_queue(b"dlock:a/", b"dlock:a/"));
        assert!(!in_queue(b"dlock:a/", b"dlock:ab/0123"));
    }
}

/// Hostile input: URLs, and whatever keys and values a queue's prefix holds.
#[cfg(test)]
mod props {
    use proptest::prelude::*;

    use super::{Queued, in_queue, parse_url};
    use crate::backend::hostile::{any_url, cases, check, url_with_password};

    #[test]
    fn etcd_urls() {
        assert_eq!(
            parse_url("etcd://a:1,b.c:2/").ok(),
            Some(vec!["http://a:1".to_owned(), "http://b.c:2".to_owned()])
        );
        assert_eq!(
            parse_url("etcd://[::1]:2379").ok(),
            Some(vec!["http://[::1]:2379".to_owned()])
        );
        for bad in [
            "etcd://",
            "etcd://h",
            "etcd://h:x",
            "etcd://h:1/x",
            "etcd://h:1?x=1",
            "etcd://h h:1",
            "etcd://[zz]:1",
            "http://h:1",
        ] {
            let err = parse_url(bad).expect_err(bad);
            assert_eq!(err.kind(), crate::ErrorKind::InvalidArgument, "{bad}");
        }
        // A parameter is named, whatever its value; none does nothing.
        for (url, name) in [
            ("etcd://h:1?min_replicas=1", "min_replicas"),
            ("etcd://h:1/?x", "x"),
        ] {
            let err = parse_url(url).expect_err(url);
            assert!(
                err.to_string()
                    .contains(&format!("unknown parameter {name:?}")),
                "{err}"
            );
        }
        let err = parse_url("etcd://root:s3cret!@h:1").expect_err("credentials");
        assert!(!format!("{err} {err:?}").contains("s3cret!"), "{err:?}");
    }

    proptest! {
        #![proptest_config(cases(256))]

        #[test]
        fn any_string_parses_or_is_invalid(url in any_url(&["etcd"])) {
            let parsed = parse_url(&url);
            check(&parsed, "")?;
            for endpoint in parsed.unwrap_or_default() {
                // What reaches the gRPC client is a plain http://host:port.
                let uri = endpoint.parse::<tonic::transport::Uri>();
                prop_assert!(uri.is_ok(), "{}", endpoint);
            }
        }

        #[test]
        fn passwords_never_reach_errors((url, secret) in url_with_password(&["etcd"])) {
            check(&parse_url(&url), &secret)?;
        }

        #[test]
        fn any_key_under_a_prefix_is_read_without_panicking(
            prefix in prop::collection::vec(any::<u8>(), 0..6),
            key in prop::collection::vec(any::<u8>(), 0..12),
            value in prop::collection::vec(any::<u8>(), 0..12),
            joined in any::<bool>(),
        ) {
            // Often a key of the queue, sometimes anything.
            let key = if joined { [&prefix[..], &key[..]].concat() } else { key };
            let Ok(prefix) = String::from_utf8(prefix) else { return Ok(()) };
            if in_queue(prefix.as_bytes(), &key) {
                let rest = &key[prefix.len()..];
                prop_assert!(!rest.is_empty() && !rest.contains(&b'/'));
                let queued = Queued { key: key.clone(), value: value.clone(), created: 1, lease: 0 };
                let _ = queued.owner(&prefix);
                // The family's tags: any value reads as some permits, and names a token
                // only as a whole token after a tag.
                let _ = super::permits_of(&value);
                let token = std::str::from_utf8(rest)
                    .ok()
                    .and_then(|r| crate::Token::from_string(r).ok());
                if let Some(token) = token
                    && super::holds_token(&value, &token)
                {
                    prop_assert!(value.ends_with(rest));
                }
            } else {
                prop_assert!(!key.starts_with(prefix.as_bytes()) || key.len() == prefix.len() || key[prefix.len()..].contains(&b'/'));
            }
        }
    }
}
