//! RedLock: one lock over several independent stores, held while a majority holds it.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::join_all;
use crate::engine::Engine;
use crate::error::{Error, ErrorKind, NodeErrors, Result};
use crate::keys::LockKeys;
use crate::observe::op;
use crate::raw::{Acquire, RawLock, Renewal};
use crate::token::Token;
use crate::validity::Drift;
use tracing::Instrument;

/// Default share of the ttl one node may take to answer before it counts as a no.
pub const DEFAULT_NODE_TIMEOUT_FRACTION: f64 = 0.1;

/// Longest a release waits for one node.
const RELEASE_TIMEOUT: Duration = Duration::from_secs(2);

/// RedLock over `N` independent stores (Kleppmann's analysis and antirez's reply): a lock is held while a majority
/// (`N/2 + 1`) of the nodes hold our token, granted within the lease's validity.
///
/// * **Acquire** asks every node at once, each bounded by a node timeout (a fraction of
///   the ttl, default 10 %), so it takes about one round trip to the slowest node needed.
///   It succeeds if a majority granted and the validity left —
///   `ttl − elapsed − drift` (monotonic clock; drift configurable, default 1 % of the
///   ttl + 2 ms) — is positive. Otherwise the grants are given back on every node at once
///   and the caller retries after a randomized backoff.
/// * **Extend** (the watchdog's renewals) succeeds when a majority extended within the
///   validity left; **release** goes to every node.
/// * Each node is asked only what RedLock needs ([`RawLock::acquire_member`],
///   [`RawLock::release_member`]): on Redis a bare `SET NX PX` and a compare-and-delete —
///   no fence counter, no waiter queue, no announcement.
/// * There is **no fencing token**: each node has its own counter, and no number minted
///   by a majority of independent counters is guaranteed to increase from one holder to
///   the next (two majorities share one node, not its counter's history). So
///   `Quorum<B>` does not implement [`RawFencing`](crate::raw::RawFencing), and
///   `fencing_token()` does not compile on its guards:
///
/// ```compile_fail
/// # async fn f(q: fencelock::backend::Quorum<fencelock::backend::Memory>) -> fencelock::Result<()> {
/// let guard = fencelock::Lock::new(q, "x")?.lock().await?;
/// let _ = guard.fencing_token(); // error: Quorum is not RawFencing
/// # Ok(()) }
/// ```
///
/// # Correctness
///
/// Safe while a majority of nodes keep their keys for the lease and the clocks of client
/// and nodes run at rates within the drift allowance. A node that restarts without
/// persistence and forgets our key lets a second holder assemble a majority with it
/// (delay restarts by more than the ttl, or persist with `appendfsync always`).
/// A holder paused past its validity is the same hazard as with one store — and here no
/// fence can stop its late writes (the Kleppmann/antirez dispute): use a single fenced
/// store where stale writes must be refused.
#[derive(Clone)]
pub struct Quorum<B: RawLock> {
    inner: Arc<Inner<B>>,
}

struct Inner<B> {
    nodes: Vec<B>,
    /// Each node's store kind (`store` of its `dlock.node` spans).
    labels: Vec<&'static str>,
    node_timeout_fraction: f64,
    drift: Drift,
    engine: Engine,
}

impl<B: RawLock> std::fmt::Debug for Quorum<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Quorum")
            .field("nodes", &self.inner.nodes.len())
            .field("quorum", &self.quorum())
            .finish_non_exhaustive()
    }
}

/// Options for a [`Quorum`]; made by [`Quorum::builder`].
#[must_use = "a builder does nothing until .build()"]
#[derive(Debug)]
pub struct QuorumBuilder<B> {
    nodes: Vec<B>,
    node_timeout_fraction: f64,
    drift: Drift,
}

impl<B: RawLock> QuorumBuilder<B> {
    /// Share of the ttl one node may take to answer (default 0.1): a slower node counts
    /// as a no, so one slow node cannot eat the lease's validity.
    pub fn node_timeout_fraction(mut self, fraction: f64) -> Self {
        self.node_timeout_fraction = fraction;
        self
    }

    /// Clock-drift allowance subtracted from the validity (default 1 % of the ttl + 2 ms).
    pub fn drift(mut self, factor: f64, constant: Duration) -> Self {
        self.drift = Drift { factor, constant };
        self
    }

