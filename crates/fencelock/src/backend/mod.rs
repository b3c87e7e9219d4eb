//! The stores dlock runs on. Each implements the [`raw`](crate::raw) traits.

pub mod hazard;
mod memory;
mod quorum;
pub use hazard::{ConfigHazard, HazardKind, refuse_config_hazards};
pub use memory::Memory;
#[cfg(any(feature = "etcd", feature = "postgres", feature = "zookeeper"))]
pub(crate) use memory::glob_match;
pub use quorum::{DEFAULT_NODE_TIMEOUT_FRACTION, Quorum, QuorumBuilder};

#[cfg(feature = "redis")]
pub mod redis;
#[cfg(feature = "redis")]
pub use self::redis::Redis;

#[cfg(feature = "memcached")]
pub mod memcached;
#[cfg(feature = "memcached")]
pub use self::memcached::Memcached;

#[cfg(feature = "etcd")]
pub mod etcd;
#[cfg(feature = "etcd")]
pub use self::etcd::Etcd;

#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "postgres")]
pub use self::postgres::{PgAdvisory, Postgres};

#[cfg(feature = "zookeeper")]
pub mod zookeeper;
#[cfg(feature = "zookeeper")]
pub use self::zookeeper::ZooKeeper;

/// An election record as one string, `<term>\n<data>`, for stores that keep it in one
/// value (etcd, memcached, ZooKeeper).
#[cfg(any(feature = "etcd", feature = "memcached", feature = "zookeeper"))]
pub(crate) fn record_text(term: u64, data: &str) -> String {
    format!("{term}\n{data}")
}

/// The `(term, data)` of a stored [`record_text`]; `where_` names the record in the error
/// when it is not one (a `Backend` error: something else wrote the key).
#[cfg(any(feature = "etcd", feature = "memcached", feature = "zookeeper"))]
pub(crate) fn parse_record(stored: &[u8], where_: &str) -> crate::Result<(u64, String)> {
    std::str::from_utf8(stored)
        .ok()
        .and_then(|text| text.split_once('\n'))
        .and_then(|(term, data)| Some((term.parse().ok()?, data.to_owned())))
        .ok_or_else(|| {
            crate::Error::new(
                crate::ErrorKind::Backend,
                format!("the election record {where_} is not `<term>\\n<data>`"),
            )
        })
}

/// Query parameters whose name contains one of these hold secrets (`password=`,
/// redis+unix's `pass=`, libpq's `sslpassword=`, a ZooKeeper `digest=user:password`).
const SECRET_PARAMETERS: [&str; 5] = ["pass", "secret", "token", "auth", "digest"];

