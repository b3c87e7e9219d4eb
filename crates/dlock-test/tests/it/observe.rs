//! Spans and metrics captured from real stores.
//!
//! Each test runs on a current-thread runtime of its own, under a thread-local tracing
//! subscriber and metrics recorder, so that everything it starts (the watchdog, a dropped
//! guard's release) reports to it and nothing from the other tests in this binary does.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use dlock_test::conformance::{Target, unique};
use dlock_test::proxy::{Fault, Proxy};
use dlock_test::targets::RedisTarget;
use fencelock::observe::{field, metric, span};
use fencelock::{ErrorKind, Lock, RwLock};
use metrics_util::MetricKind;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use tokio::time::{sleep, timeout};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

/// One captured span: name, parent's name, fields recorded so far (as text).
#[derive(Debug, Clone)]
struct Captured {
    name: &'static str,
    parent: Option<&'static str>,
    fields: BTreeMap<String, String>,
    closed: bool,
}

impl Captured {
    fn get(&self, field: &str) -> Option<&str> {
        self.fields.get(field).map(String::as_str)
    }

    /// The field's value, which must be there.
    fn field(&self, field: &str) -> &str {
        self.get(field)
            .unwrap_or_else(|| panic!("{} has no field {field}: {:?}", self.name, self.fields))
    }
}

/// Every span and event the test's code made, as a `tracing-subscriber` layer.
#[derive(Debug, Clone, Default)]
struct Capture {
    spans: Arc<Mutex<Vec<Captured>>>,
    /// Live span id -> index in `spans` (ids are reused after a span closes).
    live: Arc<Mutex<HashMap<u64, usize>>>,
    /// Every event's fields, message included.
    events: Arc<Mutex<Vec<BTreeMap<String, String>>>>,
}

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
}

impl<S: tracing::Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Capture {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = BTreeMap::new();
        attrs.record(&mut Fields(&mut fields));
        let parent = ctx
            .span(id)
            .and_then(|s| s.parent())
            .map(|p| p.metadata().name());
        let mut spans = self.spans.lock().unwrap_or_else(PoisonError::into_inner);
        spans.push(Captured {
            name: attrs.metadata().name(),
            parent,
            fields,
            closed: false,
        });
        self.live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id.into_u64(), spans.len() - 1);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, _ctx: Context<'_, S>) {
        let live = self.live.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(&i) = live.get(&id.into_u64()) {
            let mut spans = self.spans.lock().unwrap_or_else(PoisonError::into_inner);
            values.record(&mut Fields(&mut spans[i].fields));
        }
    }

    fn on_event(&self, event: &tracing::Event<'_>, _ctx: Context<'_, S>) {
        let mut fields = BTreeMap::new();
        event.record(&mut Fields(&mut fields));
        self.events
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(fields);
    }

    fn on_close(&self, id: Id, _ctx: Context<'_, S>) {
        let mut live = self.live.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(i) = live.remove(&id.into_u64()) {
            self.spans.lock().unwrap_or_else(PoisonError::into_inner)[i].closed = true;
        }
    }
}

impl Capture {
    /// The dlock spans captured so far.
    fn spans(&self) -> Vec<Captured> {
        self.spans
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter(|s| s.name.starts_with("dlock."))
            .cloned()
            .collect()
    }

    fn named(&self, name: &str) -> Vec<Captured> {
        self.spans()
            .into_iter()
            .filter(|s| s.name == name)
            .collect()
    }

    /// Every field value of every span and event, for leak checks.
    fn all_values(&self) -> Vec<String> {
        let spans = self.spans.lock().unwrap_or_else(PoisonError::into_inner);
        let events = self.events.lock().unwrap_or_else(PoisonError::into_inner);
        spans
            .iter()
            .flat_map(|s| s.fields.values().cloned())
            .chain(events.iter().flat_map(|e| e.values().cloned()))
            .collect()
    }
}

/// Metric values accumulated over snapshots (a snapshot resets what it reads).
#[derive(Debug, Default)]
struct Metrics {
    values: BTreeMap<(String, Vec<(String, String)>), Value>,
}

#[derive(Debug, Clone, PartialEq)]
enum Value {
    Counter(u64),
    Gauge(f64),
    Histogram(Vec<f64>),
}

/// The test's recorder: every read merges what was recorded since the last one.
#[derive(Clone)]
struct Recorded {
    snapshotter: Snapshotter,
    metrics: Arc<Mutex<Metrics>>,
}

impl Recorded {
    /// Everything recorded so far.
    fn now(&self) -> std::sync::MutexGuard<'_, Metrics> {
        let mut m = self.metrics.lock().unwrap_or_else(PoisonError::into_inner);
        m.merge(&self.snapshotter);
        m
    }
}

impl Metrics {
    fn merge(&mut self, snapshotter: &Snapshotter) {
        for (key, _, _, value) in snapshotter.snapshot().into_vec() {
            let (kind, key) = key.into_parts();
            let mut labels: Vec<(String, String)> = key
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            labels.sort();
            let slot = self.values.entry((key.name().to_owned(), labels));
            match (kind, value) {
                (MetricKind::Counter, DebugValue::Counter(n)) => {
                    let v = slot.or_insert(Value::Counter(0));
                    if let Value::Counter(c) = v {
                        *c += n;
                    }
                }
                // Gauges are only moved up and down by dlock: the swapped-out value is the
                // change since the last snapshot.
                (MetricKind::Gauge, DebugValue::Gauge(g)) => {
                    let v = slot.or_insert(Value::Gauge(0.0));
                    if let Value::Gauge(x) = v {
                        *x += g.into_inner();
                    }
                }
                (MetricKind::Histogram, DebugValue::Histogram(h)) => {
                    let v = slot.or_insert(Value::Histogram(Vec::new()));
                    if let Value::Histogram(xs) = v {
                        xs.extend(h.into_iter().map(|f| f.into_inner()));
                    }
                }
                other => panic!("unexpected metric value {other:?}"),
            }
        }
    }

    fn find(&self, name: &str, labels: &[(&str, &str)]) -> Option<&Value> {
        let mut want: Vec<(String, String)> = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        want.sort();
        self.values.get(&(name.to_owned(), want))
    }

    fn counter(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        match self.find(name, labels) {
            Some(Value::Counter(n)) => *n,
            None => 0,
            Some(v) => panic!("{name} is not a counter: {v:?}"),
        }
    }

    fn gauge(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        match self.find(name, labels) {
            Some(Value::Gauge(x)) => Some(*x),
            None => None,
            Some(v) => panic!("{name} is not a gauge: {v:?}"),
        }
    }

    fn observations(&self, name: &str, labels: &[(&str, &str)]) -> usize {
        match self.find(name, labels) {
            Some(Value::Histogram(xs)) => xs.len(),
            None => 0,
            Some(v) => panic!("{name} is not a histogram: {v:?}"),
        }
    }

    /// Every label set seen, for bounded-cardinality checks.
    fn label_keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = self
            .values
            .keys()
            .flat_map(|(_, labels)| labels.iter().map(|(k, _)| k.clone()))
            .collect();
        keys.sort();
        keys.dedup();
        keys
    }
}

/// Runs `test` on a current-thread runtime of its own, under a capturing subscriber and
/// recorder (thread-local: other tests in this binary are not seen).
fn observed<F, Fut>(test: F) -> (Capture, Recorded)
where
    F: FnOnce(Capture, Recorded) -> Fut,
    Fut: Future<Output = ()>,
{
    let capture = Capture::default();
    let recorder = DebuggingRecorder::new();
    let recorded = Recorded {
        snapshotter: recorder.snapshotter(),
        metrics: Arc::default(),
    };
    let subscriber = tracing_subscriber::registry().with(capture.clone());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let fut = test(capture.clone(), recorded.clone());
    tracing::subscriber::with_default(subscriber, || {
        metrics::with_local_recorder(&recorder, || {
            runtime.block_on(fut);
            // Background tasks (a release, the watchdog's linger) end under the recorder.
            drop(runtime);
        });
    });
    (capture, recorded)
}

const REDIS_LOCK: [(&str, &str); 2] = [("store", "redis"), ("primitive", "lock")];