    /// Checks the options.
    ///
    /// # Errors
    /// `InvalidArgument` without nodes, with more than 64, with a node timeout fraction
    /// outside (0, 1], or a drift factor outside [0, 0.5) or constant over 1 s.
    pub fn build(self) -> Result<Quorum<B>> {
        if self.nodes.is_empty() || self.nodes.len() > 64 {
            return Err(Error::invalid("a quorum needs 1 to 64 nodes"));
        }
        let f = self.node_timeout_fraction;
        if !(f > 0.0 && f <= 1.0) {
            return Err(Error::invalid(
                "the node timeout fraction must be in (0, 1]",
            ));
        }
        let d = self.drift;
        if !(d.factor >= 0.0 && d.factor < 0.5) || d.constant > Duration::from_secs(1) {
            return Err(Error::invalid(
                "the drift factor must be in [0, 0.5) and its constant at most 1 s",
            ));
        }
        // Each node's store kind, for its spans (read once: ids may allocate).
        let labels = self.nodes.iter().map(RawLock::store_label).collect();
        Ok(Quorum {
            inner: Arc::new(Inner {
                labels,
                nodes: self.nodes,
                node_timeout_fraction: f,
                drift: d,
                engine: Engine::new(),
            }),
        })
    }
}

impl<B: RawLock> Quorum<B> {
    /// RedLock over `nodes` with default options.
    ///
    /// # Errors
    /// As [`QuorumBuilder::build`].
    pub fn new(nodes: Vec<B>) -> Result<Quorum<B>> {
        Quorum::builder(nodes).build()
    }

    /// Options for RedLock over `nodes`.
    pub fn builder(nodes: Vec<B>) -> QuorumBuilder<B> {
        QuorumBuilder {
            nodes,
            node_timeout_fraction: DEFAULT_NODE_TIMEOUT_FRACTION,
            drift: Drift::DEFAULT,
        }
    }

    /// The nodes.
    pub fn nodes(&self) -> &[B] {
        &self.inner.nodes
    }

    /// How many nodes make a majority: `N/2 + 1`.
    pub fn quorum(&self) -> usize {
        self.inner.nodes.len() / 2 + 1
    }

    fn node_timeout(&self, ttl: Duration) -> Duration {
        ttl.mul_f64(self.inner.node_timeout_fraction)
            .max(Duration::from_millis(1))
    }

    /// Runs `op` on every node at once, each bounded by `limit`, each in a `dlock.node`
    /// span named for `what` (an [`op`](crate::observe::op)).
    async fn on_all<'a, T, F, Fut>(
        &'a self,
        what: &'static str,
        limit: Duration,
        op: F,
    ) -> Vec<Result<T>>
    where
        F: Fn(&'a B) -> Fut,
        Fut: Future<Output = Result<T>> + Send + 'a,
    {
        join_all(self.inner.nodes.iter().enumerate().map(|(i, node)| {
            let span = tracing::debug_span!(
                crate::observe::span::NODE,
                { crate::observe::field::STORE } = self.inner.labels[i],
                { crate::observe::field::NODE } = i,
                { crate::observe::field::OP } = what,
                { crate::observe::field::OUTCOME } = tracing::field::Empty,
                { crate::observe::field::RTT_MS } = tracing::field::Empty,
                { crate::observe::field::ERROR } = tracing::field::Empty,
                { crate::observe::field::OTEL_KIND } = "client",
                { crate::observe::field::OTEL_STATUS_CODE } = tracing::field::Empty,
            );
            let call = crate::observe::Call::new(span);
            let bounded = tokio::time::timeout(limit, op(node)).instrument(call.span());
            async move {
                let result = bounded.await.unwrap_or_else(|_| {
                    Err(Error::new(
                        ErrorKind::TimedOut,
                        format!("a quorum node did not answer within {limit:?}"),
                    )
                    .retryable(true))
                });
                call.done(&result, |_| crate::observe::outcome::OK);
                result
            }
        }))
        .await
    }

    /// Turns per-node booleans into a majority verdict: `Ok(true)` if a majority said
    /// yes, `Ok(false)` if a majority can no longer say yes, else the first error.
    fn verdict(&self, results: Vec<Result<bool>>) -> Result<bool> {
        let q = self.quorum();
        let yes = results.iter().filter(|r| matches!(r, Ok(true))).count();
        let no = results.iter().filter(|r| matches!(r, Ok(false))).count();
        if yes >= q {
            return Ok(true);
        }
        if self.inner.nodes.len() - no < q {
            return Ok(false);
        }
        Err(self.no_quorum(results, "no majority answered"))
    }
}

impl<B: RawLock> Quorum<B> {
    /// The error of a call no majority decided: [`ErrorKind::QuorumNotReached`], with
    /// every failed node's own error behind `source()` ([`NodeErrors`]).
    fn no_quorum<T>(&self, results: Vec<Result<T>>, what: &str) -> Error {
        let errors: Vec<(usize, String, Error)> = results
            .into_iter()
            .enumerate()
            .filter_map(|(i, r)| r.err().map(|e| (i, self.inner.nodes[i].store_id(), e)))
            .collect();
        let first = errors
            .first()
            .map(|(i, _, e)| format!(" (node {i}: {e})"))
            .unwrap_or_default();
        Error::new(ErrorKind::QuorumNotReached, format!("{what}{first}"))
            .with_source(NodeErrors::new(self.inner.nodes.len(), errors))
    }
}

