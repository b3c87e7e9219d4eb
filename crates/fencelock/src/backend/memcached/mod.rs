//! Memcached: the classic `add` lock, done right, over the meta protocol (memcached 1.6+).
//!
//! * **Acquire** is ONE round trip: `ms <key> … ME` (add: stored only if the key is
//!   absent, with its expiry in the same command), then, pipelined behind it, `ma` on the
//!   fence counter and `mg` of the lock key. The fence counts only if the add succeeded
//!   *and* the key still held our token when the fence was minted (see
//!   [fences](#fences)).
//! * **Release** is compare-and-delete by CAS: `mg` (value + CAS), then `md <key> C<cas>`
//!   only if the value is our token — never a blind `delete` (the classic recipe deletes
//!   whatever is there).
//! * **Extend** is compare-and-set by CAS: `ms <key> … C<cas> MS` with our token again and
//!   the new expiry.
//! * **Renewal** of many leases (the watchdog's [`extend_many`](RawLock::extend_many)) is
//!   two pipelined round trips on one connection for the batch's plain locks: every
//!   `mg`, then every CAS-checked `ms` (the family's leases, in items of their own, are
//!   renewed each by its primitive's extend, all of them at once).
//! * **No notification**: memcached has no pub/sub; waiters retry with jittered
//!   exponential backoff (10 ms doubling to 500 ms, [`Retry`](crate::Retry)) and at the
//!   holder's remaining ttl.
//!
//! # Connections
//!
//! One client (and its clones) keeps a small pool of connections: each call takes an idle
//! connection, or opens one if none is idle, and has it to itself for its exchange (its
//! commands pipelined in one write, their replies read in order), so concurrent calls run
//! side by side on separate connections. At most `max_connections` are open at once
//! ([`DEFAULT_MAX_CONNECTIONS`], or `memcache://host:port?max_connections=N`); further
//! calls wait, first come first served, for one to come free, and that wait counts
//! towards the call's 2 s time bound. Idle connections stay open for reuse.
//!
//! A connection goes back to the pool only after every reply of its exchange was read. A
//! call that fails, times out or is **cancelled** mid-exchange drops its connection
//! (closing it), so no later call can read its replies as its own; the next call that
//! needs one opens a new one. A connection that breaks (`Unavailable`) also closes the
//! idle ones, which most likely share its fate (a restarted server), so the calls after
//! a failure open fresh connections rather than each failing once on a stale one (calls
//! then in flight on other connections fail, or not, on their own). Reconnection is lazy:
//! there is no background task.
//!
//! # Expiry
//!
//! Memcached counts expiry in whole seconds on a clock that ticks once a second, treats
//! values over 30 days as absolute Unix times, 0 as "never" and negatives as "expired".
//! So a ttl is rounded **up** to whole seconds, must be at least [`MIN_TTL`] (a 1 s
//! expiry can fire after a few milliseconds: the second may be about to tick), and at most
//! 30 days; the lease's validity is the requested ttl minus the usual drift **minus one
//! second** ([`RawLock::drift`]).
//!
//! # Keys
//!
//! Memcached keys are at most 250 bytes, without spaces or control characters. A lock key
//! that fits is used as is; any other (long, spaces, control characters, non-ASCII) is
//! mapped to `<first 32 safe bytes>~<SHA-1 of the whole key in hex>`, so any lock name
//! works. The fence counter is the mapped key plus `~fence`, an election's record the
//! mapped key plus `~elect`.
//!
//! # Fences
//!
//! The fence comes from `ma` (atomic increment) on the counter, pipelined after the add.
//! Memcached cannot make the add and the increment one atomic step, so a grant is only
//! reported if the `mg` that follows the increment still finds our token: then no later
//! holder can have been granted before our increment, and every later holder's increment
//! comes after ours. **Ordering guaranteed**: fences of grants reported by this backend
//! strictly increase in grant order, while the counter survives. **Not guaranteed**: the
//! counter lives in memcached's memory — a restart, `flush_all` or an LRU eviction of the
//! counter resets it to 1, and fences then repeat. Eviction can also drop a held lock key
//! early under memory pressure: the holder learns it at its next renewal (`lost()`
//! fires), while another holder may already have been granted. So does the eviction of
//! a semaphore's or a read-write lock's index item for the permit holders and readers it
//! listed: they renew only while the index lists them. Run memcached with `-M`
//! (no evictions: a full cache refuses new items, so acquires fail instead of held locks
//! vanishing) and memory to spare, or use Redis with persistence where fencing must
//! survive. On connect the client reads `stats settings` and reports a server that
//! evicts ([`Memcached::config_hazards`]; the `dlock` tool refuses it unless
//! `--allow-unsafe-store`).
//!
//! # The lock family on memcached
//!
//! Memcached has `add`, expiry on its own clock and CAS on one item; no scripts, no
//! notifications, no key listing, no atomic step over two items. Per primitive:
//!
//! | primitive | offered | how, or why not |
//! |---|---|---|
//! | [`Lock`](crate::Lock) | yes | `add` + fence, CAS release and renewal (above) |
//! | [`Semaphore`](crate::Semaphore) | yes | CAS on one index item, a lease item per holder ([`RawSemaphore`] impl) |
//! | [`ReentrantLock`](crate::ReentrantLock) | yes | one item changed by CAS: fence, owner, a token per hold ([`RawReentrant`] impl) |
//! | [`Election`](crate::Election) | yes | the lock plus a record item (below) |
//! | [`RwLock`](crate::RwLock) | yes | the plain lock's item for the writer; readers and waiting writers listed in one index item changed by CAS, each alive while its lease item is; every grant a CAS on the index ([`RawRwLock`] impl) |
//! | [`FairLock`](crate::FairLock) | yes | the plain lock's item, and a line of waiters in one item changed by CAS, each waiter alive while its claim item (renewed by its attempts) is ([`RawFair`](crate::raw::RawFair) impl) |
//!
//! What cannot be had on memcached is a wake-up: waiters of every primitive poll (jittered
//! backoff, and the holder's remaining ttl), so none is fair.
//!
//! # Elections
//!
//! An election's record ([`RawElection`]) is one item without expiry, written by a
//! gets/cas loop that first checks the lock key still holds the publisher's token (two
//! items cannot be checked and written atomically; the impl's docs say what remains).
//! Terms are not compared. Observers cannot be notified: they read again at a short
//! interval. Like the fence counter, the record is lost to a restart, `flush_all` or an
//! eviction (see the impl's docs for what readers see then).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::Semaphore;
use tokio::time::Instant;