/// Polls `cond` every 10 ms for at most 10 s (a bound for a hung test, not a timing).
async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..1000 {
        if cond() {
            return;
        }
        sleep(Duration::from_millis(10)).await;
    }
    panic!("gave up waiting for {what}");
}

#[test]
fn a_lock_and_its_release_are_spans_with_the_documented_fields_and_no_secret() {
    let t = RedisTarget::start();
    let port = format!(":{}", t.server.port());
    let name = unique("observe-lock");
    let token = Arc::new(Mutex::new(String::new()));
    let (capture, recorded) = observed(|_, _| {
        let (name, token) = (name.clone(), Arc::clone(&token));
        let t = &t;
        async move {
            let lock = Lock::builder(t.client().await, &name)
                .ttl(Duration::from_secs(10))
                .holder_info(fencelock::HolderInfo::current().command("nightly-secret-job"))
                .build()
                .expect("valid");
            let guard = lock.lock().await.expect("free");
            *token.lock().expect("token") = guard.token().as_str().to_owned();
            guard.release().await.expect("release");
            assert!(!lock.is_locked().await.expect("state"));
        }
    });

    let lock_span = &capture.named(span::LOCK)[0];
    assert_eq!(lock_span.field(field::STORE), "redis");
    assert_eq!(lock_span.field(field::PRIMITIVE), "lock");
    assert_eq!(lock_span.field(field::LOCK), name);
    assert_eq!(lock_span.field(field::OUTCOME), "acquired");
    assert_eq!(lock_span.field(field::ATTEMPTS), "1");
    assert!(lock_span.closed);

    let acquires = capture.named(span::ACQUIRE);
    assert_eq!(acquires.len(), 1, "{acquires:?}");
    let acquire = &acquires[0];
    assert_eq!(acquire.parent, Some(span::LOCK));
    for (f, v) in [
        (field::STORE, "redis"),
        (field::PRIMITIVE, "lock"),
        (field::OP, "acquire"),
        (field::LOCK, name.as_str()),
        (field::ATTEMPT, "1"),
        (field::OUTCOME, "acquired"),
        (field::QUEUE, "false"),
        (field::OTEL_KIND, "client"),
    ] {
        assert_eq!(acquire.field(f), v, "{f}");
    }
    let rtt: f64 = acquire
        .field(field::RTT_MS)
        .parse()
        .expect("rtt_ms is a number");
    assert!(rtt >= 0.0);
    assert_eq!(acquire.get(field::ERROR), None);

    let release = &capture.named(span::RELEASE)[0];
    assert_eq!(release.field(field::OP), "release");
    assert_eq!(release.field(field::OUTCOME), "released");
    assert_eq!(release.field(field::ATTEMPT), "1");
    assert!(release.get(field::RTT_MS).is_some());
    let inspect = &capture.named(span::INSPECT)[0];
    assert_eq!(inspect.field(field::OUTCOME), "ok");

    // No token (not even its first characters, as its Debug shows them), no address.
    // Nor the holder metadata the token carries.
    let token = token.lock().expect("token").clone();
    assert!(
        token.len() > 32 && token.contains("nightly-secret-job"),
        "a token with metadata: {token}"
    );
    for value in capture.all_values() {
        assert!(!value.contains(&token[..8]), "token in a field: {value}");
        assert!(
            !value.contains("nightly-secret-job"),
            "metadata in a field: {value}"
        );
        assert!(!value.contains(&port), "store address in a field: {value}");
    }

    let m = recorded.now();
    let acquired = [REDIS_LOCK[0], REDIS_LOCK[1], ("outcome", "acquired")];
    assert_eq!(m.observations(metric::ACQUIRE_DURATION, &acquired), 1);
    assert_eq!(
        m.gauge(metric::HOLDS, &REDIS_LOCK),
        Some(0.0),
        "held, then released"
    );
    assert_eq!(m.gauge(metric::WAITERS, &REDIS_LOCK), None, "nobody waited");
    assert_eq!(
        m.counter(
            metric::LEASES_LOST,
            &[REDIS_LOCK[0], REDIS_LOCK[1], ("reason", "taken")]
        ),
        0
    );
    // No lock name among the labels unless asked for.
    assert_eq!(m.label_keys(), ["outcome", "primitive", "store"]);
}

#[test]
fn a_contended_wait_is_a_wait_span_woken_by_the_release() {
    let t = RedisTarget::start();
    let name = unique("observe-wait");
    let (capture, recorded) = observed(|capture, recorded| {
        let name = name.clone();
        let t = &t;
        async move {
            let holder = Lock::new(t.client().await, &name).expect("valid");
            let waiter = Lock::new(t.client().await, &name).expect("valid");
            let guard = holder.lock().await.expect("free");
            let waiting = tokio::spawn(async move {
                let g = waiter.lock().await.expect("granted after the release");
                g.release().await.expect("release");
            });
            // The waiter sleeps (its wait span is open) before the holder releases.
            until("the waiter to sleep", || {
                capture.named(span::WAIT).iter().any(|s| !s.closed)
            })
            .await;
            assert_eq!(
                recorded.now().gauge(metric::WAITERS, &REDIS_LOCK),
                Some(1.0)
            );
            guard.release().await.expect("release");
            waiting.await.expect("waiter");
        }
    });

    let waits = capture.named(span::WAIT);
    assert_eq!(waits.len(), 1, "one sleep: {waits:?}");
    let wait = &waits[0];
    assert_eq!(wait.parent, Some(span::LOCK));
    assert_eq!(wait.field(field::STORE), "redis");
    assert_eq!(wait.field(field::PRIMITIVE), "lock");
    assert_eq!(wait.field(field::LOCK), name);
    assert_eq!(wait.field(field::WOKEN_BY), "release");
    let waited: f64 = wait.field(field::WAITED_MS).parse().expect("waited_ms");
    let timer: f64 = wait.field(field::TIMER_MS).parse().expect("timer_ms");
    assert!(waited >= 0.0 && waited <= timer, "{waited} of {timer}");
    // Redis hands the lock over to the queued waiter at the release.
    assert_eq!(wait.field(field::HANDOFF), "true");
    // The waiter's acquisition: busy, subscribed, slept, granted.
    let lock_spans = capture.named(span::LOCK);
    assert_eq!(lock_spans.len(), 2);
    assert!(
        lock_spans
            .iter()
            .all(|s| s.get(field::OUTCOME) == Some("acquired"))
    );
    assert!(
        lock_spans
            .iter()
            .any(|s| s.get(field::ATTEMPTS) != Some("1")),
        "the waiter tried more than once: {lock_spans:?}"
    );
    let busy = capture
        .named(span::ACQUIRE)
        .into_iter()
        .filter(|s| s.get(field::OUTCOME) == Some("busy"))
        .count();
    assert!(busy >= 1, "the waiter's first attempt found the lock held");
    assert!(!capture.named(span::WATCH).is_empty(), "it subscribed");

    let m = recorded.now();
    let woken = [REDIS_LOCK[0], REDIS_LOCK[1], ("woken_by", "release")];
    assert_eq!(m.observations(metric::WAIT_DURATION, &woken), 1);
    let acquired = [REDIS_LOCK[0], REDIS_LOCK[1], ("outcome", "acquired")];
    assert_eq!(m.observations(metric::ACQUIRE_DURATION, &acquired), 2);
    assert_eq!(m.gauge(metric::WAITERS, &REDIS_LOCK), Some(0.0));
    assert_eq!(m.gauge(metric::HOLDS, &REDIS_LOCK), Some(0.0));
    let grant = [REDIS_LOCK[0], REDIS_LOCK[1], ("kind", "grant")];
    assert_eq!(m.counter(metric::HANDOFFS, &grant), 1);
}

