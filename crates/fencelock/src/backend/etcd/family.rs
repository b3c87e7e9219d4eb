//! The lock family on etcd, each a recipe over the plain lock's revision-ordered queue
//! (`K/<token>`, one key per holder or waiter, on its client's session lease of its ttl;
//! see the module docs of the backend), as etcd's own `concurrency` recipes and Curator's
//! are:
//!
//! * **Semaphore**: a holder's or waiter's key holds `p<n> <token>` (its n permits). The
//!   keys are served in line order: a key holds when the permits of the keys up to and
//!   including it (by create revision) fit in the permit count, so a key's grant is
//!   decided by the keys before it alone, and no key created later can come before it.
//!   The count is one key without a lease, `{K}:permits/` (out of every queue, as an
//!   election's record is): the first client's attempt stores its own count; an attempt
//!   is ONE transaction that writes the key and reads the queue only if the stored count
//!   is the one the attempt goes by, so a count changed meanwhile is never granted under.
//!   An attempt that finds another count stored reads it from the same transaction, and
//!   (refused, the default) takes nothing and withdraws any key it had, or goes by it.
//!   A waiter's task reads the keys up to its own and the count at one revision, and
//!   watches, from that revision, every deletion in the queue and every write of the
//!   count: each wakes it to look again (every waiting client of the semaphore, as
//!   Curator's and ZooKeeper's do), and a look that finds its key within the count hands
//!   the grant over without an attempt. The fence of a grant is the key's create revision.
//! * **Reentrant lock**: one key per owner, `K/<owner>` (`%` and `/` escaped), on its
//!   client's session lease; its value lists the owner's holds (`h`, then one token per line),
//!   changed by compare-and-set on the key's mod revision. The owner holds while its key
//!   is the first of the queue; a re-entry adds its token to that key, so it carries the
//!   first hold's fence, and the key goes with the owner's last hold.
//!   A hold's waiter follows its owner's key through the engine's follower as a plain
//!   waiter follows its own.
//! * **Read-write lock** (writers first): a reader's key holds `r <token>`, a writer's
//!   `w <token>`, in one queue. A writer holds while its key is the first; a reader while
//!   no writer's key is before its own, so a queued writer keeps later readers out. A
//!   writer's task watches the key just before its own, a reader's the nearest writer's
//!   key before its own (its deletion, or its downgrade). Downgrade rewrites the writer's
//!   value as `r <token>` in one compare-on-value transaction: the key keeps its place
//!   and lease, and counts as a reader from then on.
//! * **Fair lock**: the plain lock is first come, first served already (keys are served in
//!   create-revision order), so the fair lock is the plain lock's recipe under its own
//!   prefix.

use std::time::Duration;

use etcd_client::{
    Compare, CompareOp, EventType, GetOptions, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse,
    WatchFilterType, WatchOptions,
};

use super::{Entered, Etcd, Kind, Queued, heard, permits_of, queue_key, queue_prefix, queued};
use crate::engine::follow::{Fired, Look};
use crate::error::{Error, ErrorKind, Result};
use crate::keys::LockKeys;
use crate::raw::{
    Acquire, LockState, RawLock, RawReentrant, RawRwLock, RawSemaphore, ReleaseWatch,
};
use crate::token::Token;

/// How often a compare-and-set is tried before the call gives up as contended.
const CAS_TRIES: usize = 16;

/// The key of a semaphore's permit count: the companion key `permits` plus a `/`
/// (`{K}:permits/`). A key that ends in `/` is in no queue (see the election's record).
pub(super) fn permits_key(keys: &LockKeys) -> String {
    format!("{}/", keys.companion("permits"))
}

/// The permit count stored in `value`.
fn parse_count(value: &[u8]) -> Result<u32> {
    std::str::from_utf8(value)
        .ok()
        .and_then(|t| t.parse().ok())
        .ok_or_else(|| {
            Error::new(
                ErrorKind::Backend,
                format!(
                    "a semaphore's permit count in etcd is not a number: {:?}",
                    String::from_utf8_lossy(value)
                ),
            )
        })
}