use crate::backend::hazard::{self, ConfigHazard};
use crate::backend::join_all;
use crate::engine::{Engine, LeaseKind};
use crate::error::{Error, ErrorKind, Result};
use crate::keys::LockKeys;
use crate::raw::{
    Acquire, LockState, RawElection, RawFencing, RawInspect, RawLock, RawReentrant, RawRwLock,
    RawSemaphore, ReleaseWatch, Renewal,
};
use crate::token::Token;
use crate::validity::Drift;

mod fair;
mod items;
mod reentrant;
mod rwlock;
mod semaphore;

/// Shortest ttl memcached's one-second expiry clock can hold with some validity left.
pub const MIN_TTL: Duration = Duration::from_secs(2);
/// Longest ttl memcached takes as relative (30 days; beyond is an absolute Unix time).
pub const MAX_TTL: Duration = Duration::from_secs(30 * 24 * 3600);
/// Longest key memcached accepts.
pub const MAX_KEY_LEN: usize = 250;
/// The largest value a reply may announce (memcached's own item size limit tops out at
/// 1 GiB); anything larger is a garbled reply.
const MAX_VALUE_LEN: usize = 1 << 30;
/// How many connections one client opens at most unless its URL says otherwise
/// (`?max_connections=N`).
pub const DEFAULT_MAX_CONNECTIONS: usize = 8;
/// The largest `max_connections` a URL may ask for.
pub const MAX_CONNECTIONS_LIMIT: usize = 1024;

const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);

/// A memcached client for locks: a small pool of connections, one request (itself
/// pipelined) per connection at a time, so concurrent calls run side by side. Cheap to
/// clone; clones share the pool and the watchdog.
///
/// ```no_run
/// # async fn demo() -> fencelock::Result<()> {
/// let mc = fencelock::backend::Memcached::connect("memcache://127.0.0.1:11211").await?;
/// let lock = fencelock::Lock::builder(mc, "nightly")
///     .ttl(std::time::Duration::from_secs(10))
///     .build()?;
/// let guard = lock.lock().await?;
/// println!("fence {}", guard.fencing_token());
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Memcached {
    inner: Arc<Inner>,
}

struct Inner {
    addr: String,
    timeout: Duration,
    max_connections: usize,
    /// One permit per connection that may be in use: a call holds one for its whole
    /// exchange, so at most `max_connections` connections exist (idle ones were opened
    /// under a permit and are only reused under one).
    permits: Semaphore,
    /// Connections between calls, every reply of their last exchange read.
    idle: Mutex<Vec<Conn>>,
    engine: Engine,
    /// What the server's configuration can do to locks, read on connect.
    hazards: std::sync::OnceLock<Vec<ConfigHazard>>,
}

impl Inner {
    fn take_idle(&self) -> Option<Conn> {
        self.idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop()
    }

    fn put_idle(&self, conn: Conn) {
        self.idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(conn);
    }

    /// Closes every idle connection (after one failed: they most likely share its fate,
    /// e.g. a restarted server).
    fn close_idle(&self) {
        self.idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }
}

/// One connection, read and written independently so a long pipeline cannot deadlock
/// (memcached stops reading while its replies are not taken).
struct Conn {
    reader: BufReader<OwnedReadHalf>,
    writer: OwnedWriteHalf,
}

impl Conn {
    async fn open(addr: &str) -> Result<Conn> {
        let stream = TcpStream::connect(addr).await.map_err(|e| {
            Error::new(
                ErrorKind::Unavailable,
                format!("connecting to memcached at {addr}: {e}"),
            )
            .retryable(true)
        })?;
        let _ = stream.set_nodelay(true);
        let (reader, writer) = stream.into_split();
        Ok(Conn {
            reader: BufReader::new(reader),
            writer,
        })
    }

    /// Writes `request` while reading `replies` replies.
    async fn exchange(&mut self, request: &[u8], replies: usize) -> Result<Vec<Reply>> {
        let Conn { reader, writer } = self;
        let write = async { writer.write_all(request).await.map_err(io_err) };
        let read = async {
            let mut out = Vec::with_capacity(replies);
            for _ in 0..replies {
                out.push(read_reply(reader).await?);
            }
            Ok(out)
        };
        let ((), out) = tokio::try_join!(write, read)?;
        Ok(out)
    }
}

impl std::fmt::Debug for Memcached {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Memcached")
            .field("addr", &self.inner.addr)
            .field("max_connections", &self.inner.max_connections)
            .finish_non_exhaustive()
    }
}

/// One reply line of the meta protocol, with the data block of a `VA` reply.
#[derive(Debug)]
struct Reply {
    code: String,
    flags: Vec<String>,
    data: Option<Vec<u8>>,
}

impl Reply {
    fn flag(&self, name: char) -> Option<&str> {
        self.flags.iter().find_map(|f| f.strip_prefix(name))
    }
}

/// `host:port` and the connection bound of a `memcache://` URL. Messages show the URL
/// redacted (memcached takes no credentials, but a URL may carry some all the same).
fn parse_url(url: &str) -> Result<(String, usize)> {
    let shown = super::redact_url(url);
    let bad = |why: &str| Error::invalid(format!("bad memcached URL {shown:?}: {why}"));
    let rest = url
        .strip_prefix("memcache://")
        .or_else(|| url.strip_prefix("memcached://"))
        .ok_or_else(|| {
            Error::invalid(format!(
                "unsupported memcached URL {shown:?}: expected memcache://host:port"
            ))
        })?;
    let (addr, query) = rest.split_once('?').unwrap_or((rest, ""));
    let addr = addr.trim_end_matches('/');
    let usage = "expected memcache://host:port[?max_connections=N]";
    if addr.is_empty() || addr.contains(['/', '@', ',']) || addr.contains(char::is_whitespace) {
        return Err(bad(usage));
    }
    let mut max_connections = DEFAULT_MAX_CONNECTIONS;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("max_connections", n)) => {
                max_connections = n
                    .parse()
                    .ok()
                    .filter(|n| (1..=MAX_CONNECTIONS_LIMIT).contains(n))
                    .ok_or_else(|| {
                        bad(&format!(
                            "max_connections must be 1 to {MAX_CONNECTIONS_LIMIT}"
                        ))
                    })?;
            }
            // The option's name only: its value could be a secret.
            _ => {
                let name = pair.split_once('=').map_or(pair, |(name, _)| name);
                return Err(bad(&format!(
                    "unknown option {name:?} (known: max_connections)"
                )));
            }
        }
    }
    // `host`, `host:port`, `[v6]` or `[v6]:port`; a bad port is the URL's fault, not an
    // unreachable server's.
    let (host, port) = match addr.rsplit_once(':') {
        Some((host, port)) if !addr.ends_with(']') => (host, Some(port)),
        _ => (addr, None),
    };
    if host.is_empty() || port.is_some_and(|p| p.parse::<u16>().is_err()) {
        return Err(bad(usage));
    }
    let addr = match port {
        Some(_) => addr.to_owned(),
        None => format!("{addr}:11211"),
    };
    Ok((addr, max_connections))
}

