//! Where a lock lives in the store: the lock key and its companions.
//!
//! The lock key is exactly `prefix + name`, holding the plain token, so any client that
//! speaks the standard `SET key token NX PX ttl` / compare-and-delete protocol on that key
//! excludes and is excluded by dlock. The companion keys (fence counter, waiter queues,
//! holders, …) and the release channels must sit in the same Redis Cluster slot as the
//! lock key, because one script touches them together. They are written under a *base*
//! that names the lock key unambiguously:
//!
//! * a lock key without a hash tag becomes the tag: `dlock:orders` has the base
//!   `{dlock:orders}` (its companions `{dlock:orders}:fence`, …), which hashes exactly like
//!   `dlock:orders`;
//! * a lock key with a hash tag `{t}` has the base `{t}<length>:<lock key>`, the length
//!   of the lock key in bytes in decimal: `dlock:{orders}:x` has the base
//!   `{orders}16:dlock:{orders}:x`, in the slot of `orders`.
//!
//! # A closed namespace
//!
//! Every companion key and channel is `<base>:<suffix>`, and a base reads back to exactly
//! one lock key (up to its first `}`: the lock key itself, or the tag followed by the
//! length and the lock key), so two lock keys never share a companion key or channel.
//! Every base starts with `{`, so under a prefix that does not start with `{` (every
//! default prefix) no lock key is another lock's companion either. Under an empty prefix or
//! one that starts with `{`, a name whose lock key *is* some lock's companion key (such as
//! `{x}:fence`, lock `x`'s fence counter) is refused ([`LockKeys::new`]). No name of any
//! bytes, hash tags or suffixes can therefore reach another lock's keys. The default
//! prefixes of the primitives are none a prefix of another, so the same name under two
//! kinds is two lock keys; prefixes of your own should keep that property.
//!
//! Versions before this layout put the companions of a hash-tagged lock key right after
//! it (`dlock:{orders}:fence`), where the lock key of the name `{orders}:fence` is. The
//! lock key itself did not move, so a hold granted by an older version still excludes
//! this one. The fence counter of such a name moved; dlock's scripts start the new counter
//! from the old one the first time they mint a fence for it, so fences keep increasing
//! across the upgrade ([`LockKeys::legacy_fence`]). The other companions of a hash-tagged
//! lock key start empty in their new place: a semaphore's holders (their permit counts)
//! and its stored permit count, a read-write lock's readers, waiter queues, an election's
//! record. Holds of those kinds that an older version granted are therefore not seen by
//! this one: stop the older version's clients and let their leases run out (one ttl)
//! before this version's start on such names, and set a changed permit count again. The
//! two versions do not share those companions, so they must not run side by side on a
//! hash-tagged name (untagged names did not move at all).
//!
//! A Redis semaphore keeps the permits its holders hold as a running total (the companion
//! `used`), which versions before it did not. A semaphore written by such a version works
//! as it stands: the first script that finds no total sums the holders once and keeps the
//! total from then on. An older client changes the holders without the total, though, so
//! stop the older version's clients on a semaphore before this version's start on it.
//!
//! A key containing `}` without forming a hash tag cannot be wrapped in a tag and is
//! rejected.

use std::borrow::Cow;
use std::sync::Arc;

use crate::error::{Error, Result};

/// Longest lock name accepted, in bytes.
pub const MAX_NAME_LEN: usize = 1024;
/// Longest key prefix accepted, in bytes.
pub const MAX_PREFIX_LEN: usize = 256;
/// Default key prefix.
pub const DEFAULT_PREFIX: &str = "dlock:";

/// The suffixes of the companion keys dlock keeps beside a lock key
/// ([`LockKeys::companion`]); `fence` is the fence counter's ([`LockKeys::fence`]).
/// A lock key that is the companion key of another lock key under one of these suffixes is
/// refused.
pub const COMPANION_SUFFIXES: &[&str] = &[
    "fence", "claims", "holders", "permits", "used", "q", "queue", "readers", "waiters", "writers",
    RECORD,
];

/// The suffix of an election's record: the companion key ([`LockKeys::companion`])
/// where it is stored, and the side channel ([`LockKeys::side`]) on which a write of it is
/// announced.
pub const RECORD: &str = "leader";

