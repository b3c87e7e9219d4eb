//! What dlock tells an operator: [`tracing`] spans for every remote call and every wait,
//! and metrics through the [`metrics`] facade.
//!
//! Nothing here needs setting up: install a `tracing` subscriber and/or a `metrics`
//! recorder (an exporter) in the application, and dlock's spans and metrics flow into
//! them. Without a subscriber the spans cost a cached "disabled" check; without a
//! recorder a metric costs a hash of two or three static labels and a call into the no-op
//! recorder — no allocation, no formatting. dlock installs nothing and forces no exporter
//! (`docs/observability.md` in the repository shows Prometheus and OpenTelemetry set-ups;
//! `examples/prometheus.rs` runs one).
//!
//! The names below (span names, field names, metric names, label names and label values)
//! are **stable**: they change only with a major version, so dashboards, alerts and
//! OpenTelemetry pipelines may rely on them. Each is also a constant in this module.
//!
//! # Spans
//!
//! Every span is at `DEBUG` level (quiet under the usual `info` default) with target
//! `fencelock::…` (the module that makes it), so `RUST_LOG=fencelock=debug` turns them all on.
//!
//! | span | one per | fields |
//! |---|---|---|
//! | `dlock.lock` | acquisition: `lock()`, `try_lock()`, `try_lock_for()`, … of every primitive (semaphore `acquire`, read-write `read`/`write`, `campaign`, …) | `store`, `primitive`, `lock`, `outcome`, `attempts`, `error`, `otel.status_code` |
//! | `dlock.acquire` | acquire request sent to the store (each repeat too) | [call fields](#call-fields), `queue` |
//! | `dlock.release` | release request (a guard's `release()`, a dropped guard's background release, `release_token`) | call fields |
//! | `dlock.extend` | extend request (`LockGuard::extend`, `extend_token`) | call fields |
//! | `dlock.abandon` | withdrawal of a waiter's place in the store's queue | call fields |
//! | `dlock.watch` | subscription to release announcements | call fields |
//! | `dlock.inspect` | `Lock::state` / `is_locked` | call fields |
//! | `dlock.force_unlock` | `Lock::force_unlock` | call fields |
//! | `dlock.wait` | sleep between two attempts of an acquisition, wait inside the store ([below](#waits-inside-the-store)), or an election observer's wait for the next change ([below](#an-observers-waits)) | `store`, `primitive`, `lock`, `timer_ms`, `woken_by`, `waited_ms`, `handoff` |
//! | `dlock.renew` | watchdog renewal batch (one store call for every lease due) | `store`, `op` (`renew`), `leases`, `renewed`, `failed`, `lost`, `outcome`, `rtt_ms`, `error`, `otel.kind`, `otel.status_code`, and `primitive`, `lock` when the batch holds one lease |
//! | `dlock.publish` / `dlock.record` | write / read of an election's leader record (`Leadership::proclaim` and the campaign's announcement / `Election::leader`, `observe`) | call fields (`op` `publish`, `record`) |
//! | `dlock.watch` (`op` `watch_record`) | subscription to an election's record changes (`observe`) | call fields |
//! | `dlock.permits` | a semaphore's `available_permits`, `set_permits`, `add_permits` | call fields (`op` `permits_in_use`, `set_permits`, `add_permits`) |
//! | `dlock.downgrade` | a read-write lock's downgrade of its write hold | call fields |
//! | `dlock.list` | listing of the held locks under a prefix ([`RawInspect::list`](crate::raw::RawInspect::list): `dlock list`, `dlock top`) | `store`, `op` (`list`), `pattern`, `outcome` (`ok`, `error`), `listed` (names returned), `rtt_ms`, `error`, `otel.kind`, `otel.status_code` |
//! | `dlock.node` | one node's part of a [`Quorum`](crate::backend::Quorum)'s acquire, release, extend or renewal (a child of that call's span) | `store` (the node's own kind), `node` (its position, from 0), `op`, `outcome` (`ok`, `error`), `rtt_ms`, `error`, `otel.kind`, `otel.status_code` |
//!
//! The call spans (`dlock.acquire` … `dlock.force_unlock`) are children of the
//! `dlock.lock` span when made by an acquisition, and of whatever span is current
//! otherwise; `dlock.renew` and a dropped guard's `dlock.release` run on background tasks
//! and have no parent. `dlock.list` is a child of whatever span is current.
//!
//! ## Call fields
//!
//! | field | value |
//! |---|---|
//! | `store` | the kind of store, see [`RawLock::store_label`](crate::raw::RawLock::store_label): `redis`, `redlock`, `memcached`, `etcd`, `postgres`, `postgres-advisory`, `zookeeper`, `memory`, … — never an address |
//! | `primitive` | see [`primitive`]: `lock`, `semaphore`, `reentrant`, `rwlock_read`, `rwlock_write`, `fair`, `election` |
//! | `op` | the operation: the span name without `dlock.` — `acquire`, `release`, `extend`, `abandon`, `watch`, `inspect`, `force_unlock`, `downgrade`, `list` — or, where one span name covers several, see the table above (`watch_record`, `publish`, `record`, `permits_in_use`, `set_permits`, `add_permits`, `renew`) |
//! | `lock` | the lock's name (not its key) |
//! | `attempt` | 1 for the first request of this operation; counts every request of an acquisition (repeats after a lost reply and attempts after a wait) and every repeat of a release |
//! | `outcome` | see [`outcome`]: `acquired` / `busy` (acquire); `released` / `not_held` (release); `extended` / `not_held` (extend); `ok` (others); `error` |
//! | `rtt_ms` | round-trip time of the request, in milliseconds (float) |
//! | `error` | on `outcome = error`: the [`ErrorKind`](crate::ErrorKind) variant, e.g. `Unavailable` |
//! | `otel.kind` | `client` (for `tracing-opentelemetry`: the span kind) |
//! | `otel.status_code` | `ERROR` on `outcome = error` |
//!
//! `dlock.acquire` also has `queue` (bool): whether the attempt asked the store to queue
//! the waiter. `dlock.lock`'s `outcome` is `acquired`, `busy` (one attempt, found held),
//! `timeout` (waited until the deadline) or `error`, and `attempts` counts its acquire
//! requests. `dlock.wait`'s `timer_ms` is how long the waiter meant to sleep at most,
//! `waited_ms` how long it slept, `woken_by` (see [`woken_by`]) what ended the sleep:
//! `release` (a release announcement), `fallback` (the timer set from the holder's
//! remaining lease, when the announcement did not come), `backoff` (the polling timer of
//! a store that cannot announce releases), `deadline` (the caller's deadline), `outage`
//! (the pause before trying again while the store is unreachable, or a wait inside the
//! store that ended with the store failing) or, for an election's observer only, `change`
//! (an announcement that the election's record was written); `handoff` is `true` when the
//! store handed the lock over to this waiter at the release.
//!
//! ## Waits inside the store
//!
//! A store that waits inside itself ([`RawLock::WAITS_IN_STORE`](crate::raw::RawLock::WAITS_IN_STORE):
//! PostgreSQL's plain locks, whose waiters block in their acquire statement at the
//! name's gate) keeps a waiter in a queueing `dlock.acquire` rather than in a sleep. Such
//! a wait is a `dlock.wait` too:
//!
//! - once an attempt found the lock held, the `dlock.wait` span opens **before** the
//!   queueing attempt, which is its child, and ends with it: `woken_by` `release` (the
//!   store let the waiter through at a release: the lock is ours), `deadline` (the
//!   caller's deadline ended the wait in the store) or `outage` (the store failed); if
//!   the store answers without the lock (it queued the waiter, or its own bound on the
//!   wait ran out), the same span goes on through the sleep that follows and ends as a
//!   sleep does. `timer_ms` is the time left to the caller's deadline (absent without
//!   one: the store bounds its wait), raised when the sleep begins to the longest the
//!   whole wait then means to take;
//! - a client that still listens from an earlier wait queues from its first attempt,
//!   before it knows the lock held, and learns only from the store's reply whether that
//!   attempt waited (PostgreSQL: whether it had to wait for the gate). Such a wait is
//!   recorded when the reply comes: a `dlock.wait` after that `dlock.acquire`, with
//!   `waited_ms` the attempt's time in the store, `woken_by` `release` (granted),
//!   `fallback` (the store's own bound ran out: PostgreSQL's half a ttl at the gate) or
//!   `deadline`. Its own start and end are when it was recorded; the `dlock.acquire`
//!   before it spans the wait.
//!
//! `handoff` is `false` for a wait the store ended by letting the waiter's own request
//! through (nothing was handed over). Every such wait is one observation of
//! `dlock_wait_duration_seconds`, as a sleep is.
//!
//! ## An observer's waits
//!
//! An election's observer ([`Election::observe`](crate::Election::observe)) sleeps between
//! two reads of the leader record until something may have changed. Each such sleep is a
//! `dlock.wait` with `primitive` `election` and the election's name as `lock`; `timer_ms`
//! is the interval after which it reads again anyway, `handoff` is `false`, and
//! `woken_by` is
//!
//! - `change`: the store announced a write of the record (a new leader's announcement or
//!   a leader's `proclaim`);
//! - `fallback`: no announcement came within the lease's length, and the observer reads
//!   again in case one was lost;
//! - `backoff`: the poll interval of a store that cannot announce writes (memcached: a
//!   tenth of the lease, between 50 ms and 1 s);
//! - `outage`: the pause before reading again after a call of the observer failed.
//!
//! Being woken is not a change: the observer reads, and sleeps again (a new `dlock.wait`)
//! if the leader and its value are the same. The spans are children of whatever span is
//! current where the observer is polled. They are spans only: an observer idles for as
//! long as a leader stays, so its sleeps are not observations of
//! `dlock_wait_duration_seconds` and do not count in `dlock_waiters` (both are about
//! waiting for a lock). A candidate's own wait for the leadership (`campaign`,
//! `campaign_for`) is its lock's: a `dlock.lock` span with `primitive` `election` and its
//! `dlock.wait` children, counted as any lock's.
//!
//! `dlock.list` has `pattern` (the glob the names were matched against) and `listed` (how
//! many names came back); it has no `primitive` or `lock`.
//!
//! `dlock.renew` counts the batch's leases by result: `renewed`, `failed` (the store
//! failed and the lease is still valid: tried again soon) and `lost` (the store said the
//! lease was gone, or it ran out before a renewal succeeded); its `outcome` is `ok`
//! (all renewed), `partial`, `not_held` (none renewed, all gone) or `error`.
//!
//! **Never in a field**: tokens (not even abbreviated), passwords, URLs, store addresses.
//! Error messages appear only in the existing `DEBUG`/`WARN` events, which do not carry
//! tokens either.
//!
//! # Metrics
//!
//! | metric | type | labels | what |
//! |---|---|---|---|
//! | `dlock_acquire_duration_seconds` | histogram | `store`, `primitive`, `outcome` | time from calling `lock()` / `try_lock*()` to its return; `outcome`: `acquired`, `busy`, `timeout`, `error`, `cancelled` (the future was dropped) |
//! | `dlock_wait_duration_seconds` | histogram | `store`, `primitive`, `woken_by` | one observation per sleep between attempts, or wait inside the store (see `dlock.wait`; an election observer's waits are spans only) |
//! | `dlock_holds` | gauge | `store`, `primitive` | guards alive in this process |
//! | `dlock_waiters` | gauge | `store`, `primitive` | acquisitions in this process that are waiting: for the lock (found held) or for the store (unreachable, pausing before the next attempt) |
//! | `dlock_renewals_total` | counter | `store`, `primitive` | leases the watchdog renewed |
//! | `dlock_renewal_failures_total` | counter | `store`, `primitive` | watchdog renewals that did not extend their lease (store error, timeout, lease gone) |
//! | `dlock_leases_lost_total` | counter | `store`, `primitive`, `reason` | leases lost while held: `taken` (the store said the key was gone or someone else's), `expired` (the validity ran out before a renewal succeeded) |
//! | `dlock_handoffs_total` | counter | `store`, `primitive`, `kind` | `grant`: the store handed the lock over to a waiter at a release; `wakeup`: a waiter passed a release announcement on to another local waiter (it left, or its grant leaves room for more) |
//! | `dlock_retries_total` | counter | `store`, `primitive`, `op` | requests repeated because their outcome was unknown (no reply in time, connection lost), and acquisition attempts repeated during a store outage; `op`: `acquire`, `release` |
//!
//! Label values come from small fixed sets, so the number of series stays bounded. Lock
//! names are **not** labels unless a builder opts in with `metrics_name_label(true)`
//! (e.g. [`LockBuilder::metrics_name_label`](crate::LockBuilder::metrics_name_label)):
//! then every metric of that lock also carries `lock = "<name>"` — do that only for a
//! handful of well-known names.
//!
//! Call [`describe_metrics`] once after installing a recorder to give an exporter the
//! metrics' units and help texts.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use metrics::{Key, Label, SharedString};
use tokio::time::Instant;
use tracing::Span;

