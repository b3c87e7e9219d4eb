//! Several locks taken all or nothing.

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::lock::{Lock, LockGuard};
use crate::raw::RawLock;

/// A boxed, sendable future.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Something a [`MultiLock`] can take: every [`Lock`] is one, and every other primitive
/// hands out its [`Lock`] view (`Semaphore::permit_lock`, `RwLock::write_lock` /
/// `read_lock`, `FairLock::as_lock`, `ReentrantLock::holds_of`).
pub trait Lockable: Send + Sync {
    /// The lock key, then the store: the order in which a multi-lock takes its members.
    fn order_key(&self) -> (String, String);

    /// Tries to take it until `deadline` (`None`: wait as long as it takes).
    fn acquire_until(
        &self,
        deadline: Option<Instant>,
    ) -> BoxFuture<'_, Result<Option<Box<dyn Held>>>>;
}

/// One taken member of a [`MultiGuard`].
pub trait Held: Send {
    /// The member's name.
    fn name(&self) -> &str;
    /// Whether its lease can no longer be guaranteed.
    fn is_lost(&self) -> bool;
    /// Resolves when its lease can no longer be guaranteed (or it is released).
    fn lost(&self) -> BoxFuture<'static, ()>;
    /// Releases it.
    fn release(self: Box<Self>) -> BoxFuture<'static, Result<()>>;
}

impl<B: RawLock> Lockable for Lock<B> {
    fn order_key(&self) -> (String, String) {
        (self.keys().lock().to_owned(), self.backend().store_id())
    }

    fn acquire_until(
        &self,
        deadline: Option<Instant>,
    ) -> BoxFuture<'_, Result<Option<Box<dyn Held>>>> {
        Box::pin(async move {
            let guard = match deadline {
                Some(d) => self.try_lock_until(d).await?,
                None => Some(self.lock().await?),
            };
            Ok(guard.map(|g| Box::new(g) as Box<dyn Held>))
        })
    }
}

impl<B: RawLock> Held for LockGuard<B> {
    fn name(&self) -> &str {
        LockGuard::name(self)
    }

    fn is_lost(&self) -> bool {
        LockGuard::is_lost(self)
    }

    fn lost(&self) -> BoxFuture<'static, ()> {
        Box::pin(LockGuard::lost(self))
    }

    fn release(self: Box<Self>) -> BoxFuture<'static, Result<()>> {
        Box::pin(LockGuard::release(*self))
    }
}

/// Several locks — any primitives, on any backends — taken all or nothing.
///
/// Every member is first asked for at once: one attempt each, all sent together (on a
/// shared connection, such as a Redis client's, they travel pipelined, so a multi-lock of
/// free names costs about one round trip however many it has). If every member is
/// granted, that is the hold. Otherwise the members are ordered one global way (by lock
/// key, then by store): the multi-lock keeps the members granted before the first one
/// that was not, gives back the others at once, and waits for the rest one after another
/// in that order. It never waits while holding a member out of that order, so two
/// multi-locks over overlapping sets cannot deadlock each other: whoever gets the first
/// common member first gets the rest. If a member cannot be had (an error, or the time
/// ran out), the members already taken are released before the call returns.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> fencelock::Result<()> {
/// use fencelock::{Lock, MultiLock, Semaphore, backend::Memory};
///
/// let store = Memory::new();
/// let from = Lock::new(store.clone(), "account:1")?;
/// let to = Lock::new(store.clone(), "account:2")?;
/// let slots = Semaphore::new(store.clone(), "transfer-slots", 4)?;
/// let all = MultiLock::new()
///     .with(from.clone())
///     .with(to)
///     .with(slots.permit_lock().clone())
///     .build()?;
/// let held = all.lock().await?;
/// assert!(from.try_lock().await?.is_none());
/// held.release().await?;
/// assert!(from.try_lock().await?.is_some());
/// # Ok(()) }
/// ```
///
/// # Correctness
///
/// While held, every member is held, with its own lease, watchdog and guarantees;
/// [`MultiGuard::lost`] fires when any of them is lost. All-or-nothing holds for the
/// caller: it never gets a guard for a subset. Other processes may see the members taken
/// one after another (the acquisition is not one atomic step across stores), and may see
/// a member taken and given back at once by a multi-lock that then waits for an earlier
/// member. Members taken in different processes are ordered the same only if both name
/// every store the same way (the same Redis address).
pub struct MultiLock {
    members: Vec<Box<dyn Lockable>>,
}

