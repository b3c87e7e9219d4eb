//! The in-process store: the embedded default.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use tokio::time::Instant;

use tokio::sync::Notify;

use crate::engine::{Engine, LeaseKind, Renewal};
use crate::error::Error;
use crate::error::Result;
use crate::keys::LockKeys;
use crate::raw::{
    Acquire, LockState, RawElection, RawFair, RawFencing, RawInspect, RawLock, RawReentrant,
    RawRwLock, RawSemaphore, ReleaseWatch,
};
use crate::reentrant::ReentrantEntry;
use crate::token::Token;

#[cfg(feature = "simulation")]
mod sim;

/// An in-process lock store: for single-process programs, tests and doctests.
///
/// It follows the same contract as the networked stores (leases expire by themselves,
/// releases are owner-checked, fences strictly increase, waiters are woken one per
/// release), so code written against it behaves the same on Redis. Clones share one store
/// and one watchdog, like clones of one Redis client; [`Memory::client`] gives another
/// client of the same store, with its own watchdog, as another process's client would be.
/// Nothing survives the process; fences restart at 1 in a new process.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> fencelock::Result<()> {
/// use fencelock::{Lock, backend::Memory};
///
/// let store = Memory::new();
/// let lock = Lock::new(store.clone(), "invoice-42")?;
/// let guard = lock.lock().await?;
/// assert!(lock.try_lock().await?.is_none()); // held
/// guard.release().await?;
/// assert!(lock.try_lock().await?.is_some());
/// # Ok(()) }
/// ```
#[derive(Clone, Default)]
pub struct Memory {
    state: Arc<Mutex<State>>,
    engine: Engine,
}

#[derive(Default)]
struct State {
    locks: HashMap<String, Held>,
    fences: HashMap<String, u64>,
    watchers: HashMap<String, Weak<Notify>>,
    semaphores: HashMap<String, Permits>,
    reentrant: HashMap<String, ReentrantEntry>,
    rw: HashMap<String, RwEntry>,
    fair: HashMap<String, FairQueue>,
    /// Elections' leader records: `(term, data)` by record key.
    records: HashMap<String, (u64, String)>,
    /// Sweep expired entries when the map grows past this.
    sweep_at: usize,
}

struct Held {
    token: Token,
    expires: Instant,
}

/// One semaphore: its permit count and its holders' leases.
#[derive(Default)]
struct Permits {
    count: Option<u32>,
    holders: HashMap<Token, (u32, Instant)>,
}

/// One fair lock's queue (its holder is an ordinary lock entry).
#[derive(Default)]
struct FairQueue {
    order: std::collections::BTreeMap<u64, Token>,
    places: HashMap<Token, (u64, Instant)>,
    next: u64,
}

impl FairQueue {
    fn purge(&mut self, now: Instant) {
        let order = &mut self.order;
        self.places.retain(|_, (seq, claim)| {
            let live = *claim > now;
            if !live {
                order.remove(seq);
            }
            live
        });
    }

    fn head(&self) -> Option<&Token> {
        self.order.values().next()
    }

    fn remove(&mut self, token: &Token) -> bool {
        match self.places.remove(token) {
            Some((seq, _)) => {
                self.order.remove(&seq);
                true
            }
            None => false,
        }
    }
}

/// One read-write lock: the writer, the readers and the waiting writers, each with an
/// expiry.
#[derive(Default)]
struct RwEntry {
    writer: Option<(Token, Instant)>,
    readers: HashMap<Token, Instant>,
    waiting: HashMap<Token, Instant>,
}

impl RwEntry {
    fn purge(&mut self, now: Instant) {
        if self.writer.as_ref().is_some_and(|(_, e)| *e <= now) {
            self.writer = None;
        }
        self.readers.retain(|_, e| *e > now);
        self.waiting.retain(|_, e| *e > now);
    }

    fn is_empty(&self) -> bool {
        self.writer.is_none() && self.readers.is_empty() && self.waiting.is_empty()
    }
}

impl Permits {
    fn live(&mut self, now: Instant) -> &mut HashMap<Token, (u32, Instant)> {
        self.holders.retain(|_, (_, expires)| *expires > now);
        &mut self.holders
    }
}