/// The stored count among a transaction's answers (its first range read): `None` if no
/// count is stored.
fn count_in(answers: Vec<TxnOpResponse>) -> Result<Option<(u32, i64)>> {
    for answer in answers {
        if let TxnOpResponse::Get(get) = answer {
            return get
                .kvs()
                .first()
                .map(|kv| parse_count(kv.value()).map(|c| (c, kv.mod_revision())))
                .transpose();
        }
    }
    Ok(None)
}

/// For each key of `queue` (in line order), whether it holds under `count` permits: the
/// permits of the keys up to and including it fit.
fn holding(queue: &[Queued], count: u32) -> Vec<bool> {
    let mut sum: u64 = 0;
    let mut fits = true;
    queue
        .iter()
        .map(|q| {
            sum += u64::from(permits_of(&q.value));
            fits = fits && sum <= u64::from(count);
            fits
        })
        .collect()
}

/// The family's ownership check: a key named after a token is that token's while it
/// exists.
fn exists(key: &str) -> Compare {
    Compare::version(key, CompareOp::Greater, 0)
}

impl Etcd {
    /// The queue (keys with their values, in line order) and the stored permit count (and
    /// its mod revision), read at one revision.
    async fn permit_line(&self, keys: &LockKeys) -> Result<(Vec<Queued>, Option<(u32, i64)>)> {
        let prefix = queue_prefix(keys);
        let txn = Txn::new().and_then([
            TxnOp::get(permits_key(keys), None),
            TxnOp::get(prefix.as_str(), Some(super::queue_read())),
        ]);
        let resp = self
            .call(
                "reading a semaphore",
                |mut c| async move { c.txn(txn).await },
            )
            .await?;
        let mut answers = resp.op_responses().into_iter();
        let count = count_in(answers.next().into_iter().collect())?;
        let queue = match answers.next() {
            Some(TxnOpResponse::Get(get)) => queued(get.kvs(), &prefix),
            _ => Vec::new(),
        };
        Ok((queue, count))
    }

    /// Sets the permit count to `f(current)` (`permits` where none is stored) by
    /// compare-and-set on its mod revision; `None` from `f` leaves it. Returns the new
    /// count.
    async fn update_count(
        &self,
        keys: &LockKeys,
        permits: u32,
        f: impl Fn(u32) -> Option<u32>,
    ) -> Result<Option<u32>> {
        let key = permits_key(keys);
        for _ in 0..CAS_TRIES {
            let read = key.clone();
            let resp = self
                .call("reading a semaphore's permits", |mut c| async move {
                    c.get(read, None).await
                })
                .await?;
            let (count, rev) = match resp.kvs().first() {
                Some(kv) => (parse_count(kv.value())?, kv.mod_revision()),
                None => (permits, 0),
            };
            let Some(new) = f(count) else {
                return Ok(None);
            };
            let txn = Txn::new()
                .when([Compare::mod_revision(key.as_str(), CompareOp::Equal, rev)])
                .and_then([TxnOp::put(key.as_str(), new.to_string(), None)]);
            let resp = self
                .call("setting a semaphore's permits", |mut c| async move {
                    c.txn(txn).await
                })
                .await?;
            if resp.succeeded() {
                return Ok(Some(new));
            }
        }
        Err(Error::new(
            ErrorKind::Unavailable,
            "setting a semaphore's permits: contended",
        )
        .retryable(true))
    }

