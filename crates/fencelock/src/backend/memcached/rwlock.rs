//! The read-write lock on memcached: the plain lock's item for the writer, an index of
//! readers and waiting writers changed by CAS, a lease item per reader and per waiting
//! writer.
//!
//! * **The writer** holds the plain lock's item (`add`, a fence per grant, CAS release and
//!   renewal): writers exclude each other there. A writer that added it is granted only
//!   once it has written itself into the index under the CAS it read with no live reader
//!   listed; otherwise it gives the item back and waits.
//! * **A reader** is granted by writing itself into the index under the CAS it read with
//!   the writer's item absent and no live waiting writer listed; its lease item (`…~r`,
//!   the reader's expiry) says it is alive.
//!
//! Every grant is a CAS on the one index, and each side checks the other's item under the
//! version it writes: a reader that saw no writer item and a writer that saw no reader
//! read the same version, so only one of their writes succeeds — the other reads again and
//! waits. A writer that must wait lists itself as waiting with a claim item (`…~x`, the
//! holder's remaining ttl plus the writer grace, renewed by its attempts), which holds new
//! readers back (writers first) and lapses by itself if the writer crashed.
//!
//! **A lost index** (evicted, flushed or deleted while readers hold): the next attempt
//! finds none and starts a new one, without them. A reader renews its lease only while
//! the index lists it, so each loses its hold at its next renewal (`lost()` fires, its
//! lease item is deleted); until then — at most a third of the ttl, the watchdog's
//! interval — a writer granted since may hold beside them, as a plain lock's evicted key
//! may (see [fences](crate::backend::memcached#fences)). A writer's hold lives in its own item, which readers
//! check directly: a lost index lets no reader beside it.
//!
//! Waiters poll (memcached has no notifications).

use std::time::Duration;

use super::items::{self, CAS_ROUNDS};
use super::{Memcached, Reply, expiry_seconds, get_reply, lease_key, memcached_key, unexpected};
use crate::error::Result;
use crate::keys::LockKeys;
use crate::raw::{Acquire, LockState, RawLock, RawRwLock};
use crate::token::Token;

/// The index item: the lock's mapped key plus `~rw`.
pub(super) fn index_key(lock: &str) -> String {
    format!("{}~rw", memcached_key(lock))
}

/// A reader's lease item.
pub(super) fn reader_key(lock: &str, token: &str) -> String {
    lease_key(lock, token, 'r')
}

/// A waiting writer's claim item.
pub(super) fn claim_key(lock: &str, token: &str) -> String {
    lease_key(lock, token, 'x')
}

/// Who the index lists.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Index {
    pub(super) writer: Option<String>,
    pub(super) readers: Vec<String>,
    pub(super) waiting: Vec<String>,
}

/// What the index is, for errors.
const WHAT: &str = "a read-write lock's index";

impl Index {
    /// A `W` entry for the writer, `R` per reader, `X` per waiting writer.
    pub(super) fn encode(&self) -> String {
        items::encode(
            self.writer
                .iter()
                .map(|t| ("W", t))
                .chain(self.readers.iter().map(|t| ("R", t)))
                .chain(self.waiting.iter().map(|t| ("X", t))),
        )
    }

    /// What [`encode`](Self::encode) wrote; anything else is a `Backend` error.
    pub(super) fn decode(bytes: &[u8]) -> Result<Index> {
        let mut index = Index::default();
        for (tag, token) in items::decode(bytes, WHAT)? {
            match tag.as_str() {
                "W" if index.writer.is_none() => index.writer = Some(token),
                "R" => index.readers.push(token),
                "X" => index.waiting.push(token),
                _ => return Err(items::corrupt(WHAT)),
            }
        }
        Ok(index)
    }
}

/// What one attempt saw.
struct Seen {
    /// The writer's item: its token and remaining seconds.
    writer: Option<(Vec<u8>, Option<u64>)>,
    /// The index and its CAS (`None`: no index yet).
    index: Option<(Index, String)>,
    /// Per listed reader, its remaining seconds if its lease item is alive.
    readers: Vec<Option<u64>>,
    /// Per listed waiting writer, whether its claim item is alive.
    waiting: Vec<bool>,
}

