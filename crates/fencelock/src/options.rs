//! The options every primitive's builder takes — name, key prefix, lease length, watchdog,
//! retry — written once: one [`Options`] value inside each builder, one set of setters
//! ([`builder_options!`]), and `Lock::from_options`, the one place that checks them
//! and makes the lock each primitive is built on.

use std::time::Duration;

use crate::engine::wait::Retry;
use crate::error::{Error, Result};
use crate::keys::LockKeys;

/// Default lease length.
pub const DEFAULT_TTL: Duration = Duration::from_secs(30);

/// What every builder holds besides its client and its own options.
#[derive(Debug, Clone)]
pub(crate) struct Options {
    pub(crate) name: String,
    pub(crate) prefix: String,
    pub(crate) ttl: Duration,
    pub(crate) watchdog: bool,
    pub(crate) retry: Retry,
    pub(crate) holder: Option<std::sync::Arc<crate::HolderInfo>>,
    /// Whether metrics carry the lock's name as a label ([`crate::observe`]).
    pub(crate) name_label: bool,
}

impl Options {
    /// The defaults: 30 s leases, watchdog on, default retry, the primitive's prefix.
    pub(crate) fn new(name: String, prefix: &str) -> Options {
        Options {
            name,
            prefix: prefix.to_owned(),
            ttl: DEFAULT_TTL,
            watchdog: true,
            retry: Retry::default(),
            holder: None,
            name_label: false,
        }
    }

    /// Lays out the keys of the name under the prefix.
    pub(crate) fn keys(&self) -> Result<LockKeys> {
        LockKeys::new(&self.prefix, &self.name)
    }
}

/// Checks a waiter's or writer's grace: 10 ms to 60 s.
pub(crate) fn check_grace(grace: Duration, what: &str) -> Result<Duration> {
    if grace < Duration::from_millis(10) || grace > Duration::from_secs(60) {
        return Err(Error::invalid(format!(
            "{what} must be between 10 ms and 60 s"
        )));
    }
    Ok(grace)
}

/// The setters every builder shares, on its `options` field.
macro_rules! builder_options {
    ($builder:ident<B: $bound:path>, $prefix:path) => {
        impl<B: $bound> $builder<B> {
            /// Lease length (default 30 s, at least [`MIN_TTL`](crate::MIN_TTL), at most
            /// [`MAX_TTL`](crate::MAX_TTL)). With the watchdog on, every hold is renewed
            /// every third of its lease and a crashed holder's is freed within `ttl`; with
            /// it off, a hold lasts at most `ttl`.
            ///
            /// **ZooKeeper** holds live in the client's session, which changes both
            /// bounds: a hold's lease ([`LockGuard::lease`](crate::LockGuard::lease)) is
            /// `min(ttl, ⅔ of the session timeout)`, and a holder that crashes (or loses
            /// the ensemble) is freed when its session expires — within the **session
            /// timeout** (`ZooKeeper::session_timeout`, 10 s unless the URL's
            /// `?session_timeout=` says otherwise), not within `ttl`. A ttl shorter than
            /// the session timeout therefore bounds holders that live, not crashed ones
            /// (the client warns once); connect with a session timeout no longer than the
            /// ttl for the ttl to bound both.
            pub fn ttl(mut self, ttl: std::time::Duration) -> Self {
                self.options.ttl = ttl;
                self
            }

            /// Whether to renew holds for as long as their guards live (default `true`).
            pub fn watchdog(mut self, on: bool) -> Self {
                self.options.watchdog = on;
                self
            }

            /// Backoff between attempts on stores that cannot announce releases (and the
            /// fallback when a holder's remaining ttl is unknown).
            pub fn retry(mut self, retry: crate::Retry) -> Self {
                self.options.retry = retry;
                self
            }

            /// Who the holder is, for operators: carried in every token this primitive
            /// mints, shown by [`LockState::holder_info`](crate::raw::LockState) (`dlock
            /// status`, `list`, `top`). No extra round trip; no secrets (anyone who can
            /// read the key can read it). See [`HolderInfo`](crate::HolderInfo).
            pub fn holder_info(mut self, info: crate::HolderInfo) -> Self {
                self.options.holder = Some(std::sync::Arc::new(info));
                self
            }

            /// Whether this lock's metrics carry its name as a `lock` label (default
            /// `false`). Each name is a series of its own in every metric: opt in only for a
            /// few well-known names, never for names made per request or per user. Spans
            /// always carry the name. See [`observe`](crate::observe).
            pub fn metrics_name_label(mut self, on: bool) -> Self {
                self.options.name_label = on;
                self
            }

            #[doc = concat!("Key prefix (default [`", stringify!($prefix), "`]). With an")]
            /// empty prefix the key is the name itself (for the plain lock: sharing a key
            /// with another client of the standard `SET NX PX` protocol).
            pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
                self.options.prefix = prefix.into();
                self
            }
        }
    };
}
pub(crate) use builder_options;