/// Span names.
pub mod span {
    /// One acquisition (`lock()`, `try_lock*()`, …) of any primitive, from call to return.
    pub const LOCK: &str = "dlock.lock";
    /// One acquire request to the store.
    pub const ACQUIRE: &str = "dlock.acquire";
    /// One release request to the store.
    pub const RELEASE: &str = "dlock.release";
    /// One extend request to the store.
    pub const EXTEND: &str = "dlock.extend";
    /// One withdrawal of a waiter from the store's queue.
    pub const ABANDON: &str = "dlock.abandon";
    /// One subscription to release announcements.
    pub const WATCH: &str = "dlock.watch";
    /// One read of a lock's state.
    pub const INSPECT: &str = "dlock.inspect";
    /// One forced unlock.
    pub const FORCE_UNLOCK: &str = "dlock.force_unlock";
    /// One write of an election's leader record (a leadership's announcement).
    pub const PUBLISH: &str = "dlock.publish";
    /// One read of an election's leader record.
    pub const RECORD: &str = "dlock.record";
    /// One read or change of a semaphore's permit count.
    pub const PERMITS: &str = "dlock.permits";
    /// One downgrade of a read-write lock's write hold to a read hold.
    pub const DOWNGRADE: &str = "dlock.downgrade";
    /// One listing of the held locks under a prefix ([`RawInspect::list`](crate::raw::RawInspect::list):
    /// `dlock list`, `dlock top`).
    pub const LIST: &str = "dlock.list";
    /// One sleep of a waiter between attempts.
    pub const WAIT: &str = "dlock.wait";
    /// One renewal batch of the watchdog.
    pub const RENEW: &str = "dlock.renew";
    /// One node's part of a quorum's (RedLock's) request: a child of the request's span,
    /// with the node's position and its own store kind, so that a slow or failing node
    /// can be told apart from the quorum's verdict.
    pub const NODE: &str = "dlock.node";
}