    /// A semaphore waiter's look (see the module docs): the keys up to its own `key`
    /// (create revision `rev`) under `prefix` and the count at `count_key`, read at one
    /// revision. Its turn came if its key holds under `count`, the count its attempt went
    /// by; else it watches the queue's deletions and the count's writes from that
    /// revision (and attempts at once if the stored count is another).
    pub(super) async fn look_permits(
        &self,
        prefix: &str,
        count_key: &str,
        key: &str,
        rev: i64,
        count: u32,
    ) -> Look {
        if rev <= 0 {
            return Look::Failed;
        }
        let up_to_ours = GetOptions::new()
            .with_prefix()
            .with_max_create_revision(rev)
            .with_sort(SortTarget::Create, SortOrder::Ascend);
        let txn = Txn::new().and_then([
            TxnOp::get(count_key, None),
            TxnOp::get(prefix, Some(up_to_ours)),
        ]);
        let Ok(resp) = self
            .call(
                "reading a semaphore",
                |mut c| async move { c.txn(txn).await },
            )
            .await
        else {
            return Look::Failed;
        };
        let read_at = resp
            .header()
            .map_or(0, etcd_client::ResponseHeader::revision);
        let mut answers = resp.op_responses().into_iter();
        let stored = count_in(answers.next().into_iter().collect());
        let line = match answers.next() {
            Some(TxnOpResponse::Get(get)) => queued(get.kvs(), prefix),
            _ => return Look::Failed,
        };
        let Some(at) = line
            .iter()
            .position(|q| q.key == key.as_bytes() && q.created == rev)
        else {
            return Look::Gone;
        };
        // Another count stored: the waiter's attempt decides under it.
        let other = !matches!(stored, Ok(Some((c, _))) if c == count);
        if !other && holding(&line, count)[at] {
            return Look::Turn { ours: true };
        }
        let deletions = WatchOptions::new()
            .with_prefix()
            .with_start_revision(read_at + 1)
            .with_filters([WatchFilterType::NoPut]);
        let writes = WatchOptions::new()
            .with_start_revision(read_at + 1)
            .with_filters([WatchFilterType::NoDelete]);
        let watched = tokio::join!(
            self.open_watch(prefix.as_bytes(), deletions, "watching a semaphore"),
            self.open_watch(count_key.as_bytes(), writes, "watching a semaphore"),
        );
        let (Ok(Some(mut gone)), Ok(Some(mut counted))) = watched else {
            return Look::Failed;
        };
        Look::Ahead {
            watch: Box::pin(async move {
                let heard = tokio::select! {
                    h = heard(Some(&mut gone), EventType::Delete) => h,
                    h = heard(Some(&mut counted), EventType::Put) => h,
                };
                if heard {
                    Fired::Other
                } else {
                    Fired::Lost { wake: false }
                }
            }),
            only: false,
            wake: other,
        }
    }
}

impl RawSemaphore for Etcd {
    async fn acquire_permits(
        &self,
        keys: &LockKeys,
        token: &Token,
        n: u32,
        permits: u32,
        strict: bool,
        ttl: Duration,
        _queue: bool,
    ) -> Result<Acquire> {
        let count_key = permits_key(keys);
        // The count this attempt goes by: the caller's, until the store says otherwise.
        let mut expect = permits;
        for _ in 0..CAS_TRIES {
            let guard = vec![Compare::value(
                count_key.as_str(),
                CompareOp::Equal,
                expect.to_string(),
            )];
            let otherwise = vec![TxnOp::get(count_key.as_str(), None)];
            let kind = Kind::Permits { n, count: expect };
            match Box::pin(self.enter(keys, token, kind, ttl, guard, otherwise)).await? {
                Entered::Queued { queue, at } => {
                    if n > expect {
                        // It could never be served, and would hold up every waiter behind it.
                        self.release_permits(keys, token).await?;
                        return Err(Error::invalid(format!(
                            "{n} permits asked of semaphore {:?}, which has {expect}",
                            keys.name()
                        )));
                    }
                    let granted = holding(&queue, expect)[at];
                    return self.settle(keys, token, &queue, at, granted).await;
                }
                Entered::Refused(answers) => match count_in(answers)? {
                    None => {
                        // No count yet: the first client's is stored (if another client
                        // stored one first, the next turn reads that one).
                        let txn = Txn::new()
                            .when([Compare::create_revision(
                                count_key.as_str(),
                                CompareOp::Equal,
                                0,
                            )])
                            .and_then([TxnOp::put(count_key.as_str(), permits.to_string(), None)]);
                        self.call("storing a semaphore's permits", |mut c| async move {
                            c.txn(txn).await
                        })
                        .await?;
                        expect = permits;
                    }
                    Some((stored, _)) if strict && stored != permits => {
                        // No permit is taken for us, and no place kept.
                        self.release_permits(keys, token).await?;
                        return Err(Error::permits_mismatch(keys.name(), stored, permits));
                    }
                    Some((stored, _)) => expect = stored,
                },
            }
        }
        Err(Error::new(ErrorKind::Unavailable, "acquiring permits: contended").retryable(true))
    }