/// A store URL fit for messages and logs: its secrets replaced by `***` — the user
/// info's password (a plain user name before it is kept), and the value of every query
/// parameter whose name contains `pass`, `secret`, `token`, `auth` or `digest`
/// (`password=`, redis+unix's `pass=`, libpq's `sslpassword=`). Every backend shows URLs
/// this way; applications (and the `dlock` tool) can too.
///
/// Hostile input (a URL the backend then refuses) must not leak either, so the user info
/// is taken to run from the scheme to the **last** `@` anywhere in the text: a password
/// that is not percent-encoded may contain `/`, `?`, `#`, `:` or `@`, which would end a
/// URL parser's authority early. Without `://` (a mistyped `redis:/user:pw@host`),
/// everything up to the last `@` is hidden. This hides too much in URLs with an `@` in
/// their path or query, never too little.
///
/// ```
/// use fencelock::backend::redact_url;
/// assert_eq!(redact_url("redis://app:s3cret@db:6379/0"), "redis://app:***@db:6379/0");
/// assert_eq!(redact_url("redis:/app:s3cret@db"), "***@db");
/// assert_eq!(redact_url("postgres://db/x?password=s3cret"), "postgres://db/x?password=***");
/// ```
pub fn redact_url(url: &str) -> String {
    let last_at = url.rfind('@');
    // A scheme only where everything before `://` can be one (RFC 3986: letters, digits,
    // `+ - .`): in a mistyped `redis:/:pa://ss@h` the `://` is inside the password.
    let scheme_end = url
        .find("://")
        .filter(|&i| {
            i > 0
                && url[..i]
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b))
        })
        .map_or(0, |i| i + 3);
    let mut out = String::with_capacity(url.len() + 8);
    let rest = match last_at {
        Some(at) => {
            // An '@' before the scheme's end: no scheme to keep, hide from the start.
            let start = if scheme_end <= at { scheme_end } else { 0 };
            out.push_str(&url[..start]);
            match url[start..at].split_once(':') {
                // A user name is kept only where it is unambiguous: right after `://`.
                Some((user, _)) if start > 0 && !user.contains(['/', '?', '#']) => {
                    out.push_str(user);
                    out.push_str(":***@");
                }
                // A lone name before '@' may well be a password (`redis://secret@host`).
                _ => out.push_str("***@"),
            }
            &url[at + 1..]
        }
        None => url,
    };
    // Every `key=value` between '?' / '&' delimiters: a query's parameters (also when its
    // '?' came before the last '@'), at worst a path segment that looks like one.
    let mut at = 0;
    for pair in rest.split(['?', '&']) {
        if at > 0 {
            // The delimiter before this piece (one byte: '?' or '&').
            out.push_str(&rest[at - 1..at]);
        }
        at += pair.len() + 1;
        match pair.split_once('=') {
            Some((key, _))
                if SECRET_PARAMETERS
                    .iter()
                    .any(|word| key.to_ascii_lowercase().contains(word)) =>
            {
                out.push_str(key);
                out.push_str("=***");
            }
            _ => out.push_str(pair),
        }
    }
    out
}

/// Polls every future at once; their outputs in order.
pub(crate) async fn join_all<F: std::future::Future>(
    futures: impl IntoIterator<Item = F>,
) -> Vec<F::Output> {
    let mut pending: Vec<std::pin::Pin<Box<F>>> = futures.into_iter().map(Box::pin).collect();
    let mut out: Vec<Option<F::Output>> = pending.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut done = true;
        for (fut, slot) in pending.iter_mut().zip(out.iter_mut()) {
            if slot.is_none() {
                match fut.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => *slot = Some(v),
                    std::task::Poll::Pending => done = false,
                }
            }
        }
        if done {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await;
    out.into_iter().flatten().collect()
}

/// Strategies and checks shared by the backends' property tests of hostile input.
#[cfg(test)]
#[cfg(any(
    feature = "redis",
    feature = "memcached",
    feature = "etcd",
    feature = "postgres",
    feature = "zookeeper"
))]
pub(crate) mod hostile {
    use proptest::prelude::*;

    pub(crate) use dlock_hostile::{any_url, cases, password, url_with_password};