/// Span field names.
pub mod field {
    /// The kind of store ([`RawLock::store_label`](crate::raw::RawLock::store_label)).
    pub const STORE: &str = "store";
    /// The primitive ([`primitive`](super::primitive)).
    pub const PRIMITIVE: &str = "primitive";
    /// The lock's name.
    pub const LOCK: &str = "lock";
    /// The operation ([`op`](super::op)).
    pub const OP: &str = "op";
    /// The request's number within its operation, from 1.
    pub const ATTEMPT: &str = "attempt";
    /// How many acquire requests an acquisition sent.
    pub const ATTEMPTS: &str = "attempts";
    /// How the call or acquisition ended ([`outcome`](super::outcome)).
    pub const OUTCOME: &str = "outcome";
    /// Round-trip time in milliseconds.
    pub const RTT_MS: &str = "rtt_ms";
    /// A quorum node's position among the quorum's nodes, from 0 (`dlock.node`).
    pub const NODE: &str = "node";
    /// The [`ErrorKind`](crate::ErrorKind) of a failed call.
    pub const ERROR: &str = "error";
    /// Whether an acquire request asked the store to queue the waiter.
    pub const QUEUE: &str = "queue";
    /// The glob pattern a listing matched names against (`dlock.list`).
    pub const PATTERN: &str = "pattern";
    /// How many names a listing returned (`dlock.list`).
    pub const LISTED: &str = "listed";
    /// The longest a waiter meant to sleep, in milliseconds.
    pub const TIMER_MS: &str = "timer_ms";
    /// How long a waiter slept, in milliseconds.
    pub const WAITED_MS: &str = "waited_ms";
    /// What ended a waiter's sleep ([`woken_by`](super::woken_by)).
    pub const WOKEN_BY: &str = "woken_by";
    /// Whether the store handed the lock over to the waiter.
    pub const HANDOFF: &str = "handoff";
    /// Leases in a renewal batch.
    pub const LEASES: &str = "leases";
    /// Leases a renewal batch renewed.
    pub const RENEWED: &str = "renewed";
    /// Leases whose renewal failed in a batch (store errors, timeouts).
    pub const FAILED: &str = "failed";
    /// Leases a renewal batch found lost.
    pub const LOST: &str = "lost";
    /// The span kind for `tracing-opentelemetry` (`client`).
    pub const OTEL_KIND: &str = "otel.kind";
    /// The span status for `tracing-opentelemetry` (`ERROR` on failure).
    pub const OTEL_STATUS_CODE: &str = "otel.status_code";
}

/// Values of the `op` field and label.
pub mod op {
    /// An acquire request.
    pub const ACQUIRE: &str = "acquire";
    /// A release request.
    pub const RELEASE: &str = "release";
    /// An extend request.
    pub const EXTEND: &str = "extend";
    /// A waiter's withdrawal.
    pub const ABANDON: &str = "abandon";
    /// A subscription to release announcements.
    pub const WATCH: &str = "watch";
    /// A read of a lock's state.
    pub const INSPECT: &str = "inspect";
    /// A forced unlock.
    pub const FORCE_UNLOCK: &str = "force_unlock";
    /// A leader record written.
    pub const PUBLISH: &str = "publish";
    /// A leader record read.
    pub const RECORD: &str = "record";
    /// A subscription to leader record changes.
    pub const WATCH_RECORD: &str = "watch_record";
    /// The permits in use read.
    pub const PERMITS_IN_USE: &str = "permits_in_use";
    /// The permit count set.
    pub const SET_PERMITS: &str = "set_permits";
    /// Permits added or removed.
    pub const ADD_PERMITS: &str = "add_permits";
    /// A write hold downgraded.
    pub const DOWNGRADE: &str = "downgrade";
    /// The held locks listed.
    pub const LIST: &str = "list";
    /// A watchdog renewal batch.
    pub const RENEW: &str = "renew";
}