/// The store keys of one lock name. Cheap to clone.
///
/// All of them live in one shared string, `fence key + channel`, whose boundaries are
/// kept beside it: one allocation per lock name. The lock key is read out of the fence
/// key, which contains it (`{lock key}:fence`, or `{tag}<length>:lock key:fence` when the
/// lock key has a hash tag of its own).
#[derive(Clone, PartialEq, Eq)]
pub struct LockKeys {
    text: Arc<str>,
    /// Where the name starts (after the prefix).
    name_start: u16,
    /// Where the lock key starts (after `{`, or after `{tag}<length>:`).
    lock_start: u16,
    /// Where the lock key ends.
    lock_end: u16,
    /// Where the fence key ends and the channel starts (the channel runs to the end).
    fence_end: u16,
}

const FENCE_SUFFIX: &str = ":fence";

impl std::fmt::Debug for LockKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockKeys")
            .field("name", &self.name())
            .field("lock", &self.lock())
            .field("fence", &self.fence())
            .field("channel", &self.channel())
            .finish()
    }
}

impl LockKeys {
    /// Lays out the keys of lock `name` under `prefix`.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) for an empty name,
    /// a name over [`MAX_NAME_LEN`] bytes, a prefix over [`MAX_PREFIX_LEN`] bytes, a key
    /// whose braces cannot share a cluster slot with its companions, or a lock key that is
    /// another lock key's companion key (possible only under an empty prefix or one that
    /// starts with `{`; see the [module docs](self)).
    pub fn new(prefix: &str, name: &str) -> Result<LockKeys> {
        if name.is_empty() {
            return Err(Error::invalid("lock name must not be empty"));
        }
        if name.len() > MAX_NAME_LEN {
            return Err(Error::invalid(format!(
                "lock name is {} bytes; the limit is {MAX_NAME_LEN}",
                name.len()
            )));
        }
        if prefix.len() > MAX_PREFIX_LEN {
            return Err(Error::invalid(format!(
                "key prefix is {} bytes; the limit is {MAX_PREFIX_LEN}",
                prefix.len()
            )));
        }
        let lock_len = prefix.len() + name.len();
        let mut text = String::with_capacity(2 * lock_len + 2 * 16 + FENCE_SUFFIX.len() + 9);
        text.push_str(prefix);
        text.push_str(name);
        if let Some((of, suffix)) = companion_parts(&text) {
            return Err(Error::invalid(format!(
                "lock key {text:?} is the {suffix:?} companion key of lock key {of:?}; \
                 under this prefix, choose another name"
            )));
        }
        // The companions' base: `{lock key}`, or `{tag}<length>:lock key`.
        let tag = hash_tag(text.as_bytes()).map(<[u8]>::len);
        if tag.is_none() && text.contains('}') {
            return Err(Error::invalid(format!(
                "lock key {text:?} contains '}}' without forming a {{hash tag}}; \
                 its companion keys could not share its cluster slot"
            )));
        }
        let lock_start = match tag {
            None => {
                text.insert(0, '{');
                text.push('}');
                1
            }
            Some(len) => {
                let open = text.find('{').unwrap_or_default();
                let head = format!("{}{lock_len}:", &text[open..open + len + 2]);
                text.insert_str(0, &head);
                head.len()
            }
        };
        text.push_str(FENCE_SUFFIX);
        let fence_end = text.len();
        text.extend_from_within(..fence_end - FENCE_SUFFIX.len());
        text.push_str(":released");
        Ok(LockKeys {
            text: text.into(),
            name_start: offset(lock_start + prefix.len())?,
            lock_start: offset(lock_start)?,
            lock_end: offset(lock_start + lock_len)?,
            fence_end: offset(fence_end)?,
        })
    }

    /// The lock's name as the user gave it.
    pub fn name(&self) -> &str {
        &self.text[usize::from(self.name_start)..usize::from(self.lock_end)]
    }

    /// The key holding the owner token.
    pub fn lock(&self) -> &str {
        &self.text[usize::from(self.lock_start)..usize::from(self.lock_end)]
    }

    /// The key of the fencing counter (never expires).
    pub fn fence(&self) -> &str {
        &self.text[..usize::from(self.fence_end)]
    }

