//! One torture worker: acquire → read-modify-write the protected resource → release, in a
//! loop until its deadline, printing every step as a JSON line (flushed at once, so a
//! killed worker loses at most the step it was in).

use std::io::Write as _;
use std::time::Duration;

use dlock::backend::Redis;
use dlock::{Lock, LockGuard, Token};
use serde::Serialize;

use super::{Kind, ResourceKeys, monotonic_ns};
use crate::args::TortureWorkerArgs;
use crate::exit::{self, Failure};

/// The fenced resource's one operation, read or write: refuse a fence below the highest
/// seen, else record it.
/// KEYS[1] value, KEYS[2] highest fence seen, KEYS[3] log of accepted write fences
/// ARGV[1] fence, ARGV[2] the new value, or '' to read
/// returns {1, value} accepted (the value read or written); {0, highest} refused
pub(super) const FENCED_ACCESS: &str = r"
local highest = tonumber(redis.call('GET', KEYS[2]) or '0')
local fence = tonumber(ARGV[1])
if fence < highest then return {0, highest} end
redis.call('SET', KEYS[2], fence)
if ARGV[2] ~= '' then
  redis.call('SET', KEYS[1], ARGV[2])
  redis.call('RPUSH', KEYS[3], fence)
  return {1, tonumber(ARGV[2])}
end
return {1, tonumber(redis.call('GET', KEYS[1]) or '0')}
";

/// One line of a worker's history.
#[derive(Debug, Serialize, serde::Deserialize, Clone, PartialEq)]
#[serde(tag = "ev", rename_all = "snake_case")]
pub(super) enum Step {
    /// The lock is ours (as far as the lock kind can tell), from `t`.
    Acquired { t: u64, token: String, fence: u64 },
    /// The protected resource was read (the write follows after a pause).
    Read { t: u64 },
    /// The unfenced counter was read at `read` and written back + 1.
    Wrote { t: u64, read: i64 },
    /// The fenced resource accepted (or refused) a write of `value`.
    Fenced { t: u64, ok: bool, value: i64 },
    /// The holder starts releasing at `t` (its hold ends here).
    Releasing { t: u64 },
    /// The release's outcome: `Some(true)` ours, `Some(false)` not ours, `None` unknown.
    Released { t: u64, ok: Option<bool> },
    /// An acquire failed with an error (not contention).
    Error { t: u64, message: String },
}

fn emit(step: &Step) {
    if let Ok(line) = serde_json::to_string(step) {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    }
}

fn store_err(e: redis::RedisError) -> Failure {
    Failure::new(exit::UNAVAILABLE, format!("torture worker: {e}"))
}

/// A held lock of any kind.
enum Hold {
    Dlock(LockGuard<Redis>),
    /// A control: the token it set.
    Raw(String),
}

struct Worker {
    kind: Kind,
    keys: ResourceKeys,
    ttl: Duration,
    until: u64,
    lock_conn: redis::aio::ConnectionManager,
    resource: redis::aio::MultiplexedConnection,
    dlock: Option<Lock<Redis>>,
    fenced: redis::Script,
}

