//! The semaphore on memcached: CAS on one index item, a lease item per holder.
//!
//! Memcached has no scripts, no notifications and no way to list keys; it has `add`
//! (store if absent), expiry on its own clock, and CAS (compare-and-set on an item's
//! version). A semaphore fits in those:
//!
//! * **A lease item per holder** (`<head>~<SHA-1 of name and token>~h`, value the token,
//!   expiry the lease): memcached's clock ends a crashed holder's permits, no client clock
//!   is trusted. Extend and release are the plain lock's CAS-checked set and delete on it.
//! * **One index item** (the semaphore's mapped key, no expiry): the stored permit count
//!   and the holders that were granted (`permits token`). Every grant is a CAS on it, so
//!   grants are serialised: an attempt reads the index, reads the listed holders' lease
//!   items (one pipelined round trip), counts the permits of those still alive, and if
//!   `n` more fit, adds its own lease item and then writes the index with itself added —
//!   under the CAS it read. If another grant (or a count change) came between, the CAS
//!   fails, the attempt deletes its lease item and starts again. A holder whose lease item
//!   is gone is dropped from the index by the next grant.
//!
//! So at most the stored count of permits is granted at once, for as long as the index
//! item lives: like the fence counter, it is lost to a restart, `flush_all` or an LRU
//! eviction (run memcached with `-M`; `dlock` refuses an evicting one). A lease item
//! counts only while it is listed, and it is listed only after it was added, so an attempt
//! that dies half-way leaves nothing that counts.
//!
//! **A lost index** (evicted, flushed or deleted while holders hold): the next attempt
//! finds none and starts a new one, without the holders. A holder renews its lease only
//! while the index lists it, so each of them loses its permits at its next renewal
//! (`lost()` fires, its lease item is deleted); until then — at most a third of the ttl,
//! the watchdog's interval — the permits granted since may be held beside theirs, as a
//! plain lock's evicted key may (see [fences](crate::backend::memcached#fences)).
//!
//! Waiters poll (jittered backoff, and the earliest holder's remaining ttl): there is no
//! queue, so the semaphore is not fair, and permits carry no fence (as on every store).

use std::time::Duration;

use super::items::{self, CAS_ROUNDS};
use super::{Memcached, expiry_seconds, memcached_key, unexpected};
use crate::error::{Error, Result};
use crate::keys::LockKeys;
use crate::raw::{Acquire, LockState, RawSemaphore};
use crate::token::Token;

/// The index: the stored permit count and the granted holders, `(permits, token)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Index {
    pub(super) count: u32,
    pub(super) holders: Vec<(u32, String)>,
}

/// What the index is, for errors.
const WHAT: &str = "a semaphore's index";

impl Index {
    /// `N` with the count, then an entry per holder tagged with its permits.
    pub(super) fn encode(&self) -> String {
        let count = self.count.to_string();
        items::encode(
            std::iter::once(("N".to_owned(), count.as_str())).chain(
                self.holders
                    .iter()
                    .map(|(n, token)| (n.to_string(), token.as_str())),
            ),
        )
    }

    /// The index written by [`encode`](Self::encode); anything else is a `Backend` error.
    pub(super) fn decode(bytes: &[u8]) -> Result<Index> {
        let mut entries = items::decode(bytes, WHAT)?.into_iter();
        let count = match entries.next() {
            Some((tag, count)) if tag == "N" => count.parse::<u32>().ok(),
            _ => None,
        }
        .filter(|c| (1..=crate::MAX_PERMITS).contains(c))
        .ok_or_else(|| items::corrupt(WHAT))?;
        let holders = entries
            .map(|(n, token)| match n.parse::<u32>() {
                Ok(n) if n > 0 => Ok((n, token)),
                _ => Err(items::corrupt(WHAT)),
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Index { count, holders })
    }
}

/// The lease item of `token`'s permits of the semaphore at `lock`.
pub(super) fn holder_key(lock: &str, token: &str) -> String {
    super::lease_key(lock, token, 'h')
}

/// What an attempt read: the index (with its CAS, `None` if absent) and, per listed
/// holder, its lease item's remaining seconds if it is alive under its token.
struct Read {
    index: Option<(Index, String)>,
    alive: Vec<Option<u64>>,
}

impl Read {
    /// Permits held by live holders.
    fn used(&self) -> u32 {
        let Some((index, _)) = &self.index else {
            return 0;
        };
        index
            .holders
            .iter()
            .zip(&self.alive)
            .filter(|(_, alive)| alive.is_some())
            .map(|((n, _), _)| *n)
            .sum()
    }

    /// The live holders, as an index under `count` would list them.
    fn live(&self, count: u32) -> Index {
        let holders = match &self.index {
            Some((index, _)) => index
                .holders
                .iter()
                .zip(&self.alive)
                .filter(|(_, alive)| alive.is_some())
                .map(|(h, _)| h.clone())
                .collect(),
            None => Vec::new(),
        };
        Index { count, holders }
    }