impl Seen {
    fn index(&self) -> Index {
        self.index
            .as_ref()
            .map(|(i, _)| i.clone())
            .unwrap_or_default()
    }

    fn cas(&self) -> Option<&str> {
        self.index.as_ref().map(|(_, cas)| cas.as_str())
    }

    /// The index as it stands, without dead readers and lapsed waiting writers.
    fn live(&self) -> Index {
        let index = self.index();
        Index {
            writer: index.writer.filter(|w| self.holds_write(w)),
            readers: index
                .readers
                .into_iter()
                .zip(&self.readers)
                .filter(|(_, alive)| alive.is_some())
                .map(|(t, _)| t)
                .collect(),
            waiting: index
                .waiting
                .into_iter()
                .zip(&self.waiting)
                .filter(|(_, alive)| **alive)
                .map(|(t, _)| t)
                .collect(),
        }
    }

    fn holds_write(&self, token: &str) -> bool {
        self.writer
            .as_ref()
            .is_some_and(|(v, _)| v == token.as_bytes())
    }

    fn is_reader(&self, token: &str) -> bool {
        self.live().readers.iter().any(|t| t == token)
    }

    /// When the earliest live reader's lease ends.
    fn first_reader_end(&self) -> Option<Duration> {
        self.readers
            .iter()
            .flatten()
            .min()
            .map(|s| Duration::from_secs(*s))
    }

    fn writer_remaining(&self) -> Option<Duration> {
        self.writer
            .as_ref()
            .and_then(|(_, t)| *t)
            .map(Duration::from_secs)
    }
}

impl Memcached {
    /// The index and the writer's item in one round trip, the listed items in another.
    ///
    /// The index is read **before** the writer's item (memcached runs the two reads one
    /// after the other, not at once): a writer adds its item before it lists itself, so a
    /// reader that then finds no item under the version it read either writes before the
    /// writer's listing (which then fails its CAS) or fails its own. Read the other way
    /// round, a reader could miss the item of a writer granted between its two reads and
    /// write the index without it, under the version the writer had just written — a
    /// reader beside a writer (`memcached-family-fenced` in the torture harness found it).
    async fn see_rw(&self, keys: &LockKeys) -> Result<Seen> {
        let request = format!(
            "mg {} v c\r\nmg {} v t\r\n",
            index_key(keys.lock()),
            memcached_key(keys.lock())
        );
        let replies = self.call(request.into_bytes(), 2).await?;
        let [listed, held] =
            <[Reply; 2]>::try_from(replies).map_err(|_| unexpected("mg", "too few replies"))?;
        let writer = get_reply(held)?.map(|(v, _, t)| (v, t.and_then(|t| u64::try_from(t).ok())));
        let Some((value, cas, _)) = get_reply(listed)? else {
            return Ok(Seen {
                writer,
                index: None,
                readers: Vec::new(),
                waiting: Vec::new(),
            });
        };
        let index = Index::decode(&value)?;
        let listed: Vec<(String, &str)> = index
            .readers
            .iter()
            .map(|t| (reader_key(keys.lock(), t), t.as_str()))
            .chain(
                index
                    .waiting
                    .iter()
                    .map(|t| (claim_key(keys.lock(), t), t.as_str())),
            )
            .collect();
        let mut alive = self.alive(&listed).await?;
        let waiting = alive.split_off(index.readers.len());
        Ok(Seen {
            writer,
            index: Some((index, cas)),
            readers: alive,
            waiting: waiting.iter().map(Option::is_some).collect(),
        })
    }

    /// Writes `index` under `cas` (`None`: only if there is none yet).
    async fn write_rw(&self, keys: &LockKeys, index: &Index, cas: Option<&str>) -> Result<bool> {
        self.write_cas(&index_key(keys.lock()), &index.encode(), cas)
            .await
    }

    /// Takes `token` out of the index (every role), where the CAS allows within a few
    /// rounds; entries whose items are gone are dropped by the next grant anyway.
    async fn unlist_rw(&self, keys: &LockKeys, token: &str) -> Result<()> {
        for _ in 0..3 {
            let seen = self.see_rw(keys).await?;
            let Some((index, cas)) = &seen.index else {
                return Ok(());
            };
            let mut next = seen.live();
            next.writer = next.writer.filter(|w| w != token);
            next.readers.retain(|t| t != token);
            next.waiting.retain(|t| t != token);
            if &next == index || self.write_rw(keys, &next, Some(cas)).await? {
                return Ok(());
            }
        }
        Ok(())
    }

