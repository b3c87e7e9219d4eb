//! etcd: a linearizable lock with revision fencing.
//!
//! * **Acquire**: a lease (`LeaseGrant`, whole seconds, rounded up) and ONE transaction
//!   that creates the lock key, attached to that lease, only if it does not exist
//!   (`create_revision == 0`); otherwise it reads the holder. The lease is granted per
//!   attempt and revoked at once if the attempt loses, so a waiter holds no lease while it
//!   waits: a waiter whose lease ran out can never be told it holds the lock (etcd issue
//!   11456, where etcd's own lock API did exactly that).
//! * **Fence**: the key's create revision — etcd's cluster-wide revision at the grant,
//!   strictly increasing and persisted with the key, through restarts and leader changes.
//! * **Release**: a transaction that deletes the key only if it holds our token, then the
//!   lease is revoked. **Extend**: a keep-alive of our lease (it can only extend keys
//!   attached to our own lease) confirmed by reading our token at the key; a longer ttl
//!   moves the key to a new, longer lease in a compare-on-token transaction.
//! * **Waiting**: each waiter watches the lock key and retries when it is deleted (release,
//!   expiry, force-unlock); the holder's remaining ttl is the fallback.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, PutOptions, Txn, TxnOp,
    TxnOpResponse,
};
use tokio::sync::Notify;

use crate::engine::Engine;
use crate::error::{Error, ErrorKind, Result};
use crate::keys::LockKeys;
use crate::raw::{Acquire, LockState, RawFencing, RawInspect, RawLock, ReleaseWatch};
use crate::token::Token;

const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);

/// An etcd client for locks. Cheap to clone; clones share the gRPC channel and the
/// watchdog.
///
/// ```no_run
/// # async fn demo() -> dlock::Result<()> {
/// let etcd = dlock::backend::Etcd::connect("etcd://127.0.0.1:2379").await?;
/// let guard = dlock::Lock::new(etcd, "leader")?.lock().await?;
/// println!("fence {} (the key's create revision)", guard.fencing_token());
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
    /// The lease (and its granted ttl in seconds) of each lock this client holds.
    leases_of: Mutex<HashMap<Token, (i64, i64)>>,
    engine: Engine,
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
    Error::new(kind, format!("{doing}: {e}"))
        .retryable(retryable)
        .with_source(e)
}

/// Lease seconds for `ttl`: rounded up, at least 1.
fn lease_seconds(ttl: Duration) -> i64 {
    let whole = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    i64::try_from(whole.max(1)).unwrap_or(i64::MAX)
}