#[test]
fn renewals_are_spans_and_counted_and_a_deleted_lease_is_counted_lost() {
    let t = RedisTarget::start();
    let name = unique("observe-renew");
    let (capture, recorded) = observed(|_, recorded| {
        let name = name.clone();
        let t = &t;
        async move {
            let lock = Lock::builder(t.client().await, &name)
                .ttl(Duration::from_millis(300))
                .build()
                .expect("valid");
            let guard = lock.lock().await.expect("free");
            until("two renewals", || {
                recorded.now().counter(metric::RENEWALS, &REDIS_LOCK) >= 2
            })
            .await;
            assert!(!guard.is_lost());
            // Deleted behind the holder's back: the next renewal finds it gone.
            t.delete_key(lock.keys().lock()).await;
            timeout(Duration::from_secs(10), guard.lost())
                .await
                .expect("lost() fires at the next renewal");
            let err = guard.release().await.expect_err("not ours any more");
            assert_eq!(err.kind(), ErrorKind::LockLost);
        }
    });

    let renews = capture.named(span::RENEW);
    assert!(
        renews.len() >= 3,
        "two renewals and the one that found it gone"
    );
    for r in &renews {
        assert_eq!(r.parent, None, "the watchdog's own task");
        assert_eq!(r.field(field::STORE), "redis");
        assert_eq!(r.field(field::OP), "renew");
        assert_eq!(r.field(field::LEASES), "1");
        assert_eq!(r.field(field::LOCK), name);
        assert_eq!(r.field(field::PRIMITIVE), "lock");
        assert_eq!(r.field(field::OTEL_KIND), "client");
        assert!(r.get(field::RTT_MS).is_some());
    }
    assert_eq!(renews[0].field(field::OUTCOME), "ok");
    assert_eq!(renews[0].field(field::RENEWED), "1");
    let last = renews.last().expect("renew spans");
    assert_eq!(last.field(field::OUTCOME), "not_held");
    assert_eq!(last.field(field::LOST), "1");
    assert_eq!(last.field(field::RENEWED), "0");

    let m = recorded.now();
    let renewed = renews
        .iter()
        .filter(|r| r.get(field::OUTCOME) == Some("ok"))
        .count() as u64;
    assert_eq!(m.counter(metric::RENEWALS, &REDIS_LOCK), renewed);
    assert_eq!(m.counter(metric::RENEWAL_FAILURES, &REDIS_LOCK), 1);
    let taken = [REDIS_LOCK[0], REDIS_LOCK[1], ("reason", "taken")];
    let expired = [REDIS_LOCK[0], REDIS_LOCK[1], ("reason", "expired")];
    assert_eq!(m.counter(metric::LEASES_LOST, &taken), 1, "counted once");
    assert_eq!(m.counter(metric::LEASES_LOST, &expired), 0);
    assert_eq!(m.gauge(metric::HOLDS, &REDIS_LOCK), Some(0.0));
    let release = capture.named(span::RELEASE);
    assert_eq!(release[0].field(field::OUTCOME), "not_held");
}

#[test]
fn requests_whose_reply_is_lost_are_retried_and_counted() {
    let t = RedisTarget::start();
    let name = unique("observe-retry");
    let (capture, recorded) = observed(|_, _| {
        let name = name.clone();
        let t = &t;
        async move {
            let upstream = format!("127.0.0.1:{}", t.server.port())
                .parse()
                .expect("addr");
            let proxy = Proxy::start(upstream).await.expect("proxy");
            let client = fencelock::backend::Redis::builder(format!("redis://{}/", proxy.addr()))
                .response_timeout(Duration::from_millis(200))
                .connect()
                .await
                .expect("connect through the proxy");
            let lock = Lock::builder(client, &name)
                .ttl(Duration::from_secs(30))
                .build()
                .expect("valid");
            // Partitioned: every acquire request times out, is repeated twice, then fails.
            proxy.set_fault(Fault::Blackhole);
            let err = lock.try_lock().await.expect_err("no reply");
            assert!(err.is_retryable(), "{err}");
            // A release whose replies are lost is repeated the same way.
            proxy.set_fault(Fault::Pass);
            let guard = loop {
                // The partitioned attempts' grant (delivered on healing) may hold it for
                // a moment until their background release lands.
                if let Some(g) = lock
                    .try_lock_for(Duration::from_secs(5))
                    .await
                    .expect("store")
                {
                    break g;
                }
            };
            proxy.set_fault(Fault::Blackhole);
            let err = guard.release().await.expect_err("no reply");
            assert!(err.is_retryable(), "{err}");
            proxy.set_fault(Fault::Pass);
        }
    });

    let lock_spans = capture.named(span::LOCK);
    let failed = &lock_spans[0];
    assert_eq!(failed.field(field::OUTCOME), "error");
    assert_eq!(failed.field(field::ATTEMPTS), "3");
    assert_eq!(failed.field(field::ERROR), "TimedOut");
    assert_eq!(failed.field(field::OTEL_STATUS_CODE), "ERROR");
    let attempts: Vec<(String, String)> = capture
        .named(span::ACQUIRE)
        .iter()
        .take(3)
        .map(|s| {
            (
                s.field(field::ATTEMPT).to_owned(),
                s.field(field::OUTCOME).to_owned(),
            )
        })
        .collect();
    assert_eq!(
        attempts,
        [("1", "error"), ("2", "error"), ("3", "error")].map(|(a, o)| (a.to_owned(), o.to_owned()))
    );
    let releases: Vec<String> = capture
        .named(span::RELEASE)
        .iter()
        .filter(|s| s.parent.is_none() && s.get(field::ERROR) == Some("TimedOut"))
        .map(|s| s.field(field::ATTEMPT).to_owned())
        .collect();
    assert!(releases.len() >= 3, "{releases:?}");

    let m = recorded.now();
    let acquire = [REDIS_LOCK[0], REDIS_LOCK[1], ("op", "acquire")];
    let release = [REDIS_LOCK[0], REDIS_LOCK[1], ("op", "release")];
    assert_eq!(m.counter(metric::RETRIES, &acquire), 2);
    assert_eq!(m.counter(metric::RETRIES, &release), 2);
    let error = [REDIS_LOCK[0], REDIS_LOCK[1], ("outcome", "error")];
    assert_eq!(m.observations(metric::ACQUIRE_DURATION, &error), 1);
}

#[test]
fn readers_woken_together_hand_the_wake_up_on() {
    let t = RedisTarget::start();
    let name = unique("observe-readers");
    let (capture, recorded) = observed(|capture, _| {
        let name = name.clone();
        let t = &t;
        async move {
            let rw = RwLock::new(t.client().await, &name).expect("valid");
            let writer = rw.write().await.expect("free");
            let readers: Vec<_> = (0..2)
                .map(|_| {
                    let rw = rw.clone();
                    tokio::spawn(async move {
                        let g = rw.read().await.expect("read after the writer");
                        g.release().await.expect("release");
                    })
                })
                .collect();
            until("both readers to sleep", || {
                capture
                    .named(span::WAIT)
                    .iter()
                    .filter(|s| !s.closed)
                    .count()
                    == 2
            })
            .await;
            writer.release().await.expect("release");
            for r in readers {
                r.await.expect("reader");
            }
        }
    });

    let read_spans: Vec<_> = capture
        .named(span::LOCK)
        .into_iter()
        .filter(|s| s.get(field::PRIMITIVE) == Some("rwlock_read"))
        .collect();
    assert_eq!(read_spans.len(), 2);
    assert!(
        read_spans
            .iter()
            .all(|s| s.get(field::OUTCOME) == Some("acquired"))
    );
    assert!(
        capture
            .named(span::LOCK)
            .iter()
            .any(|s| s.get(field::PRIMITIVE) == Some("rwlock_write"))
    );
    let m = recorded.now();
    let wakeup = [
        ("store", "redis"),
        ("primitive", "rwlock_read"),
        ("kind", "wakeup"),
    ];
    assert!(
        m.counter(metric::HANDOFFS, &wakeup) >= 1,
        "the first reader let in passes the wake-up on: {m:?}"
    );
    let read = [("store", "redis"), ("primitive", "rwlock_read")];
    assert_eq!(m.gauge(metric::HOLDS, &read), Some(0.0));
    assert_eq!(m.gauge(metric::WAITERS, &read), Some(0.0));
}