/// Values of the `outcome` field and label.
pub mod outcome {
    /// The lock (or permits, or hold) is ours.
    pub const ACQUIRED: &str = "acquired";
    /// Someone else holds it (one attempt, or one acquisition that made one attempt).
    pub const BUSY: &str = "busy";
    /// An acquisition waited until its deadline.
    pub const TIMEOUT: &str = "timeout";
    /// An acquisition whose future was dropped before it returned (metric only).
    pub const CANCELLED: &str = "cancelled";
    /// A release found the lock ours and gave it back.
    pub const RELEASED: &str = "released";
    /// An extend renewed the lease.
    pub const EXTENDED: &str = "extended";
    /// A release or extend found the lock no longer ours.
    pub const NOT_HELD: &str = "not_held";
    /// A call without a more specific outcome succeeded; every lease of a renewal batch
    /// was renewed.
    pub const OK: &str = "ok";
    /// Some leases of a renewal batch were renewed, some not.
    pub const PARTIAL: &str = "partial";
    /// The call failed (see the `error` field).
    pub const ERROR: &str = "error";
}

/// Values of the `woken_by` field and label.
pub mod woken_by {
    /// A release announcement.
    pub const RELEASE: &str = "release";
    /// The fallback timer from the holder's remaining lease (the announcement did not
    /// come).
    pub const FALLBACK: &str = "fallback";
    /// The backoff timer of a store that cannot announce releases.
    pub const BACKOFF: &str = "backoff";
    /// The caller's deadline.
    pub const DEADLINE: &str = "deadline";
    /// The pause before trying again while the store is unreachable.
    pub const OUTAGE: &str = "outage";
    /// An announcement that an election's record was written (an observer's wait only:
    /// a span field value, never a metric label).
    pub const CHANGE: &str = "change";
}

/// Values of the `primitive` field and label ([`RawLock::PRIMITIVE`](crate::raw::RawLock::PRIMITIVE)).
pub mod primitive {
    /// [`Lock`](crate::Lock) (and backends' own primitives that set nothing else).
    pub const LOCK: &str = "lock";
    /// [`Semaphore`](crate::Semaphore) permits.
    pub const SEMAPHORE: &str = "semaphore";
    /// [`ReentrantLock`](crate::ReentrantLock) holds.
    pub const REENTRANT: &str = "reentrant";
    /// [`RwLock`](crate::RwLock) readers.
    pub const RWLOCK_READ: &str = "rwlock_read";
    /// [`RwLock`](crate::RwLock) writers.
    pub const RWLOCK_WRITE: &str = "rwlock_write";
    /// [`FairLock`](crate::FairLock).
    pub const FAIR: &str = "fair";
    /// [`Election`](crate::Election) candidates and leaders.
    pub const ELECTION: &str = "election";
}

/// Metric names.
pub mod metric {
    /// Histogram (seconds): acquisitions, by `outcome`.
    pub const ACQUIRE_DURATION: &str = "dlock_acquire_duration_seconds";
    /// Histogram (seconds): waiters' sleeps, by `woken_by`.
    pub const WAIT_DURATION: &str = "dlock_wait_duration_seconds";
    /// Gauge: guards alive.
    pub const HOLDS: &str = "dlock_holds";
    /// Gauge: acquisitions waiting.
    pub const WAITERS: &str = "dlock_waiters";
    /// Counter: leases renewed by the watchdog.
    pub const RENEWALS: &str = "dlock_renewals_total";
    /// Counter: watchdog renewals that did not extend their lease.
    pub const RENEWAL_FAILURES: &str = "dlock_renewal_failures_total";
    /// Counter: leases lost while held, by `reason`.
    pub const LEASES_LOST: &str = "dlock_leases_lost_total";
    /// Counter: hand-offs, by `kind`.
    pub const HANDOFFS: &str = "dlock_handoffs_total";
    /// Counter: repeated requests, by `op`.
    pub const RETRIES: &str = "dlock_retries_total";
}

/// Metric label names.
pub mod label {
    /// The kind of store ([`RawLock::store_label`](crate::raw::RawLock::store_label)).
    pub const STORE: &str = "store";
    /// The primitive ([`primitive`](super::primitive)).
    pub const PRIMITIVE: &str = "primitive";
    /// How an acquisition ended ([`outcome`](super::outcome)).
    pub const OUTCOME: &str = "outcome";
    /// What ended a sleep ([`woken_by`](super::woken_by)).
    pub const WOKEN_BY: &str = "woken_by";
    /// Why a lease was lost ([`reason`](super::reason)).
    pub const REASON: &str = "reason";
    /// Which hand-off ([`handoff`](super::handoff)).
    pub const KIND: &str = "kind";
    /// Which request was repeated ([`op`](super::op): `acquire`, `release`).
    pub const OP: &str = "op";
    /// The lock's name, only where a builder opted in (`metrics_name_label(true)`).
    pub const LOCK: &str = "lock";
}

/// Values of the `reason` label of `dlock_leases_lost_total`.
pub mod reason {
    /// The store said the key was gone or held by another token.
    pub const TAKEN: &str = "taken";
    /// The validity ran out before a renewal succeeded.
    pub const EXPIRED: &str = "expired";
}

/// Values of the `kind` label of `dlock_handoffs_total`.
pub mod handoff {
    /// The store handed the lock over to a waiter at a release.
    pub const GRANT: &str = "grant";
    /// A waiter passed a release announcement on to another local waiter.
    pub const WAKEUP: &str = "wakeup";
}