    async fn acquire_read(&self, keys: &LockKeys, token: &Token, secs: u64) -> Result<Acquire> {
        let me = reader_key(keys.lock(), token.as_str());
        for _ in 0..CAS_ROUNDS {
            let seen = self.see_rw(keys).await?;
            if seen.is_reader(token.as_str()) {
                // A repeat of a granted attempt.
                return Ok(if self.extend_item(&me, token, secs).await? {
                    Acquire::Acquired { fence: 0 }
                } else {
                    Acquire::Held { remaining: None }
                });
            }
            let mut next = seen.live();
            if seen.writer.is_some() || !next.waiting.is_empty() {
                return Ok(Acquire::Held {
                    remaining: seen.writer_remaining(),
                });
            }
            self.set_item(&me, token, secs).await?;
            next.readers.push(token.as_str().to_owned());
            if self.write_rw(keys, &next, seen.cas()).await? {
                return Ok(Acquire::Acquired { fence: 0 });
            }
            self.release_item(&me, token).await?;
        }
        Ok(Acquire::Held { remaining: None })
    }

    async fn acquire_write(
        &self,
        keys: &LockKeys,
        token: &Token,
        ttl: Duration,
        grace: Duration,
    ) -> Result<Acquire> {
        let claim = claim_key(keys.lock(), token.as_str());
        for _ in 0..CAS_ROUNDS {
            let seen = self.see_rw(keys).await?;
            let mut next = seen.live();
            if seen.holds_write(token.as_str()) && next.writer.as_deref() == Some(token.as_str()) {
                // A repeat of a granted attempt: the plain lock renews and reports it.
                return self.acquire(keys, token, ttl).await;
            }
            let wait = if seen.writer.is_some() {
                Some(seen.writer_remaining())
            } else if !next.readers.is_empty() {
                Some(seen.first_reader_end())
            } else {
                None
            };
            if let Some(remaining) = wait {
                // Wait, listed as a waiting writer (holding new readers back) until the
                // next attempt plus the grace.
                let until = remaining.unwrap_or_default() + Duration::from_secs(1) + grace;
                let secs = expiry_seconds(until.max(super::MIN_TTL))?;
                self.set_item(&claim, token, secs).await?;
                if !next.waiting.iter().any(|t| t == token.as_str()) {
                    next.waiting.push(token.as_str().to_owned());
                    if !self.write_rw(keys, &next, seen.cas()).await? {
                        continue;
                    }
                }
                return Ok(Acquire::Held { remaining });
            }
            // No writer, no live reader: take the writer's item, then list it under the
            // version read — a reader that came in between makes that write fail.
            let Acquire::Acquired { fence } = self.acquire(keys, token, ttl).await? else {
                continue;
            };
            next.writer = Some(token.as_str().to_owned());
            next.waiting.retain(|t| t != token.as_str());
            if self.write_rw(keys, &next, seen.cas()).await? {
                self.delete_item(&claim).await?;
                return Ok(Acquire::Acquired { fence });
            }
            self.release(keys, token).await?;
        }
        Ok(Acquire::Held { remaining: None })
    }
}

/// The read-write lock on memcached (see [the lock family on memcached](crate::backend::memcached#the-lock-family-on-memcached)). Waiters poll.
impl RawRwLock for Memcached {
    async fn acquire_rw(
        &self,
        keys: &LockKeys,
        token: &Token,
        write: bool,
        ttl: Duration,
        grace: Duration,
    ) -> Result<Acquire> {
        let secs = expiry_seconds(ttl)?;
        if write {
            self.acquire_write(keys, token, ttl, grace).await
        } else {
            self.acquire_read(keys, token, secs).await
        }
    }

    async fn release_rw(&self, keys: &LockKeys, token: &Token) -> Result<bool> {
        let released = if self.release(keys, token).await? {
            true
        } else {
            self.release_item(&reader_key(keys.lock(), token.as_str()), token)
                .await?
        };
        self.unlist_rw(keys, token.as_str()).await?;
        Ok(released)
    }