    /// Where versions before the current layout kept the fence counter: the same as
    /// [`fence`](Self::fence) for a lock key without a hash tag, `<lock key>:fence` for one
    /// with a tag (in its slot). dlock's scripts start a missing counter from the positive
    /// integer found there, once, so that fences keep increasing across the upgrade; the
    /// key is never written (it may be another lock's key now).
    pub fn legacy_fence(&self) -> Cow<'_, str> {
        if self.lock_start == 1 {
            Cow::Borrowed(self.fence())
        } else {
            Cow::Owned(format!("{}{FENCE_SUFFIX}", self.lock()))
        }
    }

    /// The channel on which releases are announced.
    pub fn channel(&self) -> &str {
        &self.text[usize::from(self.fence_end)..]
    }

    /// `{lock key}`, or `{tag}<length>:lock key`: what companion keys and channels are
    /// appended to.
    fn base(&self) -> &str {
        &self.text[..usize::from(self.fence_end) - FENCE_SUFFIX.len()]
    }

    /// The same keys with release announcements on a channel of their own
    /// (`<channel>:<side>`), for primitives whose waiters wait for different things
    /// (readers and writers).
    pub fn side(&self, side: &str) -> LockKeys {
        let mut text = String::with_capacity(self.text.len() + 1 + side.len());
        text.push_str(&self.text);
        text.push(':');
        text.push_str(side);
        LockKeys {
            text: text.into(),
            ..*self
        }
    }

    /// Another key of the same primitive, `<base>:<suffix>`, in the lock key's cluster
    /// slot. dlock's own suffixes are [`COMPANION_SUFFIXES`]; the namespace guarantee (no
    /// lock key is a companion key) covers those.
    pub fn companion(&self, suffix: &str) -> String {
        format!("{}:{suffix}", self.base())
    }
}

/// The lock key and suffix whose companion key `key` is, if it is one (a suffix of
/// [`COMPANION_SUFFIXES`], under a base [`LockKeys::new`] writes).
pub fn companion_parts(key: &str) -> Option<(&str, &str)> {
    let rest = key.strip_prefix('{')?;
    let close = rest.find('}')?;
    let (inner, after) = (&rest[..close], &rest[close + 1..]);
    let (lock, tail) = if let Some(tail) = after.strip_prefix(':') {
        // `{lock key}:suffix`, the lock key without a hash tag.
        if hash_tag(inner.as_bytes()).is_some() || inner.is_empty() {
            return None;
        }
        (inner, tail)
    } else {
        // `{tag}<length>:lock key:suffix`.
        let digits = after.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 || after.starts_with('0') {
            return None;
        }
        let len: usize = after[..digits].parse().ok()?;
        let body = after[digits..].strip_prefix(':')?;
        let lock = body.get(..len)?;
        if hash_tag(lock.as_bytes()) != Some(inner.as_bytes()) {
            return None;
        }
        (lock, body[len..].strip_prefix(':')?)
    };
    COMPANION_SUFFIXES.contains(&tail).then_some((lock, tail))
}

/// A boundary inside a [`LockKeys`] text (always small: names and prefixes are bounded).
fn offset(at: usize) -> Result<u16> {
    u16::try_from(at).map_err(|_| Error::invalid("lock key too long"))
}

/// The part of `key` that Redis Cluster hashes: the content of the first `{…}` if it is
/// non-empty, else `None` (the whole key is hashed).
pub fn hash_tag(key: &[u8]) -> Option<&[u8]> {
    let open = key.iter().position(|&b| b == b'{')?;
    let len = key[open + 1..].iter().position(|&b| b == b'}')?;
    (len > 0).then(|| &key[open + 1..open + 1 + len])
}

/// The Redis Cluster slot of `key`: CRC16 (XMODEM) of its hash tag or whole key, mod 16384.
pub fn cluster_slot(key: &[u8]) -> u16 {
    let hashed = hash_tag(key).unwrap_or(key);
    crc16_xmodem(hashed) % 16384
}