impl std::fmt::Debug for Memory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Memory").finish_non_exhaustive()
    }
}

impl Memory {
    /// A new, empty store.
    pub fn new() -> Memory {
        Memory::default()
    }

    /// Another client of the same store, with its own lease watchdog.
    pub fn client(&self) -> Memory {
        Memory {
            state: Arc::clone(&self.state),
            engine: Engine::new(),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Deletes a lock key (or a semaphore's holders) whoever holds it, as an operator's
    /// force-unlock would (holders learn it at their next renewal). Returns whether
    /// anything live was deleted.
    pub fn force_delete(&self, key: &str) -> bool {
        let mut state = self.state();
        let now = Instant::now();
        let live = state.locks.remove(key).is_some_and(|h| h.expires > now);
        let holders = state
            .semaphores
            .get_mut(key)
            .is_some_and(|sem| !std::mem::take(&mut sem.holders).is_empty());
        let reentrant = state.reentrant.remove(key).is_some_and(|e| e.expires > now);
        let rw = state.rw.remove(key).is_some_and(|mut e| {
            e.purge(now);
            e.writer.is_some() || !e.readers.is_empty()
        });
        if let Ok(keys) = LockKeys::new("", key) {
            state.notify_one(keys.channel());
            state.notify_one(keys.side("r").channel());
            state.notify_one(keys.side("w").channel());
        }
        live || holders || reentrant || rw
    }

    /// The remaining time to live of a lock key, or `None` if it is not held.
    pub fn remaining(&self, key: &str) -> Option<Duration> {
        let now = Instant::now();
        self.state()
            .locks
            .get(key)
            .and_then(|h| h.expires.checked_duration_since(now))
            .filter(|d| !d.is_zero())
    }
}

impl State {
    /// The live reentrant entry of `key`, dropping an expired one.
    fn live_reentrant(&mut self, key: &str, now: Instant) -> Option<&mut ReentrantEntry> {
        if self.reentrant.get(key).is_some_and(|e| e.expires <= now) {
            self.reentrant.remove(key);
        }
        self.reentrant.get_mut(key)
    }

    /// The live holder of `key`, dropping an expired one.
    fn live(&mut self, key: &str, now: Instant) -> Option<&mut Held> {
        if self.locks.get(key).is_some_and(|h| h.expires <= now) {
            self.locks.remove(key);
        }
        self.locks.get_mut(key)
    }

    fn notify_one(&mut self, key: &str) {
        match self.watchers.get(key).map(Weak::upgrade) {
            Some(Some(notify)) => notify.notify_one(),
            Some(None) => {
                self.watchers.remove(key);
            }
            None => {}
        }
    }

    fn sweep(&mut self, now: Instant) {
        if self.locks.len() < self.sweep_at {
            return;
        }
        self.locks.retain(|_, h| h.expires > now);
        self.watchers.retain(|_, w| w.strong_count() > 0);
        self.sweep_at = (self.locks.len() * 2).max(1024);
    }
}

impl RawLock for Memory {
    async fn acquire(&self, keys: &LockKeys, token: &Token, ttl: Duration) -> Result<Acquire> {
        let now = Instant::now();
        let mut state = self.state();
        state.sweep(now);
        if let Some(held) = state.live(keys.lock(), now) {
            if held.token == *token {
                // A repeated request: the same grant, renewed.
                held.expires = now + ttl;
                let fence = state.fences.get(keys.lock()).copied().unwrap_or(0);
                return Ok(Acquire::Acquired { fence });
            }
            return Ok(Acquire::Held {
                remaining: Some(held.expires - now),
            });
        }
        state.locks.insert(
            keys.lock().to_owned(),
            Held {
                token: token.clone(),
                expires: now + ttl,
            },
        );
        let fence = state.fences.entry(keys.lock().to_owned()).or_insert(0);
        *fence += 1;
        Ok(Acquire::Acquired { fence: *fence })
    }

    async fn release(&self, keys: &LockKeys, token: &Token) -> Result<bool> {
        let now = Instant::now();
        let mut state = self.state();
        let ours = state
            .live(keys.lock(), now)
            .is_some_and(|h| h.token == *token);
        if ours {
            state.locks.remove(keys.lock());
            state.notify_one(keys.channel());
        }
        Ok(ours)
    }

    async fn extend(&self, keys: &LockKeys, token: &Token, ttl: Duration) -> Result<bool> {
        let now = Instant::now();
        let mut state = self.state();
        match state.live(keys.lock(), now) {
            Some(held) if held.token == *token => {
                held.expires = now + ttl;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn watch(&self, keys: &LockKeys) -> Result<ReleaseWatch> {
        let mut state = self.state();
        let key = keys.channel();
        let notify = match state.watchers.get(key).and_then(Weak::upgrade) {
            Some(n) => n,
            None => {
                let n = Arc::new(Notify::new());
                state.watchers.insert(key.to_owned(), Arc::downgrade(&n));
                n
            }
        };
        Ok(ReleaseWatch::new(notify, None))
    }

    /// Each renewal by its kind (in-process: no round trips to save).
    async fn extend_many(&self, renewals: &[Renewal]) -> Vec<Result<bool>> {
        let mut out = Vec::with_capacity(renewals.len());
        for r in renewals {
            out.push(match r.kind {
                LeaseKind::Permits => self.extend_permits(&r.keys, &r.token, r.ttl).await,
                LeaseKind::Reentrant => self.extend_reentrant(&r.keys, &r.token, r.ttl).await,
                LeaseKind::ReadWrite => self.extend_rw(&r.keys, &r.token, r.ttl).await,
                _ => self.extend(&r.keys, &r.token, r.ttl).await,
            });
        }
        out
    }

    fn store_id(&self) -> String {
        format!("memory:{:p}", Arc::as_ptr(&self.state))
    }

    fn store_label(&self) -> &'static str {
        "memory"
    }

    fn engine(&self) -> &Engine {
        &self.engine
    }
}

/// Fences come from a per-key counter in the same critical section as the grant, and the
/// counter is never dropped while the store lives.
impl RawFencing for Memory {}

/// The key of an election's record in the records map: its companion key.
fn record_key(keys: &LockKeys) -> String {
    keys.companion(crate::raw::RECORD)
}

/// Every map entry (`<map> <key>`) and watched channel (`watch <channel>`) lock `keys` of
/// `primitive` uses: the maps are keyed by the lock key, records by [`record_key`],
/// watchers by the channels of [`LockKeys`] (a fair lock's waiter's for a sample token).
#[cfg(test)]
pub(crate) fn key_set(primitive: &str, keys: &LockKeys) -> Vec<String> {
    let k = keys.lock();
    let watch = |side: Option<&str>| {
        let channel = side.map_or_else(
            || keys.channel().to_owned(),
            |s| keys.side(s).channel().to_owned(),
        );
        format!("watch {channel}")
    };
    match primitive {
        "semaphore" => vec![format!("semaphores {k}"), watch(None)],
        "reentrant" => vec![format!("reentrant {k}"), format!("fences {k}"), watch(None)],
        "rwlock" => vec![
            format!("rw {k}"),
            format!("fences {k}"),
            watch(Some("r")),
            watch(Some("w")),
        ],
        "fair" => vec![
            format!("locks {k}"),
            format!("fences {k}"),
            format!("fair {k}"),
            watch(Some("0123456789abcdef")),
        ],
        "election" => vec![
            format!("locks {k}"),
            format!("fences {k}"),
            format!("records {}", record_key(keys)),
            watch(None),
            watch(Some(crate::raw::RECORD)),
        ],
        _ => vec![format!("locks {k}"), format!("fences {k}"), watch(None)],
    }
}

/// The record is a map entry, written under the store's lock if the lock is the
/// caller's; a write wakes one observer of the record's side channel.
impl RawElection for Memory {
    async fn publish(&self, keys: &LockKeys, token: &Token, term: u64, data: &str) -> Result<bool> {
        let mut state = self.state();
        if state
            .live(keys.lock(), Instant::now())
            .is_none_or(|h| h.token != *token)
        {
            return Ok(false);
        }
        state
            .records
            .insert(record_key(keys), (term, data.to_owned()));
        state.notify_one(keys.side(crate::raw::RECORD).channel());
        Ok(true)
    }

    async fn record(&self, keys: &LockKeys) -> Result<Option<(u64, String)>> {
        Ok(self.state().records.get(&record_key(keys)).cloned())
    }
}

impl RawInspect for Memory {
    const KINDS_TOLD_APART_UNDER_ONE_PREFIX: bool = true;

    crate::raw::inspect_each_kind!();

    async fn list(&self, prefix: &str, pattern: &str, limit: usize) -> Result<Vec<String>> {
        crate::observe::listed(self.store_label(), pattern, async move {
            let now = Instant::now();
            let state = self.state();
            Ok(state
                .locks
                .iter()
                .filter(|(_, h)| h.expires > now)
                .filter_map(|(k, _)| k.strip_prefix(prefix))
                .filter(|name| glob_match(pattern.as_bytes(), name.as_bytes()))
                .take(limit)
                .map(str::to_owned)
                .collect())
        })
        .await
    }
}

/// The plain lock's inspection, for [`RawInspect`].
impl Memory {
    pub(crate) async fn inspect_plain(&self, keys: &LockKeys) -> Result<LockState> {
        let now = Instant::now();
        let mut state = self.state();
        let (holder, remaining) = match state.live(keys.lock(), now) {
            Some(h) => (Some(h.token.as_str().to_owned()), Some(h.expires - now)),
            None => (None, None),
        };
        let fence = state.fences.get(keys.lock()).copied();
        Ok(LockState::new(holder, remaining, fence))
    }

    pub(crate) async fn force_unlock_plain(&self, keys: &LockKeys) -> Result<bool> {
        Ok(self.force_delete(keys.lock()))
    }
}

/// `*` matches any run, `?` one byte, anything else itself.
pub(crate) fn glob_match(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0, 0);
    let mut backtrack: Option<(usize, usize)> = None;
    while t < text.len() {
        match pattern.get(p) {
            Some(b'*') => {
                backtrack = Some((p, t));
                p += 1;
            }
            Some(&c) if c == b'?' || c == text[t] => {
                p += 1;
                t += 1;
            }
            _ => match backtrack {
                Some((bp, bt)) => {
                    p = bp + 1;
                    t = bt + 1;
                    backtrack = Some((bp, bt + 1));
                }
                None => return false,
            },
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

impl RawSemaphore for Memory {
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
        let now = Instant::now();
        let mut state = self.state();
        let sem = state.semaphores.entry(keys.lock().to_owned()).or_default();
        let count = *sem.count.get_or_insert(permits);
        if strict && count != permits {
            return Err(Error::permits_mismatch(keys.name(), count, permits));
        }
        let holders = sem.live(now);
        let used: u32 = holders
            .iter()
            .filter(|(t, _)| *t != token)
            .map(|(_, (n, _))| n)
            .sum();
        if used.saturating_add(n) <= count {
            holders.insert(token.clone(), (n, now + ttl));
            return Ok(Acquire::Acquired { fence: 0 });
        }
        let remaining = holders.values().map(|(_, e)| *e - now).min();
        Ok(Acquire::Held { remaining })
    }

    async fn release_permits(&self, keys: &LockKeys, token: &Token) -> Result<bool> {
        let now = Instant::now();
        let mut state = self.state();
        let released = state
            .semaphores
            .get_mut(keys.lock())
            .and_then(|sem| sem.live(now).remove(token));
        if let Some((n, _)) = released {
            for _ in 0..n {
                state.notify_one(keys.channel());
            }
        }
        Ok(released.is_some())
    }

    async fn extend_permits(&self, keys: &LockKeys, token: &Token, ttl: Duration) -> Result<bool> {
        let now = Instant::now();
        let mut state = self.state();
        let holder = state
            .semaphores
            .get_mut(keys.lock())
            .and_then(|sem| sem.live(now).get_mut(token));
        Ok(holder.map(|(_, expires)| *expires = now + ttl).is_some())
    }

    async fn permits_in_use(&self, keys: &LockKeys, permits: u32) -> Result<(u32, u32)> {
        let now = Instant::now();
        let mut state = self.state();
        Ok(match state.semaphores.get_mut(keys.lock()) {
            Some(sem) => {
                let count = sem.count.unwrap_or(permits);
                (sem.live(now).values().map(|(n, _)| n).sum(), count)
            }
            None => (0, permits),
        })
    }

    async fn add_permits(
        &self,
        keys: &LockKeys,
        delta: i64,
        permits: u32,
        max: u32,
    ) -> Result<Option<u32>> {
        let mut state = self.state();
        let sem = state.semaphores.entry(keys.lock().to_owned()).or_default();
        let count = i64::from(sem.count.unwrap_or(permits)) + delta;
        let Ok(count) = u32::try_from(count) else {
            return Ok(None);
        };
        if count == 0 || count > max {
            return Ok(None);
        }
        sem.count = Some(count);
        if delta > 0 {
            state.notify_one(keys.channel());
        }
        Ok(Some(count))
    }

    async fn set_permits(&self, keys: &LockKeys, permits: u32) -> Result<()> {
        let mut state = self.state();
        state
            .semaphores
            .entry(keys.lock().to_owned())
            .or_default()
            .count = Some(permits);
        state.notify_one(keys.channel());
        Ok(())
    }
}

/// Semaphore kind's inspection, for [`RawInspect`](crate::raw::RawInspect).
impl Memory {
    pub(crate) async fn inspect_permits(&self, keys: &LockKeys) -> Result<LockState> {
        let now = Instant::now();
        let mut state = self.state();
        let Some(sem) = state.semaphores.get_mut(keys.lock()) else {
            return Ok(LockState::new(None, None, None)
                .with_hold_count(0)
                .with_holders(0));
        };
        let live = sem.live(now);
        let used: u32 = live.values().map(|(n, _)| n).sum();
        let last = live.values().map(|(_, e)| *e - now).max();
        let holders = u32::try_from(live.len()).unwrap_or(u32::MAX);
        Ok(LockState::new(None, last, None)
            .with_hold_count(used)
            .with_holders(holders))
    }

    pub(crate) async fn force_unlock_permits(&self, keys: &LockKeys) -> Result<bool> {
        Ok(self.force_delete(keys.lock()))
    }
}

impl RawReentrant for Memory {
    async fn acquire_reentrant(
        &self,
        keys: &LockKeys,
        owner: &str,
        token: &Token,
        ttl: Duration,
        limit: u32,
        _queue: bool,
    ) -> Result<Acquire> {
        let now = Instant::now();
        let mut state = self.state();
        let key = keys.lock();
        if let Some(entry) = state.live_reentrant(key, now) {
            if entry.owner != owner {
                return Ok(Acquire::Held {
                    remaining: Some(entry.expires - now),
                });
            }
            if !entry.holds.contains(token) {
                if entry.count >= limit {
                    return Err(Error::new(
                        crate::ErrorKind::LimitReached,
                        format!(
                            "reentrant lock {:?}: {owner} already holds it {limit} times, \
                             its reentrancy limit",
                            keys.name()
                        ),
                    ));
                }
                entry.count += 1;
                entry.holds.insert(token.clone());
            }
            entry.expires = now + ttl;
            return Ok(Acquire::Acquired { fence: entry.fence });
        }
        let fence = state.fences.entry(key.to_owned()).or_insert(0);
        *fence += 1;
        let fence = *fence;
        state.reentrant.insert(
            key.to_owned(),
            ReentrantEntry {
                owner: owner.to_owned(),
                count: 1,
                fence,
                holds: std::iter::once(token.clone()).collect(),
                expires: now + ttl,
            },
        );
        Ok(Acquire::Acquired { fence })
    }

    async fn release_reentrant(&self, keys: &LockKeys, owner: &str, token: &Token) -> Result<bool> {
        let now = Instant::now();
        let mut state = self.state();
        let key = keys.lock();
        let Some(entry) = state.live_reentrant(key, now) else {
            return Ok(false);
        };
        if entry.owner != owner || !entry.holds.remove(token) {
            return Ok(false);
        }
        entry.count = entry.count.saturating_sub(1);
        if entry.count == 0 {
            state.reentrant.remove(key);
            state.notify_one(keys.channel());
        }
        Ok(true)
    }

    async fn extend_reentrant(
        &self,
        keys: &LockKeys,
        token: &Token,
        ttl: Duration,
    ) -> Result<bool> {
        let now = Instant::now();
        let mut state = self.state();
        Ok(match state.live_reentrant(keys.lock(), now) {
            Some(entry) if entry.holds.contains(token) => {
                entry.expires = now + ttl;
                true
            }
            _ => false,
        })
    }
}

/// Reentrant kind's inspection, for [`RawInspect`](crate::raw::RawInspect).
impl Memory {
    pub(crate) async fn inspect_reentrant(&self, keys: &LockKeys) -> Result<LockState> {
        let now = Instant::now();
        let mut state = self.state();
        let key = keys.lock();
        let fence = state.fences.get(key).copied();
        Ok(match state.live_reentrant(key, now) {
            Some(e) => LockState::new(Some(e.owner.clone()), Some(e.expires - now), fence)
                .with_hold_count(e.count),
            None => LockState::new(None, None, fence),
        })
    }

    pub(crate) async fn force_unlock_reentrant(&self, keys: &LockKeys) -> Result<bool> {
        Ok(self.force_delete(keys.lock()))
    }
}

impl RawRwLock for Memory {
    async fn acquire_rw(
        &self,
        keys: &LockKeys,
        token: &Token,
        write: bool,
        ttl: Duration,
        grace: Duration,
    ) -> Result<Acquire> {
        let now = Instant::now();
        let mut state = self.state();
        let key = keys.lock();
        let entry = state.rw.entry(key.to_owned()).or_default();
        entry.purge(now);
        if !write {
            if let Some(expires) = entry.readers.get_mut(token) {
                *expires = now + ttl; // a repeated request
                return Ok(Acquire::Acquired { fence: 0 });
            }
            if let Some((_, expires)) = &entry.writer {
                return Ok(Acquire::Held {
                    remaining: Some(*expires - now),
                });
            }
            if let Some(first) = entry.waiting.values().min() {
                // Writers first.
                return Ok(Acquire::Held {
                    remaining: Some(*first - now),
                });
            }
            entry.readers.insert(token.clone(), now + ttl);
            return Ok(Acquire::Acquired { fence: 0 });
        }
        match &mut entry.writer {
            Some((holder, expires)) if holder == token => {
                *expires = now + ttl;
                entry.waiting.remove(token);
                let fence = state.fences.get(key).copied().unwrap_or(0);
                return Ok(Acquire::Acquired { fence });
            }
            _ => {}
        }
        let busy_until = match &entry.writer {
            Some((_, expires)) => Some(*expires),
            None => entry.readers.values().min().copied(),
        };
        if let Some(until) = busy_until {
            let wait = until - now;
            entry.waiting.insert(token.clone(), now + wait + grace);
            return Ok(Acquire::Held {
                remaining: Some(wait),
            });
        }
        entry.writer = Some((token.clone(), now + ttl));
        entry.waiting.remove(token);
        let fence = state.fences.entry(key.to_owned()).or_insert(0);
        *fence += 1;
        Ok(Acquire::Acquired { fence: *fence })
    }

    async fn release_rw(&self, keys: &LockKeys, token: &Token) -> Result<bool> {
        let now = Instant::now();
        let mut state = self.state();
        let key = keys.lock();
        let Some(entry) = state.rw.get_mut(key) else {
            return Ok(false);
        };
        entry.purge(now);
        let was_writer = entry.writer.as_ref().is_some_and(|(t, _)| t == token);
        let released = if was_writer {
            entry.writer = None;
            true
        } else {
            entry.readers.remove(token).is_some()
        };
        let last = released && entry.readers.is_empty();
        if entry.is_empty() {
            state.rw.remove(key);
        }
        if last {
            // A writer may come in now.
            state.notify_one(keys.side("w").channel());
        }
        if was_writer {
            // And readers, if no writer claims the lock first.
            state.notify_one(keys.side("r").channel());
        }
        Ok(released)
    }

    async fn extend_rw(&self, keys: &LockKeys, token: &Token, ttl: Duration) -> Result<bool> {
        let now = Instant::now();
        let mut state = self.state();
        let Some(entry) = state.rw.get_mut(keys.lock()) else {
            return Ok(false);
        };
        entry.purge(now);
        if let Some((t, expires)) = &mut entry.writer
            && t == token
        {
            *expires = now + ttl;
            return Ok(true);
        }
        Ok(entry
            .readers
            .get_mut(token)
            .map(|expires| *expires = now + ttl)
            .is_some())
    }

    async fn downgrade_rw(&self, keys: &LockKeys, token: &Token, ttl: Duration) -> Result<bool> {
        let now = Instant::now();
        let mut state = self.state();
        let key = keys.lock();
        let Some(entry) = state.rw.get_mut(key) else {
            return Ok(false);
        };
        entry.purge(now);
        if !entry.writer.as_ref().is_some_and(|(t, _)| t == token) {
            return Ok(false);
        }
        entry.writer = None;
        entry.readers.insert(token.clone(), now + ttl);
        state.notify_one(keys.side("r").channel());
        Ok(true)
    }

    async fn abandon_rw(&self, keys: &LockKeys, token: &Token) -> Result<()> {
        let mut state = self.state();
        let key = keys.lock();
        let Some(entry) = state.rw.get_mut(key) else {
            return Ok(());
        };
        if entry.waiting.remove(token).is_some() && entry.waiting.is_empty() {
            // Readers held back by this writer may come in.
            state.notify_one(keys.side("r").channel());
        }
        Ok(())
    }
}

/// RwLock kind's inspection, for [`RawInspect`](crate::raw::RawInspect).
impl Memory {
    pub(crate) async fn inspect_rw(&self, keys: &LockKeys) -> Result<LockState> {
        let now = Instant::now();
        let mut state = self.state();
        let key = keys.lock();
        let fence = state.fences.get(key).copied();
        let Some(entry) = state.rw.get_mut(key) else {
            return Ok(LockState::new(None, None, fence)
                .with_holders(0)
                .with_queued(0));
        };
        entry.purge(now);
        let (holder, remaining) = match &entry.writer {
            Some((t, e)) => (Some(t.as_str().to_owned()), Some(*e - now)),
            None => (None, entry.readers.values().max().map(|e| *e - now)),
        };
        let readers = u32::try_from(entry.readers.len()).unwrap_or(u32::MAX);
        let queued = u32::try_from(entry.waiting.len()).unwrap_or(u32::MAX);
        Ok(LockState::new(holder, remaining, fence)
            .with_holders(readers)
            .with_queued(queued))
    }

    pub(crate) async fn force_unlock_rw(&self, keys: &LockKeys) -> Result<bool> {
        Ok(self.force_delete(keys.lock()))
    }
}

impl State {
    /// Wakes the head of a fair lock's queue, on its own channel.
    fn wake_head(&mut self, keys: &LockKeys, now: Instant) {
        let head = self.fair.get_mut(keys.lock()).and_then(|q| {
            q.purge(now);
            q.head().cloned()
        });
        if let Some(head) = head {
            self.notify_one(keys.side(head.as_str()).channel());
        }
    }
}

impl RawFair for Memory {
    async fn acquire_fair(
        &self,
        keys: &LockKeys,
        token: &Token,
        ttl: Duration,
        grace: Duration,
    ) -> Result<Acquire> {
        let now = Instant::now();
        let mut state = self.state();
        let key = keys.lock();
        let holder = state
            .live(key, now)
            .map(|h| (h.token == *token, h.expires - now));
        if let Some((true, _)) = holder {
            // A repeated request: the same grant, renewed.
            if let Some(h) = state.live(key, now) {
                h.expires = now + ttl;
            }
            let fence = state.fences.get(key).copied().unwrap_or(0);
            return Ok(Acquire::Acquired { fence });
        }
        let queue = state.fair.entry(key.to_owned()).or_default();
        queue.purge(now);
        if !queue.places.contains_key(token) {
            let seq = queue.next;
            queue.next += 1;
            queue.order.insert(seq, token.clone());
            queue.places.insert(token.clone(), (seq, now));
        }
        let head_claim = queue
            .head()
            .and_then(|h| queue.places.get(h))
            .map(|(_, claim)| *claim);
        let at_head = queue.head() == Some(token);
        let wait = match holder {
            Some((_, remaining)) => remaining,
            None if at_head => {
                queue.remove(token);
                state.locks.insert(
                    key.to_owned(),
                    Held {
                        token: token.clone(),
                        expires: now + ttl,
                    },
                );
                let fence = state.fences.entry(key.to_owned()).or_insert(0);
                *fence += 1;
                return Ok(Acquire::Acquired { fence: *fence });
            }
            // At most a lease, as on Redis: claims behind a head that never comes must not
            // chain (each a grace past the one in front).
            None => head_claim
                .map_or(Duration::ZERO, |c| c.saturating_duration_since(now))
                .min(ttl),
        };
        if let Some(place) = queue.places.get_mut(token) {
            place.1 = now + wait + grace;
        }
        Ok(Acquire::Held {
            remaining: Some(wait),
        })
    }

    async fn release_fair(&self, keys: &LockKeys, token: &Token) -> Result<bool> {
        let now = Instant::now();
        let mut state = self.state();
        let ours = state
            .live(keys.lock(), now)
            .is_some_and(|h| h.token == *token);
        if ours {
            state.locks.remove(keys.lock());
            state.wake_head(keys, now);
        }
        Ok(ours)
    }

    async fn abandon_fair(&self, keys: &LockKeys, token: &Token) -> Result<()> {
        let now = Instant::now();
        let mut state = self.state();
        let was_head = state.fair.get_mut(keys.lock()).is_some_and(|q| {
            let head = q.head() == Some(token);
            q.remove(token) && head
        });
        // (A bug planted for the simulator keeps the head's turn from the next in line.)
        if was_head
            && state.live(keys.lock(), now).is_none()
            && !crate::simulation::planted(crate::simulation::Plant::WakeNotPassedOn)
        {
            state.wake_head(keys, now);
        }
        Ok(())
    }
}

/// Fair kind's inspection, for [`RawInspect`](crate::raw::RawInspect).
impl Memory {
    pub(crate) async fn inspect_fair(&self, keys: &LockKeys) -> Result<LockState> {
        let now = Instant::now();
        let base = self.inspect_plain(keys).await?;
        let mut state = self.state();
        let queued = state.fair.get_mut(keys.lock()).map_or(0, |q| {
            q.purge(now);
            q.order.len()
        });
        Ok(base.with_queued(u32::try_from(queued).unwrap_or(u32::MAX)))
    }

    pub(crate) async fn force_unlock_fair(&self, keys: &LockKeys) -> Result<bool> {
        let now = Instant::now();
        let mut state = self.state();
        let live = state
            .locks
            .remove(keys.lock())
            .is_some_and(|h| h.expires > now);
        state.wake_head(keys, now);
        Ok(live)
    }
}

#[cfg(test)]
mod tests {
    use super::glob_match;

    proptest::proptest! {
        #![proptest_config(dlock_hostile::cases(48))]
        /// No name reaches another lock's entries or channels (DESIGN.md principle 9).
        #[test]
        fn distinct_locks_share_no_entry_or_channel(
            names in proptest::collection::vec(crate::keys::namespace::hostile_name(), 1..3)
        ) {
            let primitives = crate::keys::namespace::PRIMITIVES;
            crate::keys::namespace::check_disjoint(primitives, &names, super::key_set)?;
        }
    }

    #[test]
    fn glob() {
        for (p, t, m) in [
            ("*", "", true),
            ("*", "abc", true),
            ("a*c", "abbbc", true),
            ("a*c", "abbb", false),
            ("a?c", "abc", true),
            ("a?c", "ac", false),
            ("job-*-x", "job-1-2-x", true),
            ("", "a", false),
            ("abc", "abc", true),
        ] {
            assert_eq!(glob_match(p.as_bytes(), t.as_bytes()), m, "{p} ~ {t}");
        }
    }
}