impl Memcached {
    /// Connects to `memcache://host:port` (port 11211 if omitted), opening one connection
    /// now and more, up to `max_connections` (default [`DEFAULT_MAX_CONNECTIONS`]; set it
    /// with `memcache://host:port?max_connections=N`, 1 to [`MAX_CONNECTIONS_LIMIT`]),
    /// while calls overlap.
    ///
    /// On connect it also reads the server's `stats settings`: a server that evicts
    /// (memcached's default; `-M` turns it off) can drop a held lock and a fence
    /// counter under memory pressure, which [`config_hazards`](Memcached::config_hazards)
    /// then reports (and a `tracing` warning says once).
    ///
    /// # Errors
    /// `InvalidArgument` for a malformed URL (an unknown parameter included);
    /// `Unavailable` if the server cannot be reached within 2 s; `Backend` if it does not
    /// speak the meta protocol (memcached older than 1.6).
    pub async fn connect(url: &str) -> Result<Memcached> {
        let (addr, max_connections) = parse_url(url)?;
        let mc = Memcached {
            inner: Arc::new(Inner {
                addr,
                timeout: DEFAULT_TIMEOUT,
                max_connections,
                permits: Semaphore::new(max_connections),
                idle: Mutex::new(Vec::with_capacity(max_connections)),
                engine: Engine::new(),
                hazards: std::sync::OnceLock::new(),
            }),
        };
        // Proves the server is there and speaks the meta protocol.
        let replies = mc.call(b"mn\r\n".to_vec(), 1).await?;
        if replies.first().map(|r| r.code.as_str()) != Some("MN") {
            return Err(Error::new(
                ErrorKind::Backend,
                "the server does not speak memcached's meta protocol (memcached 1.6+ needed)",
            ));
        }
        let hazards = match mc.read_settings().await {
            Ok(text) => hazard::found(hazard::memcached_settings(&mc.inner.addr, &text)),
            Err(e) => {
                tracing::warn!(
                    "could not read memcached's settings ({e}): eviction was not checked"
                );
                Vec::new()
            }
        };
        let _ = mc.inner.hazards.set(hazards);
        Ok(mc)
    }

    /// The server's address.
    pub fn addr(&self) -> &str {
        &self.inner.addr
    }

    /// The most connections this client opens at once.
    pub fn max_connections(&self) -> usize {
        self.inner.max_connections
    }

    /// What the server's configuration can do to locks and fences, as read on connect
    /// (`stats settings`): with evictions on (memcached's default) a full cache may
    /// evict a held lock's item (another holder is then granted while the first still
    /// runs; it learns at its next renewal) and a fence counter (fences start again at
    /// 1): [`HazardKind::EvictsLocksAndFences`](crate::backend::HazardKind). Start
    /// memcached with `-M` (a full cache then refuses new items: acquires fail, nothing
    /// held is dropped). [`refuse_config_hazards`](crate::backend::refuse_config_hazards)
    /// turns it into an error.
    pub fn config_hazards(&self) -> Vec<ConfigHazard> {
        self.inner.hazards.get().cloned().unwrap_or_default()
    }

    /// The `STAT` lines of memcached's `stats settings`, on a connection of the pool (the
    /// reply's length is not known ahead, unlike the meta commands', so not through
    /// [`call`](Memcached::call)), within the call bound.
    async fn read_settings(&self) -> Result<String> {
        /// `stats settings` has about 70 lines: more is no memcached.
        const MAX_LINES: usize = 1000;
        let inner = &*self.inner;
        let _permit = inner
            .permits
            .acquire()
            .await
            .map_err(|_| Error::new(ErrorKind::Backend, "memcached client closed"))?;
        let idle = inner.take_idle();
        let read = async {
            let mut conn = match idle {
                Some(conn) => conn,
                None => Conn::open(&inner.addr).await?,
            };
            conn.writer
                .write_all(b"stats settings\r\n")
                .await
                .map_err(io_err)?;
            let mut text = String::new();
            for _ in 0..MAX_LINES {
                let mut line = String::new();
                if conn.reader.read_line(&mut line).await.map_err(io_err)? == 0 {
                    return Err(io_err(std::io::ErrorKind::UnexpectedEof.into()));
                }
                if line.trim_end() == "END" {
                    // Every line read: the connection can serve the next call.
                    inner.put_idle(conn);
                    return Ok(text);
                }
                if !line.starts_with("STAT ") {
                    return Err(unexpected("stats settings", line.trim_end()));
                }
                text.push_str(&line);
            }
            Err(unexpected("stats settings", "too many lines"))
        };
        tokio::time::timeout(inner.timeout, read)
            .await
            .map_err(|_| Error::new(ErrorKind::TimedOut, "reading memcached's settings"))?
    }