#[test]
fn the_name_label_is_there_only_when_asked_for() {
    let t = RedisTarget::start();
    let name = unique("observe-named");
    let (_, recorded) = observed(|_, _| {
        let name = name.clone();
        let t = &t;
        async move {
            let client = t.client().await;
            let named = Lock::builder(client.clone(), &name)
                .metrics_name_label(true)
                .build()
                .expect("valid");
            named
                .lock()
                .await
                .expect("free")
                .release()
                .await
                .expect("release");
            let plain = Lock::new(client, unique("observe-plain")).expect("valid");
            plain
                .lock()
                .await
                .expect("free")
                .release()
                .await
                .expect("release");
        }
    });
    let m = recorded.now();
    let with_name = [
        ("store", "redis"),
        ("primitive", "lock"),
        ("outcome", "acquired"),
        ("lock", name.as_str()),
    ];
    let without = [
        ("store", "redis"),
        ("primitive", "lock"),
        ("outcome", "acquired"),
    ];
    assert_eq!(m.observations(metric::ACQUIRE_DURATION, &with_name), 1);
    assert_eq!(m.observations(metric::ACQUIRE_DURATION, &without), 1);
}

/// A quorum's call span has one `dlock.node` child per node: the call says what the
/// quorum decided, the children which node was slow or failing.
#[test]
fn a_quorum_call_has_a_span_per_node_naming_the_failing_one() {
    let servers: Vec<dlock_test::server::RedisServer> = (0..3)
        .map(|_| dlock_test::server::RedisServer::start().expect("redis-server"))
        .collect();
    let name = unique("observe-quorum");
    let (capture, _) = observed(|_, _| {
        let name = name.clone();
        let servers = &servers;
        async move {
            let upstream = format!("127.0.0.1:{}", servers[2].port())
                .parse()
                .expect("addr");
            let proxy = Proxy::start(upstream).await.expect("proxy");
            let mut nodes = Vec::new();
            for addr in [
                format!("127.0.0.1:{}", servers[0].port()),
                format!("127.0.0.1:{}", servers[1].port()),
                proxy.addr().to_string(),
            ] {
                nodes.push(
                    fencelock::backend::Redis::builder(format!("redis://{addr}/"))
                        .response_timeout(Duration::from_millis(300))
                        .connect()
                        .await
                        .expect("connect"),
                );
            }
            let quorum = fencelock::backend::Quorum::new(nodes).expect("valid");
            let lock = Lock::builder(quorum, &name)
                .ttl(Duration::from_secs(2))
                .build()
                .expect("valid");
            // Node 2 silent: two of three still grant.
            proxy.set_fault(Fault::Blackhole);
            let guard = lock.try_lock().await.expect("store").expect("a majority");
            proxy.set_fault(Fault::Pass);
            guard.release().await.expect("release");
        }
    });
    let acquire = capture
        .named(span::ACQUIRE)
        .into_iter()
        .next()
        .expect("an acquire span");
    assert_eq!(acquire.field(field::STORE), "redlock");
    assert_eq!(acquire.field(field::OUTCOME), "acquired");
    let nodes: Vec<Captured> = capture
        .named(span::NODE)
        .into_iter()
        .filter(|s| s.get(field::OP) == Some("acquire"))
        .collect();
    assert_eq!(nodes.len(), 3, "{nodes:?}");
    for n in &nodes {
        assert_eq!(n.parent, Some(span::ACQUIRE), "{n:?}");
        assert_eq!(n.field(field::STORE), "redis");
        assert!(n.get(field::RTT_MS).is_some(), "{n:?}");
        let silent = n.field(field::NODE) == "2";
        assert_eq!(
            n.field(field::OUTCOME),
            if silent { "error" } else { "ok" },
            "{n:?}"
        );
        if silent {
            assert_eq!(n.field(field::ERROR), "TimedOut");
        }
    }
    let released = capture
        .named(span::NODE)
        .into_iter()
        .filter(|s| s.get(field::OP) == Some("release") && s.get(field::OUTCOME) == Some("ok"))
        .count();
    assert_eq!(released, 3, "every node answered the release");
}

/// The calls a primitive makes beyond its lock's own are spans too: an election's record
/// written and read, a semaphore's permit count, a read-write lock's downgrade.
#[test]
fn election_records_permit_counts_and_downgrades_are_spans() {
    let t = RedisTarget::start();
    let name = unique("observe-extra");
    let (capture, _) = observed(|_, _| {
        let name = name.clone();
        let t = &t;
        async move {
            let election = fencelock::Election::new(t.client().await, &name).expect("valid");
            let leadership = election.campaign("node-a").await.expect("leads");
            let leader = election.leader().await.expect("store").expect("a leader");
            assert_eq!(leader.value.as_deref(), Some("node-a"));
            leadership.resign().await.expect("resign");

            let sem = fencelock::Semaphore::new(t.client().await, &name, 3).expect("valid");
            sem.set_permits(5).await.expect("set");
            assert_eq!(sem.available_permits().await.expect("count"), 5);
            assert!(sem.state().await.expect("state").holder.is_none());
            let reentrant = fencelock::ReentrantLock::new(t.client().await, &name).expect("valid");
            assert!(
                !reentrant.force_unlock().await.expect("force"),
                "nothing held"
            );

            let rw = RwLock::new(t.client().await, &name).expect("valid");
            let write = rw.write().await.expect("write");
            let read = rw.downgrade(write).await.expect("downgrade");
            read.release().await.expect("release");
        }
    });
    let one = |name: &str, op: &str| {
        let spans: Vec<Captured> = capture
            .named(name)
            .into_iter()
            .filter(|s| s.get(field::OP) == Some(op))
            .collect();
        assert!(!spans.is_empty(), "no {name} span with op {op}");
        spans[0].clone()
    };
    let publish = one(span::PUBLISH, "publish");
    assert_eq!(publish.field(field::PRIMITIVE), "election");
    assert_eq!(publish.field(field::OUTCOME), "ok");
    assert_eq!(publish.field(field::STORE), "redis");
    assert_eq!(one(span::RECORD, "record").field(field::LOCK), name);
    for op in ["set_permits", "permits_in_use"] {
        let s = one(span::PERMITS, op);
        assert_eq!(s.field(field::PRIMITIVE), "semaphore");
        assert!(s.get(field::RTT_MS).is_some(), "{s:?}");
    }
    let downgrade = one(span::DOWNGRADE, "downgrade");
    assert_eq!(downgrade.field(field::OUTCOME), "ok");
    // The primitives' own state and force-unlock calls are spans too.
    let inspected: Vec<String> = capture
        .named(span::INSPECT)
        .iter()
        .map(|s| s.field(field::PRIMITIVE).to_owned())
        .collect();
    assert!(inspected.iter().any(|p| p == "semaphore"), "{inspected:?}");
    let forced = one(span::FORCE_UNLOCK, "force_unlock");
    assert_eq!(forced.field(field::PRIMITIVE), "reentrant");
    assert_eq!(forced.field(field::LOCK), name);
}

/// The wait spans closed so far, in the order they were opened.
fn closed_waits(capture: &Capture) -> Vec<Captured> {
    capture
        .named(span::WAIT)
        .into_iter()
        .filter(|s| s.closed)
        .collect()
}

/// A `try_lock_for` that runs out while the lock stays held: its last sleep is cut short
/// by the caller's deadline.
#[test]
fn a_bounded_wait_that_runs_out_is_woken_by_the_deadline() {
    let t = RedisTarget::start();
    let name = unique("observe-deadline");
    let (capture, recorded) = observed(|_, _| {
        let name = name.clone();
        let t = &t;
        async move {
            let holder = Lock::new(t.client().await, &name).expect("valid");
            let waiter = Lock::new(t.client().await, &name).expect("valid");
            let guard = holder.lock().await.expect("free");
            let got = waiter
                .try_lock_for(Duration::from_millis(300))
                .await
                .expect("store");
            assert!(got.is_none(), "held all along");
            guard.release().await.expect("release");
        }
    });

    let waits = closed_waits(&capture);
    let last = waits.last().expect("the waiter slept");
    assert_eq!(last.field(field::WOKEN_BY), "deadline", "{waits:?}");
    assert_eq!(last.field(field::HANDOFF), "false");
    assert_eq!(last.parent, Some(span::LOCK));
    let timer: f64 = last.field(field::TIMER_MS).parse().expect("timer_ms");
    assert!(timer <= 300.0, "never past the deadline: {timer}");
    let timed_out: Vec<_> = capture
        .named(span::LOCK)
        .into_iter()
        .filter(|s| s.get(field::OUTCOME) == Some("timeout"))
        .collect();
    assert_eq!(timed_out.len(), 1, "{:?}", capture.named(span::LOCK));

    let m = recorded.now();
    let deadline = [REDIS_LOCK[0], REDIS_LOCK[1], ("woken_by", "deadline")];
    assert_eq!(m.observations(metric::WAIT_DURATION, &deadline), 1);
    let timeout = [REDIS_LOCK[0], REDIS_LOCK[1], ("outcome", "timeout")];
    assert_eq!(m.observations(metric::ACQUIRE_DURATION, &timeout), 1);
    let release = [REDIS_LOCK[0], REDIS_LOCK[1], ("woken_by", "release")];
    assert_eq!(m.observations(metric::WAIT_DURATION, &release), 0);
}