/// A copy of a node's error for one renewal of a batch (errors do not clone).
fn copy_error(e: &Error) -> Error {
    Error::new(e.kind(), e.message().to_owned()).retryable(e.is_retryable())
}

impl<B: RawLock> RawLock for Quorum<B> {
    async fn acquire(&self, keys: &LockKeys, token: &Token, ttl: Duration) -> Result<Acquire> {
        let started = Instant::now();
        let results = self
            .on_all(op::ACQUIRE, self.node_timeout(ttl), |node| {
                node.acquire_member(keys, token, ttl)
            })
            .await;
        let granted = results
            .iter()
            .filter(|r| matches!(r, Ok(Acquire::Acquired { .. })))
            .count();
        let refused: Vec<Option<Duration>> = results
            .iter()
            .filter_map(|r| match r {
                Ok(Acquire::Held { remaining }) => Some(*remaining),
                _ => None,
            })
            .collect();
        let validity = ttl
            .saturating_sub(started.elapsed())
            .saturating_sub(self.inner.drift.of(ttl));
        if granted >= self.quorum() && !validity.is_zero() {
            return Ok(Acquire::Acquired { fence: 0 });
        }
        // No majority in time: give back every grant, including ones whose reply was lost.
        if granted > 0 || refused.len() < self.inner.nodes.len() {
            let _ = self.release(keys, token).await;
        }
        if granted + refused.len() < self.quorum() {
            return Err(self.no_quorum(
                results,
                &format!(
                    "only {} of {} quorum nodes answered in time; {} are needed",
                    granted + refused.len(),
                    self.inner.nodes.len(),
                    self.quorum()
                ),
            ));
        }
        // Held by others on enough nodes, a split vote, or the validity ran out: the
        // waiter backs off for a random while (full jitter), then tries again.
        let remaining = refused.iter().flatten().min().copied();
        Ok(Acquire::Held { remaining })
    }

    async fn release(&self, keys: &LockKeys, token: &Token) -> Result<bool> {
        // Not bounded by a lease's ttl: each node gets its client's own response timeout,
        // at most RELEASE_TIMEOUT (a node that misses it lets our key expire).
        let results = self
            .on_all(op::RELEASE, RELEASE_TIMEOUT, |node| {
                node.release_member(keys, token)
            })
            .await;
        self.verdict(results)
    }

    async fn extend(&self, keys: &LockKeys, token: &Token, ttl: Duration) -> Result<bool> {
        let started = Instant::now();
        let results = self
            .on_all(op::EXTEND, self.node_timeout(ttl), |node| {
                node.extend(keys, token, ttl)
            })
            .await;
        let verdict = self.verdict(results)?;
        if verdict && started.elapsed() + self.inner.drift.of(ttl) >= ttl {
            return Err(Error::new(
                ErrorKind::TimedOut,
                "a majority extended, but only after the new lease's validity",
            )
            .retryable(true));
        }
        Ok(verdict)
    }

    async fn extend_many(&self, renewals: &[Renewal]) -> Vec<Result<bool>> {
        let ttl = renewals
            .iter()
            .map(|r| r.ttl)
            .min()
            .unwrap_or(Duration::from_secs(1));
        let per_node = self
            .on_all(op::RENEW, self.node_timeout(ttl), |node| async move {
                Ok(node.extend_many(renewals).await)
            })
            .await;
        (0..renewals.len())
            .map(|i| {
                self.verdict(
                    per_node
                        .iter()
                        .map(|node| match node {
                            Ok(results) => match results.get(i) {
                                Some(Ok(b)) => Ok(*b),
                                Some(Err(e)) => Err(copy_error(e)),
                                None => {
                                    Err(Error::new(ErrorKind::Backend, "missing renewal reply"))
                                }
                            },
                            Err(e) => Err(copy_error(e)),
                        })
                        .collect(),
                )
            })
            .collect()
    }

    fn drift(&self) -> Drift {
        self.inner.drift
    }

    /// The shortest a member can count on.
    fn lease_validity(&self, ttl: Duration) -> Duration {
        self.inner
            .nodes
            .iter()
            .map(|n| n.lease_validity(ttl))
            .min()
            .unwrap_or(ttl)
    }

    fn store_id(&self) -> String {
        let ids: Vec<String> = self.inner.nodes.iter().map(RawLock::store_id).collect();
        format!("quorum[{}]", ids.join(","))
    }

    /// `redlock` over Redis nodes, `quorum` over any other store.
    fn store_label(&self) -> &'static str {
        if self.inner.labels.iter().all(|l| *l == "redis") {
            "redlock"
        } else {
            "quorum"
        }
    }

    fn engine(&self) -> &Engine {
        &self.inner.engine
    }
}