/// Registers the units and help texts of dlock's metrics with the installed recorder.
/// Optional (exporters work without it); call it once, after installing the recorder.
pub fn describe_metrics() {
    use metrics::Unit;
    metrics::describe_histogram!(
        metric::ACQUIRE_DURATION,
        Unit::Seconds,
        "Time from asking for a dlock lock to getting it, giving up or failing."
    );
    metrics::describe_histogram!(
        metric::WAIT_DURATION,
        Unit::Seconds,
        "Time a dlock waiter slept between two attempts, by what woke it."
    );
    metrics::describe_gauge!(
        metric::HOLDS,
        Unit::Count,
        "dlock guards alive in this process."
    );
    metrics::describe_gauge!(
        metric::WAITERS,
        Unit::Count,
        "dlock acquisitions in this process waiting for a held lock."
    );
    metrics::describe_counter!(
        metric::RENEWALS,
        Unit::Count,
        "Leases the dlock watchdog renewed."
    );
    metrics::describe_counter!(
        metric::RENEWAL_FAILURES,
        Unit::Count,
        "dlock watchdog renewals that did not extend their lease."
    );
    metrics::describe_counter!(
        metric::LEASES_LOST,
        Unit::Count,
        "dlock leases lost while held (taken: gone from the store; expired: not renewed in time)."
    );
    metrics::describe_counter!(
        metric::HANDOFFS,
        Unit::Count,
        "dlock hand-offs: grants handed over at a release, wake-ups passed on to another waiter."
    );
    metrics::describe_counter!(
        metric::RETRIES,
        Unit::Count,
        "dlock requests repeated because their outcome was unknown or the store was unreachable."
    );
}

/// The label pairs beyond `store` and `primitive` that a metric may carry. The index is
/// the position in [`EXTRA`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Extra {
    Acquired,
    Busy,
    Timeout,
    Error,
    Cancelled,
    WokenRelease,
    WokenFallback,
    WokenBackoff,
    WokenDeadline,
    WokenOutage,
    LostTaken,
    LostExpired,
    HandoffGrant,
    HandoffWakeup,
    RetryAcquire,
    RetryRelease,
}

const EXTRA: [(&str, &str); 16] = [
    (label::OUTCOME, outcome::ACQUIRED),
    (label::OUTCOME, outcome::BUSY),
    (label::OUTCOME, outcome::TIMEOUT),
    (label::OUTCOME, outcome::ERROR),
    (label::OUTCOME, outcome::CANCELLED),
    (label::WOKEN_BY, woken_by::RELEASE),
    (label::WOKEN_BY, woken_by::FALLBACK),
    (label::WOKEN_BY, woken_by::BACKOFF),
    (label::WOKEN_BY, woken_by::DEADLINE),
    (label::WOKEN_BY, woken_by::OUTAGE),
    (label::REASON, reason::TAKEN),
    (label::REASON, reason::EXPIRED),
    (label::KIND, handoff::GRANT),
    (label::KIND, handoff::WAKEUP),
    (label::OP, op::ACQUIRE),
    (label::OP, op::RELEASE),
];

impl Extra {
    /// The label's value (also the span field's, for `woken_by`).
    pub(crate) fn value(self) -> &'static str {
        EXTRA[self as usize].1
    }
}

/// Every label set of one (store, primitive) pair, built once and kept for the life of
/// the process, so that recording a metric allocates nothing.
#[derive(Debug)]
struct Table {
    store: &'static str,
    primitive: &'static str,
    base: [Label; 2],
    extra: [[Label; 3]; EXTRA.len()],
}

/// The tables made so far: one per (store kind, primitive) pair, a bounded number.
static TABLES: Mutex<Vec<&'static Table>> = Mutex::new(Vec::new());

fn table(store: &'static str, primitive: &'static str) -> &'static Table {
    let mut tables = TABLES.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(t) = tables
        .iter()
        .find(|t| t.store == store && t.primitive == primitive)
    {
        return t;
    }
    let base = [
        Label::from_static_parts(label::STORE, store),
        Label::from_static_parts(label::PRIMITIVE, primitive),
    ];
    let extra = EXTRA.map(|(k, v)| {
        [
            base[0].clone(),
            base[1].clone(),
            Label::from_static_parts(k, v),
        ]
    });
    let t: &'static Table = Box::leak(Box::new(Table {
        store,
        primitive,
        base,
        extra,
    }));
    tables.push(t);
    t
}

static META: metrics::Metadata<'static> =
    metrics::Metadata::new("dlock", metrics::Level::INFO, Some(module_path!()));

/// What one lock (and its guards and leases) labels its spans and metrics with.
#[derive(Debug, Clone)]
pub(crate) struct Obs {
    table: &'static Table,
    /// The lock's name as a metric label, where the builder opted in.
    name: Option<Arc<str>>,
}

impl Obs {
    /// The labels of a lock on a store of kind `store` (its
    /// [`store_label`](crate::raw::RawLock::store_label)) of `primitive`, named `name`; the
    /// name becomes a metric label only with `name_label`.
    pub(crate) fn new(
        store: &'static str,
        primitive: &'static str,
        name: &str,
        name_label: bool,
    ) -> Obs {
        Obs {
            table: table(store, primitive),
            name: name_label.then(|| Arc::from(name)),
        }
    }

    /// The same labels for another primitive.
    pub(crate) fn with_primitive(&self, primitive: &'static str) -> Obs {
        Obs {
            table: table(self.table.store, primitive),
            name: self.name.clone(),
        }
    }

    pub(crate) fn store(&self) -> &'static str {
        self.table.store
    }

    pub(crate) fn primitive(&self) -> &'static str {
        self.table.primitive
    }

    fn key(&self, name: &'static str, extra: Option<Extra>) -> Key {
        let labels: &'static [Label] = match extra {
            None => &self.table.base,
            Some(e) => &self.table.extra[e as usize],
        };
        match &self.name {
            None => Key::from_static_parts(name, labels),
            Some(lock) => {
                let mut labels = labels.to_vec();
                labels.push(Label::new(
                    label::LOCK,
                    SharedString::from_shared(Arc::clone(lock)),
                ));
                Key::from_parts(name, labels)
            }
        }
    }

    /// Adds `n` to counter `name`.
    pub(crate) fn count(&self, name: &'static str, extra: Option<Extra>, n: u64) {
        let key = self.key(name, extra);
        metrics::with_recorder(|r| r.register_counter(&key, &META).increment(n));
    }

    /// Records `d` in histogram `name` (in seconds).
    pub(crate) fn time(&self, name: &'static str, extra: Extra, d: Duration) {
        let key = self.key(name, Some(extra));
        metrics::with_recorder(|r| r.register_histogram(&key, &META).record(d.as_secs_f64()));
    }

    /// Moves gauge `name` by `delta`.
    pub(crate) fn gauge(&self, name: &'static str, delta: f64) {
        let key = self.key(name, None);
        metrics::with_recorder(|r| {
            let g = r.register_gauge(&key, &META);
            if delta >= 0.0 {
                g.increment(delta);
            } else {
                g.decrement(-delta);
            }
        });
    }

    /// A `dlock.wait` span for a sleep of at most `timer` (`None`: a wait inside the
    /// store without a deadline, which the store bounds).
    pub(crate) fn wait_span(&self, lock: &str, timer: Option<Duration>) -> Span {
        tracing::debug_span!(
            span::WAIT,
            { field::STORE } = self.store(),
            { field::PRIMITIVE } = self.primitive(),
            { field::LOCK } = lock,
            { field::TIMER_MS } = timer.map(millis),
            { field::WOKEN_BY } = tracing::field::Empty,
            { field::WAITED_MS } = tracing::field::Empty,
            { field::HANDOFF } = tracing::field::Empty,
        )
    }

    /// Records a sleep that `woken_by` ended after `waited`.
    pub(crate) fn waited(&self, span: &Span, woken_by: Extra, waited: Duration) {
        span.record(field::WOKEN_BY, woken_by.value());
        span.record(field::WAITED_MS, millis(waited));
        self.time(metric::WAIT_DURATION, woken_by, waited);
    }
}

