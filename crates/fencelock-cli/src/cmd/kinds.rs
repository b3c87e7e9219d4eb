//! Inspection and force-unlock of every kind of primitive, for `status` and
//! `force-unlock`.

use fencelock::raw::{LockState, RawFair, RawInspect, RawReentrant, RawRwLock, RawSemaphore};
use fencelock::{Lock, Semaphore};

use crate::args::Kind;
use crate::exit::Failure;

/// Every primitive `run` can take (inspection and force-unlock need only
/// [`RawInspect`], which takes the kind).
pub(crate) trait AnyKind:
    RawInspect + RawSemaphore + RawReentrant + RawRwLock + RawFair
{
}
impl<B: RawInspect + RawSemaphore + RawReentrant + RawRwLock + RawFair> AnyKind for B {}

impl Kind {
    /// The kind as `--kind` and JSON name it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::Lock => "lock",
            Kind::Semaphore => "semaphore",
            Kind::Reentrant => "reentrant",
            Kind::Rwlock => "rwlock",
            Kind::Fair => "fair",
        }
    }

    /// The kind in a sentence: "a lock", "a fair lock", …
    pub(crate) fn described(self) -> &'static str {
        self.raw().described()
    }

    /// The library's name of the kind, for [`RawInspect`].
    pub(crate) fn raw(self) -> fencelock::raw::Kind {
        match self {
            Kind::Lock => fencelock::raw::Kind::Lock,
            Kind::Semaphore => fencelock::raw::Kind::Semaphore,
            Kind::Reentrant => fencelock::raw::Kind::Reentrant,
            Kind::Rwlock => fencelock::raw::Kind::RwLock,
            Kind::Fair => fencelock::raw::Kind::Fair,
        }
    }
}

/// Every kind, in the order `list` shows them for one name.
pub(crate) const ALL: [Kind; 5] = [
    Kind::Lock,
    Kind::Semaphore,
    Kind::Reentrant,
    Kind::Rwlock,
    Kind::Fair,
];

/// The permit count stored for the semaphore `name` (`None`: none is stored).
pub(crate) async fn stored_permits<B: RawSemaphore>(
    backend: B,
    prefix: Option<&str>,
    name: &str,
) -> Result<Option<u32>, Failure> {
    let sem = Semaphore::builder(backend, name, 1)
        .prefix(prefix_for(Kind::Semaphore, prefix))
        .build()?;
    Ok(sem.stored_permits().await?)
}

/// The kinds other than `mine` that `name` is held as now, by someone other than the
/// holder of token `own` (this run), each under its default prefix, or under `prefix` if
/// the user gave one.
///
/// Under one `--prefix` every kind of `name` has the same lock key, so another kind's
/// view of it may be this run's own hold: a holder with `own`'s token is not counted, and
/// a store that finds a value of another type there (Redis: this run's own value, of its
/// own kind's type) is not an error. What other kinds keep beside the lock key (a
/// read-write lock's readers) is still seen — except where that kind's state cannot be
/// read past this run's own value: those kinds are returned second (not checked). Under
/// a `--prefix` of the user's, only on a store whose kinds are told apart there
/// ([`RawInspect::KINDS_TOLD_APART_UNDER_ONE_PREFIX`]).
pub(crate) async fn held_as_others<B: RawInspect>(
    backend: &B,
    mine: Kind,
    prefix: Option<&str>,
    name: &str,
    own: &str,
) -> Result<(Vec<Kind>, Vec<Kind>), Failure> {
    let (mut held, mut unchecked) = (Vec::new(), Vec::new());
    for kind in ALL.into_iter().filter(|k| *k != mine) {
        let state = match state_raw(backend.clone(), kind, prefix, name).await {
            Ok((_, state)) => state,
            Err(err) if prefix.is_some() && err.kind() == fencelock::ErrorKind::Backend => {
                // Every other kind's hold is at the lock key, which this run holds: not
                // held. A read-write lock's readers are beside it, and may be.
                if kind == Kind::Rwlock {
                    unchecked.push(kind);
                }
                continue;
            }
            Err(err) => return Err(err.into()),
        };
        // (A read-write lock's readers, a semaphore's permit holders: never this run.)
        let by_another = state.holder.as_deref().is_some_and(|holder| holder != own);
        if by_another || state.holders.unwrap_or(0) > 0 {
            held.push(kind);
        }
    }
    Ok((held, unchecked))
}

/// `prefix` if the user chose one (whatever it is), else the kind's default.
pub(crate) fn prefix_for(kind: Kind, prefix: Option<&str>) -> String {
    if let Some(prefix) = prefix {
        return prefix.to_owned();
    }
    match kind {
        Kind::Lock => fencelock::keys::DEFAULT_PREFIX,
        Kind::Semaphore => fencelock::DEFAULT_SEMAPHORE_PREFIX,
        Kind::Reentrant => fencelock::DEFAULT_REENTRANT_PREFIX,
        Kind::Rwlock => fencelock::DEFAULT_RWLOCK_PREFIX,
        Kind::Fair => fencelock::DEFAULT_FAIR_PREFIX,
    }
    .to_owned()
}

/// The primitive's lock key and what the store says about it.
pub(crate) async fn state_of<B: RawInspect>(
    backend: B,
    kind: Kind,
    prefix: Option<&str>,
    name: &str,
) -> Result<(String, LockState), Failure> {
    Ok(state_raw(backend, kind, prefix, name).await?)
}

/// [`state_of`], with the store's error as it is.
async fn state_raw<B: RawInspect>(
    backend: B,
    kind: Kind,
    prefix: Option<&str>,
    name: &str,
) -> fencelock::Result<(String, LockState)> {
    let keys = keys_of(backend.clone(), kind, prefix, name)?;
    let state = backend.inspect(kind.raw(), &keys).await?;
    Ok((keys.lock().to_owned(), state))
}

/// The keys of the primitive `name` of `kind` (every kind lays out its keys as a lock
/// does, under its own default prefix), checked as its builder checks them.
fn keys_of<B: RawInspect>(
    backend: B,
    kind: Kind,
    prefix: Option<&str>,
    name: &str,
) -> fencelock::Result<fencelock::keys::LockKeys> {
    let lock = Lock::builder(backend, name)
        .prefix(prefix_for(kind, prefix))
        .build()?;
    Ok(lock.keys().clone())
}

/// Whether the primitive is held (by anyone) in `state`.
pub(crate) fn is_held(state: &LockState) -> bool {
    state.holder.is_some() || state.holders.unwrap_or(0) > 0
}

/// Deletes every hold of the primitive; whether anything was held.
pub(crate) async fn force_unlock<B: RawInspect>(
    backend: B,
    kind: Kind,
    prefix: Option<&str>,
    name: &str,
) -> Result<bool, Failure> {
    let keys = keys_of(backend.clone(), kind, prefix, name)?;
    Ok(backend.force_unlock(kind.raw(), &keys).await?)
}
