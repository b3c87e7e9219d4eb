//! Owner tokens and fencing tokens.

use std::cell::RefCell;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use crate::error::{Error, ErrorKind, Result};

/// The random value that marks one holder of one lock.
///
/// 128 bits from the operating system's generator, written as 32 lowercase hex digits, so
/// it is a plain string any client speaking the standard `SET NX PX` / compare-and-delete
/// protocol can store and compare. Only the holder knows it, so only the holder can release
/// or extend the lock.
///
/// A token of up to 32 bytes (every random one) is stored inline: making or cloning it
/// allocates nothing.
#[derive(Clone)]
pub struct Token(Repr);

#[derive(Clone)]
enum Repr {
    /// `len` bytes of UTF-8 at the start of `bytes`.
    Inline { len: u8, bytes: [u8; INLINE] },
    /// A longer token handed to [`Token::from_string`].
    Shared(Arc<str>),
}

/// Longest token stored inline, in bytes (a random token's 32 hex digits).
const INLINE: usize = 32;

impl Token {
    /// Number of random bytes in a token.
    pub const RANDOM_BYTES: usize = 16;

    /// Draws a fresh token from the OS random number generator.
    ///
    /// The bytes come straight from the OS generator (`getrandom`), read a batch at a time
    /// into a small per-thread buffer: one system call serves many tokens. Each batch
    /// belongs to the process that read it — a forked child never hands out its parent's
    /// bytes — and every 16 bytes are handed out once, then wiped from the buffer.
    ///
    /// # Errors
    /// [`ErrorKind::Backend`] if the OS generator fails (it practically never does).
    pub fn random() -> Result<Token> {
        let mut random = [0u8; Self::RANDOM_BYTES];
        if !crate::simulation::fill(&mut random) {
            draw(&mut random).map_err(|e| {
                Error::new(
                    ErrorKind::Backend,
                    format!("OS random generator failed: {e}"),
                )
            })?;
        }
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut bytes = [0u8; INLINE];
        for (pair, b) in bytes.chunks_exact_mut(2).zip(random) {
            pair[0] = DIGITS[usize::from(b >> 4)];
            pair[1] = DIGITS[usize::from(b & 0x0f)];
        }
        Ok(Token(Repr::Inline {
            len: INLINE as u8,
            bytes,
        }))
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
        if s.len() <= INLINE {
            let mut bytes = [0u8; INLINE];
            bytes[..s.len()].copy_from_slice(s.as_bytes());
            return Ok(Token(Repr::Inline {
                len: s.len() as u8,
                bytes,
            }));
        }
        Ok(Token(Repr::Shared(s.into())))
    }

    /// The token as stored at the lock key.
    pub fn as_str(&self) -> &str {
        match &self.0 {
            // Always valid: the bytes were copied from a `str` or are hex digits.
            Repr::Inline { len, bytes } => {
                std::str::from_utf8(&bytes[..usize::from(*len)]).unwrap_or_default()
            }
            Repr::Shared(s) => s,
        }
    }
}

impl PartialEq for Token {
    fn eq(&self, other: &Token) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for Token {}

impl Hash for Token {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_str().hash(state);
    }
}

/// Bytes of OS randomness read per system call (64 tokens' worth).
const POOL_BYTES: usize = 1024;

/// One thread's batch of OS randomness: `bytes[next..]` not handed out yet, read by
/// process `pid`.
struct Pool {
    bytes: [u8; POOL_BYTES],
    next: usize,
    pid: u32,
}

thread_local! {
    static POOL: RefCell<Option<Box<Pool>>> = const { RefCell::new(None) };
}