/// Records how an election observer's wait in `span` (an [`Obs::wait_span`]) ended:
/// `woken_by` (a [`woken_by`] value) after `waited`. Span fields only: an observer's waits
/// are not waits for a lock, and stay out of `dlock_wait_duration_seconds` (see the
/// [module docs](self#an-observers-waits)).
pub(crate) fn observer_waited(span: &Span, woken_by: &'static str, waited: Duration) {
    span.record(field::WOKEN_BY, woken_by);
    span.record(field::WAITED_MS, millis(waited));
    span.record(field::HANDOFF, false);
}

/// One acquisition (`lock()`, `try_lock*()`) in progress: its `dlock.lock` span, its
/// attempts, whether it waits (`dlock_waiters`), and its entry in
/// `dlock_acquire_duration_seconds` when it ends — `cancelled` if its future is dropped.
pub(crate) struct Acquisition<'a> {
    obs: &'a Obs,
    span: Span,
    started: Instant,
    /// One attempt and no wait: a `busy` rather than a `timeout` when it finds the lock
    /// held.
    once: bool,
    attempts: AtomicU32,
    waiting: AtomicBool,
    finished: bool,
}

impl<'a> Acquisition<'a> {
    pub(crate) fn start(obs: &'a Obs, lock: &str, deadline: Option<Instant>) -> Acquisition<'a> {
        let started = Instant::now();
        let span = tracing::debug_span!(
            span::LOCK,
            { field::STORE } = obs.store(),
            { field::PRIMITIVE } = obs.primitive(),
            { field::LOCK } = lock,
            { field::OUTCOME } = tracing::field::Empty,
            { field::ATTEMPTS } = tracing::field::Empty,
            { field::ERROR } = tracing::field::Empty,
            { field::OTEL_STATUS_CODE } = tracing::field::Empty,
        );
        Acquisition {
            obs,
            span,
            started,
            once: deadline.is_some_and(|d| d <= started),
            attempts: AtomicU32::new(0),
            waiting: AtomicBool::new(false),
            finished: false,
        }
    }

    pub(crate) fn span(&self) -> Span {
        self.span.clone()
    }

    /// The number of the acquire request about to be sent, from 1.
    pub(crate) fn next_attempt(&self) -> u32 {
        self.attempts.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// The acquisition waits (from its first sleep or subscription on).
    pub(crate) fn waiting(&self) {
        if !self.waiting.swap(true, Ordering::Relaxed) {
            self.obs.gauge(metric::WAITERS, 1.0);
        }
    }

    /// Records how the acquisition ended.
    pub(crate) fn finish<T>(&mut self, result: &crate::Result<Option<T>>) {
        self.finished = true;
        let extra = match result {
            Ok(Some(_)) => Extra::Acquired,
            Ok(None) if self.once => Extra::Busy,
            Ok(None) => Extra::Timeout,
            Err(_) => Extra::Error,
        };
        if !self.span.is_disabled() {
            self.span
                .record(field::ATTEMPTS, self.attempts.load(Ordering::Relaxed));
            match result {
                Err(err) => failed(&self.span, err),
                Ok(_) => {
                    self.span.record(field::OUTCOME, extra.value());
                }
            }
        }
        self.obs
            .time(metric::ACQUIRE_DURATION, extra, self.started.elapsed());
    }
}

impl Drop for Acquisition<'_> {
    fn drop(&mut self) {
        if *self.waiting.get_mut() {
            self.obs.gauge(metric::WAITERS, -1.0);
        }
        if !self.finished {
            self.obs.time(
                metric::ACQUIRE_DURATION,
                Extra::Cancelled,
                self.started.elapsed(),
            );
        }
    }
}

/// A duration in (fractional) milliseconds, for span fields.
pub(crate) fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// A remote-call span (see the [module docs](self)): `$name` and `$op` from [`span`] and
/// [`op`], the lock's [`Obs`], its name and the request's number.
macro_rules! call_span {
    ($name:expr, $op:expr, $obs:expr, $lock:expr, $attempt:expr $(, $k:ident = $v:expr)*) => {
        tracing::debug_span!(
            $name,
            { $crate::observe::field::STORE } = $obs.store(),
            { $crate::observe::field::PRIMITIVE } = $obs.primitive(),
            { $crate::observe::field::OP } = $op,
            { $crate::observe::field::LOCK } = $lock,
            { $crate::observe::field::ATTEMPT } = $attempt,
            { $crate::observe::field::OUTCOME } = tracing::field::Empty,
            { $crate::observe::field::RTT_MS } = tracing::field::Empty,
            { $crate::observe::field::ERROR } = tracing::field::Empty,
            { $crate::observe::field::OTEL_KIND } = "client",
            { $crate::observe::field::OTEL_STATUS_CODE } = tracing::field::Empty,
            $($k = $v,)*
        )
    };
}
pub(crate) use call_span;

/// Awaits `$call`, a remote call a primitive makes beyond its lock's own (an election's
/// record, a semaphore's permit count, a downgrade, a primitive's state), in a call span
/// labelled by `$obs` (an [`Obs`]) for the lock named `$lock`, named `$name` with `$op`;
/// evaluates to its result.
macro_rules! observed {
    ($obs:expr, $lock:expr, $name:expr, $op:expr, $call:expr) => {{
        let call =
            $crate::observe::Call::new($crate::observe::call_span!($name, $op, $obs, $lock, 1u32));
        let result = tracing::Instrument::instrument($call, call.span()).await;
        call.done(&result, |_| $crate::observe::outcome::OK);
        result
    }};
}
pub(crate) use observed;

/// One remote call in flight: its span and, while the span is recorded, when it was sent.
pub(crate) struct Call {
    span: Span,
    sent: Option<Instant>,
}

impl Call {
    pub(crate) fn new(span: Span) -> Call {
        // The clock is read only for a span someone listens to.
        let sent = (!span.is_disabled()).then(Instant::now);
        Call { span, sent }
    }

