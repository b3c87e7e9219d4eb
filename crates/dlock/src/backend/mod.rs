//! The stores dlock runs on. Each implements the [`raw`](crate::raw) traits.

mod memory;
mod quorum;
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

/// `scheme://user:password@host…` with the password (in the user info, or a `password=`
/// query parameter) replaced by `***`, for messages.
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

#[cfg(any(feature = "postgres", feature = "zookeeper"))]
pub(crate) fn redact_url(url: &str) -> String {
    use std::fmt::Write as _;
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    // The authority ends at the first '/' or '?'; its user info at the last '@'.
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let mut out = format!("{scheme}://");
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _)) => {
                let _ = write!(out, "{user}:***@{host}");
            }
            None => {
                let _ = write!(out, "{userinfo}@{host}");
            }
        },
        None => out.push_str(authority),
    }
    // A password can also come as a query parameter.
    let (path, query) = tail.split_once('?').unwrap_or((tail, ""));
    out.push_str(path);
    if !tail.contains('?') {
        return out;
    }
    let query = query
        .split('&')
        .map(|p| match p.split_once('=') {
            Some(("password", _)) => "password=***".to_owned(),
            _ => p.to_owned(),
        })
        .collect::<Vec<_>>()
        .join("&");
    out.push('?');
    out.push_str(&query);
    out
}