/// A holder that forgets its guard never releases: no announcement comes, and the waiter
/// is woken by its fallback timer, set from the holder's remaining lease.
#[test]
fn a_waiter_behind_a_forgotten_guard_is_woken_by_its_fallback_timer() {
    let t = RedisTarget::start();
    let name = unique("observe-fallback");
    let (capture, recorded) = observed(|_, _| {
        let name = name.clone();
        let t = &t;
        async move {
            let holder = Lock::builder(t.client().await, &name)
                .ttl(Duration::from_secs(1))
                .build()
                .expect("valid");
            let waiter = Lock::new(t.client().await, &name).expect("valid");
            holder.lock().await.expect("free").forget();
            let guard = timeout(Duration::from_secs(10), waiter.lock())
                .await
                .expect("the lease runs out within its ttl")
                .expect("store");
            guard.release().await.expect("release");
        }
    });

    let waits = closed_waits(&capture);
    assert!(!waits.is_empty(), "the waiter slept");
    for w in &waits {
        assert_eq!(w.field(field::WOKEN_BY), "fallback", "{waits:?}");
        assert_eq!(w.field(field::HANDOFF), "false");
        assert_eq!(w.field(field::STORE), "redis");
    }
    let first_timer: f64 = waits[0].field(field::TIMER_MS).parse().expect("timer_ms");
    assert!(
        first_timer <= 1001.0,
        "the timer is the holder's remaining lease (ttl 1 s): {first_timer}"
    );
    let m = recorded.now();
    let fallback = [REDIS_LOCK[0], REDIS_LOCK[1], ("woken_by", "fallback")];
    assert_eq!(
        m.observations(metric::WAIT_DURATION, &fallback),
        waits.len()
    );
    let acquired = [REDIS_LOCK[0], REDIS_LOCK[1], ("outcome", "acquired")];
    assert_eq!(m.observations(metric::ACQUIRE_DURATION, &acquired), 2);
}

/// The store becomes unreachable while a waiter waits: when the waiter next tries, the
/// request fails, and it pauses before trying again — a wait woken by the outage.
#[test]
fn a_waiter_cut_off_from_the_store_pauses_and_the_pause_is_woken_by_the_outage() {
    let t = RedisTarget::start();
    let name = unique("observe-outage");
    let (capture, recorded) = observed(|capture, _| {
        let name = name.clone();
        let t = &t;
        async move {
            let upstream = format!("127.0.0.1:{}", t.server.port())
                .parse()
                .expect("addr");
            let proxy = Proxy::start(upstream).await.expect("proxy");
            let cut_off = fencelock::backend::Redis::builder(format!("redis://{}/", proxy.addr()))
                .response_timeout(Duration::from_millis(200))
                .connect()
                .await
                .expect("connect through the proxy");
            // The holder's lease runs out in a second; its release never comes.
            let holder = Lock::builder(t.client().await, &name)
                .ttl(Duration::from_secs(1))
                .build()
                .expect("valid");
            holder.lock().await.expect("free").forget();
            let waiter = Lock::new(cut_off, &name).expect("valid");
            let waiting = tokio::spawn(async move {
                let g = waiter.lock().await.expect("granted once the store is back");
                g.release().await.expect("release");
            });
            until("the waiter to sleep", || {
                capture.named(span::WAIT).iter().any(|s| !s.closed)
            })
            .await;
            proxy.set_fault(Fault::Blackhole);
            // It wakes at the holder's lease end, finds the store unreachable and pauses.
            until("a pause for the outage", || {
                closed_waits(&capture)
                    .iter()
                    .any(|s| s.get(field::WOKEN_BY) == Some("outage"))
            })
            .await;
            proxy.set_fault(Fault::Pass);
            timeout(Duration::from_secs(10), waiting)
                .await
                .expect("the waiter gets the lock once the store answers")
                .expect("waiter");
        }
    });

    let waits = closed_waits(&capture);
    let outage: Vec<&Captured> = waits
        .iter()
        .filter(|s| s.get(field::WOKEN_BY) == Some("outage"))
        .collect();
    assert!(!outage.is_empty(), "{waits:?}");
    for w in &outage {
        assert_eq!(w.parent, Some(span::LOCK));
        assert_eq!(w.field(field::LOCK), name);
        assert!(w.get(field::TIMER_MS).is_some(), "{w:?}");
    }
    // Before the outage: asleep until the holder's lease ran out.
    assert_eq!(waits[0].field(field::WOKEN_BY), "fallback", "{waits:?}");
    let failed = capture
        .named(span::ACQUIRE)
        .into_iter()
        .filter(|s| s.get(field::ERROR) == Some("TimedOut"))
        .count();
    assert!(failed >= 1, "an attempt failed during the outage");
    let m = recorded.now();
    let woken = [REDIS_LOCK[0], REDIS_LOCK[1], ("woken_by", "outage")];
    assert_eq!(m.observations(metric::WAIT_DURATION, &woken), outage.len());
    let retried = [REDIS_LOCK[0], REDIS_LOCK[1], ("op", "acquire")];
    assert!(m.counter(metric::RETRIES, &retried) >= 1);
    assert_eq!(m.gauge(metric::WAITERS, &REDIS_LOCK), Some(0.0));
}

/// Memcached cannot announce releases: a waiter polls, each sleep woken by its backoff.
#[test]
fn a_waiter_on_a_store_without_announcements_is_woken_by_its_backoff() {
    let t = dlock_test::targets::MemcachedTarget::start();
    let name = unique("observe-backoff");
    let (capture, recorded) = observed(|capture, _| {
        let name = name.clone();
        let t = &t;
        async move {
            let ttl = t.ttl(Duration::from_secs(10));
            let holder = Lock::builder(t.client().await, &name)
                .ttl(ttl)
                .build()
                .expect("valid");
            let waiter = Lock::builder(t.client().await, &name)
                .ttl(ttl)
                .build()
                .expect("valid");
            let guard = holder.lock().await.expect("free");
            let waiting = tokio::spawn(async move {
                let g = waiter.lock().await.expect("granted after the release");
                g.release().await.expect("release");
            });
            until("the waiter to poll", || !closed_waits(&capture).is_empty()).await;
            guard.release().await.expect("release");
            timeout(Duration::from_secs(10), waiting)
                .await
                .expect("the waiter polls its way in")
                .expect("waiter");
        }
    });

    let waits = closed_waits(&capture);
    assert!(!waits.is_empty());
    for w in &waits {
        assert_eq!(w.field(field::STORE), "memcached");
        assert_eq!(w.field(field::WOKEN_BY), "backoff", "{waits:?}");
        assert_eq!(w.field(field::HANDOFF), "false");
    }
    let m = recorded.now();
    let backoff = [
        ("store", "memcached"),
        ("primitive", "lock"),
        ("woken_by", "backoff"),
    ];
    assert_eq!(m.observations(metric::WAIT_DURATION, &backoff), waits.len());
}

/// The waits of an election's observer: `dlock.wait` spans with `primitive` `election`
/// made where no acquisition is (no `dlock.lock` parent), apart from a campaign's own
/// waits, which are its lock's.
fn observer_waits(capture: &Capture) -> Vec<Captured> {
    capture
        .named(span::WAIT)
        .into_iter()
        .filter(|s| s.get(field::PRIMITIVE) == Some("election") && s.parent.is_none())
        .collect()
}