    /// The span, to instrument the call's future with.
    pub(crate) fn span(&self) -> Span {
        self.span.clone()
    }

    /// Records how the call ended: `outcome` of its value, or the error.
    pub(crate) fn done<T>(
        self,
        result: &crate::Result<T>,
        outcome: impl FnOnce(&T) -> &'static str,
    ) {
        let Some(sent) = self.sent else {
            return;
        };
        self.span.record(field::RTT_MS, millis(sent.elapsed()));
        match result {
            Ok(v) => {
                self.span.record(field::OUTCOME, outcome(v));
            }
            Err(err) => failed(&self.span, err),
        }
    }
}

/// Marks `span` as failed with `err`'s kind.
pub(crate) fn failed(span: &Span, err: &crate::Error) {
    span.record(field::OUTCOME, outcome::ERROR);
    span.record(field::ERROR, tracing::field::debug(err.kind()));
    span.record(field::OTEL_STATUS_CODE, "ERROR");
}

/// Awaits `call`, a store's [`RawInspect::list`](crate::raw::RawInspect::list) on the
/// a store of kind `store` for names matching `pattern`, in a `dlock.list` span; evaluates
/// to its result.
pub(crate) async fn listed(
    store: &'static str,
    pattern: &str,
    call: impl std::future::Future<Output = crate::Result<Vec<String>>>,
) -> crate::Result<Vec<String>> {
    let span = tracing::debug_span!(
        span::LIST,
        { field::STORE } = store,
        { field::OP } = op::LIST,
        { field::PATTERN } = pattern,
        { field::OUTCOME } = tracing::field::Empty,
        { field::LISTED } = tracing::field::Empty,
        { field::RTT_MS } = tracing::field::Empty,
        { field::ERROR } = tracing::field::Empty,
        { field::OTEL_KIND } = "client",
        { field::OTEL_STATUS_CODE } = tracing::field::Empty,
    );
    let call_ = Call::new(span.clone());
    let result = tracing::Instrument::instrument(call, span.clone()).await;
    if let Ok(names) = &result {
        span.record(field::LISTED, names.len());
    }
    call_.done(&result, |_| outcome::OK);
    result
}

tokio::task_local! {
    /// Where a store that waits inside itself (`RawLock::WAITS_IN_STORE`) reports that the
    /// acquire request in flight on this task waited there.
    static STORE_WAIT: Arc<AtomicBool>;
}

/// Tells the acquisition whether a queueing request waited inside the store: the store
/// learns it only from the reply (PostgreSQL: whether the request had to wait for the
/// name's gate), and the acquisition reports that wait as a `dlock.wait` then.
#[derive(Debug, Default)]
pub(crate) struct StoreWait(Arc<AtomicBool>);

impl StoreWait {
    /// Runs `request` with this probe where the store finds it ([`StoreWait::reporter`]).
    pub(crate) async fn scope<F: std::future::Future>(&self, request: F) -> F::Output {
        STORE_WAIT.scope(Arc::clone(&self.0), request).await
    }