    async fn abandon_permits(
        &self,
        keys: &LockKeys,
        token: &Token,
        _n: u32,
        _ttl: Duration,
    ) -> Result<()> {
        self.release_permits(keys, token).await.map(|_| ())
    }

    async fn release_permits(&self, keys: &LockKeys, token: &Token) -> Result<bool> {
        let key = queue_key(keys, token);
        self.leave(&key, exists(&key)).await
    }

    async fn extend_permits(&self, keys: &LockKeys, token: &Token, ttl: Duration) -> Result<bool> {
        self.extend(keys, token, ttl).await
    }

    async fn permits_in_use(&self, keys: &LockKeys, permits: u32) -> Result<(u32, u32)> {
        let (queue, stored) = self.permit_line(keys).await?;
        let count = stored.map_or(permits, |(c, _)| c);
        let used = queue
            .iter()
            .zip(holding(&queue, count))
            .filter(|(_, holds)| *holds)
            .map(|(q, _)| permits_of(&q.value))
            .sum();
        Ok((used, count))
    }

    async fn set_permits(&self, keys: &LockKeys, permits: u32) -> Result<()> {
        let key = permits_key(keys);
        self.call("setting a semaphore's permits", |mut c| async move {
            c.put(key, permits.to_string(), None).await
        })
        .await
        .map(|_| ())
    }

    async fn add_permits(
        &self,
        keys: &LockKeys,
        delta: i64,
        permits: u32,
        max: u32,
    ) -> Result<Option<u32>> {
        self.update_count(keys, permits, |count| {
            crate::raw::added_permits(count, delta, max)
        })
        .await
    }
}

/// Semaphore kind's inspection, for [`RawInspect`](crate::raw::RawInspect).
impl Etcd {
    pub(crate) async fn inspect_permits(&self, keys: &LockKeys) -> Result<LockState> {
        let (queue, stored) = self.permit_line(keys).await?;
        let count = stored.map_or(u32::MAX, |(c, _)| c);
        let holds = holding(&queue, count);
        let held: Vec<&Queued> = queue
            .iter()
            .zip(&holds)
            .filter(|(_, h)| **h)
            .map(|(q, _)| q)
            .collect();
        let used: u32 = held.iter().map(|q| permits_of(&q.value)).sum();
        let remaining = match held.last() {
            Some(q) => self.lease_remaining(q.lease).await?,
            None => None,
        };
        let fence = held.last().and_then(|q| u64::try_from(q.created).ok());
        Ok(LockState::new(None, remaining, fence)
            .with_hold_count(used)
            .with_holders(u32::try_from(held.len()).unwrap_or(u32::MAX))
            .with_queued(u32::try_from(queue.len() - held.len()).unwrap_or(u32::MAX)))
    }

    pub(crate) async fn force_unlock_permits(&self, keys: &LockKeys) -> Result<bool> {
        // Every key, waiters' too (they queue again): which keys hold cannot be told from
        // the count alone once it was lowered below what is held.
        let (queue, _) = self.permit_line(keys).await?;
        self.delete_all(queue).await
    }
}