impl Etcd {
    /// Connects to `etcd://host:port[,host:port…]` (every member as an endpoint).
    ///
    /// # Errors
    /// `InvalidArgument` for a malformed URL; `Unavailable` if no endpoint answers within
    /// 2 s.
    pub async fn connect(url: &str) -> Result<Etcd> {
        let hosts = url.strip_prefix("etcd://").ok_or_else(|| {
            Error::invalid(format!(
                "unsupported etcd URL {url:?}: expected etcd://host:port[,host:port…]"
            ))
        })?;
        let endpoints: Vec<String> = hosts
            .trim_end_matches('/')
            .split(',')
            .filter(|h| !h.is_empty())
            .map(|h| format!("http://{h}"))
            .collect();
        if endpoints.is_empty() || hosts.contains('@') {
            return Err(Error::invalid(format!(
                "bad etcd URL {url:?}: expected etcd://host:port[,host:port…]"
            )));
        }
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
                leases_of: Mutex::new(HashMap::new()),
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

    fn remember(&self, token: &Token, lease: i64, ttl: i64) {
        self.inner
            .leases_of
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(token.clone(), (lease, ttl));
    }

    fn forget(&self, token: &Token) -> Option<(i64, i64)> {
        self.inner
            .leases_of
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(token)
    }

    fn lease_of(&self, token: &Token) -> Option<(i64, i64)> {
        self.inner
            .leases_of
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(token)
            .copied()
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

    /// The key's value, create revision and lease, if it exists.
    async fn read(&self, key: &str) -> Result<Option<(Vec<u8>, i64, i64)>> {
        let key = key.to_owned();
        let resp = self
            .call(
                "reading a lock",
                |mut c| async move { c.get(key, None).await },
            )
            .await?;
        Ok(resp
            .kvs()
            .first()
            .map(|kv| (kv.value().to_vec(), kv.create_revision(), kv.lease())))
    }

    /// The remaining ttl of `lease`, if it is alive.
    async fn lease_remaining(&self, lease: i64) -> Result<Option<Duration>> {
        let resp = self
            .call("reading a lease", |mut c| async move {
                c.lease_time_to_live(lease, None).await
            })
            .await?;
        Ok(u64::try_from(resp.ttl()).ok().map(Duration::from_secs))
    }

    /// Moves the key held under `token` to a new lease of `secs` (keeping its create
    /// revision, so the fence stays). Returns whether the key held our token.
    async fn move_to_lease(&self, key: &str, token: &Token, secs: i64) -> Result<bool> {
        let grant = self
            .call("granting a lease", |mut c| async move {
                c.lease_grant(secs, None).await
            })
            .await?;
        let lease = grant.id();
        let txn = Txn::new()
            .when([Compare::value(key, CompareOp::Equal, token.as_str())])
            .and_then([TxnOp::put(
                key,
                token.as_str(),
                Some(PutOptions::new().with_lease(lease)),
            )]);
        let moved = self
            .call("extending a lock", |mut c| async move { c.txn(txn).await })
            .await?
            .succeeded();
        if moved {
            if let Some((old, _)) = self.lease_of(token) {
                self.revoke_later(old);
            }
            self.remember(token, lease, secs);
        } else {
            self.revoke_later(lease);
        }
        Ok(moved)
    }
}

impl RawLock for Etcd {
    async fn acquire(&self, keys: &LockKeys, token: &Token, ttl: Duration) -> Result<Acquire> {
        let secs = lease_seconds(ttl);
        let key = keys.lock().to_owned();
        let grant = self
            .call("granting a lease", |mut c| async move {
                c.lease_grant(secs, None).await
            })
            .await?;
        let lease = grant.id();
        let txn = Txn::new()
            .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key.as_str(),
                token.as_str(),
                Some(PutOptions::new().with_lease(lease)),
            )])
            .or_else([TxnOp::get(key.as_str(), None)]);
        let resp = match self
            .call("acquiring", |mut c| async move { c.txn(txn).await })
            .await
        {
            Ok(resp) => resp,
            Err(err) => {
                // Whatever happened, the key can only live as long as this lease.
                self.revoke_later(lease);
                return Err(err);
            }
        };
        if resp.succeeded() {
            let fence = resp
                .header()
                .map_or(0, etcd_client::ResponseHeader::revision);
            self.remember(token, lease, secs);
            return Ok(Acquire::Acquired {
                fence: u64::try_from(fence).unwrap_or(0),
            });
        }
        self.revoke_later(lease);
        let holder = resp.op_responses().into_iter().find_map(|op| match op {
            TxnOpResponse::Get(get) => get
                .kvs()
                .first()
                .map(|kv| (kv.value().to_vec(), kv.create_revision(), kv.lease())),
            _ => None,
        });
        match holder {
            // A repeat of a granted request: the grant stands, renewed.
            Some((value, created, held_lease)) if value == token.as_str().as_bytes() => {
                let renewed = self
                    .call("renewing a lease", |mut c| async move {
                        let (mut keeper, mut stream) = c.lease_keep_alive(held_lease).await?;
                        keeper.keep_alive().await?;
                        stream.message().await
                    })
                    .await?
                    .is_some_and(|r| r.ttl() > 0);
                if renewed {
                    self.remember(token, held_lease, secs);
                    Ok(Acquire::Acquired {
                        fence: u64::try_from(created).unwrap_or(0),
                    })
                } else {
                    Ok(Acquire::Held { remaining: None })
                }
            }
            Some((_, _, held_lease)) => Ok(Acquire::Held {
                remaining: self.lease_remaining(held_lease).await.ok().flatten(),
            }),
            // Deleted between the compare and the read: try again soon.
            None => Ok(Acquire::Held { remaining: None }),
        }
    }

    async fn release(&self, keys: &LockKeys, token: &Token) -> Result<bool> {
        let key = keys.lock().to_owned();
        let txn = Txn::new()
            .when([Compare::value(
                key.as_str(),
                CompareOp::Equal,
                token.as_str(),
            )])
            .and_then([
                TxnOp::get(key.as_str(), None),
                TxnOp::delete(key.as_str(), None),
            ]);
        let resp = self
            .call("releasing", |mut c| async move { c.txn(txn).await })
            .await?;
        let remembered = self.forget(token);
        if !resp.succeeded() {
            return Ok(false);
        }
        let lease = resp
            .op_responses()
            .into_iter()
            .find_map(|op| match op {
                TxnOpResponse::Get(get) => get.kvs().first().map(|kv| kv.lease()),
                _ => None,
            })
            .or(remembered.map(|(l, _)| l));
        if let Some(lease) = lease.filter(|l| *l != 0) {
            self.revoke_later(lease);
        }
        Ok(true)
    }

    async fn extend(&self, keys: &LockKeys, token: &Token, ttl: Duration) -> Result<bool> {
        let secs = lease_seconds(ttl);
        let key = keys.lock();
        let known = match self.lease_of(token) {
            Some(l) => Some(l),
            None => match self.read(key).await? {
                Some((value, _, lease)) if value == token.as_str().as_bytes() => {
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
        if secs > granted {
            return self.move_to_lease(key, token, secs).await;
        }
        // Keep our own lease alive (it can only hold our key), and check the key is still
        // ours on it.
        let alive = self.call("renewing a lease", |mut c| async move {
            let (mut keeper, mut stream) = c.lease_keep_alive(lease).await?;
            keeper.keep_alive().await?;
            stream.message().await
        });
        let (alive, holder) = tokio::join!(alive, self.read(key));
        let alive = alive?.is_some_and(|r| r.ttl() > 0);
        let ours =
            holder?.is_some_and(|(value, _, l)| value == token.as_str().as_bytes() && l == lease);
        Ok(alive && ours)
    }

    async fn watch(&self, keys: &LockKeys) -> Result<ReleaseWatch> {
        let key = keys.lock().to_owned();
        let mut stream = self
            .call("watching a lock", |mut c| async move {
                c.watch(key, None).await
            })
            .await?;
        // The first response confirms the watch: releases from here on are heard.
        let created = tokio::time::timeout(self.inner.timeout, stream.message())
            .await
            .map_err(|_| Error::new(ErrorKind::TimedOut, "etcd did not confirm a watch"))?
            .map_err(|e| map_err(e, "watching a lock"))?
            .is_some_and(|r| r.created());
        if !created {
            return Ok(ReleaseWatch::none());
        }
        let notify = Arc::new(Notify::new());
        let wake = Arc::clone(&notify);
        let task = tokio::spawn(async move {
            while let Ok(Some(resp)) = stream.message().await {
                if resp
                    .events()
                    .iter()
                    .any(|e| e.event_type() == EventType::Delete)
                {
                    wake.notify_one();
                }
                if resp.canceled() {
                    break;
                }
            }
            // The watch ended (connection lost): let the waiter retry now.
            wake.notify_one();
        });
        Ok(ReleaseWatch::new(notify, Some(Box::new(AbortOnDrop(task)))))
    }

    fn store_id(&self) -> String {
        format!("etcd:{}", self.inner.endpoints.join(","))
    }

    fn engine(&self) -> &Engine {
        &self.inner.engine
    }
}

/// Ends a waiter's watch task with the waiter.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The fence is the key's create revision: etcd's revision counter is cluster-wide,
/// strictly increasing and persisted (raft log and snapshots), so it survives restarts
/// and leader changes.
impl RawFencing for Etcd {}

impl RawInspect for Etcd {
    async fn inspect(&self, keys: &LockKeys) -> Result<LockState> {
        Ok(match self.read(keys.lock()).await? {
            Some((value, created, lease)) => LockState::new(
                Some(String::from_utf8_lossy(&value).into_owned()),
                self.lease_remaining(lease).await?,
                u64::try_from(created).ok(),
            ),
            None => LockState::new(None, None, None),
        })
    }

    async fn force_unlock(&self, keys: &LockKeys) -> Result<bool> {
        let key = keys.lock().to_owned();
        let txn = Txn::new()
            .when([Compare::create_revision(
                key.as_str(),
                CompareOp::Greater,
                0,
            )])
            .and_then([
                TxnOp::get(key.as_str(), None),
                TxnOp::delete(key.as_str(), None),
            ]);
        let resp = self
            .call("force-unlocking", |mut c| async move { c.txn(txn).await })
            .await?;
        if let Some(lease) = resp.op_responses().into_iter().find_map(|op| match op {
            TxnOpResponse::Get(get) => get.kvs().first().map(|kv| kv.lease()),
            _ => None,
        }) && lease != 0
        {
            self.revoke_later(lease);
        }
        Ok(resp.succeeded())
    }

    async fn list(&self, prefix: &str, pattern: &str, limit: usize) -> Result<Vec<String>> {
        let from = prefix.to_owned();
        let resp = self
            .call("listing locks", |mut c| async move {
                c.get(from, Some(GetOptions::new().with_prefix().with_keys_only()))
                    .await
            })
            .await?;
        Ok(resp
            .kvs()
            .iter()
            .filter(|kv| kv.lease() != 0)
            .filter_map(|kv| std::str::from_utf8(kv.key()).ok())
            .filter_map(|k| k.strip_prefix(prefix))
            .filter(|name| crate::backend::glob_match(pattern.as_bytes(), name.as_bytes()))
            .take(limit)
            .map(str::to_owned)
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::lease_seconds;
    use std::time::Duration;

    #[test]
    fn lease_seconds_round_up() {
        assert_eq!(lease_seconds(Duration::from_millis(100)), 1);
        assert_eq!(lease_seconds(Duration::from_millis(1001)), 2);
        assert_eq!(lease_seconds(Duration::from_secs(30)), 30);
    }
}