impl std::fmt::Debug for MultiLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MultiLock")
            .field(
                "members",
                &self
                    .members
                    .iter()
                    .map(|m| m.order_key().0)
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// Members of a [`MultiLock`]; made by [`MultiLock::new`].
#[must_use = "a builder does nothing until .build()"]
#[derive(Default)]
pub struct MultiLockBuilder {
    members: Vec<Box<dyn Lockable>>,
}

impl std::fmt::Debug for MultiLockBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MultiLockBuilder")
            .field("members", &self.members.len())
            .finish()
    }
}

impl MultiLockBuilder {
    /// Adds a member.
    pub fn with(mut self, member: impl Lockable + 'static) -> Self {
        self.members.push(Box::new(member));
        self
    }

    /// Orders the members and makes the multi-lock.
    ///
    /// # Errors
    /// `InvalidArgument` without members, or with one lock twice (it would wait for
    /// itself).
    pub fn build(mut self) -> Result<MultiLock> {
        if self.members.is_empty() {
            return Err(Error::invalid("a multi-lock needs at least one member"));
        }
        self.members.sort_by_key(|m| m.order_key());
        if let Some(w) = self
            .members
            .windows(2)
            .find(|w| w[0].order_key() == w[1].order_key())
        {
            return Err(Error::invalid(format!(
                "lock {:?} is in the multi-lock twice",
                w[0].order_key().0
            )));
        }
        Ok(MultiLock {
            members: self.members,
        })
    }
}

impl MultiLock {
    /// An empty set of members; add them with [`with`](MultiLockBuilder::with).
    #[allow(clippy::new_ret_no_self)]
    pub fn new() -> MultiLockBuilder {
        MultiLockBuilder::default()
    }

    /// How many members.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether there are no members (never true for a built multi-lock).
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Waits until every member is held.
    ///
    /// # Errors
    /// The first member's error, in the members' order (the members taken are released
    /// first).
    ///
    /// # Cancel safety
    /// Cancel-safe: members already taken are released in the background, a member being
    /// waited for leaves nothing behind.
    pub async fn lock(&self) -> Result<MultiGuard> {
        match self.acquire_until(None).await? {
            Some(guard) => Ok(guard),
            None => Err(Error::new(
                crate::ErrorKind::TimedOut,
                "multi-lock wait ended without a deadline",
            )),
        }
    }

    /// Every member if each is free now; `Ok(None)` (and nothing held) otherwise.
    ///
    /// # Errors
    /// As [`lock`](MultiLock::lock).
    ///
    /// # Cancel safety
    /// As [`lock`](MultiLock::lock).
    pub async fn try_lock(&self) -> Result<Option<MultiGuard>> {
        self.acquire_until(Some(Instant::now())).await
    }

    /// Every member, waiting at most `timeout` in all; `Ok(None)` (and nothing held) if
    /// the time ran out.
    ///
    /// # Errors
    /// As [`lock`](MultiLock::lock).
    ///
    /// # Cancel safety
    /// As [`lock`](MultiLock::lock).
    pub async fn try_lock_for(&self, timeout: Duration) -> Result<Option<MultiGuard>> {
        self.acquire_until(Instant::now().checked_add(timeout))
            .await
    }

