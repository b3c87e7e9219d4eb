//! The fair lock on memcached: the plain lock's item, and a line of waiters by CAS.
//!
//! The holder is the plain lock's item (`add`, a fence per grant, CAS release and
//! renewal), so exclusion is the plain lock's. The line is one item (`<mapped key>~queue`,
//! no expiry) listing the waiters' tokens in arrival order, changed only by CAS; each
//! waiter also keeps a claim item of its own (`…~w`) whose expiry — the holder's remaining
//! ttl plus the waiter grace — every attempt renews. A waiter whose claim item is gone
//! (it crashed, or was cancelled) is out of the line; the next waiter to join drops it.
//! Only the first live waiter tries the plain `add` when the lock is free, so grants go
//! in arrival order; two waiters that disagree about who is first (a claim that lapsed
//! while its waiter stalled) still cannot both hold the lock, since the `add` decides.
//!
//! Waiters poll (memcached has no notifications): a hand-off waits for the next waiter's
//! next attempt.

use std::time::Duration;

use super::items::{self, CAS_ROUNDS};
use super::{Memcached, expiry_seconds, get_reply, lease_key, memcached_key, unexpected};
use crate::error::Result;
use crate::keys::LockKeys;
use crate::raw::{Acquire, LockState, RawFair, RawLock};
use crate::token::Token;

/// The line's item: the lock's mapped key plus `~queue`.
pub(super) fn queue_key(lock: &str) -> String {
    format!("{}~queue", memcached_key(lock))
}

/// A waiter's claim item.
pub(super) fn claim_key(lock: &str, token: &str) -> String {
    lease_key(lock, token, 'w')
}

/// What the line is, for errors.
const WHAT: &str = "a fair lock's line";

/// A `W` entry per waiter, in arrival order.
pub(super) fn encode(tokens: &[String]) -> String {
    items::encode(tokens.iter().map(|t| ("W", t)))
}

/// What [`encode`] wrote; anything else is a `Backend` error.
pub(super) fn decode(bytes: &[u8]) -> Result<Vec<String>> {
    items::decode(bytes, WHAT)?
        .into_iter()
        .map(|(tag, token)| {
            if tag == "W" {
                Ok(token)
            } else {
                Err(items::corrupt(WHAT))
            }
        })
        .collect()
}

/// The holder and the line as one attempt saw them.
struct Seen {
    /// The holder's token and remaining seconds, if held.
    holder: Option<(Vec<u8>, Option<u64>)>,
    /// The line's waiters with whether each one's claim is alive, and the line's CAS.
    line: Option<(Vec<(String, bool)>, String)>,
}

impl Seen {
    fn live(&self) -> impl Iterator<Item = &str> {
        self.line
            .iter()
            .flat_map(|(line, _)| line.iter())
            .filter(|(_, alive)| *alive)
            .map(|(t, _)| t.as_str())
    }

    fn listed(&self, token: &str) -> bool {
        self.line
            .as_ref()
            .is_some_and(|(line, _)| line.iter().any(|(t, _)| t == token))
    }

    fn remaining(&self) -> Option<Duration> {
        self.holder
            .as_ref()
            .and_then(|(_, t)| *t)
            .map(Duration::from_secs)
    }
}

impl Memcached {
    /// The holder and the line in one round trip, then the listed claims in another.
    async fn see_line(&self, keys: &LockKeys) -> Result<Seen> {
        let lock = memcached_key(keys.lock());
        let request = format!("mg {lock} v t\r\nmg {} v c\r\n", queue_key(keys.lock()));
        let replies = self.call(request.into_bytes(), 2).await?;
        let [held, queued] = <[super::Reply; 2]>::try_from(replies)
            .map_err(|_| unexpected("mg", "too few replies"))?;
        let holder = get_reply(held)?.map(|(v, _, t)| (v, t.and_then(|t| u64::try_from(t).ok())));
        let Some((value, cas, _)) = get_reply(queued)? else {
            return Ok(Seen { holder, line: None });
        };
        let tokens = decode(&value)?;
        let claims: Vec<(String, &str)> = tokens
            .iter()
            .map(|t| (claim_key(keys.lock(), t), t.as_str()))
            .collect();
        let alive = self.alive(&claims).await?;
        let line = tokens
            .into_iter()
            .zip(alive)
            .map(|(t, alive)| (t, alive.is_some()))
            .collect();
        Ok(Seen {
            holder,
            line: Some((line, cas)),
        })
    }