crate::raw::fair_is_the_plain_lock!(Etcd);

/// The key of `owner`'s holds of a reentrant lock: `K/<owner>`, with `%` and `/` escaped
/// (`%25`, `%2F`) so that it stays in the lock's queue.
pub(super) fn owner_key(keys: &LockKeys, owner: &str) -> String {
    let escaped = owner.replace('%', "%25").replace('/', "%2F");
    format!("{}/{escaped}", keys.lock())
}

/// The owner an owner's key names (the rest of the key after the queue's prefix).
fn owner_named(rest: &[u8]) -> String {
    String::from_utf8_lossy(rest)
        .replace("%2F", "/")
        .replace("%25", "%")
}

/// The holds listed in a reentrant owner's key: `h`, then one token per line.
pub(super) fn holds(value: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(value);
    let mut lines = text.split('\n');
    if lines.next() != Some("h") {
        return Vec::new();
    }
    lines.filter(|l| !l.is_empty()).map(str::to_owned).collect()
}

/// The value of an owner's key holding `tokens`.
fn holds_value(tokens: &[String]) -> String {
    let mut value = String::from("h");
    for t in tokens {
        value.push('\n');
        value.push_str(t);
    }
    value
}

/// Whether a key's value is a writer's that has not downgraded.
fn is_writer(value: &[u8]) -> bool {
    value.starts_with(b"w ")
}

impl Etcd {
    /// The key's value, mod revision and lease, if it exists.
    async fn read_versioned(&self, key: &str) -> Result<Option<(Vec<u8>, i64, i64)>> {
        Ok(self
            .read_kv(key)
            .await?
            .map(|kv| (kv.value().to_vec(), kv.mod_revision(), kv.lease())))
    }

    /// Takes `token`'s hold out of the owner's key `key` (the key goes with the
    /// last hold). Returns whether the hold was there.
    pub(super) async fn release_hold(&self, key: &str, token: &Token) -> Result<bool> {
        for _ in 0..CAS_TRIES {
            let Some((value, rev, _)) = self.read_versioned(key).await? else {
                self.forget(key);
                return Ok(false);
            };
            let mut rest = holds(&value);
            let before = rest.len();
            rest.retain(|t| t != token.as_str());
            if rest.len() == before {
                return Ok(false);
            }
            let same = Compare::mod_revision(key, CompareOp::Equal, rev);
            if rest.is_empty() {
                // The last hold: the key goes (its session lease stays).
                if self.leave(key, same).await? {
                    return Ok(true);
                }
            } else {
                let txn = Txn::new().when([same]).and_then([TxnOp::put(
                    key,
                    holds_value(&rest),
                    Some(etcd_client::PutOptions::new().with_ignore_lease()),
                )]);
                let resp = self
                    .call("releasing a reentrant hold", |mut c| async move {
                        c.txn(txn).await
                    })
                    .await?;
                if resp.succeeded() {
                    return Ok(true);
                }
            }
        }
        Err(Error::new(
            ErrorKind::Unavailable,
            "releasing a reentrant hold: contended",
        )
        .retryable(true))
    }

    /// The owner's key of a reentrant hold under `token`: the one this client recorded,
    /// else the queue's key that lists the token (a hold handed over from elsewhere).
    async fn hold_key(&self, keys: &LockKeys, token: &Token) -> Result<Option<String>> {
        if let Some(key) = self.alias(&queue_key(keys, token)) {
            return Ok(Some(key));
        }
        let prefix = queue_prefix(keys);
        let from = prefix.clone();
        let resp = self
            .call("reading a lock's queue", |mut c| async move {
                c.get(from, Some(super::queue_read())).await
            })
            .await?;
        Ok(queued(resp.kvs(), &prefix)
            .into_iter()
            .find(|q| holds(&q.value).iter().any(|t| t == token.as_str()))
            .map(|q| String::from_utf8_lossy(&q.key).into_owned()))
    }

