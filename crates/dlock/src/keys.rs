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
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockKeys(Arc<KeysInner>);

#[derive(Debug, PartialEq, Eq)]
struct KeysInner {
    name: String,
    /// The lock key, or `{lock key}` when it has no hash tag of its own.
    base: String,
    lock: String,
    fence: String,
    channel: String,
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
        let lock = format!("{prefix}{name}");
        let base = if hash_tag(lock.as_bytes()).is_some() {
            lock.clone()
        } else if lock.contains('}') {
            return Err(Error::invalid(format!(
                "lock key {lock:?} contains '}}' without forming a {{hash tag}}; \
                 its companion keys could not share its cluster slot"
            )));
        } else {
            format!("{{{lock}}}")
        };
        Ok(LockKeys(Arc::new(KeysInner {
            name: name.to_owned(),
            fence: format!("{base}:fence"),
            channel: format!("{base}:released"),
            base,
            lock,
        })))
    }

    /// The lock's name as the user gave it.
    pub fn name(&self) -> &str {
        &self.0.name
    }

    /// The key holding the owner token.
    pub fn lock(&self) -> &str {
        &self.0.lock
    }

    /// The key of the fencing counter (never expires).
    pub fn fence(&self) -> &str {
        &self.0.fence
    }

    /// The channel on which releases are announced.
    pub fn channel(&self) -> &str {
        &self.0.channel
    }

    /// The same keys with release announcements on a channel of their own
    /// (`<channel>:<side>`), for primitives whose waiters wait for different things
    /// (readers and writers).
    pub fn side(&self, side: &str) -> LockKeys {
        LockKeys(Arc::new(KeysInner {
            name: self.0.name.clone(),
            base: self.0.base.clone(),
            lock: self.0.lock.clone(),
            fence: self.0.fence.clone(),
            channel: format!("{}:{side}", self.0.channel),
        }))
    }

    /// Another key of the same primitive, in the lock key's cluster slot.
    pub fn companion(&self, suffix: &str) -> String {
        format!("{}:{suffix}", self.0.base)
    }
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
            } else {
                // Only the brace case may be refused for names within the limits.
                let key = format!("{prefix}{name}");
                prop_assert!(key.contains('}'), "refused {:?}", key);
            }
        }
    }
}