/// How many waits of elections `dlock_wait_duration_seconds` holds, whatever woke them.
fn election_wait_observations(recorded: &Recorded, store: &str) -> usize {
    let m = recorded.now();
    [
        "release", "fallback", "backoff", "deadline", "outage", "change",
    ]
    .into_iter()
    .map(|woken_by| {
        let labels = [
            ("store", store),
            ("primitive", "election"),
            ("woken_by", woken_by),
        ];
        m.observations(metric::WAIT_DURATION, &labels)
    })
    .sum()
}

/// An observer sleeps until the store announces the record's write: its wait is a
/// `dlock.wait` woken by the `change`. The candidate that waits to lead meanwhile waits as
/// its lock does (`dlock.lock` > `dlock.wait`, woken by the release).
#[test]
fn an_observers_wait_is_woken_by_the_records_announcement() {
    let t = RedisTarget::start();
    let name = unique("observe-observer");
    let (capture, recorded) = observed(|capture, _| {
        let name = name.clone();
        let t = &t;
        async move {
            let first = fencelock::Election::new(t.client().await, &name).expect("valid");
            let second = fencelock::Election::new(t.client().await, &name).expect("valid");
            let watched = fencelock::Election::new(t.client().await, &name).expect("valid");
            let a = first.campaign("node-a").await.expect("leads");
            let mut observer = watched.observe();
            let seen = next_leader(&mut observer).await.expect("store");
            assert_eq!(seen.value.as_deref(), Some("node-a"));
            let candidate = tokio::spawn(async move {
                second
                    .campaign("node-b")
                    .await
                    .expect("leads after the resignation")
            });
            // The resignation may be reported as a vacancy first: passed over.
            let observing = tokio::spawn(async move { next_leader(&mut observer).await });
            // Both sleep: the candidate in its acquisition, the observer on its own.
            until("the candidate and the observer to wait", || {
                let open: Vec<Captured> = capture
                    .named(span::WAIT)
                    .into_iter()
                    .filter(|s| !s.closed)
                    .collect();
                open.iter().any(|s| s.parent == Some(span::LOCK))
                    && open.iter().any(|s| s.parent.is_none())
            })
            .await;
            a.resign().await.expect("resign");
            let b = timeout(Duration::from_secs(10), candidate)
                .await
                .expect("the candidate leads at the resignation")
                .expect("candidate");
            let seen = timeout(Duration::from_secs(10), observing)
                .await
                .expect("the observer hears the new leader's announcement")
                .expect("observer")
                .expect("store");
            assert_eq!(seen.value.as_deref(), Some("node-b"));
            assert_eq!(seen.term, b.term());
            b.resign().await.expect("resign");
        }
    });

    let waits = observer_waits(&capture);
    assert!(!waits.is_empty(), "the observer slept");
    for w in &waits {
        assert!(w.closed, "{w:?}");
        assert_eq!(w.field(field::WOKEN_BY), "change", "{waits:?}");
        assert_eq!(w.field(field::STORE), "redis");
        assert_eq!(w.field(field::LOCK), name);
        assert_eq!(w.field(field::HANDOFF), "false");
        let timer: f64 = w.field(field::TIMER_MS).parse().expect("timer_ms");
        assert_eq!(timer, 30_000.0, "it reads again at the lease's length");
        let waited: f64 = w.field(field::WAITED_MS).parse().expect("waited_ms");
        assert!(waited >= 0.0 && waited < timer, "{waited} of {timer}");
    }
    // The campaign's wait is its lock's: a child of its `dlock.lock`, woken by the
    // resignation (a release that hands the lock over).
    let campaign: Vec<Captured> = capture
        .named(span::WAIT)
        .into_iter()
        .filter(|s| s.parent == Some(span::LOCK))
        .collect();
    assert_eq!(campaign.len(), 1, "{campaign:?}");
    assert_eq!(campaign[0].field(field::PRIMITIVE), "election");
    assert_eq!(campaign[0].field(field::WOKEN_BY), "release");
    assert_eq!(campaign[0].field(field::HANDOFF), "true");
    let acquisitions: Vec<Captured> = capture
        .named(span::LOCK)
        .into_iter()
        .filter(|s| s.get(field::OUTCOME) == Some("acquired"))
        .collect();
    assert_eq!(acquisitions.len(), 2, "{acquisitions:?}");
    assert!(
        acquisitions
            .iter()
            .all(|s| s.get(field::PRIMITIVE) == Some("election"))
    );
    // Only the campaign's wait is measured: the observer's are spans only.
    assert_eq!(election_wait_observations(&recorded, "redis"), 1);
    let woken = [
        ("store", "redis"),
        ("primitive", "election"),
        ("woken_by", "release"),
    ];
    assert_eq!(
        recorded.now().observations(metric::WAIT_DURATION, &woken),
        1
    );
}

/// A record written without an announcement (the announcement lost) is found by the
/// observer's fallback read, a lease's length after it went to sleep.
#[test]
fn an_observer_that_misses_the_announcement_is_woken_by_its_fallback_read() {
    let t = RedisTarget::start();
    let name = unique("observe-lost-change");
    let (capture, recorded) = observed(|capture, _| {
        let name = name.clone();
        let t = &t;
        async move {
            let leading = fencelock::Election::new(t.client().await, &name).expect("valid");
            let watched = fencelock::Election::builder(t.client().await, &name)
                .ttl(Duration::from_secs(1))
                .build()
                .expect("valid");
            let leader = leading.campaign("node-a").await.expect("leads");
            let mut observer = watched.observe();
            let seen = next_leader(&mut observer).await.expect("store");
            assert_eq!(seen.value.as_deref(), Some("node-a"));
            let observing = tokio::spawn(async move { next_leader(&mut observer).await });
            until("the observer to sleep", || {
                observer_waits(&capture).iter().any(|s| !s.closed)
            })
            .await;
            // The leader's new value, written as its announcement would be but without
            // telling anyone (the record is a hash `term`, `data` = token, '\n', value).
            let record = leading.lock().keys().companion(fencelock::raw::RECORD);
            let data = format!("{}\nnode-a2", leader.token().as_str());
            let _: () = redis::cmd("HSET")
                .arg(&record)
                .arg("data")
                .arg(&data)
                .query_async(&mut t.admin().await)
                .await
                .expect("write the record");
            let seen = timeout(Duration::from_secs(10), observing)
                .await
                .expect("the fallback read finds the new value")
                .expect("observer")
                .expect("store");
            assert_eq!(seen.value.as_deref(), Some("node-a2"));
            assert_eq!(seen.term, leader.term());
            leader.resign().await.expect("resign");
        }
    });

    let waits = observer_waits(&capture);
    assert!(!waits.is_empty(), "the observer slept");
    for w in &waits {
        assert!(w.closed, "{w:?}");
        assert_eq!(w.field(field::WOKEN_BY), "fallback", "{waits:?}");
        assert_eq!(w.field(field::STORE), "redis");
        assert_eq!(w.field(field::LOCK), name);
        let timer: f64 = w.field(field::TIMER_MS).parse().expect("timer_ms");
        assert_eq!(timer, 1_000.0, "the observer's lease");
    }
    assert_eq!(election_wait_observations(&recorded, "redis"), 0);
}