    /// A reader's look (see the module docs): the nearest writer's key before its own
    /// `key` (create revision `rev`) under `prefix`, watched from the read on for its
    /// deletion (the last writer ahead gone: the turn) or its downgrade (look again).
    pub(super) async fn look_read(&self, prefix: &str, key: &str, rev: i64) -> Look {
        if rev <= 0 {
            return Look::Failed;
        }
        let from = prefix.to_owned();
        let up_to_ours = GetOptions::new()
            .with_prefix()
            .with_max_create_revision(rev)
            .with_sort(SortTarget::Create, SortOrder::Descend);
        let Ok(resp) = self
            .call("reading a lock's queue", |mut c| async move {
                c.get(from, Some(up_to_ours)).await
            })
            .await
        else {
            return Look::Failed;
        };
        let read_at = resp
            .header()
            .map_or(0, etcd_client::ResponseHeader::revision);
        let line = queued(resp.kvs(), prefix);
        let ours = line
            .iter()
            .any(|q| q.key == key.as_bytes() && q.created == rev);
        let mut writers = line
            .iter()
            .filter(|q| q.created < rev && is_writer(&q.value));
        let Some(writer) = writers.next() else {
            return Look::Turn { ours };
        };
        let only = writers.next().is_none();
        let options = WatchOptions::new().with_start_revision(read_at + 1);
        let Ok(Some(mut stream)) = self
            .open_watch(&writer.key, options, "watching the writer ahead")
            .await
        else {
            return Look::Failed;
        };
        Look::Ahead {
            watch: Box::pin(async move {
                loop {
                    match stream.message().await {
                        Ok(Some(resp)) => {
                            let events = resp.events();
                            if events.iter().any(|e| e.event_type() == EventType::Delete) {
                                return Fired::Deleted;
                            }
                            // A write: the writer downgraded (or wrote its value again).
                            if !events.is_empty() {
                                return Fired::Other;
                            }
                            if resp.canceled() {
                                return Fired::Lost { wake: false };
                            }
                        }
                        Ok(None) | Err(_) => return Fired::Lost { wake: false },
                    }
                }
            }),
            only,
            wake: false,
        }
    }

    /// Deletes every key of `queue` (each compared on its create revision); their leases
    /// stay (a session lease may hold its client's other keys). Returns whether any was
    /// there.
    async fn delete_all(&self, queue: Vec<Queued>) -> Result<bool> {
        let mut any = false;
        for q in queue {
            let txn = Txn::new()
                .when([Compare::create_revision(
                    q.key.clone(),
                    CompareOp::Equal,
                    q.created,
                )])
                .and_then([TxnOp::delete(q.key.clone(), None)]);
            let resp = self
                .call("force-unlocking", |mut c| async move { c.txn(txn).await })
                .await?;
            any |= resp.succeeded();
        }
        Ok(any)
    }

    /// The queue of `keys` with every key's value, in line order.
    async fn full_queue(&self, keys: &LockKeys) -> Result<Vec<Queued>> {
        let prefix = queue_prefix(keys);
        let from = prefix.clone();
        let resp = self
            .call("reading a lock's queue", |mut c| async move {
                c.get(from, Some(super::queue_read())).await
            })
            .await?;
        Ok(queued(resp.kvs(), &prefix))
    }
}