    /// Sends `request` (one or more pipelined commands) and reads `replies` replies, on
    /// one connection of the pool used by no other call meanwhile, bounded in time
    /// (waiting for a free connection included). A connection whose state is unknown (an
    /// error, a timeout or a cancellation mid-exchange) is dropped, never reused.
    async fn call(&self, request: Vec<u8>, replies: usize) -> Result<Vec<Reply>> {
        let inner = &*self.inner;
        let deadline = Instant::now() + inner.timeout;
        let timed_out = || {
            Error::new(
                ErrorKind::TimedOut,
                format!("memcached at {} did not answer in time", inner.addr),
            )
            .retryable(true)
        };
        // Waiters queue here (first come, first served), one per pending call: nothing
        // is buffered for them.
        let _permit = tokio::time::timeout_at(deadline, inner.permits.acquire())
            .await
            .map_err(|_| timed_out())?
            .map_err(|_| Error::new(ErrorKind::Backend, "memcached client closed"))?;
        // The connection is owned by the exchange and goes back to the pool only once
        // every reply was read: a call cancelled mid-exchange drops it (closing it), so
        // no later call can read this one's replies as its own.
        let idle = inner.take_idle();
        let exchange = async {
            let mut conn = match idle {
                Some(conn) => conn,
                None => Conn::open(&inner.addr).await?,
            };
            let out = conn.exchange(&request, replies).await?;
            Ok::<_, Error>((conn, out))
        };
        match tokio::time::timeout_at(deadline, exchange).await {
            Ok(Ok((conn, out))) => {
                inner.put_idle(conn);
                Ok(out)
            }
            Ok(Err(err)) => {
                if err.kind() == ErrorKind::Unavailable {
                    inner.close_idle();
                }
                Err(err)
            }
            Err(_) => Err(timed_out()),
        }
    }

    /// `mg <key> v c t`: the value, its CAS and remaining seconds, if present.
    async fn get(&self, key: &str) -> Result<Option<Stored>> {
        let reply = self.one(format!("mg {key} v c t\r\n").into_bytes()).await?;
        get_reply(reply)
    }

    async fn one(&self, request: Vec<u8>) -> Result<Reply> {
        self.call(request, 1)
            .await?
            .pop()
            .ok_or_else(|| unexpected("a command", "no reply"))
    }

    /// Compare-and-delete of one item by CAS: deletes `key` only while it holds `token`.
    /// Returns whether it did.
    async fn release_item(&self, key: &str, token: &Token) -> Result<bool> {
        for _ in 0..3 {
            let Some((value, cas, _)) = self.get(key).await? else {
                return Ok(false);
            };
            if value != token.as_str().as_bytes() {
                return Ok(false);
            }
            let reply = self
                .one(format!("md {key} C{cas}\r\n").into_bytes())
                .await?;
            match reply.code.as_str() {
                "HD" => return Ok(true),
                "NF" => return Ok(false),
                // Changed between our read and the delete: look again.
                "EX" => {}
                other => return Err(unexpected("md", other)),
            }
        }
        Err(Error::new(
            ErrorKind::Backend,
            "the lock key kept changing while releasing",
        )
        .retryable(true))
    }

    /// Compare-and-set of one item's expiry by CAS: renews `key` for `secs` only while it
    /// holds `token`. Returns whether it did.
    async fn extend_item(&self, key: &str, token: &Token, secs: u64) -> Result<bool> {
        let value = token.as_str();
        for _ in 0..3 {
            let Some((current, cas, _)) = self.get(key).await? else {
                return Ok(false);
            };
            if current != value.as_bytes() {
                return Ok(false);
            }
            let reply = self
                .one(extend_request(key, value, secs, &cas).into_bytes())
                .await?;
            if let Some(renewed) = Self::extend_outcome(&reply)? {
                return Ok(renewed);
            }
        }
        Err(Error::new(
            ErrorKind::Backend,
            "the lock key kept changing while extending",
        )
        .retryable(true))
    }

    /// The CAS-checked set of an extend: `Some(renewed)`, or `None` if the key changed
    /// since its CAS was read.
    fn extend_outcome(reply: &Reply) -> Result<Option<bool>> {
        match reply.code.as_str() {
            "HD" => Ok(Some(true)),
            "NF" | "NS" => Ok(Some(false)),
            "EX" => Ok(None),
            other => Err(unexpected("ms (extend)", other)),
        }
    }
}

/// A key's value, its CAS and its remaining seconds (if asked for).
type Stored = (Vec<u8>, String, Option<i64>);

/// The outcome of `mg <key> v c [t]`.
fn get_reply(reply: Reply) -> Result<Option<Stored>> {
    match reply.code.as_str() {
        "EN" => Ok(None),
        "VA" => {
            let cas = reply.flag('c').unwrap_or_default().to_owned();
            let ttl = reply.flag('t').and_then(|t| t.parse().ok());
            Ok(Some((reply.data.unwrap_or_default(), cas, ttl)))
        }
        other => Err(unexpected("mg", other)),
    }
}

fn extend_request(key: &str, value: &str, secs: u64, cas: &str) -> String {
    format!("ms {key} {} T{secs} C{cas} MS\r\n{value}\r\n", value.len())
}

fn io_err(e: std::io::Error) -> Error {
    Error::new(ErrorKind::Unavailable, format!("memcached connection: {e}")).retryable(true)
}

/// The same error again, for each of the calls a batch failed for.
fn copy_err(e: &Error) -> Error {
    Error::new(e.kind(), e.message().to_owned()).retryable(e.is_retryable())
}

fn unexpected(command: &str, reply: &str) -> Error {
    Error::new(
        ErrorKind::Backend,
        format!("unexpected memcached reply to {command}: {reply:?}"),
    )
}

async fn read_reply<R: AsyncBufRead + Unpin>(conn: &mut R) -> Result<Reply> {
    let mut line = String::new();
    if conn.read_line(&mut line).await.map_err(io_err)? == 0 {
        return Err(
            Error::new(ErrorKind::Unavailable, "memcached closed the connection").retryable(true),
        );
    }
    let mut parts = line.trim_end().split(' ');
    let code = parts.next().unwrap_or_default().to_owned();
    if code == "VA" {
        let len: usize = parts
            .next()
            .and_then(|n| n.parse().ok())
            .filter(|n| *n <= MAX_VALUE_LEN)
            .ok_or_else(|| unexpected("mg", line.trim_end()))?;
        let flags = parts.map(str::to_owned).collect();
        // Read as it arrives rather than allocated from the announced length: a garbled
        // or hostile reply must not make the client allocate what it claims.
        let mut data = Vec::new();
        let expected = len + 2;
        (&mut *conn)
            .take(expected as u64)
            .read_to_end(&mut data)
            .await
            .map_err(io_err)?;
        if data.len() < expected {
            return Err(Error::new(
                ErrorKind::Unavailable,
                "memcached closed the connection in the middle of a value",
            )
            .retryable(true));
        }
        if !data.ends_with(b"\r\n") {
            return Err(unexpected("mg", "a value without its line end"));
        }
        data.truncate(len);
        return Ok(Reply {
            code,
            flags,
            data: Some(data),
        });
    }
    if matches!(code.as_str(), "ERROR" | "CLIENT_ERROR" | "SERVER_ERROR") {
        return Err(Error::new(
            ErrorKind::Backend,
            format!("memcached refused a command: {}", line.trim_end()),
        ));
    }
    Ok(Reply {
        code,
        flags: parts.map(str::to_owned).collect(),
        data: None,
    })
}

