//! Blocking leader election: [`crate::Election`] on a [`Client`]'s runtime.

use std::sync::Arc;
use std::time::Duration;

use super::{Client, Lock, LockGuard, Runtime, forward_options};
use crate::election::{Leader, LeaderChange};
use crate::error::Result;
use crate::raw::RawElection;
use crate::token::{FencingToken, Token};

/// A named election: at most one leader at a time. [`crate::Election`] for synchronous
/// code.
///
/// ```
/// use fencelock::backend::Memory;
/// use fencelock::blocking::{Client, Election};
///
/// let client = Client::from_backend(Memory::new())?;
/// let election = Election::new(&client, "scheduler")?;
/// let leadership = election.campaign("host-a:8080")?; // blocks until we lead
/// let leader = election.leader()?.expect("someone leads");
/// assert_eq!(leader.term, leadership.term());
/// leadership.resign()?; // the next candidate leads at once
/// # Ok::<(), fencelock::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct Election<B: RawElection> {
    election: crate::Election<B>,
    runtime: Arc<Runtime>,
}

/// Options for a blocking [`Election`]; made by [`Election::builder`].
#[must_use = "a builder does nothing until .build()"]
#[derive(Debug)]
pub struct ElectionBuilder<B: RawElection> {
    builder: crate::ElectionBuilder<B>,
    runtime: Arc<Runtime>,
}

forward_options!(ElectionBuilder<B: RawElection>, "ElectionBuilder");

impl<B: RawElection> ElectionBuilder<B> {
    /// Checks the options and makes the election.
    ///
    /// # Errors
    /// As [`crate::ElectionBuilder::build`].
    pub fn build(self) -> Result<Election<B>> {
        Ok(Election {
            election: self.builder.build()?,
            runtime: self.runtime,
        })
    }
}

impl<B: RawElection> Election<B> {
    /// An election named `name` with default options.
    ///
    /// # Errors
    /// As [`crate::Election::new`].
    pub fn new(client: &Client<B>, name: impl Into<String>) -> Result<Election<B>> {
        Election::builder(client, name).build()
    }

    /// Options for an election named `name`.
    pub fn builder(client: &Client<B>, name: impl Into<String>) -> ElectionBuilder<B> {
        ElectionBuilder {
            builder: crate::Election::builder(client.backend.clone(), name),
            runtime: Arc::clone(&client.runtime),
        }
    }

    /// The same election for async code.
    pub fn as_async(&self) -> &crate::Election<B> {
        &self.election
    }

    /// The election's name.
    pub fn name(&self) -> &str {
        self.election.name()
    }

    /// The leader's lease length.
    pub fn ttl(&self) -> Duration {
        self.election.ttl()
    }

    /// The lock that candidates queue for (its keys, its state).
    pub fn lock(&self) -> Lock<B> {
        Lock::from_async(self.election.lock().clone(), Arc::clone(&self.runtime))
    }

    fn leadership(&self, leadership: crate::Leadership<B>) -> Leadership<B> {
        Leadership {
            leadership: Some(leadership),
            runtime: Arc::clone(&self.runtime),
        }
    }

    /// Blocks until this candidate leads, then advertises `value` (as
    /// [`crate::Election::campaign`]).
    ///
    /// # Errors
    /// As [`crate::Election::campaign`]; `InvalidArgument` inside a runtime.
    pub fn campaign(&self, value: impl Into<String>) -> Result<Leadership<B>> {
        self.runtime
            .call(|| self.election.campaign(value))
            .map(|l| self.leadership(l))
    }

    /// One attempt: `Ok(None)` if another candidate leads now.
    ///
    /// # Errors
    /// As [`campaign`](Election::campaign).
    pub fn try_campaign(&self, value: impl Into<String>) -> Result<Option<Leadership<B>>> {
        self.runtime
            .call(|| self.election.try_campaign(value))
            .map(|l| l.map(|l| self.leadership(l)))
    }

    /// Campaigns for at most `timeout`: `Ok(None)` if another candidate led all along.
    ///
    /// # Errors
    /// As [`campaign`](Election::campaign).
    pub fn campaign_for(
        &self,
        timeout: Duration,
        value: impl Into<String>,
    ) -> Result<Option<Leadership<B>>> {
        self.runtime
            .call(|| self.election.campaign_for(timeout, value))
            .map(|l| l.map(|l| self.leadership(l)))
    }

    /// The current leader's term and value, or `None` if nobody leads.
    ///
    /// # Errors
    /// Store failures; `InvalidArgument` inside a runtime.
    pub fn leader(&self) -> Result<Option<Leader>> {
        self.runtime.call(|| self.election.leader())
    }

    /// Follows the leader: an [`Iterator`] over every change of leader or advertised value,
    /// and every vacancy (as [`crate::Election::observe`]); it never ends.
    pub fn observe(&self) -> Observer<B> {
        Observer {
            observer: self.election.observe(),
            runtime: Arc::clone(&self.runtime),
        }
    }
}

