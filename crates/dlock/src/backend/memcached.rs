//! Memcached: seed 001's `add` lock, done right, over the meta protocol (memcached 1.6+).
//!
//! * **Acquire** is ONE round trip: `ms <key> … ME` (add: stored only if the key is
//!   absent, with its expiry in the same command), then, pipelined behind it, `ma` on the
//!   fence counter and `mg` of the lock key. The fence counts only if the add succeeded
//!   *and* the key still held our token when the fence was minted (see
//!   [fences](#fences)).
//! * **Release** is compare-and-delete by CAS: `mg` (value + CAS), then `md <key> C<cas>`
//!   only if the value is our token — never a blind `delete` (seed 001's scheme deletes
//!   whatever is there).
//! * **Extend** is compare-and-set by CAS: `ms <key> … C<cas> MS` with our token again and
//!   the new expiry.
//! * **No notification**: memcached has no pub/sub; waiters retry with jittered
//!   exponential backoff (10 ms doubling to 500 ms, [`Retry`](crate::Retry)) and at the
//!   holder's remaining ttl.
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
//! works. The fence counter is the mapped key plus `~fence`.
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
//! fires). Give memcached memory to spare, or use Redis with persistence where fencing
//! must survive.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufStream};
use tokio::net::TcpStream;
use tokio::sync::Mutex;

use crate::engine::Engine;
use crate::error::{Error, ErrorKind, Result};
use crate::keys::LockKeys;
use crate::raw::{Acquire, LockState, RawFencing, RawInspect, RawLock};
use crate::token::Token;
use crate::validity::Drift;

/// Shortest ttl memcached's one-second expiry clock can hold with some validity left.
pub const MIN_TTL: Duration = Duration::from_secs(2);
/// Longest ttl memcached takes as relative (30 days; beyond is an absolute Unix time).
pub const MAX_TTL: Duration = Duration::from_secs(30 * 24 * 3600);
/// Longest key memcached accepts.
pub const MAX_KEY_LEN: usize = 250;

const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);

/// A memcached client for locks: one connection, requests one at a time (pipelined
/// within a request). Cheap to clone; clones share the connection and the watchdog.
///
/// ```no_run
/// # async fn demo() -> dlock::Result<()> {
/// let mc = dlock::backend::Memcached::connect("memcache://127.0.0.1:11211").await?;
/// let lock = dlock::Lock::builder(mc, "nightly")
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
    conn: Mutex<Option<BufStream<TcpStream>>>,
    engine: Engine,
}

