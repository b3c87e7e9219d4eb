//! Inspection and force-unlock of every kind of primitive, for `status` and
//! `force-unlock`.

use fencelock::raw::{LockState, RawFair, RawInspect, RawReentrant, RawRwLock, RawSemaphore};
use fencelock::{FairLock, Lock, ReentrantLock, RwLock, Semaphore};

use crate::args::Kind;
use crate::exit::Failure;

/// Every store trait `status` and `force-unlock` need.
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
        match self {
            Kind::Lock => "a lock",
            Kind::Semaphore => "a semaphore",
            Kind::Reentrant => "a reentrant lock",
            Kind::Rwlock => "a read-write lock",
            Kind::Fair => "a fair lock",
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
pub(crate) async fn stored_permits<B: AnyKind>(
    backend: B,
    prefix: Option<&str>,
    name: &str,
) -> Result<Option<u32>, Failure> {
    let sem = Semaphore::builder(backend, name, 1)
        .prefix(prefix_for(Kind::Semaphore, prefix))
        .build()?;
    Ok(sem.stored_permits().await?)
}

/// The kinds other than `mine` that `name` is held as now, each under its default
/// prefix (none with a `--prefix` of the user's, which every kind would share).
pub(crate) async fn held_as_others<B: AnyKind>(
    backend: &B,
    mine: Kind,
    prefix: Option<&str>,
    name: &str,
) -> Result<Vec<Kind>, Failure> {
    let mut held = Vec::new();
    if prefix.is_some() {
        return Ok(held);
    }
    for kind in ALL.into_iter().filter(|k| *k != mine) {
        let (_, state) = state_of(backend.clone(), kind, prefix, name).await?;
        if is_held(&state) {
            held.push(kind);
        }
    }
    Ok(held)
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
pub(crate) async fn state_of<B: AnyKind>(
    backend: B,
    kind: Kind,
    prefix: Option<&str>,
    name: &str,
) -> Result<(String, LockState), Failure> {
    let prefix = prefix_for(kind, prefix);
    Ok(match kind {
        Kind::Lock => {
            let lock = Lock::builder(backend, name).prefix(prefix).build()?;
            (lock.keys().lock().to_owned(), lock.state().await?)
        }
        Kind::Semaphore => {
            let sem = Semaphore::builder(backend, name, 1)
                .prefix(prefix)
                .build()?;
            (sem.keys().lock().to_owned(), sem.state().await?)
        }
        Kind::Reentrant => {
            let lock = ReentrantLock::builder(backend, name)
                .prefix(prefix)
                .build()?;
            (lock.keys().lock().to_owned(), lock.state().await?)
        }
        Kind::Rwlock => {
            let rw = RwLock::builder(backend, name).prefix(prefix).build()?;
            (rw.keys().lock().to_owned(), rw.state().await?)
        }
        Kind::Fair => {
            let fair = FairLock::builder(backend, name).prefix(prefix).build()?;
            (fair.keys().lock().to_owned(), fair.state().await?)
        }
    })
}

/// Whether the primitive is held (by anyone) in `state`.
pub(crate) fn is_held(state: &LockState) -> bool {
    state.holder.is_some() || state.holders.unwrap_or(0) > 0
}

/// Deletes every hold of the primitive; whether anything was held.
pub(crate) async fn force_unlock<B: AnyKind>(
    backend: B,
    kind: Kind,
    prefix: Option<&str>,
    name: &str,
) -> Result<bool, Failure> {
    let prefix = prefix_for(kind, prefix);
    Ok(match kind {
        Kind::Lock => {
            Lock::builder(backend, name)
                .prefix(prefix)
                .build()?
                .force_unlock()
                .await?
        }
        Kind::Semaphore => {
            Semaphore::builder(backend, name, 1)
                .prefix(prefix)
                .build()?
                .force_unlock()
                .await?
        }
        Kind::Reentrant => {
            ReentrantLock::builder(backend, name)
                .prefix(prefix)
                .build()?
                .force_unlock()
                .await?
        }
        Kind::Rwlock => {
            RwLock::builder(backend, name)
                .prefix(prefix)
                .build()?
                .force_unlock()
                .await?
        }
        Kind::Fair => {
            FairLock::builder(backend, name)
                .prefix(prefix)
                .build()?
                .force_unlock()
                .await?
        }
    })
}