impl RawReentrant for Etcd {
    async fn acquire_reentrant(
        &self,
        keys: &LockKeys,
        owner: &str,
        token: &Token,
        ttl: Duration,
        limit: u32,
        _queue: bool,
    ) -> Result<Acquire> {
        let secs = super::lease_seconds(ttl);
        let key = owner_key(keys, owner);
        let prefix = queue_prefix(keys);
        self.set_alias(queue_key(keys, token), key.clone());
        for _ in 0..CAS_TRIES {
            let lease = self.session(secs).await?;
            self.set_lease(&key, lease, secs);
            let (mut tokens, rev) = match self.read_versioned(&key).await? {
                Some((value, rev, _)) => (holds(&value), rev),
                None => (Vec::new(), 0),
            };
            if !tokens.iter().any(|t| t == token.as_str()) {
                if u32::try_from(tokens.len()).unwrap_or(u32::MAX) >= limit {
                    self.unalias(&queue_key(keys, token));
                    return Err(Error::new(
                        ErrorKind::LimitReached,
                        format!(
                            "owner {owner:?} already holds lock {:?} {limit} times",
                            keys.name()
                        ),
                    ));
                }
                tokens.push(token.as_str().to_owned());
            }
            // The owner's key with our hold on a lease that restarted now (a new key goes
            // to the back), if no other hold changed it meanwhile; and the queue at that
            // revision.
            let txn = Txn::new()
                .when([Compare::mod_revision(key.as_str(), CompareOp::Equal, rev)])
                .and_then([
                    TxnOp::put(
                        key.as_str(),
                        holds_value(&tokens),
                        Some(etcd_client::PutOptions::new().with_lease(lease)),
                    ),
                    TxnOp::get(prefix.as_str(), Some(super::queue_read().with_keys_only())),
                ]);
            // Beside a keep-alive of the session lease (None: it ran out, try on a new one).
            let Some(resp) = Box::pin(self.txn_on(&key, lease, secs, txn, "acquiring")).await?
            else {
                continue;
            };
            if !resp.succeeded() {
                continue;
            }
            let queue = resp
                .op_responses()
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
            self.placed(&key, queue[at].created, Kind::Holds);
            return self.settle(keys, token, &queue, at, at == 0).await;
        }
        Err(Error::new(ErrorKind::Unavailable, "re-entering a lock: contended").retryable(true))
    }

    async fn release_reentrant(&self, keys: &LockKeys, owner: &str, token: &Token) -> Result<bool> {
        self.unalias(&queue_key(keys, token));
        self.release_hold(&owner_key(keys, owner), token).await
    }

    async fn extend_reentrant(
        &self,
        keys: &LockKeys,
        token: &Token,
        ttl: Duration,
    ) -> Result<bool> {
        let Some(key) = self.hold_key(keys, token).await? else {
            return Ok(false);
        };
        self.extend_at(&key, ttl, |value| {
            holds(value).iter().any(|t| t == token.as_str())
        })
        .await
    }
}

/// Reentrant kind's inspection, for [`RawInspect`](crate::raw::RawInspect).
impl Etcd {
    pub(crate) async fn inspect_reentrant(&self, keys: &LockKeys) -> Result<LockState> {
        let queue = self.full_queue(keys).await?;
        let prefix = queue_prefix(keys);
        let Some(head) = queue.first() else {
            return Ok(LockState::new(None, None, None).with_queued(0));
        };
        Ok(LockState::new(
            Some(owner_named(&head.key[prefix.len()..])),
            self.lease_remaining(head.lease).await?,
            u64::try_from(head.created).ok(),
        )
        .with_hold_count(u32::try_from(holds(&head.value).len()).unwrap_or(u32::MAX))
        .with_queued(u32::try_from(queue.len() - 1).unwrap_or(u32::MAX)))
    }

    pub(crate) async fn force_unlock_reentrant(&self, keys: &LockKeys) -> Result<bool> {
        let queue = self.full_queue(keys).await?;
        let Some(head) = queue.into_iter().next() else {
            return Ok(false);
        };
        self.delete_all(vec![head]).await
    }
}

impl RawRwLock for Etcd {
    const READERS_QUEUE: bool = true;