impl std::fmt::Debug for Memcached {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Memcached")
            .field("addr", &self.inner.addr)
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

impl Memcached {
    /// Connects to `memcache://host:port` (port 11211 if omitted).
    ///
    /// # Errors
    /// `InvalidArgument` for a malformed URL; `Unavailable` if the server cannot be
    /// reached within 2 s; `Backend` if it does not speak the meta protocol (memcached
    /// older than 1.6).
    pub async fn connect(url: &str) -> Result<Memcached> {
        let addr = url
            .strip_prefix("memcache://")
            .or_else(|| url.strip_prefix("memcached://"))
            .ok_or_else(|| {
                Error::invalid(format!(
                    "unsupported memcached URL {url:?}: expected memcache://host:port"
                ))
            })?
            .trim_end_matches('/');
        if addr.is_empty() || addr.contains('/') || addr.contains('@') {
            return Err(Error::invalid(format!(
                "bad memcached URL {url:?}: expected memcache://host:port"
            )));
        }
        let addr = if addr.contains(':') {
            addr.to_owned()
        } else {
            format!("{addr}:11211")
        };
        let mc = Memcached {
            inner: Arc::new(Inner {
                addr,
                timeout: DEFAULT_TIMEOUT,
                conn: Mutex::new(None),
                engine: Engine::new(),
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
        Ok(mc)
    }

    /// The server's address.
    pub fn addr(&self) -> &str {
        &self.inner.addr
    }

    /// Sends `request` (one or more pipelined commands) and reads `replies` replies, on
    /// one connection, bounded in time. A connection whose state is unknown (an error or
    /// a timeout mid-reply) is dropped and opened again on the next call.
    async fn call(&self, request: Vec<u8>, replies: usize) -> Result<Vec<Reply>> {
        let mut slot = self.inner.conn.lock().await;
        // The connection is taken out for the exchange and put back only once every reply
        // was read: a call cancelled mid-exchange drops it (closing it), so no later call
        // can read this one's replies as its own.
        let taken = slot.take();
        let exchange = async {
            let mut conn = match taken {
                Some(conn) => conn,
                None => {
                    let stream = TcpStream::connect(&self.inner.addr).await.map_err(|e| {
                        Error::new(
                            ErrorKind::Unavailable,
                            format!("connecting to memcached at {}: {e}", self.inner.addr),
                        )
                        .retryable(true)
                    })?;
                    let _ = stream.set_nodelay(true);
                    BufStream::new(stream)
                }
            };
            conn.write_all(&request).await.map_err(io_err)?;
            conn.flush().await.map_err(io_err)?;
            let mut out = Vec::with_capacity(replies);
            for _ in 0..replies {
                out.push(read_reply(&mut conn).await?);
            }
            Ok((conn, out))
        };
        match tokio::time::timeout(self.inner.timeout, exchange).await {
            Ok(Ok((conn, out))) => {
                *slot = Some(conn);
                Ok(out)
            }
            Ok(Err(err)) => Err(err),
            Err(_) => Err(Error::new(
                ErrorKind::TimedOut,
                format!("memcached at {} did not answer in time", self.inner.addr),
            )
            .retryable(true)),
        }
    }

    /// `mg <key> v c t`: the value, its CAS and remaining seconds, if present.
    async fn get(&self, key: &str) -> Result<Option<(Vec<u8>, String, Option<i64>)>> {
        let reply = self.one(format!("mg {key} v c t\r\n").into_bytes()).await?;
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

    async fn one(&self, request: Vec<u8>) -> Result<Reply> {
        self.call(request, 1)
            .await?
            .pop()
            .ok_or_else(|| unexpected("a command", "no reply"))
    }
}

fn io_err(e: std::io::Error) -> Error {
    Error::new(ErrorKind::Unavailable, format!("memcached connection: {e}")).retryable(true)
}

fn unexpected(command: &str, reply: &str) -> Error {
    Error::new(
        ErrorKind::Backend,
        format!("unexpected memcached reply to {command}: {reply:?}"),
    )
}

async fn read_reply(conn: &mut BufStream<TcpStream>) -> Result<Reply> {
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
            .ok_or_else(|| unexpected("mg", line.trim_end()))?;
        let flags = parts.map(str::to_owned).collect();
        let mut data = vec![0; len + 2];
        conn.read_exact(&mut data).await.map_err(io_err)?;
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

fn fence_key(key: &str) -> String {
    format!("{}~fence", memcached_key(key))
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
        let key = memcached_key(keys.lock());
        for _ in 0..3 {
            let Some((value, cas, _)) = self.get(&key).await? else {
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

    async fn extend(&self, keys: &LockKeys, token: &Token, ttl: Duration) -> Result<bool> {
        let secs = expiry_seconds(ttl)?;
        let key = memcached_key(keys.lock());
        let value = token.as_str();
        for _ in 0..3 {
            let Some((current, cas, _)) = self.get(&key).await? else {
                return Ok(false);
            };
            if current != value.as_bytes() {
                return Ok(false);
            }
            let reply = self
                .one(
                    format!("ms {key} {} T{secs} C{cas} MS\r\n{value}\r\n", value.len())
                        .into_bytes(),
                )
                .await?;
            match reply.code.as_str() {
                "HD" => return Ok(true),
                "NF" | "NS" => return Ok(false),
                "EX" => {}
                other => return Err(unexpected("ms (extend)", other)),
            }
        }
        Err(Error::new(
            ErrorKind::Backend,
            "the lock key kept changing while extending",
        )
        .retryable(true))
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

    fn engine(&self) -> &Engine {
        &self.inner.engine
    }
}

/// Fences come from `ma` pipelined with the add and count only when the key still held
/// our token afterwards; see the module docs for what resets the counter.
impl RawFencing for Memcached {}

impl RawInspect for Memcached {
    async fn inspect(&self, keys: &LockKeys) -> Result<LockState> {
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

    async fn force_unlock(&self, keys: &LockKeys) -> Result<bool> {
        let key = memcached_key(keys.lock());
        let reply = self.one(format!("md {key}\r\n").into_bytes()).await?;
        Ok(reply.code == "HD")
    }

    /// Memcached cannot enumerate keys without walking its whole LRU.
    async fn list(&self, _prefix: &str, _pattern: &str, _limit: usize) -> Result<Vec<String>> {
        Err(Error::invalid(
            "memcached cannot list locks (it has no key iteration)",
        ))
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
    fn expiry_rounds_up_and_refuses_what_memcached_cannot_express() {
        assert_eq!(expiry_seconds(Duration::from_millis(2001)).ok(), Some(3));
        assert_eq!(expiry_seconds(Duration::from_secs(2)).ok(), Some(2));
        assert!(expiry_seconds(Duration::from_secs(1)).is_err());
        assert!(expiry_seconds(Duration::ZERO).is_err());
        assert_eq!(expiry_seconds(MAX_TTL).ok(), Some(30 * 24 * 3600));
        assert!(expiry_seconds(MAX_TTL + Duration::from_secs(1)).is_err());
    }
}
