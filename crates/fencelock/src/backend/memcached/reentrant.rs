//! The reentrant lock on memcached: one item, changed only by CAS.
//!
//! The lock item (the mapped key, its expiry the lease) holds the first grant's fence,
//! the lease in seconds, the owner and one token per hold. A first grant is the plain
//! lock's `add` with the fence minted behind it (so fences keep the plain lock's order
//! guarantee), then the fence written into the item under the CAS the add left; every
//! later change — one more hold of the same owner, a hold given back, a renewal — is a
//! CAS-checked set of the whole item that renews its expiry by the stored lease (never
//! shortens it), and the last hold deletes it by CAS. Another owner's attempt finds the
//! item and waits (polling: memcached has no notifications).

use std::time::Duration;

use super::items::{self, CAS_ROUNDS};
use super::{Memcached, expiry_seconds, fence_key, memcached_key, unexpected};
use crate::error::{Error, ErrorKind, Result};
use crate::keys::LockKeys;
use crate::raw::{Acquire, LockState, RawReentrant};
use crate::token::Token;

/// What the lock item holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Holds {
    pub(super) fence: u64,
    pub(super) secs: u64,
    pub(super) owner: String,
    pub(super) tokens: Vec<String>,
}

/// What the item is, for errors.
const WHAT: &str = "a reentrant lock's item";

impl Holds {
    /// `F` with the fence, `S` with the lease's seconds, `O` with the owner, then a `T`
    /// entry per hold.
    pub(super) fn encode(&self) -> String {
        let (fence, secs) = (self.fence.to_string(), self.secs.to_string());
        items::encode(
            [("F", fence.as_str()), ("S", &secs), ("O", &self.owner)]
                .into_iter()
                .chain(self.tokens.iter().map(|t| ("T", t.as_str()))),
        )
    }

    /// What [`encode`](Self::encode) wrote; anything else is a `Backend` error.
    pub(super) fn decode(bytes: &[u8]) -> Result<Holds> {
        let corrupt = || items::corrupt(WHAT);
        let mut entries = items::decode(bytes, WHAT)?.into_iter();
        let mut head = |tag: &str| match entries.next() {
            Some((t, text)) if t == tag => Ok(text),
            _ => Err(corrupt()),
        };
        let fence: u64 = head("F")?.parse().map_err(|_| corrupt())?;
        let secs: u64 = head("S")?.parse().map_err(|_| corrupt())?;
        let owner = head("O")?;
        if expiry_seconds(std::time::Duration::from_secs(secs)).is_err() {
            return Err(corrupt());
        }
        let tokens = entries
            .map(|(tag, token)| {
                if tag == "T" {
                    Ok(token)
                } else {
                    Err(corrupt())
                }
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Holds {
            fence,
            secs,
            owner,
            tokens,
        })
    }
}

impl Memcached {
    /// `ms` of `holds` at `key` under `cas`, renewing its expiry by its lease; whether it
    /// was written (`false`: changed or gone meanwhile).
    async fn write_holds(&self, key: &str, holds: &Holds, cas: &str) -> Result<bool> {
        let value = holds.encode();
        let reply = self
            .one(
                format!(
                    "ms {key} {} T{} C{cas}\r\n{value}\r\n",
                    value.len(),
                    holds.secs
                )
                .into_bytes(),
            )
            .await?;
        match reply.code.as_str() {
            "HD" => Ok(true),
            "EX" | "NS" | "NF" => Ok(false),
            other => Err(unexpected("ms (reentrant)", other)),
        }
    }

    /// The item, decoded, with its CAS and remaining seconds.
    async fn holds(&self, key: &str) -> Result<Option<(Holds, String, Option<i64>)>> {
        match self.get(key).await? {
            Some((value, cas, ttl)) => Ok(Some((Holds::decode(&value)?, cas, ttl))),
            None => Ok(None),
        }
    }

