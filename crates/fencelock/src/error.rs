//! The one error type of the crate.
//!
//! Contention is not an error: `try_*` methods return `Ok(None)` when someone else holds a
//! lock. An [`Error`] means the operation could not be carried out (or, for
//! [`ErrorKind::LockLost`], that a guarantee the caller relied on no longer holds).

use std::borrow::Cow;
use std::fmt;

/// What went wrong, in terms a caller can act on.
///
/// The store client's own error, where there is one, is reachable through
/// [`std::error::Error::source`]; it is not part of this crate's API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The lock was no longer ours: its lease ran out, the key was deleted, or another
    /// holder took it over. Work done under the lock may have overlapped with another
    /// holder's; a fenced resource will have rejected stale writes.
    LockLost,
    /// An argument or option was out of range or malformed (empty name, zero ttl, bad URL…).
    /// Nothing was sent to the store.
    InvalidArgument,
    /// The store could not be reached (connection refused, dropped, DNS…).
    Unavailable,
    /// A store operation did not complete within its time bound. Whether it took effect is
    /// unknown; dlock's operations are safe to retry.
    TimedOut,
    /// The store answered with an error or an unexpected reply (wrong value type at the
    /// lock key, scripting not permitted, protocol mismatch…).
    Backend,
    /// A configured limit would be exceeded (a reentrant lock's hold count at its
    /// reentrancy limit). Nothing changed in the store.
    LimitReached,
    /// The store applied a grant or renewal, but fewer replicas than required
    /// acknowledged it in time (`WAIT`); a grant was given back.
    NotReplicated,
    /// A quorum of independent stores (RedLock) could not decide: too few of its nodes
    /// answered for a majority either way. One node's failure alone never surfaces (a
    /// majority decides without it); this does, with every node's own error reachable
    /// through [`source`](std::error::Error::source) as [`NodeErrors`]. Whether a grant
    /// or release took effect on the nodes that did not answer is unknown; retrying is
    /// safe.
    QuorumNotReached,
    /// The store is configured so that it can drop a held lock (it may evict lock keys,
    /// or end the sessions locks live in), and the caller asked to refuse such a store
    /// ([`refuse_config_hazards`](crate::backend::refuse_config_hazards)). The message
    /// names each setting and how to change it.
    UnsafeConfig,
    /// A semaphore's permit count differs from the count the store holds for its name,
    /// and the semaphore was not told to set or adopt it (see
    /// [`SemaphoreBuilder::on_other_count`](crate::SemaphoreBuilder::on_other_count)):
    /// nothing was taken or queued. Both counts are reachable through
    /// [`source`](std::error::Error::source) as [`PermitCounts`]. Change the stored count
    /// with [`Semaphore::set_permits`](crate::Semaphore::set_permits) (every client of the
    /// name shares it), or use the stored one.
    PermitsMismatch,
    /// The store does not offer what was asked of it (an operator's inspection or
    /// force-unlock of a kind of primitive the store has no recipe for). Nothing was sent
    /// to the store.
    Unsupported,
}

impl ErrorKind {
    fn as_str(self) -> &'static str {
        match self {
            ErrorKind::LockLost => "lock lost",
            ErrorKind::InvalidArgument => "invalid argument",
            ErrorKind::Unavailable => "backend unavailable",
            ErrorKind::TimedOut => "timed out",
            ErrorKind::Backend => "backend error",
            ErrorKind::LimitReached => "limit reached",
            ErrorKind::NotReplicated => "not replicated",
            ErrorKind::QuorumNotReached => "quorum not reached",
            ErrorKind::UnsafeConfig => "unsafe store configuration",
            ErrorKind::PermitsMismatch => "permit count mismatch",
            ErrorKind::Unsupported => "unsupported",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

type Source = Box<dyn std::error::Error + Send + Sync + 'static>;

/// An error from a dlock operation: a [`kind`](Error::kind), a message, and maybe a source.
pub struct Error {
    inner: Box<Inner>,
}

struct Inner {
    kind: ErrorKind,
    message: Cow<'static, str>,
    retryable: bool,
    source: Option<Source>,
}

/// `Result<T, fencelock::Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// A new error of `kind`. Backends outside this crate use it to report their failures.
    pub fn new(kind: ErrorKind, message: impl Into<Cow<'static, str>>) -> Self {
        let retryable = matches!(
            kind,
            ErrorKind::Unavailable | ErrorKind::TimedOut | ErrorKind::QuorumNotReached
        );
        Error {
            inner: Box::new(Inner {
                kind,
                message: message.into(),
                retryable,
                source: None,
            }),
        }
    }

    /// Attaches the underlying error (kept behind [`std::error::Error::source`]).
    #[must_use]
    pub fn with_source(mut self, source: impl Into<Source>) -> Self {
        self.inner.source = Some(source.into());
        self
    }

    /// Overrides whether [`is_retryable`](Error::is_retryable) answers yes.
    #[must_use]
    pub fn retryable(mut self, retryable: bool) -> Self {
        self.inner.retryable = retryable;
        self
    }

    pub(crate) fn invalid(message: impl Into<Cow<'static, str>>) -> Self {
        Error::new(ErrorKind::InvalidArgument, message)
    }

    /// A semaphore `name` of `requested` permits found `stored` in the store.
    pub fn permits_mismatch(name: &str, stored: u32, requested: u32) -> Self {
        Error::new(
            ErrorKind::PermitsMismatch,
            format!(
                "semaphore {name:?} has {stored} permits in the store, not {requested}: change \
                 the count for every client with set_permits({requested}), or use {stored}"
            ),
        )
        .with_source(PermitCounts { stored, requested })
    }

    pub(crate) fn lost(message: impl Into<Cow<'static, str>>) -> Self {
        Error::new(ErrorKind::LockLost, message)
    }

    /// What kind of failure this is.
    pub fn kind(&self) -> ErrorKind {
        self.inner.kind
    }

    /// The human-readable message (without the kind or source).
    pub fn message(&self) -> &str {
        &self.inner.message
    }

    /// Whether the same call may succeed if tried again later: the store was unreachable,
    /// slow, or answered with a transient error. Invalid arguments and lost locks are not
    /// retryable.
    pub fn is_retryable(&self) -> bool {
        self.inner.retryable
    }

    /// Shorthand for `kind() == ErrorKind::LockLost`.
    pub fn is_lock_lost(&self) -> bool {
        self.kind() == ErrorKind::LockLost
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Error");
        d.field("kind", &self.inner.kind)
            .field("message", &self.inner.message)
            .field("retryable", &self.inner.retryable);
        if let Some(source) = &self.inner.source {
            d.field("source", source);
        }
        d.finish()
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.inner.kind, self.inner.message)
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.inner
            .source
            .as_ref()
            .map(|s| &**s as &(dyn std::error::Error + 'static))
    }
}

/// The two counts behind an [`ErrorKind::PermitsMismatch`] error (its
/// [`source`](std::error::Error::source)).
///
/// ```
/// # async fn demo(sem: fencelock::Semaphore<fencelock::backend::Memory>) -> fencelock::Result<()> {
/// use fencelock::{ErrorKind, PermitCounts};
/// if let Err(e) = sem.try_acquire().await {
///     if e.kind() == ErrorKind::PermitsMismatch {
///         let counts = std::error::Error::source(&e)
///             .and_then(|s| s.downcast_ref::<PermitCounts>());
///         if let Some(c) = counts {
///             eprintln!("the store has {} permits, we asked for {}", c.stored, c.requested);
///         }
///     }
/// }
/// # Ok::<(), fencelock::Error>(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct PermitCounts {
    /// The count the store holds for the semaphore's name.
    pub stored: u32,
    /// The count the semaphore was built with.
    pub requested: u32,
}

impl fmt::Display for PermitCounts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} permits stored, {} requested",
            self.stored, self.requested
        )
    }
}