    /// The parse result of hostile input: a value, or an `InvalidArgument` that shows
    /// nothing of `secret` (in its `Display` or its `Debug`, source included).
    pub(crate) fn check<T>(result: &crate::Result<T>, secret: &str) -> Result<(), TestCaseError> {
        if let Err(err) = result {
            prop_assert_eq!(err.kind(), crate::ErrorKind::InvalidArgument, "{}", err);
            if !secret.is_empty() {
                prop_assert!(!err.to_string().contains(secret), "leak: {}", err);
                prop_assert!(!format!("{err:?}").contains(secret), "leak: {:?}", err);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[cfg(any(
    feature = "redis",
    feature = "memcached",
    feature = "etcd",
    feature = "postgres",
    feature = "zookeeper"
))]
mod redact_props {
    use super::hostile::{password, url_with_password};
    use super::redact_url;
    use proptest::prelude::*;

    const SCHEMES: &[&str] = &[
        "redis",
        "rediss",
        "redis+unix",
        "redis+sentinel",
        "redis+cluster",
        "redlock",
        "memcache",
        "etcd",
        "postgres",
        "postgresql",
        "zk",
    ];

    #[test]
    fn known_shapes() {
        for (url, shown) in [
            ("redis://u:pw@h:1/0", "redis://u:***@h:1/0"),
            ("redis://:pw@h", "redis://:***@h"),
            ("redis://pw@h", "redis://***@h"),
            ("redis://u:p/w?x#y@h", "redis://u:***@h"),
            ("postgres://u:p@w@h/db", "postgres://u:***@h/db"),
            ("redis:/u:pw@h", "***@h"),
            // A mistyped separator, and the password holding a `://` of its own.
            ("redis:/:pa://ss@h", "***@h"),
            ("u:pw@h:1", "***@h:1"),
            (
                "redis+unix:///s?db=1&pass=pw",
                "redis+unix:///s?db=1&pass=***",
            ),
            (
                "postgres://h/x?sslpassword=pw&a=b",
                "postgres://h/x?sslpassword=***&a=b",
            ),
            ("redis://h:1/0", "redis://h:1/0"),
            ("", ""),
        ] {
            assert_eq!(redact_url(url), shown, "{url}");
        }
    }

    proptest! {
        #![proptest_config(super::hostile::cases(256))]

        #[test]
        fn never_panics(url in any::<String>()) {
            let _ = redact_url(&url);
        }

        #[test]
        fn hides_every_password((url, secret) in url_with_password(SCHEMES)) {
            let shown = redact_url(&url);
            prop_assert!(!shown.contains(&secret), "{} -> {}", url, shown);
        }

        #[test]
        fn hides_a_password_given_alone(pw in password(), host in "[a-z0-9.:]{0,12}") {
            // No user (then the password has no ':' by URL syntax), an empty user.
            let pw = pw.replace(':', ";");
            for url in [format!("redis://{pw}@{host}"), format!("redis://:{pw}@{host}"), format!("{pw}@{host}")] {
                let shown = redact_url(&url);
                prop_assert!(host.contains(&pw) || !shown.contains(&pw), "{} -> {}", url, shown);
            }
        }

        #[test]
        fn hides_a_password_holding_a_scheme_separator(
            scheme in "[a-z]{1,6}", left in "[A-Z0-9]{1,8}", right in "[A-Z0-9]{1,8}", host in "[a-z]{1,8}"
        ) {
            // `scheme:/:left://right@host`: one '/' missing, so `left://right` is the password.
            let url = format!("{scheme}:/:{left}://{right}@{host}");
            let shown = redact_url(&url);
            prop_assert!(!shown.contains(&format!(":{left}")) && !shown.contains(&right), "{} -> {}", url, shown);
        }

        #[test]
        fn urls_without_secrets_are_unchanged(url in "[a-z+]{1,10}://[a-z0-9.:,/]{0,30}(\\?[a-z_]{1,8}=[a-z0-9]{0,5})?") {
            prop_assume!(!super::SECRET_PARAMETERS.iter().any(|w| url.contains(w)));
            prop_assert_eq!(redact_url(&url), url);
        }
    }
}

#[cfg(test)]
#[cfg(any(feature = "etcd", feature = "memcached", feature = "zookeeper"))]
mod record_props {
    use super::{parse_record, record_text};
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(super::hostile::cases(256))]

        #[test]
        fn records_round_trip(term in any::<u64>(), data in any::<String>()) {
            let parsed = parse_record(record_text(term, &data).as_bytes(), "x")
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(parsed, (term, data));
        }

        #[test]
        fn any_bytes_parse_or_are_a_backend_error(stored in prop::collection::vec(any::<u8>(), 0..64)) {
            match parse_record(&stored, "in test") {
                Ok((term, data)) => {
                    // The term is what precedes the first line break, the data all after.
                    let text = std::str::from_utf8(&stored).map_err(|e| TestCaseError::fail(e.to_string()))?;
                    let (head, tail) = text.split_once('\n').ok_or_else(|| TestCaseError::fail("no line"))?;
                    prop_assert_eq!(head.parse::<u64>().ok(), Some(term));
                    prop_assert_eq!(tail, data);
                }
                Err(e) => prop_assert_eq!(e.kind(), crate::ErrorKind::Backend),
            }
        }
    }
}