    async fn acquire_until(&self, deadline: Option<Instant>) -> Result<Option<MultiGuard>> {
        // Dropped on every early exit: releases what was taken.
        let mut taken = MultiGuard { held: Vec::new() };
        // One attempt at every member, all at once.
        let now = Instant::now();
        let tries = join_all(
            self.members
                .iter()
                .map(|m| m.acquire_until(Some(now)))
                .collect(),
        )
        .await;
        // The members granted in order up to the first that was not are kept; those
        // granted after it are given back before any wait (holding them while waiting
        // for an earlier one could deadlock another multi-lock).
        let mut first_err = None;
        let mut next = None;
        let mut out_of_order = MultiGuard { held: Vec::new() };
        for (i, tried) in tries.into_iter().enumerate() {
            match tried {
                Ok(Some(held)) if next.is_none() => taken.held.push(held),
                Ok(Some(held)) => out_of_order.held.push(held),
                Ok(None) => {
                    next.get_or_insert(i);
                }
                Err(err) => {
                    next.get_or_insert(i);
                    first_err.get_or_insert(err);
                }
            }
        }
        out_of_order.release_quietly().await;
        if let Some(err) = first_err {
            taken.release_quietly().await;
            return Err(err);
        }
        let Some(next) = next else {
            return Ok(Some(taken));
        };
        if deadline.is_some_and(|d| Instant::now() >= d) {
            taken.release_quietly().await;
            return Ok(None);
        }
        for member in &self.members[next..] {
            match member.acquire_until(deadline).await {
                Ok(Some(held)) => taken.held.push(held),
                Ok(None) => {
                    taken.release_quietly().await;
                    return Ok(None);
                }
                Err(err) => {
                    taken.release_quietly().await;
                    return Err(err);
                }
            }
        }
        Ok(Some(taken))
    }
}

/// Every member of a [`MultiLock`], held. Released by [`release`](MultiGuard::release), or
/// member by member in the background when dropped.
#[must_use = "the locks are released in the background as soon as the guard is dropped"]
pub struct MultiGuard {
    held: Vec<Box<dyn Held>>,
}

impl std::fmt::Debug for MultiGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MultiGuard")
            .field(
                "members",
                &self.held.iter().map(|h| h.name()).collect::<Vec<_>>(),
            )
            .field("lost", &self.is_lost())
            .finish()
    }
}

impl MultiGuard {
    /// Whether any member's lease can no longer be guaranteed.
    pub fn is_lost(&self) -> bool {
        self.held.iter().any(|h| h.is_lost())
    }

    /// Resolves as soon as any member's lease can no longer be guaranteed.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut futures: Vec<BoxFuture<'static, ()>> = self.held.iter().map(|h| h.lost()).collect();
        std::future::poll_fn(move |cx| {
            if futures.iter_mut().any(|f| f.as_mut().poll(cx).is_ready()) {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
    }

    /// Releases every member, all at once (on a shared connection, pipelined).
    ///
    /// # Errors
    /// The first error among the members' releases, in the members' order (`LockLost`
    /// if one was no longer ours); the other members are released all the same.
    pub async fn release(mut self) -> Result<()> {
        let released = join_all(self.held.drain(..).map(|h| h.release()).collect()).await;
        released
            .into_iter()
            .find_map(Result::err)
            .map_or(Ok(()), Err)
    }

    async fn release_quietly(&mut self) {
        if self.held.is_empty() {
            return;
        }
        for released in join_all(self.held.drain(..).map(|h| h.release()).collect()).await {
            if let Err(err) = released {
                tracing::debug!(error = %err, "releasing a partial multi-lock");
            }
        }
    }
}

/// Runs `futures` side by side; their outputs in their order.
async fn join_all<'a, T>(futures: Vec<BoxFuture<'a, T>>) -> Vec<T> {
    let mut slots: Vec<(BoxFuture<'a, T>, Option<T>)> =
        futures.into_iter().map(|f| (f, None)).collect();
    let mut pending = slots.len();
    std::future::poll_fn(|cx| {
        for (future, out) in &mut slots {
            if out.is_none()
                && let Poll::Ready(v) = future.as_mut().poll(cx)
            {
                *out = Some(v);
                pending -= 1;
            }
        }
        if pending == 0 {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
    slots.into_iter().filter_map(|(_, out)| out).collect()
}