    /// Writes the line's live waiters plus `join` (if any) under the CAS `seen` read.
    async fn write_line(&self, keys: &LockKeys, seen: &Seen, join: Option<&str>) -> Result<bool> {
        let mut tokens: Vec<String> = seen.live().map(str::to_owned).collect();
        tokens.extend(join.map(str::to_owned));
        let cas = seen.line.as_ref().map(|(_, cas)| cas.as_str());
        self.write_cas(&queue_key(keys.lock()), &encode(&tokens), cas)
            .await
    }

    /// Takes `token` out of the line: its claim item goes (so nobody counts it), then the
    /// line is rewritten without it where the CAS allows (else the next joiner drops it).
    async fn leave_line(&self, keys: &LockKeys, token: &Token) -> Result<()> {
        self.delete_item(&claim_key(keys.lock(), token.as_str()))
            .await?;
        for _ in 0..3 {
            let seen = self.see_line(keys).await?;
            if !seen.listed(token.as_str()) || self.write_line(keys, &seen, None).await? {
                break;
            }
        }
        Ok(())
    }
}

/// The fair lock on memcached (see [the lock family on memcached](crate::backend::memcached#the-lock-family-on-memcached)): the plain lock's item, a
/// line of waiters changed by CAS, a claim item per waiter. Waiters poll.
impl RawFair for Memcached {
    async fn acquire_fair(
        &self,
        keys: &LockKeys,
        token: &Token,
        ttl: Duration,
        grace: Duration,
    ) -> Result<Acquire> {
        expiry_seconds(ttl)?;
        for _ in 0..CAS_ROUNDS {
            let seen = self.see_line(keys).await?;
            if seen
                .holder
                .as_ref()
                .is_some_and(|(v, _)| v == token.as_str().as_bytes())
            {
                // A repeat of a granted attempt: the plain lock renews and reports it.
                return self.acquire(keys, token, ttl).await;
            }
            // The claim outlives the next attempt: at most the holder's remaining ttl
            // (whole seconds, rounded down: one more) away, plus the grace.
            let until_next = seen.remaining().unwrap_or_default() + Duration::from_secs(1);
            let secs = expiry_seconds((until_next + grace).max(super::MIN_TTL))?;
            self.set_item(&claim_key(keys.lock(), token.as_str()), token, secs)
                .await?;
            if !seen.listed(token.as_str()) {
                if !self.write_line(keys, &seen, Some(token.as_str())).await? {
                    continue;
                }
                if seen.live().next().is_some() {
                    return Ok(Acquire::Held {
                        remaining: seen.remaining(),
                    });
                }
            } else if seen.live().next() != Some(token.as_str()) {
                return Ok(Acquire::Held {
                    remaining: seen.remaining(),
                });
            }
            if seen.holder.is_some() {
                return Ok(Acquire::Held {
                    remaining: seen.remaining(),
                });
            }
            // First in line and the lock free: the plain lock's add decides.
            let attempt = self.acquire(keys, token, ttl).await?;
            if matches!(attempt, Acquire::Acquired { .. }) {
                self.leave_line(keys, token).await?;
            }
            return Ok(attempt);
        }
        Ok(Acquire::Held { remaining: None })
    }

    async fn release_fair(&self, keys: &LockKeys, token: &Token) -> Result<bool> {
        self.release(keys, token).await
    }

    async fn abandon_fair(&self, keys: &LockKeys, token: &Token) -> Result<()> {
        self.leave_line(keys, token).await
    }
}

/// Fair kind's inspection, for [`RawInspect`](crate::raw::RawInspect).
impl Memcached {
    pub(crate) async fn inspect_fair(&self, keys: &LockKeys) -> Result<LockState> {
        let mut state = self.inspect_plain(keys).await?;
        let seen = self.see_line(keys).await?;
        state.queued = Some(u32::try_from(seen.live().count()).unwrap_or(u32::MAX));
        Ok(state)
    }

    pub(crate) async fn force_unlock_fair(&self, keys: &LockKeys) -> Result<bool> {
        self.force_unlock_plain(keys).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(crate::backend::hostile::cases(128))]

        #[test]
        fn lines_round_trip(tokens in prop::collection::vec(any::<String>(), 0..5)) {
            let decoded = decode(encode(&tokens).as_bytes())
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(decoded, tokens);
        }

        #[test]
        fn any_bytes_decode_or_are_refused(bytes in prop::collection::vec(any::<u8>(), 0..64)) {
            let _ = decode(&bytes);
        }
    }
}
