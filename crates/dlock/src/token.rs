//! Owner tokens and fencing tokens.

use std::fmt;
use std::sync::Arc;

use crate::error::{Error, ErrorKind, Result};

/// The random value that marks one holder of one lock.
///
/// 128 bits from the operating system's generator, written as 32 lowercase hex digits, so
/// it is a plain string any client speaking the standard `SET NX PX` / compare-and-delete
/// protocol can store and compare. Only the holder knows it, so only the holder can release
/// or extend the lock.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Token(Arc<str>);

impl Token {
    /// Number of random bytes in a token.
    pub const RANDOM_BYTES: usize = 16;

    /// Draws a fresh token from the OS random number generator.
    ///
    /// # Errors
    /// [`ErrorKind::Backend`] if the OS generator fails (it practically never does).
    pub fn random() -> Result<Token> {
        let mut bytes = [0u8; Self::RANDOM_BYTES];
        getrandom::fill(&mut bytes).map_err(|e| {
            Error::new(
                ErrorKind::Backend,
                format!("OS random generator failed: {e}"),
            )
        })?;
        let mut hex = String::with_capacity(Self::RANDOM_BYTES * 2);
        for b in bytes {
            const DIGITS: &[u8; 16] = b"0123456789abcdef";
            hex.push(char::from(DIGITS[usize::from(b >> 4)]));
            hex.push(char::from(DIGITS[usize::from(b & 0x0f)]));
        }
        Ok(Token(hex.into()))
    }

    /// Wraps a token obtained elsewhere (for example printed by `dlock acquire`), so that
    /// the holder can release or extend the lock from another process.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidArgument`] if `s` is empty or longer than 256 bytes.
    pub fn from_string(s: impl Into<String>) -> Result<Token> {
        let s = s.into();
        if s.is_empty() || s.len() > 256 {
            return Err(Error::invalid("a token must be 1 to 256 bytes long"));
        }
        Ok(Token(s.into()))
    }

    /// The token as stored at the lock key.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Token {
    // Only a prefix: a full token in a log line lets anyone who reads logs release the lock.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown: String = self.0.chars().take(8).collect();
        write!(f, "Token({shown}…)")
    }
}

/// A number that strictly increases with every grant of one lock name.
///
/// Pass it along with every write to the protected resource; the resource remembers the
/// highest token it has seen and rejects writes carrying a smaller one. That turns a holder
/// whose lease silently ran out (a GC pause, a stalled VM) from a corrupting writer into a
/// rejected one — see the crate docs' safety section.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(u64);

impl FencingToken {
    /// Wraps a raw fence value minted by a backend.
    pub const fn new(value: u64) -> Self {
        FencingToken(value)
    }

    /// The raw value.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_tokens_are_128_bit_hex_and_distinct() {
        let a = Token::random().expect("rng");
        let b = Token::random().expect("rng");
        assert_eq!(a.as_str().len(), 32);
        assert!(a.as_str().bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
        assert!(!format!("{a:?}").contains(a.as_str()));
    }

    #[test]
    fn token_from_string_validates() {
        assert_eq!(
            Token::from_string("").map_err(|e| e.kind()).err(),
            Some(ErrorKind::InvalidArgument)
        );
        assert!(Token::from_string("x".repeat(257)).is_err());
        assert_eq!(Token::from_string("abc").expect("ok").as_str(), "abc");
    }

    #[test]
    fn fencing_tokens_order_by_value() {
        assert!(FencingToken::new(2) > FencingToken::new(1));
        assert_eq!(FencingToken::new(7).to_string(), "7");
    }
}