    /// The writer renews the plain lock's item (readers check that item itself, not the
    /// index). A reader renews its lease item only while the index still lists it as a
    /// reader: one the index no longer lists (the index was evicted, flushed or deleted,
    /// and maybe started again by a writer's grant) loses its hold (its lease item is
    /// deleted) rather than read beside a writer granted since.
    async fn extend_rw(&self, keys: &LockKeys, token: &Token, ttl: Duration) -> Result<bool> {
        let secs = expiry_seconds(ttl)?;
        if self.extend(keys, token, ttl).await? {
            return Ok(true);
        }
        let me = reader_key(keys.lock(), token.as_str());
        let listed = match self.get(&index_key(keys.lock())).await? {
            Some((value, _, _)) => Index::decode(&value)?
                .readers
                .iter()
                .any(|t| t == token.as_str()),
            None => false,
        };
        if !listed {
            self.release_item(&me, token).await?;
            return Ok(false);
        }
        self.extend_item(&me, token, secs).await
    }

    async fn downgrade_rw(&self, keys: &LockKeys, token: &Token, ttl: Duration) -> Result<bool> {
        let secs = expiry_seconds(ttl)?;
        let me = reader_key(keys.lock(), token.as_str());
        for _ in 0..CAS_ROUNDS {
            let seen = self.see_rw(keys).await?;
            if !seen.holds_write(token.as_str()) {
                return Ok(false);
            }
            // The reader's lease first, then the index (no writer, us a reader), then the
            // writer's item goes: a writer waits on the item, then on our read lease.
            self.set_item(&me, token, secs).await?;
            let mut next = seen.live();
            next.writer = None;
            next.readers.push(token.as_str().to_owned());
            if self.write_rw(keys, &next, seen.cas()).await? {
                self.release(keys, token).await?;
                return Ok(true);
            }
        }
        Err(items::contended(WHAT))
    }

    async fn abandon_rw(&self, keys: &LockKeys, token: &Token) -> Result<()> {
        self.delete_item(&claim_key(keys.lock(), token.as_str()))
            .await?;
        self.unlist_rw(keys, token.as_str()).await
    }
}

/// RwLock kind's inspection, for [`RawInspect`](crate::raw::RawInspect).
impl Memcached {
    pub(crate) async fn inspect_rw(&self, keys: &LockKeys) -> Result<LockState> {
        let mut state = self.inspect_plain(keys).await?;
        let seen = self.see_rw(keys).await?;
        let live = seen.live();
        state.holders = Some(u32::try_from(live.readers.len()).unwrap_or(u32::MAX));
        state.queued = Some(u32::try_from(live.waiting.len()).unwrap_or(u32::MAX));
        if state.holder.is_none() && !live.readers.is_empty() {
            state.remaining = seen
                .readers
                .iter()
                .flatten()
                .max()
                .map(|s| Duration::from_secs(*s));
        }
        Ok(state)
    }

    pub(crate) async fn force_unlock_rw(&self, keys: &LockKeys) -> Result<bool> {
        let seen = self.see_rw(keys).await?;
        let live = seen.live();
        let any = seen.writer.is_some() || !live.readers.is_empty();
        let index = seen.index();
        let mut request = format!("md {}\r\n", memcached_key(keys.lock()));
        for t in &index.readers {
            request.push_str(&format!("md {}\r\n", reader_key(keys.lock(), t)));
        }
        for t in &index.waiting {
            request.push_str(&format!("md {}\r\n", claim_key(keys.lock(), t)));
        }
        let n = 1 + index.readers.len() + index.waiting.len();
        self.call(request.into_bytes(), n).await?;
        self.delete_item(&index_key(keys.lock())).await?;
        Ok(any)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(crate::backend::hostile::cases(128))]

        #[test]
        fn indexes_round_trip(
            writer in proptest::option::of(any::<String>()),
            readers in prop::collection::vec(any::<String>(), 0..4),
            waiting in prop::collection::vec(any::<String>(), 0..3),
        ) {
            let index = Index { writer, readers, waiting };
            let decoded = Index::decode(index.encode().as_bytes())
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(decoded, index);
        }

        #[test]
        fn any_bytes_decode_or_are_refused(bytes in prop::collection::vec(any::<u8>(), 0..64)) {
            let _ = Index::decode(&bytes);
        }
    }
}
