//! Where a lock lives in the store: the lock key and its companions.
//!
//! The lock key is exactly `prefix + name`, holding the plain token, so any client that
//! speaks the standard `SET key token NX PX ttl` / compare-and-delete protocol on that key
//! excludes and is excluded by dlock. The companion keys (fence counter, release channel)
//! must sit in the same Redis Cluster slot as the lock key, because one script touches them
//! together:
//!
//! * if the lock key already carries a hash tag (`dlock:{orders}`), companions append to it:
//!   `dlock:{orders}:fence`;
//! * otherwise the whole lock key becomes the tag: `{dlock:orders}:fence` hashes exactly
//!   like `dlock:orders`.
//!
//! A key containing `}` without forming a hash tag cannot be wrapped that way and is
//! rejected.

use std::sync::Arc;

use crate::error::{Error, Result};

/// Longest lock name accepted, in bytes.
pub const MAX_NAME_LEN: usize = 1024;
/// Longest key prefix accepted, in bytes.
pub const MAX_PREFIX_LEN: usize = 256;
/// Default key prefix.
pub const DEFAULT_PREFIX: &str = "dlock:";

/// The store keys of one lock name. Cheap to clone.
///
/// All of them live in one shared string, `fence key + channel`, whose boundaries are
/// kept beside it: one allocation per lock name. The lock key is read out of the fence
/// key, which starts with it (`{lock key}:fence`, or `lock key:fence` when the lock key
/// has a hash tag of its own).
#[derive(Clone, PartialEq, Eq)]
pub struct LockKeys {
    text: Arc<str>,
    /// Where the name starts (after `{` and the prefix).
    name_start: u16,
    /// Where the lock key ends; it starts at 0, or at 1 after a `{` when the base is
    /// `{lock key}` (then the base ends one byte later).
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
    /// a name over [`MAX_NAME_LEN`] bytes, a prefix over [`MAX_PREFIX_LEN`] bytes, or a key
    /// whose braces cannot share a cluster slot with its companions.
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
        let mut text = String::with_capacity(2 * lock_len + 4 + FENCE_SUFFIX.len() + 9);
        text.push_str(prefix);
        text.push_str(name);
        // The companions' base: the lock key, or `{lock key}` when it has no hash tag.
        let tagged = hash_tag(text.as_bytes()).is_some();
        if !tagged && text.contains('}') {
            return Err(Error::invalid(format!(
                "lock key {text:?} contains '}}' without forming a {{hash tag}}; \
                 its companion keys could not share its cluster slot"
            )));
        }
        if !tagged {
            text.clear();
            text.push('{');
            text.push_str(prefix);
            text.push_str(name);
            text.push('}');
        }
        let open = usize::from(!tagged);
        text.push_str(FENCE_SUFFIX);
        let fence_end = text.len();
        text.extend_from_within(..fence_end - FENCE_SUFFIX.len());
        text.push_str(":released");
        Ok(LockKeys {
            text: text.into(),
            name_start: offset(open + prefix.len())?,
            lock_end: offset(open + lock_len)?,
            fence_end: offset(fence_end)?,
        })
    }

    /// The lock's name as the user gave it.
    pub fn name(&self) -> &str {
        &self.text[usize::from(self.name_start)..usize::from(self.lock_end)]
    }

    /// The key holding the owner token.
    pub fn lock(&self) -> &str {
        let start = self.base().len() - usize::from(self.lock_end);
        &self.text[start..usize::from(self.lock_end)]
    }

    /// The key of the fencing counter (never expires).
    pub fn fence(&self) -> &str {
        &self.text[..usize::from(self.fence_end)]
    }

    /// The channel on which releases are announced.
    pub fn channel(&self) -> &str {
        &self.text[usize::from(self.fence_end)..]
    }

    /// The lock key, or `{lock key}` when it has no hash tag of its own: what companion
    /// keys are appended to.
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

    /// Another key of the same primitive, in the lock key's cluster slot.
    pub fn companion(&self, suffix: &str) -> String {
        format!("{}:{suffix}", self.base())
    }
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
        assert_eq!(k.channel(), "{dlock:orders}:released");

        let k = LockKeys::new("", "{orders}").expect("valid");
        assert_eq!(k.lock(), "{orders}");
        assert_eq!(k.fence(), "{orders}:fence");

        let k = LockKeys::new("", "orders").expect("valid");
        assert_eq!(k.lock(), "orders");
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
        assert_eq!(t.companion("q"), "p:{o}x:q");
        assert_eq!(t.channel(), "p:{o}x:released");
        let long =
            LockKeys::new(&"p".repeat(MAX_PREFIX_LEN), &"x".repeat(MAX_NAME_LEN)).expect("valid");
        assert_eq!(long.name().len(), MAX_NAME_LEN);
        assert_eq!(long.fence().len(), MAX_PREFIX_LEN + MAX_NAME_LEN + 2 + 6);
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
            } else {
                // Only the brace case may be refused for names within the limits.
                let key = format!("{prefix}{name}");
                prop_assert!(key.contains('}'), "refused {:?}", key);
            }
        }
    }
}