/// Proof that this candidate leads: [`crate::Leadership`] for synchronous code.
///
/// Dropped, it resigns as a [`LockGuard`] releases: waiting for the store at most
/// [`DROP_RELEASE_WAIT`](super::DROP_RELEASE_WAIT).
#[must_use = "leadership ends as soon as it is dropped"]
pub struct Leadership<B: RawElection> {
    /// `None` only once consumed (resigned, handed on).
    leadership: Option<crate::Leadership<B>>,
    runtime: Arc<Runtime>,
}

impl<B: RawElection> std::fmt::Debug for Leadership<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.held().fmt(f)
    }
}

impl<B: RawElection> Leadership<B> {
    fn held(&self) -> &crate::Leadership<B> {
        self.leadership
            .as_ref()
            .expect("a leadership lives until it is consumed")
    }

    fn take(&mut self) -> crate::Leadership<B> {
        self.leadership
            .take()
            .expect("a leadership lives until it is consumed")
    }

    /// The election's name.
    pub fn name(&self) -> &str {
        self.held().name()
    }

    /// This leadership's term: strictly greater than every earlier leader's. A fencing
    /// token: send it with every write.
    pub fn term(&self) -> FencingToken {
        self.held().term()
    }

    /// The value advertised now.
    pub fn value(&self) -> &str {
        self.held().value()
    }

    /// The lease's owner token.
    pub fn token(&self) -> &Token {
        self.held().token()
    }

    /// Whether the leadership can no longer be guaranteed: stop acting as the leader.
    pub fn is_lost(&self) -> bool {
        self.held().is_lost()
    }

    /// How much of the lease's validity is left.
    pub fn remaining(&self) -> Duration {
        self.held().remaining()
    }

    /// The lease each renewal buys.
    pub fn lease(&self) -> Duration {
        self.held().lease()
    }

    /// Blocks until the leadership can no longer be guaranteed or `timeout` passes:
    /// `Ok(true)` if it was lost (as [`LockGuard::wait_lost`]).
    ///
    /// # Errors
    /// `InvalidArgument` inside a runtime.
    pub fn wait_lost(&self, timeout: Duration) -> Result<bool> {
        self.runtime.run(|| {
            let lost = self.held().lost();
            async move { tokio::time::timeout(timeout, lost).await.is_ok() }
        })
    }

    /// Changes the advertised value without a new election.
    ///
    /// # Errors
    /// As [`crate::Leadership::proclaim`]; `InvalidArgument` inside a runtime.
    pub fn proclaim(&mut self, value: impl Into<String>) -> Result<()> {
        let runtime = Arc::clone(&self.runtime);
        runtime.call(|| {
            self.leadership
                .as_mut()
                .expect("a leadership lives until it is consumed")
                .proclaim(value)
        })
    }

    /// Steps down: the lease is released at once and the next candidate is woken.
    ///
    /// # Errors
    /// As [`crate::Leadership::resign`]; `InvalidArgument` inside a runtime (the
    /// leadership is then dropped: it resigns in the background).
    pub fn resign(mut self) -> Result<()> {
        let runtime = Arc::clone(&self.runtime);
        runtime.call(|| self.take().resign())
    }

    /// The lock guard underneath (releasing it resigns).
    pub fn into_guard(mut self) -> LockGuard<B> {
        LockGuard::new(self.take().into_guard(), Arc::clone(&self.runtime))
    }
}

impl<B: RawElection> Drop for Leadership<B> {
    fn drop(&mut self) {
        if let Some(leadership) = self.leadership.take() {
            self.runtime.settle(async move {
                let _ = leadership.resign().await;
            });
        }
    }
}

/// Leader changes of an [`Election`], as a never-ending [`Iterator`] of
/// `Result<LeaderChange>`; made by [`Election::observe`].
///
/// Each `next()` blocks until the next change (an error is one item: the next call reads
/// again; inside a runtime every item is the `InvalidArgument` error).
pub struct Observer<B: RawElection> {
    observer: crate::Observer<B>,
    runtime: Arc<Runtime>,
}

impl<B: RawElection> std::fmt::Debug for Observer<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.observer.fmt(f)
    }
}

impl<B: RawElection> Observer<B> {
    /// The next change, blocking at most `timeout`: `Ok(None)` if nothing changed that
    /// long (a change found meanwhile is returned by the next call).
    ///
    /// # Errors
    /// Store failures; `InvalidArgument` inside a runtime.
    pub fn next_timeout(&mut self, timeout: Duration) -> Result<Option<LeaderChange>> {
        let observer = &mut self.observer;
        self.runtime.run(|| async move {
            match tokio::time::timeout(timeout, observer.next()).await {
                Ok(change) => change.map(Some),
                Err(_) => Ok(None),
            }
        })?
    }
}

impl<B: RawElection> Iterator for Observer<B> {
    type Item = Result<LeaderChange>;

    fn next(&mut self) -> Option<Result<LeaderChange>> {
        let observer = &mut self.observer;
        Some(self.runtime.call(|| observer.next()))
    }
}
