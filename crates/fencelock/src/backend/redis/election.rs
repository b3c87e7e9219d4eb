//! Leader election on Redis: the plain lock, plus the leader's record in a hash under the
//! lock's hash tag (`<base>:leader`, fields `term` and `data`, no expiry), written by one
//! script that checks the caller holds the lock and announces the write on the record's
//! channel.

use super::{Redis, map_err};
use crate::error::{Error, ErrorKind, Result};
use crate::keys::LockKeys;
use crate::raw::{RECORD, RawElection};
use crate::token::Token;

/// The key of an election's record.
pub(super) fn record(keys: &LockKeys) -> String {
    keys.companion(RECORD)
}

/// The record is a hash (`term`, `data`) that never expires. [`publish`] is one script
/// (`lua/elect_publish.lua`): it checks that the lock key holds the caller's token, writes,
/// and announces the write on the record's channel as a release is
/// announced (`PUBLISH`, or `SPUBLISH` on a Redis Cluster), so that the default
/// [`watch_record`](RawElection::watch_record) wakes. [`record`] is one `HMGET`.
///
/// The write is not followed by `WAIT` (even with
/// [`min_replicas`](super::RedisBuilder::min_replicas)): the record is what the leader
/// advertises, not what makes it the leader. A failover that loses it leaves the lock's
/// holder without a matching record, which readers then report as a leader without a
/// value, never as someone else's.
///
/// [`publish`]: RawElection::publish
/// [`record`]: RawElection::record
impl RawElection for Redis {
    async fn publish(&self, keys: &LockKeys, token: &Token, term: u64, data: &str) -> Result<bool> {
        let side = keys.side(RECORD);
        let written: i64 = self
            .eval(
                &self.inner.scripts.elect_publish,
                &[keys.lock(), &record(keys)],
                &[
                    &token.as_str(),
                    &term,
                    &data,
                    &side.channel(),
                    &self.publish_cmd(),
                ],
                "publishing the election record",
            )
            .await?;
        Ok(written == 1)
    }

    async fn record(&self, keys: &LockKeys) -> Result<Option<(u64, String)>> {
        let key = record(keys);
        let (term, data): (Option<String>, Option<String>) = redis::cmd("HMGET")
            .arg(&key)
            .arg("term")
            .arg("data")
            .query_async(&mut self.conn())
            .await
            .map_err(|e| map_err(e, "reading the election record"))?;
        decode_record(&key, term, data)
    }
}

/// The record at `key` from its `HMGET term data`: nothing, or a term and data as
/// `elect_publish.lua` writes them; anything else is a `Backend` error.
fn decode_record(
    key: &str,
    term: Option<String>,
    data: Option<String>,
) -> Result<Option<(u64, String)>> {
    match (term, data) {
        (None, None) => Ok(None),
        (Some(term), Some(data)) => match parse_term(&term) {
            Some(term) => Ok(Some((term, data))),
            None => Err(malformed(key, &format!("its term {term:?} is not a u64"))),
        },
        _ => Err(malformed(key, "it lacks its term or its data")),
    }
}

/// A term as the script writes it: a u64 in decimal without sign or leading zeros.
fn parse_term(term: &str) -> Option<u64> {
    let canonical = term == "0" || !term.starts_with(['0', '+']);
    term.parse().ok().filter(|_| canonical)
}

/// The error of a record that dlock did not write.
fn malformed(key: &str, why: &str) -> Error {
    Error::new(
        ErrorKind::Backend,
        format!("reading the election record: {key} was tampered with: {why}"),
    )
}

#[cfg(test)]
mod tests {
    use super::parse_term;

    #[test]
    fn only_canonical_terms_parse() {
        assert_eq!(parse_term("0"), Some(0));
        assert_eq!(parse_term("42"), Some(42));
        assert_eq!(parse_term("18446744073709551615"), Some(u64::MAX));
        for bad in ["", "007", "+7", "-1", "7 ", "18446744073709551616", "x"] {
            assert_eq!(parse_term(bad), None, "{bad:?}");
        }
    }
}

/// Hostile input: whatever the record's hash holds.
#[cfg(test)]
mod props {
    use proptest::prelude::*;

    use super::{decode_record, parse_term};

    proptest! {
        #![proptest_config(crate::backend::hostile::cases(256))]

        #[test]
        fn terms_round_trip(term in any::<u64>()) {
            prop_assert_eq!(parse_term(&term.to_string()), Some(term));
        }

        #[test]
        fn any_term_text_is_canonical_or_refused(text in prop_oneof![any::<String>(), "[-+0-9 ]{0,22}"]) {
            if let Some(term) = parse_term(&text) {
                prop_assert_eq!(term.to_string(), text);
            }
        }

        #[test]
        fn any_hash_content_decodes_or_is_a_backend_error(
            term in proptest::option::of(prop_oneof![any::<String>(), "[0-9]{1,20}"]),
            data in proptest::option::of(any::<String>()),
        ) {
            match decode_record("k", term.clone(), data.clone()) {
                Ok(None) => prop_assert!(term.is_none() && data.is_none()),
                Ok(Some((t, d))) => {
                    prop_assert_eq!(Some(t.to_string()), term);
                    prop_assert_eq!(Some(d), data);
                }
                Err(e) => prop_assert_eq!(e.kind(), crate::ErrorKind::Backend),
            }
        }
    }
}