/// The memcached key for a lock key: itself if memcached can take it, else a safe prefix
/// plus the SHA-1 of the whole key.
pub fn memcached_key(key: &str) -> String {
    let safe = |c: char| c.is_ascii_graphic();
    if key.len() <= MAX_KEY_LEN - 6 && key.chars().all(safe) && !key.contains('~') {
        return key.to_owned();
    }
    let head: String = key
        .chars()
        .filter(|c| safe(*c) && *c != '~')
        .take(32)
        .collect();
    format!("{head}~{}", sha1_smol::Sha1::from(key.as_bytes()).digest())
}

/// An item of `token` (a semaphore holder's `h`, a fair-lock waiter's `w`, a reader's
/// `r`) of the lock at `lock`: `<first 32 safe bytes>~<SHA-1 of both>~<kind>`, never a
/// lock's mapped key (no `~`, or one followed by 40 hex digits at the end), its fence
/// (`~fence`), record (`~elect`) or queue (`~queue`), nor another kind's item.
fn lease_key(lock: &str, token: &str, kind: char) -> String {
    let head: String = lock
        .chars()
        .filter(|c| c.is_ascii_graphic() && *c != '~')
        .take(32)
        .collect();
    let whole = format!("{}:{lock}{token}", lock.len());
    format!(
        "{head}~{}~{kind}",
        sha1_smol::Sha1::from(whole.as_bytes()).digest()
    )
}

fn fence_key(key: &str) -> String {
    format!("{}~fence", memcached_key(key))
}

/// The key of an election's record: the mapped lock key plus `~elect` (no longer than
/// `~fence`, so it fits wherever the fence key does).
fn record_key(key: &str) -> String {
    format!("{}~elect", memcached_key(key))
}

/// Every item lock `keys` of `primitive` (a plain lock; an election: the lock and its
/// record; a semaphore: its index and a holder's lease item) uses, as `item <key>`, named by the functions the backend calls.
#[cfg(test)]
pub(crate) fn key_set(primitive: &str, keys: &LockKeys) -> Vec<String> {
    let mut all = vec![memcached_key(keys.lock())];
    match primitive {
        "semaphore" => all.push(semaphore::holder_key(
            keys.lock(),
            "0123456789abcdef0123456789abcdef",
        )),
        "election" => all.extend([fence_key(keys.lock()), record_key(keys.lock())]),
        "rwlock" => all.extend([
            fence_key(keys.lock()),
            rwlock::index_key(keys.lock()),
            rwlock::reader_key(keys.lock(), "0123456789abcdef0123456789abcdef"),
            rwlock::claim_key(keys.lock(), "0123456789abcdef0123456789abcdef"),
        ]),
        "fair" => all.extend([
            fence_key(keys.lock()),
            fair::queue_key(keys.lock()),
            fair::claim_key(keys.lock(), "0123456789abcdef0123456789abcdef"),
        ]),
        _ => all.push(fence_key(keys.lock())),
    }
    all.into_iter().map(|k| format!("item {k}")).collect()
}

/// Memcached's expiry for `ttl`: whole seconds, rounded up.
///
/// # Errors
/// `InvalidArgument` below [`MIN_TTL`] or above [`MAX_TTL`].
pub fn expiry_seconds(ttl: Duration) -> Result<u64> {
    if ttl < MIN_TTL {
        return Err(Error::invalid(format!(
            "memcached expires keys on a one-second clock: a ttl of {ttl:?} is below its \
             minimum of {MIN_TTL:?}"
        )));
    }
    if ttl > MAX_TTL {
        return Err(Error::invalid(format!(
            "memcached reads expiries over 30 days as absolute times: a ttl of {ttl:?} \
             cannot be expressed"
        )));
    }
    let whole = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    Ok(whole)
}

impl RawLock for Memcached {
    async fn acquire(&self, keys: &LockKeys, token: &Token, ttl: Duration) -> Result<Acquire> {
        let secs = expiry_seconds(ttl)?;
        let key = memcached_key(keys.lock());
        let fence = fence_key(keys.lock());
        let value = token.as_str();
        // add, then (in the same write) mint a fence and read the key back.
        let request = format!(
            "ms {key} {} T{secs} ME\r\n{value}\r\nma {fence} N0 J1 v\r\nmg {key} v t\r\n",
            value.len()
        );
        let replies = self.call(request.into_bytes(), 3).await?;
        let [added, minted, now] = <[Reply; 3]>::try_from(replies)
            .map_err(|_| unexpected("acquire", "too few replies"))?;
        let holder = (now.code == "VA").then(|| now.data.clone().unwrap_or_default());
        let ours = holder.as_deref() == Some(value.as_bytes());
        match added.code.as_str() {
            "HD" if ours => {
                let fence = minted
                    .data
                    .as_deref()
                    .and_then(|d| std::str::from_utf8(d).ok())
                    .and_then(|d| d.trim().parse::<u64>().ok())
                    .ok_or_else(|| unexpected("ma", &minted.code))?;
                Ok(Acquire::Acquired { fence })
            }
            // Added, but gone or taken over before the fence was minted (our lease ran
            // out meanwhile): the fence is not ours to use.
            "HD" => Ok(Acquire::Held { remaining: None }),
            // A repeat of a granted request finds our own token: renew it and report the
            // grant again with the current fence.
            "NS" if ours => {
                if self.extend(keys, token, ttl).await? {
                    let last = self.get(&fence).await?;
                    let fence = last
                        .and_then(|(v, _, _)| String::from_utf8(v).ok())
                        .and_then(|v| v.trim().parse().ok())
                        .unwrap_or(0);
                    Ok(Acquire::Acquired { fence })
                } else {
                    Ok(Acquire::Held { remaining: None })
                }
            }
            "NS" => Ok(Acquire::Held {
                remaining: now
                    .flag('t')
                    .and_then(|t| t.parse::<u64>().ok())
                    .map(Duration::from_secs),
            }),
            other => Err(unexpected("ms (add)", other)),
        }
    }