/// An observer cut off from the store fails one call; the next one pauses before reading
/// again, and that pause is a wait woken by the `outage`.
#[test]
fn an_observer_cut_off_from_the_store_pauses_and_the_pause_is_woken_by_the_outage() {
    let t = RedisTarget::start();
    let name = unique("observe-observer-outage");
    let (capture, _) = observed(|_, _| {
        let name = name.clone();
        let t = &t;
        async move {
            let upstream = format!("127.0.0.1:{}", t.server.port())
                .parse()
                .expect("addr");
            let proxy = Proxy::start(upstream).await.expect("proxy");
            let cut_off = fencelock::backend::Redis::builder(format!("redis://{}/", proxy.addr()))
                .response_timeout(Duration::from_millis(200))
                .connect()
                .await
                .expect("connect through the proxy");
            let leading = fencelock::Election::new(t.client().await, &name).expect("valid");
            let watched = fencelock::Election::builder(cut_off, &name)
                .ttl(Duration::from_secs(1))
                .build()
                .expect("valid");
            let mut leader = leading.campaign("node-a").await.expect("leads");
            let mut observer = watched.observe();
            let seen = next_leader(&mut observer).await.expect("store");
            assert_eq!(seen.value.as_deref(), Some("node-a"));
            proxy.set_fault(Fault::Blackhole);
            let failed = timeout(Duration::from_secs(10), observer.next())
                .await
                .expect("the read after the fallback timer fails in time");
            assert!(failed.is_err(), "the store is unreachable: {failed:?}");
            proxy.set_fault(Fault::Pass);
            leader.proclaim("node-a2").await.expect("proclaim");
            let seen = timeout(Duration::from_secs(10), next_leader(&mut observer))
                .await
                .expect("the observer reads again once the store answers")
                .expect("store");
            assert_eq!(seen.value.as_deref(), Some("node-a2"));
            leader.resign().await.expect("resign");
        }
    });

    let waits = observer_waits(&capture);
    let woken: Vec<&str> = waits.iter().map(|w| w.field(field::WOKEN_BY)).collect();
    // The failed call read at once (the value had not changed since the last one, so it
    // would have slept after the read); the next call paused, then read and found the
    // new value without sleeping.
    assert_eq!(woken, ["outage"], "{waits:?}");
    let pause = &waits[0];
    assert!(pause.closed);
    assert_eq!(pause.field(field::LOCK), name);
    assert_eq!(pause.field(field::PRIMITIVE), "election");
    let timer: f64 = pause.field(field::TIMER_MS).parse().expect("timer_ms");
    assert_eq!(timer, 100.0, "a tenth of the observer's lease");
}

/// An observer's next leader, passing over vacancies.
async fn next_leader<B: fencelock::raw::RawElection>(
    observer: &mut fencelock::Observer<B>,
) -> fencelock::Result<fencelock::Leader> {
    loop {
        if let fencelock::LeaderChange::Leader(leader) = observer.next().await? {
            return Ok(leader);
        }
    }
}

/// Memcached announces nothing: an observer polls, each sleep woken by its `backoff`
/// (a tenth of the lease), until a poll finds the leader.
#[test]
fn an_observer_on_a_store_without_announcements_is_woken_by_its_poll() {
    let t = dlock_test::targets::MemcachedTarget::start();
    let name = unique("observe-observer-poll");
    let ttl = t.ttl(Duration::from_secs(1));
    let (capture, recorded) = observed(|capture, _| {
        let name = name.clone();
        let t = &t;
        async move {
            let leading = fencelock::Election::builder(t.client().await, &name)
                .ttl(ttl)
                .build()
                .expect("valid");
            let watched = fencelock::Election::builder(t.client().await, &name)
                .ttl(ttl)
                .build()
                .expect("valid");
            let mut observer = watched.observe();
            // Its first report: nobody leads (nobody ever did).
            let first = observer.next().await.expect("store");
            assert_eq!(
                first.vacancy().map(|v| v.last_term),
                Some(None),
                "{first:?}"
            );
            let observing = tokio::spawn(async move { next_leader(&mut observer).await });
            // It has polled at least once and found nobody leading.
            until("the observer to poll", || {
                observer_waits(&capture).iter().any(|s| s.closed)
            })
            .await;
            let leader = leading.campaign("node-a").await.expect("leads");
            let seen = timeout(Duration::from_secs(10), observing)
                .await
                .expect("a poll finds the leader")
                .expect("observer")
                .expect("store");
            assert_eq!(seen.value.as_deref(), Some("node-a"));
            leader.resign().await.expect("resign");
        }
    });

    let waits = observer_waits(&capture);
    assert!(!waits.is_empty(), "the observer polled");
    let interval = (ttl / 10).clamp(Duration::from_millis(50), Duration::from_secs(1));
    for w in &waits {
        assert!(w.closed, "{w:?}");
        assert_eq!(w.field(field::STORE), "memcached");
        assert_eq!(w.field(field::PRIMITIVE), "election");
        assert_eq!(w.field(field::WOKEN_BY), "backoff", "{waits:?}");
        assert_eq!(w.field(field::HANDOFF), "false");
        let timer: f64 = w.field(field::TIMER_MS).parse().expect("timer_ms");
        assert_eq!(timer, interval.as_secs_f64() * 1e3, "the poll interval");
    }
    assert_eq!(election_wait_observations(&recorded, "memcached"), 0);
}

/// Sessions waiting for the name's gate inside PostgreSQL (not granted yet), and
/// sessions holding it.
async fn gate(admin: &tokio_postgres::Client, key: &str) -> (i64, i64) {
    let row = admin
        .query_one(
            "SELECT count(*) FILTER (WHERE NOT granted), count(*) FILTER (WHERE granted)
             FROM pg_locks p
             WHERE p.locktype = 'advisory' AND p.objsubid = 1
               AND ((p.classid::bigint << 32) | p.objid::bigint) = dlock.gate_key($1)",
            &[&key],
        )
        .await
        .expect("pg_locks");
    (row.get(0), row.get(1))
}

/// A PostgreSQL waiter that waits inside the server (its acquire statement blocked at the
/// name's gate) has a `dlock.wait` woken by the release, as a sleeping waiter does: round
/// one with new clients (the wait span opens before the queueing attempt), round two
/// with clients that waited before (they queue from their first attempt and learn from
/// the reply that it waited).
#[test]
fn a_wait_inside_postgres_is_a_wait_span_woken_by_the_release() {
    let t = dlock_test::targets::PostgresTarget::start();
    let name = unique("observe-gate");
    let rounds: Arc<Mutex<Vec<usize>>> = Arc::default();
    let (capture, recorded) = observed(|capture, _| {
        let (name, rounds) = (name.clone(), Arc::clone(&rounds));
        let t = &t;
        async move {
            let admin = t.server.admin().await;
            let key = format!("{}{name}", fencelock::keys::DEFAULT_PREFIX);
            let lock = |client| {
                Lock::builder(client, &name)
                    .ttl(Duration::from_secs(30))
                    .build()
                    .expect("valid")
            };
            let holder = lock(t.client().await);
            let (head, second) = (lock(t.client().await), lock(t.client().await));
            for _ in 0..2 {
                let guard = holder.lock().await.expect("free");
                let head_waits = {
                    let head = head.clone();
                    tokio::spawn(async move { head.lock().await.expect("handed over") })
                };
                let at = |want: (i64, i64)| {
                    let (admin, key) = (&admin, &key);
                    async move {
                        let reached = async {
                            while gate(admin, key).await != want {
                                sleep(Duration::from_millis(10)).await;
                            }
                        };
                        timeout(Duration::from_secs(10), reached)
                            .await
                            .unwrap_or_else(|_| panic!("the gate never got to {want:?}"));
                    }
                };
                // The head of the line keeps the gate and waits to be handed the lock.
                at((0, 1)).await;
                let second_waits = {
                    let second = second.clone();
                    tokio::spawn(async move { second.lock().await.expect("after the head") })
                };
                // The second waits for the gate inside the server.
                at((1, 1)).await;
                guard.release().await.expect("release");
                let g = head_waits.await.expect("head");
                // Its release frees the gate: the second's statement takes the lock.
                g.release().await.expect("release");
                let g = timeout(Duration::from_secs(10), second_waits)
                    .await
                    .expect("the second got it")
                    .expect("second");
                g.release().await.expect("release");
                rounds
                    .lock()
                    .expect("rounds")
                    .push(capture.named(span::WAIT).len());
            }
        }
    });

    let rounds = rounds.lock().expect("rounds").clone();
    let waits = capture.named(span::WAIT);
    assert_eq!(rounds, [2, 4], "one wait per waiter and round: {waits:?}");
    for (round, waits) in [&waits[..2], &waits[2..]].into_iter().enumerate() {
        for w in waits {
            assert!(w.closed);
            assert_eq!(w.field(field::STORE), "postgres");
            assert_eq!(w.field(field::WOKEN_BY), "release", "round {round}: {w:?}");
            assert_eq!(w.parent, Some(span::LOCK));
        }
        // The head is handed the lock (NOTIFY); the second's own statement takes it.
        let mut handoffs: Vec<&str> = waits.iter().map(|w| w.field(field::HANDOFF)).collect();
        handoffs.sort_unstable();
        assert_eq!(handoffs, ["false", "true"], "round {round}: {waits:?}");
        let at_gate = waits
            .iter()
            .find(|w| w.get(field::HANDOFF) == Some("false"))
            .expect("the gate's wait");
        let waited: f64 = at_gate.field(field::WAITED_MS).parse().expect("waited_ms");
        assert!(waited > 0.0, "{at_gate:?}");
        assert_eq!(
            at_gate.get(field::TIMER_MS),
            None,
            "no deadline: {at_gate:?}"
        );
    }
    // Round one: the queueing attempts ran inside their waits.
    let in_wait: Vec<Captured> = capture
        .named(span::ACQUIRE)
        .into_iter()
        .filter(|s| s.parent == Some(span::WAIT))
        .collect();
    assert!(
        in_wait.iter().all(|s| s.get(field::QUEUE) == Some("true")),
        "{in_wait:?}"
    );
    let outcomes: Vec<&str> = in_wait.iter().map(|s| s.field(field::OUTCOME)).collect();
    assert!(
        outcomes.contains(&"acquired") && outcomes.contains(&"busy"),
        "the second's attempt waited at the gate and got the lock, the head's queued it: \
         {outcomes:?}"
    );
    // Round two: the second's first attempt waited at the gate, outside any wait span.
    let first_attempt_waited = capture.named(span::ACQUIRE).into_iter().any(|s| {
        s.parent == Some(span::LOCK)
            && s.get(field::QUEUE) == Some("true")
            && s.get(field::ATTEMPT) == Some("1")
            && s.get(field::OUTCOME) == Some("acquired")
    });
    assert!(first_attempt_waited, "{:?}", capture.named(span::ACQUIRE));

    let m = recorded.now();
    let release = [
        ("store", "postgres"),
        ("primitive", "lock"),
        ("woken_by", "release"),
    ];
    assert_eq!(m.observations(metric::WAIT_DURATION, &release), 4);
    let pg = [("store", "postgres"), ("primitive", "lock")];
    assert_eq!(m.gauge(metric::WAITERS, &pg), Some(0.0));
}

