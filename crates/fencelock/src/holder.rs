//! Who holds a lock: metadata a holder attaches for operators (host, process id, a
//! command or any value of the caller's, since when), carried inside its owner token.
//!
//! The metadata travels in the token, so it costs no extra round trip, needs nothing of a
//! store that it does not already do, and expires, is renewed and is released with the
//! lease itself: the token at the lock key is `<32 hex digits>~<fields>`, where the fields
//! are `h=<host>`, `p=<pid>`, `s=<since, Unix ms>` and `c=<command or value>`, separated by
//! `;`, each value percent-encoded. [`LockState::holder_info`](crate::raw::LockState)
//! reads it back for `dlock status`, `list` and `top`. Whoever can read the lock key can
//! read it: put no secret in it.

use std::fmt::Write as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::token::Token;

/// What marks the metadata's start in a token.
const SEPARATOR: char = '~';
/// The longest token a store is handed (see [`Token::from_string`]).
const MAX_TOKEN: usize = 256;

/// Who holds a lock, as the holder chose to tell. Attach it with a builder's
/// `holder_info(...)`; read it from [`LockState::holder_info`](crate::raw::LockState).
///
/// ```
/// let me = fencelock::HolderInfo::current().command("nightly-backup");
/// assert_eq!(me.pid, Some(std::process::id()));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct HolderInfo {
    /// The holder's host name.
    pub host: Option<String>,
    /// The holder's process id.
    pub pid: Option<u32>,
    /// The command it runs, or any value of the caller's (a job id, a build number). Cut
    /// to fit the token's 256 bytes.
    pub command: Option<String>,
    /// When the holder asked for the lock: for a lock taken without waiting, when it was
    /// taken. Filled in at each acquire; what a builder was given is ignored.
    pub since: Option<SystemTime>,
}

impl HolderInfo {
    /// This process: the host name (from `/proc/sys/kernel/hostname`, else `$HOSTNAME`)
    /// and the process id; no command.
    pub fn current() -> HolderInfo {
        HolderInfo {
            host: host_name(),
            pid: Some(std::process::id()),
            command: None,
            since: None,
        }
    }

    /// With `command` (or any value) as the command.
    #[must_use]
    pub fn command(mut self, command: impl Into<String>) -> HolderInfo {
        self.command = Some(command.into());
        self
    }

    /// With `host` as the host name.
    #[must_use]
    pub fn host(mut self, host: impl Into<String>) -> HolderInfo {
        self.host = Some(host.into());
        self
    }

    /// How long ago the holder asked for the lock, by this machine's clock (`None`
    /// without `since`, or for a time in the future).
    pub fn age(&self) -> Option<Duration> {
        SystemTime::now().duration_since(self.since?).ok()
    }

    /// Reads the metadata from a token as stored at a lock key: `None` if it carries none
    /// (a token of another client, a random one) or it does not parse.
    pub fn from_token(token: &str) -> Option<HolderInfo> {
        let (_, fields) = token.split_once(SEPARATOR)?;
        let mut info = HolderInfo::default();
        for field in fields.split(';').filter(|f| !f.is_empty()) {
            let (key, value) = field.split_once('=')?;
            let value = decode(value)?;
            match key {
                "h" => info.host = Some(value),
                "p" => info.pid = Some(value.parse().ok()?),
                "s" => {
                    let ms: u64 = value.parse().ok()?;
                    info.since = UNIX_EPOCH.checked_add(Duration::from_millis(ms));
                }
                "c" => info.command = Some(value),
                // Fields of a later version: skipped.
                _ => {}
            }
        }
        (info != HolderInfo::default()).then_some(info)
    }

    /// A fresh random token carrying this metadata (with `since` = now), cut to fit the
    /// token's length limit: the command first, then the host.
    pub(crate) fn token(&self) -> crate::Result<Token> {
        let random = Token::random()?;
        let since = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        let mut text = String::with_capacity(MAX_TOKEN);
        text.push_str(random.as_str());
        text.push(SEPARATOR);
        if let Some(pid) = self.pid {
            let _ = write!(text, "p={pid};");
        }
        let _ = write!(text, "s={since}");
        for (key, value) in [("h", &self.host), ("c", &self.command)] {
            if let Some(value) = value {
                let room = MAX_TOKEN.saturating_sub(text.len() + key.len() + 2);
                let encoded = encode(value, room);
                if !encoded.is_empty() {
                    let _ = write!(text, ";{key}={encoded}");
                }
            }
        }
        Token::from_string(text)
    }
}

/// The host name, if the system tells it.
fn host_name() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
}

/// `value` percent-encoded (all but ASCII letters, digits, `-`, `.`, `_`), whole
/// characters only, in at most `room` bytes.
fn encode(value: &str, room: usize) -> String {
    let mut out = String::new();
    for c in value.chars() {
        let mut piece = String::new();
        if c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_') {
            piece.push(c);
        } else {
            let mut buf = [0u8; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                let _ = write!(piece, "%{b:02X}");
            }
        }
        if out.len() + piece.len() > room {
            break;
        }
        out.push_str(&piece);
    }
    out
}

/// Percent-decoding, the inverse of [`encode`] (and of the ZooKeeper backend's name
/// escaping): `None` for a bad escape or bytes that are not UTF-8.
pub(crate) fn decode(value: &str) -> Option<String> {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = value.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_goes_into_the_token_and_comes_back() {
        let info = HolderInfo::current()
            .host("web-1.example")
            .command("backup --all; rm /tmp/x ~ é");
        let token = info.token().expect("token");
        let text = token.as_str();
        assert!(text.len() <= MAX_TOKEN);
        assert!(text[..32].bytes().all(|b| b.is_ascii_hexdigit()));
        assert!(!text.contains(' '), "{text}");
        let back = HolderInfo::from_token(text).expect("parses");
        assert_eq!(back.host.as_deref(), Some("web-1.example"));
        assert_eq!(back.pid, Some(std::process::id()));
        assert_eq!(back.command.as_deref(), Some("backup --all; rm /tmp/x ~ é"));
        assert!(back.age().expect("since") < Duration::from_secs(60));
    }

    #[test]
    fn a_long_command_is_cut_to_fit_the_token() {
        let info = HolderInfo::current().command("é".repeat(500));
        let token = info.token().expect("a token within the limit");
        assert!(token.as_str().len() <= MAX_TOKEN);
        let back = HolderInfo::from_token(token.as_str()).expect("parses");
        let command = back.command.expect("some of the command");
        assert!(!command.is_empty() && command.chars().all(|c| c == 'é'));
    }

    #[test]
    fn tokens_without_metadata_or_with_bad_metadata_read_as_none() {
        let random = Token::random().expect("token");
        assert_eq!(HolderInfo::from_token(random.as_str()), None);
        for bad in [
            "x~",
            "x~p=abc",
            "x~h=%G1",
            "x~h=%C3",
            "x~novalue",
            "x~s=99999999999999999999",
        ] {
            assert_eq!(HolderInfo::from_token(bad), None, "{bad}");
        }
        let later = HolderInfo::from_token("x~p=7;z=new").expect("unknown fields skipped");
        assert_eq!(later.pid, Some(7));
    }
}