    fn position(&self, token: &str) -> Option<usize> {
        let (index, _) = self.index.as_ref()?;
        index
            .holders
            .iter()
            .zip(&self.alive)
            .position(|((_, t), alive)| t == token && alive.is_some())
    }

    /// The earliest end of a live lease.
    fn earliest(&self) -> Option<Duration> {
        self.alive
            .iter()
            .flatten()
            .min()
            .map(|s| Duration::from_secs(*s))
    }
}

impl Memcached {
    /// Reads the index and every listed holder's lease item, in two round trips.
    async fn read_semaphore(&self, keys: &LockKeys) -> Result<Read> {
        let Some((value, cas, _)) = self.get(&memcached_key(keys.lock())).await? else {
            return Ok(Read {
                index: None,
                alive: Vec::new(),
            });
        };
        let index = Index::decode(&value)?;
        let listed: Vec<(String, &str)> = index
            .holders
            .iter()
            .map(|(_, token)| (holder_key(keys.lock(), token), token.as_str()))
            .collect();
        let alive = self.alive(&listed).await?;
        Ok(Read {
            index: Some((index, cas)),
            alive,
        })
    }

    /// Writes `index` if the index item is still at `cas` (`None`: still absent). Returns
    /// whether it was written.
    async fn write_index(&self, keys: &LockKeys, index: &Index, cas: Option<&str>) -> Result<bool> {
        self.write_cas(&memcached_key(keys.lock()), &index.encode(), cas)
            .await
    }

    /// Changes the stored count by `change` (given the current one, or `None` if none is
    /// stored): CAS rounds on the index. `change` returns `None` to leave it as it is.
    async fn change_count(
        &self,
        keys: &LockKeys,
        change: impl Fn(Option<u32>) -> Option<u32>,
    ) -> Result<Option<u32>> {
        for _ in 0..CAS_ROUNDS {
            let read = self.read_semaphore(keys).await?;
            let current = read.index.as_ref().map(|(i, _)| i.count);
            let Some(count) = change(current) else {
                return Ok(None);
            };
            let index = read.live(count);
            let cas = read.index.as_ref().map(|(_, cas)| cas.as_str());
            if self.write_index(keys, &index, cas).await? {
                return Ok(Some(count));
            }
        }
        Err(items::contended(WHAT))
    }
}

/// Permits on memcached, by CAS on one index item with a lease item per holder (see the
/// [lock family on memcached](crate::backend::memcached#the-lock-family-on-memcached)): at most the stored count granted at once, a crashed holder's
/// permits back at its lease's end by memcached's clock. No queue: waiters poll, and the
/// first to try after a release gets the permit.
impl RawSemaphore for Memcached {
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
        let secs = expiry_seconds(ttl)?;
        let me = holder_key(keys.lock(), token.as_str());
        for _ in 0..CAS_ROUNDS {
            let read = self.read_semaphore(keys).await?;
            let count = read.index.as_ref().map_or(permits, |(i, _)| i.count);
            if strict && count != permits {
                return Err(Error::permits_mismatch(keys.name(), count, permits));
            }
            if n > count {
                return Err(Error::invalid(format!(
                    "{n} permits asked of semaphore {:?}, which has {count}",
                    keys.name()
                )));
            }
            if read.position(token.as_str()).is_some() {
                // A repeat of a granted attempt: renew the lease and report it again.
                return Ok(if self.extend_item(&me, token, secs).await? {
                    Acquire::Acquired { fence: 0 }
                } else {
                    Acquire::Held { remaining: None }
                });
            }
            if read.used() + n > count {
                return Ok(Acquire::Held {
                    remaining: read.earliest(),
                });
            }
            let value = token.as_str();
            let added = self
                .one(format!("ms {me} {} T{secs} ME\r\n{value}\r\n", value.len()).into_bytes())
                .await?;
            if added.code != "HD" {
                if added.code != "NS" {
                    return Err(unexpected("ms (add)", &added.code));
                }
                // Our lease item exists already: an earlier attempt of ours that was not
                // listed. Take it over with the new expiry before listing it.
                if !self.extend_item(&me, token, secs).await? {
                    continue;
                }
            }
            let mut index = read.live(count);
            index.holders.push((n, value.to_owned()));
            let cas = read.index.as_ref().map(|(_, cas)| cas.as_str());
            if self.write_index(keys, &index, cas).await? {
                return Ok(Acquire::Acquired { fence: 0 });
            }
            // Another grant or count change came first: ours is not listed, so it counts
            // for nobody; delete it and look again.
            self.release_item(&me, token).await?;
        }
        Ok(Acquire::Held { remaining: None })
    }