impl std::error::Error for PermitCounts {}

/// Each node's error behind an [`ErrorKind::QuorumNotReached`] error (its
/// [`source`](std::error::Error::source)): which node (its position in the quorum and its
/// [`store_id`](crate::raw::RawLock::store_id), no password) and what it said.
///
/// ```
/// # async fn demo(quorum: fencelock::backend::Quorum<fencelock::backend::Memory>) -> fencelock::Result<()> {
/// use fencelock::{ErrorKind, NodeErrors};
/// let lock = fencelock::Lock::new(quorum, "report")?;
/// if let Err(e) = lock.try_lock().await {
///     if e.kind() == ErrorKind::QuorumNotReached {
///         let nodes = std::error::Error::source(&e)
///             .and_then(|s| s.downcast_ref::<NodeErrors>());
///         for (i, store, err) in nodes.into_iter().flat_map(NodeErrors::iter) {
///             eprintln!("node {i} ({store}): {err}");
///         }
///     }
/// }
/// # Ok::<(), fencelock::Error>(()) }
/// ```
#[derive(Debug)]
pub struct NodeErrors {
    nodes: usize,
    errors: Vec<(usize, String, Error)>,
}

impl NodeErrors {
    /// The errors of `nodes` nodes: `(position, store id, error)` of each that failed.
    pub fn new(nodes: usize, errors: Vec<(usize, String, Error)>) -> NodeErrors {
        NodeErrors { nodes, errors }
    }

    /// How many nodes the quorum has.
    pub fn nodes(&self) -> usize {
        self.nodes
    }

    /// Each failed node: its position in the quorum, its store id, its error.
    pub fn iter(&self) -> impl Iterator<Item = (usize, &str, &Error)> {
        self.errors.iter().map(|(i, s, e)| (*i, s.as_str(), e))
    }

    /// How many nodes failed.
    pub fn len(&self) -> usize {
        self.errors.len()
    }

    /// Whether no node failed (the quorum was not reached by answers alone: late or split).
    pub fn is_empty(&self) -> bool {
        self.errors.is_empty()
    }
}

impl fmt::Display for NodeErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} of {} nodes failed", self.errors.len(), self.nodes)?;
        for (i, (node, store, err)) in self.errors.iter().enumerate() {
            let sep = if i == 0 { ": " } else { "; " };
            write!(f, "{sep}node {node} ({store}): {err}")?;
        }
        Ok(())
    }
}

impl std::error::Error for NodeErrors {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kind_message_source_and_retry_classification() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let err = Error::new(ErrorKind::Unavailable, "cannot reach redis").with_source(io);
        assert_eq!(err.kind(), ErrorKind::Unavailable);
        assert!(err.is_retryable());
        assert_eq!(err.to_string(), "backend unavailable: cannot reach redis");
        let source = std::error::Error::source(&err).map(|s| s.to_string());
        assert_eq!(source.as_deref(), Some("refused"));

        let err = Error::invalid("ttl must not be zero");
        assert!(!err.is_retryable());
        assert!(!Error::lost("gone").is_retryable());
        assert!(Error::lost("gone").is_lock_lost());
    }

    #[test]
    fn error_is_send_sync_and_small() {
        fn assert_send_sync<T: Send + Sync + 'static>() {}
        assert_send_sync::<Error>();
        assert_eq!(std::mem::size_of::<Error>(), std::mem::size_of::<usize>());
    }
}