fn crc16_xmodem(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in data {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn crc16_matches_the_cluster_spec_vectors() {
        // The Redis Cluster specification's reference value and well-known slots.
        assert_eq!(crc16_xmodem(b"123456789"), 0x31c3);
        assert_eq!(cluster_slot(b"foo"), 12182);
        assert_eq!(
            cluster_slot(b"{user1000}.following"),
            cluster_slot(b"user1000")
        );
        assert_eq!(cluster_slot(b"foo{}{bar}"), cluster_slot(b"foo{}{bar}"));
        assert_eq!(hash_tag(b"foo{}{bar}"), None);
        assert_eq!(hash_tag(b"foo{{bar}}zap"), Some(&b"{bar"[..]));
    }

    #[test]
    fn layout_of_plain_and_tagged_names() {
        let k = LockKeys::new("dlock:", "orders").expect("valid");
        assert_eq!(k.lock(), "dlock:orders");
        assert_eq!(k.fence(), "{dlock:orders}:fence");
        assert_eq!(k.legacy_fence(), "{dlock:orders}:fence");
        assert_eq!(k.channel(), "{dlock:orders}:released");

        let k = LockKeys::new("", "{orders}").expect("valid");
        assert_eq!(k.lock(), "{orders}");
        assert_eq!(k.fence(), "{orders}8:{orders}:fence");
        assert_eq!(k.legacy_fence(), "{orders}:fence");

        let k = LockKeys::new("dlock:", "{o}").expect("valid");
        assert_eq!(k.lock(), "dlock:{o}");
        assert_eq!(k.name(), "{o}");
        assert_eq!(k.fence(), "{o}9:dlock:{o}:fence");
        assert_eq!(k.legacy_fence(), "dlock:{o}:fence");
        assert_eq!(k.channel(), "{o}9:dlock:{o}:released");
        // The issue's name: its lock key is the old fence counter, no key of `{o}`'s now.
        let f = LockKeys::new("dlock:", "{o}:fence").expect("valid");
        assert_eq!(f.lock(), "dlock:{o}:fence");
        assert_ne!(f.lock(), k.fence());

        let k = LockKeys::new("", "orders").expect("valid");
        assert_eq!(k.lock(), "orders");
    }

    #[test]
    fn companion_keys_read_back_to_their_lock_key() {
        for (prefix, name) in [("dlock:", "orders"), ("", "{o}"), ("p:", "{o}x:12:fence")] {
            let k = LockKeys::new(prefix, name).expect("valid");
            for suffix in COMPANION_SUFFIXES {
                let key = k.companion(suffix);
                assert_eq!(companion_parts(&key), Some((k.lock(), *suffix)), "{key}");
            }
            assert_eq!(companion_parts(k.fence()), Some((k.lock(), "fence")));
            assert_eq!(companion_parts(k.lock()), None);
        }
        for not in [
            "{o}:x",
            "{o}9:dlock:{o}:x",
            "{o}09:dlock:{o}:fence",
            "{o}8:dlock:{o}:fence",
        ] {
            assert_eq!(companion_parts(not), None, "{not}");
        }
    }

    #[test]
    fn a_lock_key_that_is_a_companion_key_is_refused() {
        // Only under a prefix that is empty or starts with `{`.
        for (prefix, name) in [
            ("", "{orders}:fence"),
            ("{app}:", "fence"),
            ("{app}:", "waiters"),
            ("", "{o}9:dlock:{o}:fence"),
            ("{", "o}9:dlock:{o}:holders"),
        ] {
            let err = LockKeys::new(prefix, name).expect_err(name);
            assert_eq!(err.kind(), crate::ErrorKind::InvalidArgument);
        }
        for (prefix, name) in [
            ("{app}:", "orders"),
            ("{app}:", "x:fence"),
            ("dlock:", "{orders}:fence"),
            ("", "{o}9:dlock:{o}:other"),
        ] {
            assert!(LockKeys::new(prefix, name).is_ok(), "{prefix}{name}");
        }
    }

    #[test]
    fn sides_and_companions_keep_every_key() {
        let k = LockKeys::new("dlock:", "orders").expect("valid");
        let w = k.side("writers");
        assert_eq!(w.name(), "orders");
        assert_eq!(w.lock(), "dlock:orders");
        assert_eq!(w.fence(), "{dlock:orders}:fence");
        assert_eq!(w.channel(), "{dlock:orders}:released:writers");
        assert_eq!(w.companion("holders"), "{dlock:orders}:holders");
        assert_ne!(w, k);
        assert_eq!(k, LockKeys::new("dlock:", "orders").expect("valid"));
        let t = LockKeys::new("p:", "{o}x").expect("valid");
        assert_eq!(t.name(), "{o}x");
        assert_eq!(t.lock(), "p:{o}x");
        assert_eq!(t.companion("q"), "{o}6:p:{o}x:q");
        assert_eq!(t.channel(), "{o}6:p:{o}x:released");
        assert_eq!(t.side("w").lock(), "p:{o}x");
        let long =
            LockKeys::new(&"p".repeat(MAX_PREFIX_LEN), &"x".repeat(MAX_NAME_LEN)).expect("valid");
        assert_eq!(long.name().len(), MAX_NAME_LEN);
        assert_eq!(long.fence().len(), MAX_PREFIX_LEN + MAX_NAME_LEN + 2 + 6);
        let long = LockKeys::new(
            &"p".repeat(MAX_PREFIX_LEN),
            &format!("{{t}}{}", "x".repeat(1021)),
        )
        .expect("valid");
        assert_eq!(long.name().len(), MAX_NAME_LEN);
        assert_eq!(long.lock().len(), MAX_PREFIX_LEN + MAX_NAME_LEN);
    }

    #[test]
    fn bad_names_are_rejected() {
        assert!(LockKeys::new("dlock:", "").is_err());
        assert!(LockKeys::new("dlock:", &"x".repeat(MAX_NAME_LEN + 1)).is_err());
        assert!(LockKeys::new(&"p".repeat(MAX_PREFIX_LEN + 1), "x").is_err());
        assert!(LockKeys::new("", "a}b").is_err());
        assert!(LockKeys::new("dlock:", &"x".repeat(MAX_NAME_LEN)).is_ok());
    }

    proptest! {
        #[test]
        fn companions_share_the_lock_keys_slot(prefix in ".{0,12}", name in ".{1,40}") {
            if let Ok(k) = LockKeys::new(&prefix, &name) {
                let slot = cluster_slot(k.lock().as_bytes());
                prop_assert_eq!(cluster_slot(k.fence().as_bytes()), slot);
                prop_assert_eq!(cluster_slot(k.channel().as_bytes()), slot);
                prop_assert_eq!(cluster_slot(k.companion("holders").as_bytes()), slot);
                prop_assert_eq!(k.lock(), format!("{prefix}{name}"));
                prop_assert_eq!(k.name(), name.as_str());
                prop_assert_eq!(cluster_slot(k.legacy_fence().as_bytes()), slot);
                let holders = k.companion("holders");
                prop_assert_eq!(companion_parts(&holders), Some((k.lock(), "holders")));
            } else {
                // Only the brace cases may be refused for names within the limits.
                let key = format!("{prefix}{name}");
                prop_assert!(key.contains('}'), "refused {:?}", key);
            }
        }
    }
}

/// Test support for every store's namespace property (DESIGN.md principle 9): the key sets
/// of distinct (name, primitive) pairs are disjoint.
#[cfg(test)]
pub(crate) mod namespace {
    use std::collections::HashMap;

    use proptest::prelude::*;

    use super::LockKeys;

    /// Every primitive, with its default prefix.
    pub(crate) const PRIMITIVES: &[(&str, &str)] = &[
        ("lock", super::DEFAULT_PREFIX),
        ("semaphore", crate::DEFAULT_SEMAPHORE_PREFIX),
        ("reentrant", crate::DEFAULT_REENTRANT_PREFIX),
        ("rwlock", crate::DEFAULT_RWLOCK_PREFIX),
        ("fair", crate::DEFAULT_FAIR_PREFIX),
        ("election", crate::DEFAULT_ELECTION_PREFIX),
    ];

    /// Prefixes of a user's own, besides the defaults: empty, a hash tag, no separator, a
    /// lone brace.
    const OWN_PREFIXES: &[&str] = &["", "{app}:", "p", "{"];

    /// What hostile names are made of: hash tags, braces, dlock's suffixes, separators,
    /// escapes, digits (a length), other prefixes.
    #[rustfmt::skip]
    const PARTS: &[&str] = &[
        "{", "}", "{o}", "{u}", "o", ":", "/", "%", "%2F", "-", "~", ".", "fence", ":fence",
        ":waiters", ":claims", ":holders", ":permits", ":used", ":q", ":queue", ":readers", ":writers",
        ":released", ":leader", ":w", ":r", "1", "12", "dlock:", "dlock-sem:", "{dlock:o}",
        "\u{e9}", " ", "\"", "dlock-gate:\"dlock\":", LONG,
    ];

    /// A part long enough to take a name past the stores' direct key lengths.
    const LONG: &str = concat!(
        "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
        "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
        "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
        "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
        "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
    );

    /// A name made of [`PARTS`].
    pub(crate) fn hostile_name() -> impl Strategy<Value = String> {
        prop::collection::vec(prop::sample::select(PARTS), 1..7).prop_map(|p| p.concat())
    }

    /// Checks that no two distinct locks share an entry of `key_set` (each entry
    /// `<namespace> <key>`: a store's key, row, node or channel; none for a lock key the
    /// store refuses). The locks: every name of `seeds`, and every name that spells one of
    /// their keys (or its start up to a separator) under some prefix, each under every primitive of `primitives` (a store's
    /// primitives and their default prefixes, as [`PRIMITIVES`]) with its default prefix
    /// and with the [`OWN_PREFIXES`]. Two primitives given one prefix of the user's own share the lock
    /// key of a name by the user's choice: those pairs are not compared.
    pub(crate) fn check_disjoint(
        primitives: &[(&'static str, &'static str)],
        seeds: &[String],
        key_set: impl Fn(&str, &LockKeys) -> Vec<String>,
    ) -> Result<(), TestCaseError> {
        let prefixes = |primitive: &str| -> Vec<(&'static str, bool)> {
            primitives
                .iter()
                .filter(|(p, _)| *p == primitive)
                .map(|(_, prefix)| (*prefix, true))
                .chain(OWN_PREFIXES.iter().map(|p| (*p, false)))
                .collect()
        };
        let all_prefixes: Vec<&str> = primitives
            .iter()
            .map(|(_, p)| *p)
            .chain(OWN_PREFIXES.iter().copied())
            .collect();
        let primitives: Vec<&str> = primitives.iter().map(|(p, _)| *p).collect();
        let mut names: Vec<String> = seeds.to_vec();
        for name in seeds {
            for &primitive in &primitives {
                for (prefix, _) in prefixes(primitive) {
                    let Ok(keys) = LockKeys::new(prefix, name) else {
                        continue;
                    };
                    for entry in key_set(primitive, &keys) {
                        let key = entry.split_once(' ').map_or(&*entry, |(_, k)| k);
                        // The key, and every start of it that ends before a separator
                        // (a base: a lock key wrapped as another's companions are).
                        let cuts = key
                            .char_indices()
                            .filter(|(_, c)| matches!(c, ':' | '/' | '~'))
                            .map(|(i, _)| i)
                            .chain([key.len()]);
                        for cut in cuts {
                            for p in &all_prefixes {
                                if let Some(n) = key[..cut].strip_prefix(p) {
                                    names.push(n.to_owned());
                                }
                            }
                        }
                    }
                }
            }
        }
        names.sort();
        names.dedup();
        // entry -> (primitive, lock key, default prefix?)
        let mut owners: HashMap<String, (&str, String, bool)> = HashMap::new();
        for name in &names {
            for &primitive in &primitives {
                for (prefix, default) in prefixes(primitive) {
                    let Ok(keys) = LockKeys::new(prefix, name) else {
                        continue;
                    };
                    prop_assert_eq!(keys.lock(), format!("{prefix}{name}"));
                    for entry in key_set(primitive, &keys) {
                        let me = (primitive, keys.lock().to_owned(), default);
                        match owners.get(&entry) {
                            None => {
                                owners.insert(entry, me);
                            }
                            Some(other) if other.0 == me.0 && other.1 == me.1 => {}
                            Some(other) if other.1 == me.1 && !(other.2 && me.2) => {}
                            Some(other) => {
                                return Err(TestCaseError::fail(format!(
                                    "{entry:?} belongs to {primitive} {:?} and to {} {:?}",
                                    me.1, other.0, other.1
                                )));
                            }
                        }
                    }
                }
            }
        }
        Ok(())
    }
}