    async fn release_permits(&self, keys: &LockKeys, token: &Token) -> Result<bool> {
        let released = self
            .release_item(&holder_key(keys.lock(), token.as_str()), token)
            .await?;
        // Unlist it (best effort: the next grant drops a holder whose lease item is gone).
        for _ in 0..3 {
            let Some((value, cas, _)) = self.get(&memcached_key(keys.lock())).await? else {
                break;
            };
            let mut index = Index::decode(&value)?;
            let before = index.holders.len();
            index.holders.retain(|(_, t)| t != token.as_str());
            if index.holders.len() == before || self.write_index(keys, &index, Some(&cas)).await? {
                break;
            }
        }
        Ok(released)
    }

    /// Renews the holder's lease item only while the index still lists the holder: one
    /// the index no longer lists (the index was evicted, flushed or deleted, and maybe
    /// started again by a later grant) counts against no permit, so it loses its permits
    /// (its lease item is deleted) rather than hold beside the permits granted since.
    async fn extend_permits(&self, keys: &LockKeys, token: &Token, ttl: Duration) -> Result<bool> {
        let secs = expiry_seconds(ttl)?;
        let me = holder_key(keys.lock(), token.as_str());
        let listed = match self.get(&memcached_key(keys.lock())).await? {
            Some((value, _, _)) => Index::decode(&value)?
                .holders
                .iter()
                .any(|(_, t)| t == token.as_str()),
            None => false,
        };
        if !listed {
            self.release_item(&me, token).await?;
            return Ok(false);
        }
        self.extend_item(&me, token, secs).await
    }

    async fn permits_in_use(&self, keys: &LockKeys, permits: u32) -> Result<(u32, u32)> {
        let read = self.read_semaphore(keys).await?;
        let count = read.index.as_ref().map_or(permits, |(i, _)| i.count);
        Ok((read.used(), count))
    }

    async fn set_permits(&self, keys: &LockKeys, permits: u32) -> Result<()> {
        self.change_count(keys, |_| Some(permits)).await.map(|_| ())
    }

    async fn add_permits(
        &self,
        keys: &LockKeys,
        delta: i64,
        permits: u32,
        max: u32,
    ) -> Result<Option<u32>> {
        self.change_count(keys, |current| {
            crate::raw::added_permits(current.unwrap_or(permits), delta, max)
        })
        .await
    }
}

/// Semaphore kind's inspection, for [`RawInspect`](crate::raw::RawInspect).
impl Memcached {
    pub(crate) async fn inspect_permits(&self, keys: &LockKeys) -> Result<LockState> {
        let read = self.read_semaphore(keys).await?;
        let live = read.alive.iter().flatten().count();
        let latest = read
            .alive
            .iter()
            .flatten()
            .max()
            .map(|s| Duration::from_secs(*s));
        let holder = read.index.as_ref().and_then(|(index, _)| {
            index
                .holders
                .iter()
                .zip(&read.alive)
                .rev()
                .find(|(_, alive)| alive.is_some())
                .map(|((_, t), _)| t.clone())
        });
        let mut state = LockState::new(holder, latest, None);
        state.hold_count = Some(read.used());
        state.holders = Some(u32::try_from(live).unwrap_or(u32::MAX));
        Ok(state)
    }

    pub(crate) async fn force_unlock_permits(&self, keys: &LockKeys) -> Result<bool> {
        let read = self.read_semaphore(keys).await?;
        let Some((index, _)) = &read.index else {
            return Ok(false);
        };
        let mut any = false;
        for ((_, token), alive) in index.holders.iter().zip(&read.alive) {
            let deleted = self.delete_item(&holder_key(keys.lock(), token)).await?;
            any |= alive.is_some() && deleted;
        }
        // The count stays; the holders go.
        self.change_count(keys, |current| current).await?;
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
            count in 1..=crate::MAX_PERMITS,
            holders in prop::collection::vec((1..1000u32, any::<String>()), 0..5),
        ) {
            let index = Index { count, holders };
            let decoded = Index::decode(index.encode().as_bytes())
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(decoded, index);
        }

        #[test]
        fn any_bytes_decode_or_are_refused(bytes in prop::collection::vec(any::<u8>(), 0..64)) {
            let _ = Index::decode(&bytes);
        }

        #[test]
        fn holder_keys_fit_and_are_nobody_elses(lock in ".{1,300}", token in ".{1,80}") {
            let key = holder_key(&lock, &token);
            prop_assert!(key.len() <= super::super::MAX_KEY_LEN);
            prop_assert!(key.bytes().all(|b| b.is_ascii_graphic()));
            prop_assert!(key.ends_with("~h"));
            prop_assert_ne!(&key, &memcached_key(&lock));
            prop_assert_ne!(key, super::super::lease_key(&lock, &token, 'w'));
        }
    }

    #[test]
    fn a_token_with_separators_stays_one_holder() {
        let index = Index {
            count: 3,
            holders: vec![(1, "a b\n2 5 c".to_owned()), (2, String::new())],
        };
        assert_eq!(
            Index::decode(index.encode().as_bytes()).expect("decodes"),
            index
        );
        assert!(Index::decode(b"0\n").is_err());
        assert!(Index::decode(b"2\n1 99 x\n").is_err());
    }
}