pub(crate) async fn run(args: TortureWorkerArgs) -> Result<u8, Failure> {
    let kind = Kind::parse(&args.kind)?;
    let keys = ResourceKeys::parse(&args.keys);
    let ttl = Duration::from_millis(args.ttl_ms);
    let open = |url: &str| {
        redis::Client::open(url).map_err(|e| Failure::usage(format!("torture worker URL: {e}")))
    };
    // Reconnects by itself after a closed connection or a server restart.
    // No reply timeout: a paused control worker must finish the very call it was stopped
    // in (a timeout would fire the moment it resumes and hide the bug under test).
    let config = redis::aio::ConnectionManagerConfig::new()
        .set_response_timeout(None)
        .set_connection_timeout(Some(ttl))
        .set_number_of_retries(2);
    let lock_conn = open(&args.lock_url)?
        .get_connection_manager_with_config(config)
        .await
        .map_err(store_err)?;
    let resource = open(&args.resource_url)?
        .get_multiplexed_async_connection()
        .await
        .map_err(store_err)?;
    let dlock = match kind {
        Kind::Dlock | Kind::DlockFenced => Some(
            Lock::builder(
                Redis::builder(args.lock_url.clone())
                    .response_timeout(ttl)
                    .connect()
                    .await?,
                &keys.lock,
            )
            .prefix("")
            .ttl(ttl)
            .build()?,
        ),
        _ => None,
    };
    let mut worker = Worker {
        kind,
        keys,
        ttl,
        until: args.until_ns,
        lock_conn,
        resource,
        dlock,
        fenced: redis::Script::new(FENCED_ACCESS),
    };
    while monotonic_ns() < worker.until {
        match worker.acquire().await {
            Ok(Some((hold, fence))) => {
                if let Err(failure) = worker.critical_section(fence).await {
                    // The resource is never faulted, but a paused worker's own timers may
                    // time its calls out when it resumes: record it and go on.
                    emit(&Step::Error {
                        t: monotonic_ns(),
                        message: failure.message,
                    });
                }
                emit(&Step::Releasing { t: monotonic_ns() });
                let ok = worker.release(hold).await;
                emit(&Step::Released {
                    t: monotonic_ns(),
                    ok,
                });
            }
            Ok(None) => {}
            Err(message) => {
                emit(&Step::Error {
                    t: monotonic_ns(),
                    message,
                });
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    Ok(exit::SUCCESS)
}

/// A model of one network round trip between two commands of a non-atomic control:
/// it makes their race windows as wide as a slow network would.
const GAP: Duration = Duration::from_millis(30);

/// The read-modify-write's pause between read and write: a fault aimed at a holder lands
/// inside it.
const CRITICAL: Duration = Duration::from_millis(10);

/// The controls' critical sections outlast their [`GAP`], so that a stale release that
/// lands in another holder's critical section lets a third holder in while it works.
const CONTROL_CRITICAL: Duration = Duration::from_millis(45);

impl Worker {
    fn remaining(&self) -> Duration {
        Duration::from_nanos(self.until.saturating_sub(monotonic_ns()))
    }

    fn acquired(&self, token: &str, fence: u64) {
        emit(&Step::Acquired {
            t: monotonic_ns(),
            token: token.to_owned(),
            fence,
        });
    }

    async fn acquire(&mut self) -> Result<Option<(Hold, u64)>, String> {
        if let Some(lock) = &self.dlock {
            return match lock.try_lock_for(self.remaining()).await {
                Ok(Some(g)) => {
                    let fence = g.fencing_token().get();
                    self.acquired(g.token().as_str(), fence);
                    Ok(Some((Hold::Dlock(g), fence)))
                }
                Ok(None) => Ok(None),
                Err(e) => Err(e.to_string()),
            };
        }
        let token = Token::random().map_err(|e| e.to_string())?.to_string();
        let key = self.keys.lock.clone();
        let ttl_ms = u64::try_from(self.ttl.as_millis()).unwrap_or(u64::MAX);
        while monotonic_ns() < self.until {
            let c = &mut self.lock_conn;
            let got = match self.kind {
                Kind::SetnxExpire => {
                    let set: bool = redis::cmd("SETNX")
                        .arg(&key)
                        .arg(&token)
                        .query_async(c)
                        .await
                        .map_err(|e| e.to_string())?;
                    if set {
                        self.acquired(&token, 0);
                        tokio::time::sleep(GAP).await;
                        let secs = ttl_ms.div_ceil(1000).max(1);
                        let _: i64 = redis::cmd("EXPIRE")
                            .arg(&key)
                            .arg(secs)
                            .query_async(&mut self.lock_conn)
                            .await
                            .map_err(|e| e.to_string())?;
                        return Ok(Some((Hold::Raw(token), 0)));
                    }
                    false
                }
                Kind::SetnxGetset => {
                    let now = wall_ms();
                    let expires = (now + u128::from(ttl_ms) + 1).to_string();
                    let set: bool = redis::cmd("SETNX")
                        .arg(&key)
                        .arg(&expires)
                        .query_async(c)
                        .await
                        .map_err(|e| e.to_string())?;
                    if set {
                        true
                    } else {
                        let current: Option<String> = redis::cmd("GET")
                            .arg(&key)
                            .query_async(c)
                            .await
                            .map_err(|e| e.to_string())?;
                        let expired = current
                            .as_deref()
                            .and_then(|v| v.parse::<u128>().ok())
                            .is_some_and(|at| at < wall_ms());
                        if expired {
                            let old: Option<String> = redis::cmd("GETSET")
                                .arg(&key)
                                .arg(&expires)
                                .query_async(c)
                                .await
                                .map_err(|e| e.to_string())?;
                            old == current
                        } else {
                            false
                        }
                    }
                }
                Kind::GetDel | Kind::PlainDel => {
                    let set: Option<String> = redis::cmd("SET")
                        .arg(&key)
                        .arg(&token)
                        .arg("NX")
                        .arg("PX")
                        .arg(ttl_ms)
                        .query_async(c)
                        .await
                        .map_err(|e| e.to_string())?;
                    set.is_some()
                }
                Kind::Dlock | Kind::DlockFenced | Kind::Memory => false,
            };
            if got {
                self.acquired(&token, 0);
                return Ok(Some((Hold::Raw(token), 0)));
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        Ok(None)
    }

    async fn critical_section(&mut self, fence: u64) -> Result<(), Failure> {
        let r = &mut self.resource;
        if self.kind == Kind::DlockFenced {
            let (ok, value): (i64, i64) = self
                .fenced
                .key(&self.keys.fenced)
                .key(&self.keys.highest)
                .key(&self.keys.log)
                .arg(fence)
                .arg("")
                .invoke_async(r)
                .await
                .map_err(store_err)?;
            if ok == 0 {
                emit(&Step::Fenced {
                    t: monotonic_ns(),
                    ok: false,
                    value: 0,
                });
                return Ok(());
            }
            emit(&Step::Read { t: monotonic_ns() });
            tokio::time::sleep(CRITICAL).await;
            let (ok, _): (i64, i64) = self
                .fenced
                .key(&self.keys.fenced)
                .key(&self.keys.highest)
                .key(&self.keys.log)
                .arg(fence)
                .arg(value + 1)
                .invoke_async(r)
                .await
                .map_err(store_err)?;
            emit(&Step::Fenced {
                t: monotonic_ns(),
                ok: ok == 1,
                value: value + 1,
            });
        } else {
            let read: Option<i64> = redis::cmd("GET")
                .arg(&self.keys.counter)
                .query_async(r)
                .await
                .map_err(store_err)?;
            let read = read.unwrap_or(0);
            emit(&Step::Read { t: monotonic_ns() });
            let critical = if self.dlock.is_some() {
                CRITICAL
            } else {
                CONTROL_CRITICAL
            };
            tokio::time::sleep(critical).await;
            let _: () = redis::cmd("SET")
                .arg(&self.keys.counter)
                .arg(read + 1)
                .query_async(r)
                .await
                .map_err(store_err)?;
            emit(&Step::Wrote {
                t: monotonic_ns(),
                read,
            });
        }
        Ok(())
    }

    async fn release(&mut self, hold: Hold) -> Option<bool> {
        let c = &mut self.lock_conn;
        let key = &self.keys.lock;
        match hold {
            Hold::Dlock(g) => match g.release().await {
                Ok(()) => Some(true),
                Err(e) if e.is_lock_lost() => Some(false),
                Err(_) => None,
            },
            Hold::Raw(token) => match self.kind {
                Kind::GetDel => {
                    let current: Option<String> =
                        redis::cmd("GET").arg(key).query_async(c).await.ok()?;
                    tokio::time::sleep(GAP).await;
                    if current.as_deref() == Some(token.as_str()) {
                        let n: i64 = redis::cmd("DEL").arg(key).query_async(c).await.ok()?;
                        Some(n == 1)
                    } else {
                        Some(false)
                    }
                }
                Kind::SetnxExpire => {
                    // This control's bug is its acquire alone: its release is the correct
                    // compare-and-delete, so it cannot clear another's orphaned key.
                    let n: i64 = redis::Script::new(
                        "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0",
                    )
                    .key(key)
                    .arg(&token)
                    .invoke_async(c)
                    .await
                    .ok()?;
                    Some(n == 1)
                }
                _ => {
                    let n: i64 = redis::cmd("DEL").arg(key).query_async(c).await.ok()?;
                    Some(n == 1)
                }
            },
        }
    }
}

fn wall_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}