    /// Whether the store reported a wait.
    pub(crate) fn waited(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    /// For a store, on the task that made the request (before it hands the request to a
    /// task of its own): what reports a wait to the acquisition, if one is listening.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn reporter() -> StoreWaitReporter {
        StoreWaitReporter(STORE_WAIT.try_with(Arc::clone).ok())
    }
}

/// A store's end of a [`StoreWait`].
#[derive(Debug, Clone, Default)]
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
pub(crate) struct StoreWaitReporter(Option<Arc<AtomicBool>>);

impl StoreWaitReporter {
    /// The request waited inside the store.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn waited(&self) {
        if let Some(flag) = &self.0 {
            flag.store(true, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every stable name, spelled out: renaming a constant fails here (and a rename is a
    /// breaking change for dashboards and pipelines).
    const NAMES: &[(&str, &str)] = &[
        (span::LOCK, "dlock.lock"),
        (span::ACQUIRE, "dlock.acquire"),
        (span::RELEASE, "dlock.release"),
        (span::EXTEND, "dlock.extend"),
        (span::ABANDON, "dlock.abandon"),
        (span::WATCH, "dlock.watch"),
        (span::INSPECT, "dlock.inspect"),
        (span::FORCE_UNLOCK, "dlock.force_unlock"),
        (span::PUBLISH, "dlock.publish"),
        (span::RECORD, "dlock.record"),
        (span::PERMITS, "dlock.permits"),
        (span::DOWNGRADE, "dlock.downgrade"),
        (span::LIST, "dlock.list"),
        (span::WAIT, "dlock.wait"),
        (span::RENEW, "dlock.renew"),
        (span::NODE, "dlock.node"),
        (field::STORE, "store"),
        (field::PRIMITIVE, "primitive"),
        (field::LOCK, "lock"),
        (field::OP, "op"),
        (field::ATTEMPT, "attempt"),
        (field::ATTEMPTS, "attempts"),
        (field::OUTCOME, "outcome"),
        (field::RTT_MS, "rtt_ms"),
        (field::NODE, "node"),
        (field::ERROR, "error"),
        (field::QUEUE, "queue"),
        (field::PATTERN, "pattern"),
        (field::LISTED, "listed"),
        (field::TIMER_MS, "timer_ms"),
        (field::WAITED_MS, "waited_ms"),
        (field::WOKEN_BY, "woken_by"),
        (field::HANDOFF, "handoff"),
        (field::LEASES, "leases"),
        (field::RENEWED, "renewed"),
        (field::FAILED, "failed"),
        (field::LOST, "lost"),
        (field::OTEL_KIND, "otel.kind"),
        (field::OTEL_STATUS_CODE, "otel.status_code"),
        (op::ACQUIRE, "acquire"),
        (op::RELEASE, "release"),
        (op::EXTEND, "extend"),
        (op::ABANDON, "abandon"),
        (op::WATCH, "watch"),
        (op::INSPECT, "inspect"),
        (op::FORCE_UNLOCK, "force_unlock"),
        (op::PUBLISH, "publish"),
        (op::RECORD, "record"),
        (op::WATCH_RECORD, "watch_record"),
        (op::PERMITS_IN_USE, "permits_in_use"),
        (op::SET_PERMITS, "set_permits"),
        (op::ADD_PERMITS, "add_permits"),
        (op::DOWNGRADE, "downgrade"),
        (op::LIST, "list"),
        (op::RENEW, "renew"),
        (outcome::ACQUIRED, "acquired"),
        (outcome::BUSY, "busy"),
        (outcome::TIMEOUT, "timeout"),
        (outcome::CANCELLED, "cancelled"),
        (outcome::RELEASED, "released"),
        (outcome::EXTENDED, "extended"),
        (outcome::NOT_HELD, "not_held"),
        (outcome::OK, "ok"),
        (outcome::PARTIAL, "partial"),
        (outcome::ERROR, "error"),
        (woken_by::RELEASE, "release"),
        (woken_by::FALLBACK, "fallback"),
        (woken_by::BACKOFF, "backoff"),
        (woken_by::DEADLINE, "deadline"),
        (woken_by::OUTAGE, "outage"),
        (woken_by::CHANGE, "change"),
        (primitive::LOCK, "lock"),
        (primitive::SEMAPHORE, "semaphore"),
        (primitive::REENTRANT, "reentrant"),
        (primitive::RWLOCK_READ, "rwlock_read"),
        (primitive::RWLOCK_WRITE, "rwlock_write"),
        (primitive::FAIR, "fair"),
        (primitive::ELECTION, "election"),
        (metric::ACQUIRE_DURATION, "dlock_acquire_duration_seconds"),
        (metric::WAIT_DURATION, "dlock_wait_duration_seconds"),
        (metric::HOLDS, "dlock_holds"),
        (metric::WAITERS, "dlock_waiters"),
        (metric::RENEWALS, "dlock_renewals_total"),
        (metric::RENEWAL_FAILURES, "dlock_renewal_failures_total"),
        (metric::LEASES_LOST, "dlock_leases_lost_total"),
        (metric::HANDOFFS, "dlock_handoffs_total"),
        (metric::RETRIES, "dlock_retries_total"),
        (label::STORE, "store"),
        (label::PRIMITIVE, "primitive"),
        (label::OUTCOME, "outcome"),
        (label::WOKEN_BY, "woken_by"),
        (label::REASON, "reason"),
        (label::KIND, "kind"),
        (label::OP, "op"),
        (label::LOCK, "lock"),
        (reason::TAKEN, "taken"),
        (reason::EXPIRED, "expired"),
        (handoff::GRANT, "grant"),
        (handoff::WAKEUP, "wakeup"),
    ];

    /// The operator's page (`docs/observability.md`).
    const GUIDE: &str = include_str!("../../../docs/observability.md");

    #[test]
    fn stable_names_are_spelled_as_documented() {
        for (constant, literal) in NAMES {
            assert_eq!(constant, literal, "a stable name changed");
        }
        // The module's own reference (this file's docs, above the code).
        let source = include_str!("observe.rs");
        let reference = &source[..source.find("\nuse ").expect("the module docs end")];
        for (_, name) in NAMES {
            let quoted = format!("`{name}`");
            assert!(
                GUIDE.contains(&quoted),
                "{quoted} is missing from docs/observability.md"
            );
            assert!(
                reference.contains(&quoted),
                "{quoted} is missing from the module docs of fencelock::observe"
            );
        }
    }

    #[test]
    fn a_label_value_is_one_of_the_documented_values() {
        for (key, value) in EXTRA {
            assert!(
                NAMES.iter().any(|(_, name)| *name == key)
                    && NAMES.iter().any(|(_, name)| *name == value),
                "{key}={value} is not among the stable names"
            );
        }
    }

    #[test]
    fn an_observers_change_is_a_span_value_never_a_metric_label() {
        assert!(
            EXTRA.iter().all(|(_, value)| *value != woken_by::CHANGE),
            "`change` is documented as a span field value only"
        );
    }

    #[test]
    fn label_sets_are_made_once_per_pair() {
        let a = Obs::new("redis", primitive::LOCK, "n", false);
        let b = Obs::new("redis", primitive::LOCK, "m", false);
        assert!(std::ptr::eq(a.table, b.table));
        let c = a.with_primitive(primitive::ELECTION);
        assert_eq!((c.store(), c.primitive()), ("redis", "election"));
        let key = a.key(metric::LEASES_LOST, Some(Extra::LostTaken));
        let labels: Vec<_> = key.labels().map(|l| (l.key(), l.value())).collect();
        assert_eq!(
            labels,
            [
                ("store", "redis"),
                ("primitive", "lock"),
                ("reason", "taken")
            ]
        );
        let named = Obs::new("redis", primitive::LOCK, "orders", true);
        let key = named.key(metric::HOLDS, None);
        assert_eq!(key.labels().last().map(|l| l.value()), Some("orders"));
    }

    #[test]
    fn every_extra_label_has_its_slot() {
        for (i, e) in [
            Extra::Acquired,
            Extra::Busy,
            Extra::Timeout,
            Extra::Error,
            Extra::Cancelled,
            Extra::WokenRelease,
            Extra::WokenFallback,
            Extra::WokenBackoff,
            Extra::WokenDeadline,
            Extra::WokenOutage,
            Extra::LostTaken,
            Extra::LostExpired,
            Extra::HandoffGrant,
            Extra::HandoffWakeup,
            Extra::RetryAcquire,
            Extra::RetryRelease,
        ]
        .into_iter()
        .enumerate()
        {
            assert_eq!(e as usize, i);
        }
        assert_eq!(Extra::WokenOutage.value(), woken_by::OUTAGE);
        assert_eq!(Extra::RetryRelease.value(), op::RELEASE);
    }
}