    /// A first grant: add the item, mint a fence behind it, and write the fence in.
    async fn first_hold(
        &self,
        keys: &LockKeys,
        owner: &str,
        token: &Token,
        secs: u64,
    ) -> Result<Option<u64>> {
        let key = memcached_key(keys.lock());
        let mut holds = Holds {
            fence: 0,
            secs,
            owner: owner.to_owned(),
            tokens: vec![token.as_str().to_owned()],
        };
        let value = holds.encode();
        let request = format!(
            "ms {key} {} T{secs} ME\r\n{value}\r\nma {} N0 J1 v\r\nmg {key} v c\r\n",
            value.len(),
            fence_key(keys.lock())
        );
        let replies = self.call(request.into_bytes(), 3).await?;
        let [added, minted, now] = <[super::Reply; 3]>::try_from(replies)
            .map_err(|_| unexpected("acquire", "too few replies"))?;
        if added.code != "HD" {
            return Ok(None);
        }
        // Still ours when the fence was minted: no later grant can carry a smaller one.
        let Some((current, cas, _)) = super::get_reply(now)? else {
            return Ok(None);
        };
        if current != value.as_bytes() {
            return Ok(None);
        }
        holds.fence = minted
            .data
            .as_deref()
            .and_then(|d| std::str::from_utf8(d).ok())
            .and_then(|d| d.trim().parse::<u64>().ok())
            .ok_or_else(|| unexpected("ma", &minted.code))?;
        Ok(self
            .write_holds(&key, &holds, &cas)
            .await?
            .then_some(holds.fence))
    }
}

/// The reentrant lock on memcached: one item changed by CAS (see the
/// [lock family on memcached](crate::backend::memcached#the-lock-family-on-memcached)). Waiters poll.
impl RawReentrant for Memcached {
    async fn acquire_reentrant(
        &self,
        keys: &LockKeys,
        owner: &str,
        token: &Token,
        ttl: Duration,
        limit: u32,
        _queue: bool,
    ) -> Result<Acquire> {
        let secs = expiry_seconds(ttl)?;
        let key = memcached_key(keys.lock());
        for _ in 0..CAS_ROUNDS {
            let Some((mut holds, cas, remaining)) = self.holds(&key).await? else {
                match self.first_hold(keys, owner, token, secs).await? {
                    Some(fence) => return Ok(Acquire::Acquired { fence }),
                    None => continue,
                }
            };
            if holds.owner != owner {
                return Ok(Acquire::Held {
                    remaining: remaining
                        .and_then(|t| u64::try_from(t).ok())
                        .map(Duration::from_secs),
                });
            }
            if !holds.tokens.iter().any(|t| t == token.as_str()) {
                if holds.tokens.len() >= limit as usize {
                    return Err(Error::new(
                        ErrorKind::LimitReached,
                        format!(
                            "reentrant lock {:?}: {owner} already holds it {limit} times, \
                             its reentrancy limit",
                            keys.name()
                        ),
                    ));
                }
                holds.tokens.push(token.as_str().to_owned());
            }
            holds.secs = holds.secs.max(secs);
            if self.write_holds(&key, &holds, &cas).await? {
                return Ok(Acquire::Acquired { fence: holds.fence });
            }
        }
        Ok(Acquire::Held { remaining: None })
    }

    async fn release_reentrant(&self, keys: &LockKeys, owner: &str, token: &Token) -> Result<bool> {
        let key = memcached_key(keys.lock());
        for _ in 0..CAS_ROUNDS {
            let Some((mut holds, cas, _)) = self.holds(&key).await? else {
                return Ok(false);
            };
            let before = holds.tokens.len();
            holds.tokens.retain(|t| t != token.as_str());
            if holds.owner != owner || holds.tokens.len() == before {
                return Ok(false);
            }
            let done = if holds.tokens.is_empty() {
                let reply = self
                    .one(format!("md {key} C{cas}\r\n").into_bytes())
                    .await?;
                match reply.code.as_str() {
                    "HD" => true,
                    "EX" | "NF" => false,
                    other => return Err(unexpected("md", other)),
                }
            } else {
                self.write_holds(&key, &holds, &cas).await?
            };
            if done {
                return Ok(true);
            }
        }
        Err(items::contended(WHAT))
    }

    async fn extend_reentrant(
        &self,
        keys: &LockKeys,
        token: &Token,
        ttl: Duration,
    ) -> Result<bool> {
        let secs = expiry_seconds(ttl)?;
        let key = memcached_key(keys.lock());
        for _ in 0..CAS_ROUNDS {
            let Some((mut holds, cas, _)) = self.holds(&key).await? else {
                return Ok(false);
            };
            if !holds.tokens.iter().any(|t| t == token.as_str()) {
                return Ok(false);
            }
            holds.secs = holds.secs.max(secs);
            if self.write_holds(&key, &holds, &cas).await? {
                return Ok(true);
            }
        }
        Err(items::contended(WHAT))
    }
}

/// Reentrant kind's inspection, for [`RawInspect`](crate::raw::RawInspect).
impl Memcached {
    pub(crate) async fn inspect_reentrant(&self, keys: &LockKeys) -> Result<LockState> {
        let fence = self
            .get(&fence_key(keys.lock()))
            .await?
            .and_then(|(v, _, _)| String::from_utf8(v).ok())
            .and_then(|v| v.trim().parse().ok());
        Ok(match self.holds(&memcached_key(keys.lock())).await? {
            Some((holds, _, ttl)) => LockState::new(
                Some(holds.owner.clone()),
                ttl.and_then(|t| u64::try_from(t).ok())
                    .map(Duration::from_secs),
                fence,
            )
            .with_hold_count(u32::try_from(holds.tokens.len()).unwrap_or(u32::MAX)),
            None => LockState::new(None, None, fence),
        })
    }

    pub(crate) async fn force_unlock_reentrant(&self, keys: &LockKeys) -> Result<bool> {
        self.delete_item(&memcached_key(keys.lock())).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(crate::backend::hostile::cases(128))]

        #[test]
        fn holds_round_trip(
            fence in any::<u64>(),
            secs in 2..1000u64,
            owner in any::<String>(),
            tokens in prop::collection::vec(any::<String>(), 0..4),
        ) {
            let holds = Holds { fence, secs, owner, tokens };
            let decoded = Holds::decode(holds.encode().as_bytes())
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(decoded, holds);
        }

        #[test]
        fn any_bytes_decode_or_are_refused(bytes in prop::collection::vec(any::<u8>(), 0..64)) {
            let _ = Holds::decode(&bytes);
        }
    }
}
