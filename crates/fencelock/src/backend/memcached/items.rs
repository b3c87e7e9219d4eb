//! What the lock family on memcached shares: the text of its index items, CAS-checked
//! writes of them, lease items and reading which of them are alive.

use super::{Memcached, get_reply, unexpected};
use crate::error::{Error, ErrorKind, Result};
use crate::token::Token;

/// An index item's text: `<tag> <length> <text>\n` per entry, so a text (a token, an
/// owner) may hold anything, spaces and newlines included.
pub(super) fn encode<T: AsRef<str>, V: AsRef<str>>(
    entries: impl IntoIterator<Item = (T, V)>,
) -> String {
    let mut out = String::new();
    for (tag, text) in entries {
        let (tag, text) = (tag.as_ref(), text.as_ref());
        out.push_str(&format!("{tag} {} {text}\n", text.len()));
    }
    out
}

/// The entries [`encode`] wrote, as `(tag, text)`; anything else is a `Backend` error
/// naming `what` the item is.
pub(super) fn decode(bytes: &[u8], what: &str) -> Result<Vec<(String, String)>> {
    let corrupt = || {
        Error::new(
            ErrorKind::Backend,
            format!("{what} on memcached is not one dlock wrote"),
        )
    };
    let mut rest = std::str::from_utf8(bytes).map_err(|_| corrupt())?;
    let mut entries = Vec::new();
    while !rest.is_empty() {
        let (tag, after) = rest.split_once(' ').ok_or_else(corrupt)?;
        let (len, after) = after.split_once(' ').ok_or_else(corrupt)?;
        let len: usize = len.parse().map_err(|_| corrupt())?;
        let text = after.get(..len).ok_or_else(corrupt)?;
        rest = after[len..].strip_prefix('\n').ok_or_else(corrupt)?;
        entries.push((tag.to_owned(), text.to_owned()));
    }
    Ok(entries)
}

/// The error of an item that [`decode`] read but that does not say what `what` says.
pub(super) fn corrupt(what: &str) -> Error {
    Error::new(
        ErrorKind::Backend,
        format!("{what} on memcached is not one dlock wrote"),
    )
}

/// How many times a change of an index item starts again after losing a CAS race.
pub(super) const CAS_ROUNDS: usize = 8;

/// The error of a change that lost [`CAS_ROUNDS`] races in a row.
pub(super) fn contended(what: &str) -> Error {
    Error::new(
        ErrorKind::Backend,
        format!("{what} on memcached kept changing (too many clients writing it at once)"),
    )
    .retryable(true)
}

impl Memcached {
    /// Writes `value` at `key`, without expiry, only if the item is still at `cas`
    /// (`None`: only if there is none). Whether it was written: `false` when another
    /// write came first.
    pub(super) async fn write_cas(
        &self,
        key: &str,
        value: &str,
        cas: Option<&str>,
    ) -> Result<bool> {
        let mode = cas.map_or_else(|| "ME".to_owned(), |cas| format!("C{cas}"));
        let reply = self
            .one(format!("ms {key} {} T0 {mode}\r\n{value}\r\n", value.len()).into_bytes())
            .await?;
        match reply.code.as_str() {
            "HD" => Ok(true),
            "EX" | "NS" | "NF" => Ok(false),
            other => Err(unexpected("ms (index)", other)),
        }
    }

    /// Sets the lease item `key` to `token` for `secs`.
    pub(super) async fn set_item(&self, key: &str, token: &Token, secs: u64) -> Result<()> {
        let value = token.as_str();
        let reply = self
            .one(format!("ms {key} {} T{secs}\r\n{value}\r\n", value.len()).into_bytes())
            .await?;
        match reply.code.as_str() {
            "HD" => Ok(()),
            other => Err(unexpected("ms (lease item)", other)),
        }
    }

    /// Deletes `key` whatever it holds; whether it was there.
    pub(super) async fn delete_item(&self, key: &str) -> Result<bool> {
        let reply = self.one(format!("md {key}\r\n").into_bytes()).await?;
        Ok(reply.code == "HD")
    }

    /// Per `(lease item, token)`: its remaining seconds if it still holds that token, in
    /// one pipelined round trip.
    pub(super) async fn alive(&self, items: &[(String, &str)]) -> Result<Vec<Option<u64>>> {
        if items.is_empty() {
            return Ok(Vec::new());
        }
        let request: String = items
            .iter()
            .map(|(key, _)| format!("mg {key} v t\r\n"))
            .collect();
        let replies = self.call(request.into_bytes(), items.len()).await?;
        let mut alive = Vec::with_capacity(items.len());
        for ((_, token), reply) in items.iter().zip(replies) {
            alive.push(match get_reply(reply)? {
                Some((v, _, t)) if v == token.as_bytes() => {
                    Some(t.and_then(|t| u64::try_from(t).ok()).unwrap_or(0))
                }
                _ => None,
            });
        }
        Ok(alive)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(crate::backend::hostile::cases(128))]

        #[test]
        fn entries_round_trip(entries in prop::collection::vec(("[A-Z0-9]{1,4}", any::<String>()), 0..6)) {
            let decoded = decode(encode(entries.iter().map(|(t, v)| (t, v))).as_bytes(), "an index")
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(decoded, entries);
        }

        #[test]
        fn any_bytes_decode_or_are_refused(bytes in prop::collection::vec(any::<u8>(), 0..64)) {
            let _ = decode(&bytes, "an index");
        }
    }

    #[test]
    fn texts_with_separators_stay_one_entry() {
        let entries = vec![
            ("R".to_owned(), "a b\n2 5 c".to_owned()),
            ("X".to_owned(), String::new()),
        ];
        let text = encode(entries.iter().map(|(t, v)| (t, v)));
        assert_eq!(
            decode(text.as_bytes(), "an index").expect("decodes"),
            entries
        );
        assert!(decode(b"R 99 x\n", "an index").is_err());
        assert!(decode(b"R 1 x", "an index").is_err());
    }
}