    async fn release(&self, keys: &LockKeys, token: &Token) -> Result<bool> {
        self.release_item(&memcached_key(keys.lock()), token).await
    }

    async fn extend(&self, keys: &LockKeys, token: &Token, ttl: Duration) -> Result<bool> {
        let secs = expiry_seconds(ttl)?;
        self.extend_item(&memcached_key(keys.lock()), token, secs)
            .await
    }

    /// Two pipelined round trips on one connection for the plain locks of the batch:
    /// every `mg` (value + CAS), then a CAS-checked `ms` for each key that still holds its
    /// token. A key that changed between the two (rare: `EX`) is renewed on its own by
    /// [`extend`](RawLock::extend). The family's leases (a permit holder's, a reader's
    /// or a writer's, a reentrant hold) live in other items: each is renewed by its
    /// primitive's own extend, all of them at once.
    async fn extend_many(&self, renewals: &[Renewal]) -> Vec<Result<bool>> {
        let mut out: Vec<Option<Result<bool>>> = Vec::with_capacity(renewals.len());
        let mut todo = Vec::new(); // (index, key, secs)
        let mut family = Vec::new(); // indexes of the family's leases
        for (i, r) in renewals.iter().enumerate() {
            if matches!(
                r.kind,
                LeaseKind::Permits | LeaseKind::Reentrant | LeaseKind::ReadWrite
            ) {
                family.push(i);
                out.push(None);
                continue;
            }
            match expiry_seconds(r.ttl) {
                Ok(secs) => {
                    todo.push((i, memcached_key(r.keys.lock()), secs));
                    out.push(None);
                }
                Err(e) => out.push(Some(Err(e))),
            }
        }
        if !todo.is_empty() {
            let gets: String = todo
                .iter()
                .map(|(_, key, _)| format!("mg {key} v c\r\n"))
                .collect();
            match self.call(gets.into_bytes(), todo.len()).await {
                Err(e) => {
                    for (i, _, _) in &todo {
                        out[*i] = Some(Err(copy_err(&e)));
                    }
                }
                Ok(replies) => {
                    let mut sets = Vec::new(); // (index, request)
                    for ((i, key, secs), reply) in todo.iter().zip(replies) {
                        let token = renewals[*i].token.as_str();
                        match get_reply(reply) {
                            Ok(Some((value, cas, _))) if value == token.as_bytes() => {
                                sets.push((*i, extend_request(key, token, *secs, &cas)));
                            }
                            Ok(_) => out[*i] = Some(Ok(false)),
                            Err(e) => out[*i] = Some(Err(e)),
                        }
                    }
                    if !sets.is_empty() {
                        let request: String = sets.iter().map(|(_, req)| req.as_str()).collect();
                        match self.call(request.into_bytes(), sets.len()).await {
                            Err(e) => {
                                for (i, _) in &sets {
                                    out[*i] = Some(Err(copy_err(&e)));
                                }
                            }
                            Ok(replies) => {
                                for ((i, _), reply) in sets.iter().zip(replies) {
                                    match Self::extend_outcome(&reply) {
                                        Ok(Some(renewed)) => out[*i] = Some(Ok(renewed)),
                                        Ok(None) => {}
                                        Err(e) => out[*i] = Some(Err(e)),
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        // The family's leases, each by its primitive's own extend, all at once.
        let renewed = join_all(family.iter().map(|&i| {
            let r = &renewals[i];
            async move {
                match r.kind {
                    LeaseKind::Permits => self.extend_permits(&r.keys, &r.token, r.ttl).await,
                    LeaseKind::Reentrant => self.extend_reentrant(&r.keys, &r.token, r.ttl).await,
                    _ => self.extend_rw(&r.keys, &r.token, r.ttl).await,
                }
            }
        }))
        .await;
        for (&i, result) in family.iter().zip(renewed) {
            out[i] = Some(result);
        }
        let mut results = Vec::with_capacity(renewals.len());
        for (r, done) in renewals.iter().zip(out) {
            results.push(match done {
                Some(result) => result,
                None => self.extend(&r.keys, &r.token, r.ttl).await,
            });
        }
        results
    }

    /// The one-second expiry clock can end a lease up to a second early.
    fn drift(&self) -> Drift {
        Drift {
            factor: Drift::DEFAULT.factor,
            constant: Drift::DEFAULT.constant + Duration::from_secs(1),
        }
    }

    fn store_id(&self) -> String {
        format!("memcache:{}", self.inner.addr)
    }

    fn store_label(&self) -> &'static str {
        "memcached"
    }

    fn engine(&self) -> &Engine {
        &self.inner.engine
    }
}

/// Fences come from `ma` pipelined with the add and count only when the key still held
/// our token afterwards; see the module docs for what resets the counter.
impl RawFencing for Memcached {}

/// The record is one item without expiry (the mapped lock key plus `~elect`); a publish
/// is a gets/cas loop: `mg` of the record (value and CAS) and `mg` of the lock key,
/// pipelined in that order, then, if the lock key holds our token, `ms … C<cas>` of the
/// record (an add where there was none). Terms are not compared. Memcached cannot
/// notify, so observers read again at a short interval.
///
/// # The check and the write
///
/// Memcached cannot check one item and write another in one step, so a leader deposed
/// between the check and the write (its lease ran out, an operator force-unlocked it) can
/// still write. The CAS keeps that write from overwriting its successor's record: the
/// successor was granted after our check, so its first write comes after our read of the
/// record and changes the CAS our write names. A late write can land only before the
/// successor's first write (which then replaces it), or, across a restart between our
/// read and our write, on a fresh item whose CAS happens to equal the old one (the
/// server's CAS counter starts over). Either way readers see a record whose token is not
/// the holder's and report the leader without a value until its next announcement: never
/// a wrong leader.
///
/// # Durability
///
/// Like the fence counter, the record lives in memcached's memory only: a restart,
/// `flush_all` or an LRU eviction loses it. The leader is then reported without a value
/// until its next [`proclaim`](crate::Leadership::proclaim) (or the next leader) writes it
/// again; a restart also loses the lock, so a leader's announcement repeated after one
/// writes nothing.
impl RawElection for Memcached {
    async fn publish(&self, keys: &LockKeys, token: &Token, term: u64, data: &str) -> Result<bool> {
        let key = record_key(keys.lock());
        let lock = memcached_key(keys.lock());
        let value = super::record_text(term, data);
        // Only the holder writes, so a lost race is rare: the holder's own repeat, or a
        // deposed leader's late write (the next check then finds we no longer hold).
        for _ in 0..5 {
            // The record first: a successor's write after our check changes its CAS.
            let request = format!("mg {key} v c\r\nmg {lock} v\r\n").into_bytes();
            let mut replies = self.call(request, 2).await?.into_iter();
            let (Some(record), Some(holder)) = (replies.next(), replies.next()) else {
                return Err(unexpected("mg (publish)", "too few replies"));
            };
            let record = get_reply(record)?;
            if get_reply(holder)?.is_none_or(|(held, _, _)| held != token.as_str().as_bytes()) {
                return Ok(false);
            }
            // T0: no expiry. ME: add (only if absent).
            let write = match record {
                Some((_, cas, _)) => format!("ms {key} {} T0 C{cas}\r\n{value}\r\n", value.len()),
                None => format!("ms {key} {} T0 ME\r\n{value}\r\n", value.len()),
            };
            let reply = self.one(write.into_bytes()).await?;
            match reply.code.as_str() {
                "HD" => return Ok(true),
                // Written (EX, NS) or deleted (NF) since our read: read again.
                "EX" | "NS" | "NF" => {}
                other => return Err(unexpected("ms (publish)", other)),
            }
        }
        Err(Error::new(
            ErrorKind::Backend,
            "the election record kept changing while publishing",
        )
        .retryable(true))
    }

    async fn record(&self, keys: &LockKeys) -> Result<Option<(u64, String)>> {
        self.get(&record_key(keys.lock()))
            .await?
            .map(|(stored, _, _)| super::parse_record(&stored, "in memcached"))
            .transpose()
    }

    /// Memcached has no notification: [`ReleaseWatch::none`].
    async fn watch_record(&self, _keys: &LockKeys) -> Result<ReleaseWatch> {
        Ok(ReleaseWatch::none())
    }
}

impl RawInspect for Memcached {
    crate::raw::inspect_each_kind!();

    /// Memcached cannot enumerate keys without walking its whole LRU.
    async fn list(&self, _prefix: &str, pattern: &str, _limit: usize) -> Result<Vec<String>> {
        crate::observe::listed(self.store_label(), pattern, async move {
            Err(Error::invalid(
                "memcached cannot list locks (it has no key iteration)",
            ))
        })
        .await
    }
}

/// The plain lock's inspection, for [`RawInspect`].
impl Memcached {
    pub(crate) async fn inspect_plain(&self, keys: &LockKeys) -> Result<LockState> {
        let key = memcached_key(keys.lock());
        let held = self.get(&key).await?;
        let fence = self
            .get(&fence_key(keys.lock()))
            .await?
            .and_then(|(v, _, _)| String::from_utf8(v).ok())
            .and_then(|v| v.trim().parse().ok());
        Ok(match held {
            Some((value, _, ttl)) => LockState::new(
                Some(String::from_utf8_lossy(&value).into_owned()),
                ttl.and_then(|t| u64::try_from(t).ok())
                    .map(Duration::from_secs),
                fence,
            ),
            None => LockState::new(None, None, fence),
        })
    }

    pub(crate) async fn force_unlock_plain(&self, keys: &LockKeys) -> Result<bool> {
        let key = memcached_key(keys.lock());
        let reply = self.one(format!("md {key}\r\n").into_bytes()).await?;
        Ok(reply.code == "HD")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_mapped_only_when_memcached_cannot_take_them() {
        assert_eq!(memcached_key("dlock:orders"), "dlock:orders");
        for bad in ["with space", "tab\there", "é", &"x".repeat(300), "a~b"] {
            let k = memcached_key(bad);
            assert!(
                k.len() <= MAX_KEY_LEN && k.chars().all(|c| c.is_ascii_graphic()),
                "{k}"
            );
            assert_ne!(
                k,
                memcached_key(&format!("{bad}!")),
                "distinct names, distinct keys"
            );
        }
        assert_eq!(memcached_key("a b"), memcached_key("a b"));
    }

    #[test]
    fn election_records_fit_and_read_back() {
        for key in [
            "dlock-election:a",
            &"x".repeat(MAX_KEY_LEN - 6),
            &"y".repeat(400),
        ] {
            let k = record_key(key);
            assert!(k.len() <= MAX_KEY_LEN, "{k}");
            assert_ne!(k, fence_key(key));
            assert_ne!(k, memcached_key(key));
        }
        let data = "token\nline one\nünïcödé\r\n";
        assert_eq!(
            crate::backend::parse_record(format!("7\n{data}").as_bytes(), "").ok(),
            Some((7, data.to_owned()))
        );
        assert!(crate::backend::parse_record(b"7", "").is_err());
        assert!(crate::backend::parse_record(b"-1\nx", "").is_err());
    }

    #[test]
    fn urls_give_the_address_and_the_connection_bound() {
        let ok = |url: &str| parse_url(url).ok();
        assert_eq!(
            ok("memcache://h"),
            Some(("h:11211".to_owned(), DEFAULT_MAX_CONNECTIONS))
        );
        assert_eq!(
            ok("memcache://h:1/"),
            Some(("h:1".to_owned(), DEFAULT_MAX_CONNECTIONS))
        );
        assert_eq!(
            ok("memcached://h:1?max_connections=3"),
            Some(("h:1".to_owned(), 3))
        );
        assert_eq!(
            ok("memcache://h:1/?max_connections=1024"),
            Some(("h:1".to_owned(), 1024))
        );
        for bad in [
            "redis://h",
            "memcache://",
            "memcache://u@h",
            "memcache://h/x",
            "memcache://h?max_connections=0",
            "memcache://h?max_connections=1025",
            "memcache://h?max_connections=x",
            "memcache://h?pool=3",
        ] {
            assert_eq!(
                parse_url(bad).map_err(|e| e.kind()),
                Err(ErrorKind::InvalidArgument),
                "{bad}"
            );
        }
    }

    #[test]
    fn expiry_rounds_up_and_refuses_what_memcached_cannot_express() {
        assert_eq!(expiry_seconds(Duration::from_millis(2001)).ok(), Some(3));
        assert_eq!(expiry_seconds(Duration::from_secs(2)).ok(), Some(2));
        assert!(expiry_seconds(Duration::from_secs(1)).is_err());
        assert!(expiry_seconds(Duration::ZERO).is_err());
        assert_eq!(expiry_seconds(MAX_TTL).ok(), Some(30 * 24 * 3600));
        assert!(expiry_seconds(MAX_TTL + Duration::from_secs(1)).is_err());
    }
}

/// Hostile input: URLs, and whatever bytes the server (or something posing as it) sends.
#[cfg(test)]
mod props {
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(crate::backend::hostile::cases(48))]
        /// No name reaches another lock's items (DESIGN.md principle 9).
        #[test]
        fn distinct_locks_share_no_item(
            names in proptest::collection::vec(crate::keys::namespace::hostile_name(), 1..3)
        ) {
            let primitives = &[
                ("lock", crate::keys::DEFAULT_PREFIX),
                ("election", crate::DEFAULT_ELECTION_PREFIX),
                ("semaphore", crate::DEFAULT_SEMAPHORE_PREFIX),
                ("reentrant", crate::DEFAULT_REENTRANT_PREFIX),
                ("fair", crate::DEFAULT_FAIR_PREFIX),
                ("rwlock", crate::DEFAULT_RWLOCK_PREFIX),
            ];
            crate::keys::namespace::check_disjoint(primitives, &names, super::key_set)?;
        }
    }

    use super::*;
    use crate::backend::hostile::{any_url, cases, check, url_with_password};

    const SCHEMES: &[&str] = &["memcache", "memcached"];

    /// Every reply `bytes` holds, read as a client would (up to the first error).
    fn read_all(bytes: &[u8]) -> Vec<Result<Reply>> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            let mut input = bytes;
            let mut out = Vec::new();
            while !input.is_empty() && out.len() < 64 {
                let reply = read_reply(&mut input).await;
                let failed = reply.is_err();
                out.push(reply);
                if failed {
                    break;
                }
            }
            out
        })
    }

    /// Reply lines as memcached writes them, and mangled ones.
    fn reply_bytes() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            prop::collection::vec(any::<u8>(), 0..64),
            "(VA [0-9]{1,20}( [a-z][0-9a-z]{0,6}){0,3}|HD|NS|EX|EN|NF|MN|ERROR|CLIENT_ERROR x|SERVER_ERROR y)\r?\n[ -~]{0,12}(\r\n)?"
                .prop_map(String::into_bytes),
        ]
    }

    #[test]
    fn garbled_replies_are_errors_not_panics_or_huge_allocations() {
        for bytes in [
            &b"VA 18446744073709551615\r\n"[..],
            b"VA 99999999999 c1\r\nab\r\n",
            b"VA 1073741825\r\n",
            b"VA 3\r\nab",
            b"VA 2\r\nabcd",
            b"VA -1\r\n",
            b"\xff\xfe\r\n",
        ] {
            let replies = read_all(bytes);
            assert!(
                replies.last().is_some_and(Result::is_err),
                "{:?}",
                String::from_utf8_lossy(bytes)
            );
        }
        let replies = read_all(b"VA 2 c7 t5\r\nok\r\nHD\r\n");
        let [Ok(va), Ok(hd)] = &replies[..] else {
            panic!("two replies");
        };
        assert_eq!(
            (va.data.as_deref(), va.flag('c'), hd.code.as_str()),
            (Some(&b"ok"[..]), Some("7"), "HD")
        );
    }

    #[test]
    fn memcached_urls_keep_secrets_and_check_ports() {
        for (url, secret) in [
            ("memcache://u:s3cret!@h:1", "s3cret!"),
            ("memcache://h:1?password=s3cret!", "s3cret!"),
            ("memcache://h:1?token=s3cret!", "s3cret!"),
        ] {
            let err = parse_url(url).expect_err(url);
            assert!(!format!("{err} {err:?}").contains(secret), "{err:?}");
        }
        for bad in [
            "memcache://h:x",
            "memcache://h:",
            "memcache://:1",
            "memcache://h:99999",
            "memcache://a b:1",
        ] {
            assert_eq!(
                parse_url(bad).map_err(|e| e.kind()),
                Err(ErrorKind::InvalidArgument),
                "{bad}"
            );
        }
        assert_eq!(
            parse_url("memcache://[::1]").ok(),
            Some(("[::1]:11211".to_owned(), DEFAULT_MAX_CONNECTIONS))
        );
        assert_eq!(
            parse_url("memcache://[::1]:7").ok(),
            Some(("[::1]:7".to_owned(), DEFAULT_MAX_CONNECTIONS))
        );
    }

    proptest! {
        #![proptest_config(cases(256))]

        #[test]
        fn any_string_parses_or_is_invalid(url in any_url(SCHEMES)) {
            let parsed = parse_url(&url);
            check(&parsed, "")?;
            if let Ok((addr, max)) = parsed {
                // What connects is a host and a port, and a bound in range.
                let port = addr.rsplit_once(':').map(|(_, p)| p.parse::<u16>());
                prop_assert!(matches!(port, Some(Ok(_))), "{}", addr);
                prop_assert!((1..=MAX_CONNECTIONS_LIMIT).contains(&max));
            }
        }

        #[test]
        fn passwords_never_reach_errors((url, secret) in url_with_password(SCHEMES)) {
            check(&parse_url(&url), &secret)?;
        }

        #[test]
        fn any_reply_bytes_read_or_fail_typed(bytes in reply_bytes()) {
            for reply in read_all(&bytes) {
                match reply {
                    Ok(reply) => {
                        if let Some(data) = &reply.data {
                            prop_assert!(data.len() <= bytes.len());
                        }
                        // The decoders of a reply take anything.
                        let _ = get_reply(reply);
                    }
                    Err(e) => prop_assert!(
                        matches!(e.kind(), ErrorKind::Backend | ErrorKind::Unavailable),
                        "{:?}", e
                    ),
                }
            }
        }

        #[test]
        fn values_round_trip(value in prop::collection::vec(any::<u8>(), 0..64), cas in 0..u64::MAX) {
            let mut wire = format!("VA {} c{cas} t9\r\n", value.len()).into_bytes();
            wire.extend_from_slice(&value);
            wire.extend_from_slice(b"\r\n");
            let mut replies = read_all(&wire);
            prop_assert_eq!(replies.len(), 1);
            let reply = replies.pop().expect("one").map_err(|e| TestCaseError::fail(e.to_string()))?;
            let stored = get_reply(reply).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(stored, Some((value, cas.to_string(), Some(9))));
        }
    }
}