/// Listing the held locks (`dlock list`, `dlock top`) is a span too.
#[test]
fn listing_locks_is_a_span() {
    use fencelock::raw::RawInspect;
    let t = RedisTarget::start();
    let name = unique("observe-list");
    let (capture, _) = observed(|_, _| {
        let name = name.clone();
        let t = &t;
        async move {
            for store in [None, Some(t.client().await)] {
                let found = match store {
                    Some(redis) => {
                        let guard = Lock::new(redis.clone(), &name)
                            .expect("valid")
                            .lock()
                            .await
                            .expect("free");
                        let found = redis
                            .list(fencelock::keys::DEFAULT_PREFIX, "observe-list-*", 100)
                            .await
                            .expect("list");
                        guard.release().await.expect("release");
                        found
                    }
                    None => {
                        let memory = fencelock::backend::Memory::new();
                        let guard = Lock::new(memory.clone(), &name)
                            .expect("valid")
                            .lock()
                            .await
                            .expect("free");
                        let found = memory
                            .list(fencelock::keys::DEFAULT_PREFIX, "observe-list-*", 100)
                            .await
                            .expect("list");
                        guard.release().await.expect("release");
                        found
                    }
                };
                assert_eq!(found, [name.as_str()]);
            }
            let memcached = dlock_test::targets::MemcachedTarget::start();
            let err = memcached
                .client()
                .await
                .list("", "*", 10)
                .await
                .expect_err("memcached cannot list");
            assert_eq!(err.kind(), ErrorKind::InvalidArgument);
        }
    });

    let lists = capture.named(span::LIST);
    let stores: Vec<&str> = lists.iter().map(|s| s.field(field::STORE)).collect();
    assert_eq!(stores, ["memory", "redis", "memcached"], "{lists:?}");
    for l in &lists[..2] {
        assert_eq!(l.field(field::OP), "list");
        assert_eq!(l.field(field::PATTERN), "observe-list-*");
        assert_eq!(l.field(field::OUTCOME), "ok");
        assert_eq!(l.field(field::LISTED), "1");
        assert_eq!(l.field(field::OTEL_KIND), "client");
        assert!(l.get(field::RTT_MS).is_some(), "{l:?}");
        assert_eq!(l.get(field::LOCK), None, "a listing names no one lock");
        assert!(l.closed);
    }
    assert_eq!(lists[2].field(field::OUTCOME), "error");
    assert_eq!(lists[2].field(field::ERROR), "InvalidArgument");
    assert_eq!(lists[2].field(field::OTEL_STATUS_CODE), "ERROR");
}

/// A client whose URL carries a user and password: whatever it does — locks, waits,
/// inspects, lists, fails while the store is unreachable — no span or event field shows
/// the password (nor the user's credentials pair).
#[test]
fn a_password_in_the_store_url_never_appears_in_a_field() {
    const PASSWORD: &str = "pw-observe-S3cr3t";
    let t = RedisTarget::start();
    let name = unique("observe-password");
    let (capture, _) = observed(|capture, _| {
        let name = name.clone();
        let t = &t;
        async move {
            let mut admin = t.admin().await;
            let () = redis::cmd("ACL")
                .arg(&[
                    "SETUSER",
                    "observed",
                    "on",
                    &format!(">{PASSWORD}"),
                    "~*",
                    "&*",
                    "+@all",
                ])
                .query_async(&mut admin)
                .await
                .expect("ACL SETUSER");
            let upstream = format!("127.0.0.1:{}", t.server.port())
                .parse()
                .expect("addr");
            let proxy = Proxy::start(upstream).await.expect("proxy");
            let url = format!("redis://observed:{PASSWORD}@{}/", proxy.addr());
            let connect = || {
                fencelock::backend::Redis::builder(url.clone())
                    .response_timeout(Duration::from_millis(200))
                    .connect()
            };
            let (a, b) = (connect().await.expect("a"), connect().await.expect("b"));
            let holder = Lock::builder(a.clone(), &name)
                .ttl(Duration::from_secs(10))
                .build()
                .expect("valid");
            let waiter = Lock::builder(b, &name)
                .ttl(Duration::from_secs(10))
                .build()
                .expect("valid");
            // A lock, a wait woken by the release, a state, a listing, a forced unlock.
            let guard = holder.lock().await.expect("free");
            let waiting = tokio::spawn(async move {
                waiter
                    .lock()
                    .await
                    .expect("after the release")
                    .release()
                    .await
                    .expect("release");
            });
            until("the waiter to sleep", || {
                capture.named(span::WAIT).iter().any(|s| !s.closed)
            })
            .await;
            guard.release().await.expect("release");
            waiting.await.expect("waiter");
            assert!(!holder.is_locked().await.expect("state"));
            use fencelock::raw::RawInspect;
            a.list(fencelock::keys::DEFAULT_PREFIX, "*", 10)
                .await
                .expect("list");
            assert!(!holder.force_unlock().await.expect("force"));
            // Failures: a request without a reply, and a wrong password.
            proxy.set_fault(Fault::Blackhole);
            let err = holder.try_lock().await.expect_err("no reply");
            assert!(err.is_retryable(), "{err}");
            proxy.set_fault(Fault::Pass);
            let wrong = format!("redis://observed:{PASSWORD}-wrong@{}/", proxy.addr());
            fencelock::backend::Redis::connect(wrong)
                .await
                .expect_err("wrong password");
        }
    });

    // The calls were recorded (so the check below looked at something)...
    for name in [
        span::LOCK,
        span::ACQUIRE,
        span::WAIT,
        span::RELEASE,
        span::LIST,
    ] {
        assert!(!capture.named(name).is_empty(), "no {name} span");
    }
    assert!(
        capture
            .named(span::LOCK)
            .iter()
            .any(|s| s.get(field::OUTCOME) == Some("error")),
        "the failed attempt is recorded"
    );
    // ...and none shows the secret.
    let values = capture.all_values();
    assert!(!values.is_empty());
    for value in values {
        assert!(!value.contains(PASSWORD), "password in a field: {value}");
        assert!(
            !value.contains("observed:"),
            "credentials in a field: {value}"
        );
    }
}