/// Fills `out` with OS randomness from this thread's batch, reading a new batch when it
/// is used up or was read by another process (we are a fork of it: its remaining bytes
/// are the parent's too, so they are thrown away).
fn draw(out: &mut [u8; Token::RANDOM_BYTES]) -> std::result::Result<(), getrandom::Error> {
    let drawn = POOL.try_with(|cell| {
        let Ok(mut slot) = cell.try_borrow_mut() else {
            return None;
        };
        let pool = slot.get_or_insert_with(|| {
            Box::new(Pool {
                bytes: [0; POOL_BYTES],
                next: POOL_BYTES,
                pid: 0,
            })
        });
        let pid = std::process::id();
        if pool.pid != pid || pool.next + out.len() > POOL_BYTES {
            pool.next = POOL_BYTES; // unusable until the read succeeds
            pool.bytes.fill(0);
            if let Err(e) = getrandom::fill(&mut pool.bytes) {
                return Some(Err(e));
            }
            pool.next = 0;
            pool.pid = pid;
        }
        let taken = &mut pool.bytes[pool.next..pool.next + out.len()];
        out.copy_from_slice(taken);
        taken.fill(0);
        pool.next += out.len();
        Some(Ok(()))
    });
    match drawn {
        Ok(Some(result)) => result,
        // The thread is exiting (its buffer is gone), or the buffer is busy: read just
        // what we need.
        Ok(None) | Err(_) => getrandom::fill(out),
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for Token {
    // Only a prefix: a full token in a log line lets anyone who reads logs release the lock.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown: String = self.as_str().chars().take(8).collect();
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
    fn random_tokens_are_unique_and_every_one_of_the_128_bits_varies() {
        // Many batches' worth, on several threads (each with its own batch).
        let tokens: Vec<Token> = std::thread::scope(|scope| {
            let threads: Vec<_> = (0..4)
                .map(|_| {
                    scope.spawn(|| {
                        (0..2_500)
                            .map(|_| Token::random().expect("rng"))
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            threads
                .into_iter()
                .flat_map(|t| t.join().expect("thread"))
                .collect()
        });
        let distinct: std::collections::HashSet<&str> = tokens.iter().map(Token::as_str).collect();
        assert_eq!(distinct.len(), tokens.len());
        let mut ones = [0u32; 128];
        for t in &tokens {
            let s = t.as_str();
            assert_eq!(s.len(), 2 * Token::RANDOM_BYTES);
            assert!(s.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')));
            let v = u128::from_str_radix(s, 16).expect("hex");
            for (bit, n) in ones.iter_mut().enumerate() {
                *n += u32::from(v >> bit & 1 == 1);
            }
        }
        // 10 000 fair coin flips per bit: 5 000 ± 300 (six standard deviations) holds for
        // all 128 bits with overwhelming odds; a stuck, repeated or counter-like bit would
        // not.
        for (bit, n) in ones.iter().enumerate() {
            assert!((4_700..=5_300).contains(n), "bit {bit} was set {n} times");
        }
    }

    #[test]
    fn tokens_compare_by_their_string_whatever_their_storage() {
        let a = Token::random().expect("rng");
        let b = Token::from_string(a.as_str()).expect("ok");
        assert_eq!(a, b);
        let state = std::collections::hash_map::RandomState::new();
        assert_eq!(
            std::hash::BuildHasher::hash_one(&state, &a),
            std::hash::BuildHasher::hash_one(&state, &b)
        );
        let long = "t".repeat(200);
        let c = Token::from_string(long.clone()).expect("ok");
        assert_eq!(c.as_str(), long);
        assert_eq!(c, Token::from_string(long).expect("ok"));
        assert_ne!(a, c);
        assert_eq!(
            Token::from_string("x".repeat(32))
                .expect("ok")
                .as_str()
                .len(),
            32
        );
        assert_eq!(
            Token::from_string("x".repeat(33))
                .expect("ok")
                .as_str()
                .len(),
            33
        );
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

/// Hostile input: `--token` and `DLOCK_TOKEN` come from outside.
#[cfg(test)]
mod props {
    use proptest::prelude::*;

    use super::Token;

    proptest! {
        #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::with_cases(256) })]

        #[test]
        fn any_string_is_a_token_or_invalid(s in prop_oneof![any::<String>(), "[ -~]{250,260}", ".{0,80}"]) {
            match Token::from_string(s.clone()) {
                Ok(token) => {
                    prop_assert_eq!(token.as_str(), s.as_str());
                    prop_assert!((1..=256).contains(&s.len()));
                }
                Err(e) => {
                    prop_assert_eq!(e.kind(), crate::ErrorKind::InvalidArgument);
                    prop_assert!(s.is_empty() || s.len() > 256);
                }
            }
        }
    }
}