    async fn acquire_rw(
        &self,
        keys: &LockKeys,
        token: &Token,
        write: bool,
        ttl: Duration,
        _grace: Duration,
    ) -> Result<Acquire> {
        let kind = if write { Kind::Write } else { Kind::Read };
        match self
            .enter(keys, token, kind, ttl, Vec::new(), Vec::new())
            .await?
        {
            Entered::Queued { queue, at } => {
                // A writer holds when its key is the first; a reader when no writer's key
                // (that did not downgrade) is before its own: writers first.
                let granted = if is_writer(&queue[at].value) {
                    at == 0
                } else {
                    !queue[..at].iter().any(|q| is_writer(&q.value))
                };
                self.settle(keys, token, &queue, at, granted).await
            }
            Entered::Refused(_) => Err(Error::new(
                ErrorKind::Backend,
                "etcd refused an attempt without a condition",
            )),
        }
    }

    async fn release_rw(&self, keys: &LockKeys, token: &Token) -> Result<bool> {
        let key = queue_key(keys, token);
        self.leave(&key, exists(&key)).await
    }

    async fn extend_rw(&self, keys: &LockKeys, token: &Token, ttl: Duration) -> Result<bool> {
        self.extend(keys, token, ttl).await
    }

    /// Rewrites the writer's value as a reader's in one compare-on-value transaction: the
    /// key keeps its place (no writer can come in between) and now counts as a reader;
    /// then its lease is renewed for `ttl`.
    async fn downgrade_rw(&self, keys: &LockKeys, token: &Token, ttl: Duration) -> Result<bool> {
        let key = queue_key(keys, token);
        let txn = Txn::new()
            .when([Compare::value(
                key.as_str(),
                CompareOp::Equal,
                Kind::Write.value(token),
            )])
            .and_then([TxnOp::put(
                key.as_str(),
                Kind::Read.value(token),
                Some(etcd_client::PutOptions::new().with_ignore_lease()),
            )]);
        let resp = self
            .call("downgrading", |mut c| async move { c.txn(txn).await })
            .await?;
        if !resp.succeeded() {
            return Ok(false);
        }
        if let Some(place) = self.places().get_mut(&key) {
            place.kind = Kind::Read;
        }
        self.extend(keys, token, ttl).await
    }

    async fn abandon_rw(&self, keys: &LockKeys, token: &Token) -> Result<()> {
        self.release_rw(keys, token).await.map(|_| ())
    }

    async fn watch_rw(&self, keys: &LockKeys, token: &Token, _write: bool) -> Result<ReleaseWatch> {
        self.watch_for(keys, token).await
    }
}

/// RwLock kind's inspection, for [`RawInspect`](crate::raw::RawInspect).
impl Etcd {
    pub(crate) async fn inspect_rw(&self, keys: &LockKeys) -> Result<LockState> {
        let queue = self.full_queue(keys).await?;
        let prefix = queue_prefix(keys);
        let writer = queue.first().filter(|q| is_writer(&q.value));
        let first_writer = queue
            .iter()
            .position(|q| is_writer(&q.value))
            .unwrap_or(queue.len());
        let readers = if writer.is_some() { 0 } else { first_writer };
        let waiting = queue
            .iter()
            .skip(usize::from(writer.is_some()))
            .filter(|q| is_writer(&q.value))
            .count();
        let remaining = match writer {
            Some(w) => self.lease_remaining(w.lease).await?,
            None => None,
        };
        Ok(LockState::new(
            writer.map(|w| w.owner(&prefix)),
            remaining,
            writer.and_then(|w| u64::try_from(w.created).ok()),
        )
        .with_holders(u32::try_from(readers).unwrap_or(u32::MAX))
        .with_queued(u32::try_from(waiting).unwrap_or(u32::MAX)))
    }

    pub(crate) async fn force_unlock_rw(&self, keys: &LockKeys) -> Result<bool> {
        let queue = self.full_queue(keys).await?;
        self.delete_all(queue).await
    }
}
