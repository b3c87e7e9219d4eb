//! The simulated store: the in-process [`Memory`] store's semantics behind a simulated
//! network (latency with a long tail, lost requests, lost replies, duplicates, short
//! renewal replies, partitions, notifications lost or reset) and a store that pauses,
//! restarts and runs its clock at another rate than each client's.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use fencelock::backend::Memory;
use fencelock::engine::Engine;
use fencelock::keys::LockKeys;
use fencelock::raw::{
    Acquire, Kind, LockState, RawFencing, RawInspect, RawLock, ReleaseWatch, Renewal,
};
use fencelock::{Error, ErrorKind, Result, Token};
use tokio::sync::Notify;

use crate::Plant;
use crate::world::Shared;

/// One client of the simulated store.
#[derive(Clone)]
pub struct SimStore {
    pub(crate) inner: Memory,
    pub(crate) client: usize,
    pub(crate) world: Shared,
    /// This client's subscriptions by channel: one notifier that all its waiters on the
    /// channel share (as a networked store's client has), woken by the world's
    /// announcements of releases.
    channels: Arc<std::sync::Mutex<std::collections::BTreeMap<String, std::sync::Weak<Channel>>>>,
}

/// One client's subscription to one channel.
struct Channel {
    notify: Arc<Notify>,
}

impl std::fmt::Debug for SimStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimStore")
            .field("client", &self.client)
            .finish_non_exhaustive()
    }
}

impl SimStore {
    /// A new client of the store behind `world`.
    pub fn new(world: &Shared, store: &Memory, client: usize) -> SimStore {
        SimStore {
            inner: store.client(),
            client,
            world: world.clone(),
            channels: Arc::default(),
        }
    }

    /// A watch on this client's subscription to a plain lock's release `channel`, as a
    /// networked store's client has one: every release is announced to every
    /// subscribed client (a pub/sub channel), and every waiter of the client on the
    /// channel shares its notifier, so a wake-up one waiter passes on reaches the next.
    pub(crate) fn subscription(&self, channel: &str) -> ReleaseWatch {
        let mut channels = self
            .channels
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let shared = match channels.get(channel).and_then(std::sync::Weak::upgrade) {
            Some(c) => c,
            None => {
                let notify = Arc::new(Notify::new());
                self.world.notifier(self.client, &notify);
                self.world.subscribe(channel, self.client, &notify);
                let c = Arc::new(Channel { notify });
                channels.insert(channel.to_owned(), Arc::downgrade(&c));
                c
            }
        };
        ReleaseWatch::new(Arc::clone(&shared.notify), Some(Box::new(shared)))
    }

    fn who(&self) -> String {
        format!("c{}", self.client)
    }

    /// One request through the network: `apply` runs at the store (twice if duplicated),
    /// with the ttl the store's clock gives `ttl`; `describe` names the result in the trace.
    pub(crate) async fn call<T, F, Fut>(
        &self,
        op: &str,
        key: &str,
        ttl: Option<Duration>,
        mut apply: F,
        describe: impl Fn(&Result<T>) -> String,
    ) -> Result<T>
    where
        F: FnMut(Duration) -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let fate = self.world.fate(self.client);
        tokio::time::sleep(fate.there).await;
        if self.world.cut(self.client) || fate.lose_request {
            self.world
                .event(&self.who(), format_args!("{op} {key}: request lost"));
            tokio::time::sleep(fate.back).await;
            return Err(Error::new(
                ErrorKind::Unavailable,
                "simulated: request lost",
            ));
        }
        while let Some(until) = self.world.paused_until() {
            tokio::time::sleep_until(until).await;
        }
        let store_ttl = self.world.store_ttl(self.client, ttl.unwrap_or_default());
        let result = apply(store_ttl).await;
        self.world.event(
            &self.who(),
            format_args!("{op} {key} -> {}", describe(&result)),
        );
        self.world.check_holders();
        if ttl.is_some() {
            // Checker 1 again when the store's lease of this request ends (one tick
            // after: tokio's timers count whole milliseconds).
            let world = self.world.clone();
            tokio::spawn(async move {
                tokio::time::sleep(store_ttl + Duration::from_millis(1)).await;
                world.check_holders();
            });
        }
        tokio::time::sleep(fate.back).await;
        if fate.duplicate {
            // A copy of the request reaches the store later, as the reply comes back
            // (a client's or a proxy's retransmission).
            let again = apply(store_ttl).await;
            self.world.event(
                &self.who(),
                format_args!("{op} {key}: duplicate arrives, {}", describe(&again)),
            );
            self.world.check_holders();
        }
        if self.world.cut(self.client) || fate.lose_reply {
            self.world
                .event(&self.who(), format_args!("{op} {key}: reply lost"));
            return Err(Error::new(ErrorKind::Unavailable, "simulated: reply lost"));
        }
        result
    }
}

fn acquired(r: &Result<Acquire>) -> String {
    match r {
        Ok(Acquire::Acquired { fence }) => format!("acquired fence {fence}"),
        Ok(Acquire::Held { remaining }) => format!("held ({remaining:?} left)"),
        Ok(other) => format!("{other:?}"),
        Err(e) => format!("error {e}"),
    }
}

fn ok<T>(r: &Result<T>) -> String {
    match r {
        Ok(_) => String::from("ok"),
        Err(e) => format!("error {e}"),
    }
}

fn yes<T: std::fmt::Debug>(r: &Result<T>) -> String {
    match r {
        Ok(v) => format!("{v:?}"),
        Err(e) => format!("error {e}"),
    }
}

impl SimStore {
    /// Records a grant (checker 2: fences in grant order) on the way back.
    pub(crate) fn note_grant(&self, key: &str, token: &Token, r: &Result<Acquire>) {
        if let Ok(Acquire::Acquired { fence }) = r {
            self.world.granted(key, token.as_str(), *fence);
        }
    }
}

impl RawLock for SimStore {
    async fn acquire(&self, keys: &LockKeys, token: &Token, ttl: Duration) -> Result<Acquire> {
        self.call(
            "acquire",
            keys.lock(),
            Some(ttl),
            |t| async move {
                self.world.attempt(self.client, keys.lock());
                let r = self.inner.acquire(keys, token, t).await;
                self.note_grant(keys.lock(), token, &r);
                r
            },
            acquired,
        )
        .await
    }

    async fn release(&self, keys: &LockKeys, token: &Token) -> Result<bool> {
        self.call(
            "release",
            keys.lock(),
            None,
            |_| async move {
                let r = if self.world.lock().plant == Some(Plant::ReleaseWithoutOwnerCheck) {
                    // The planted bug: a delete that does not check the owner.
                    Ok(self.inner.force_delete(keys.lock()))
                } else {
                    self.inner.release(keys, token).await
                };
                if matches!(r, Ok(true)) {
                    self.world.released(keys.lock());
                    self.world.broadcast(keys.channel(), keys.lock());
                }
                r
            },
            yes,
        )
        .await
    }

    async fn extend(&self, keys: &LockKeys, token: &Token, ttl: Duration) -> Result<bool> {
        self.call(
            "extend",
            keys.lock(),
            Some(ttl),
            |t| self.inner.extend(keys, token, t),
            yes,
        )
        .await
    }

    async fn extend_many(&self, renewals: &[Renewal]) -> Vec<Result<bool>> {
        let Some(first) = renewals.first() else {
            return Vec::new();
        };
        // A short reply: the connection broke mid-batch, so only the first half of the
        // renewals reached the store and only they are answered.
        let fate_short = self.world.fate(self.client).short_batch && renewals.len() > 1;
        let applied = if fate_short {
            renewals.len() / 2
        } else {
            renewals.len()
        };
        let ttl = first.ttl;
        let names: Vec<&str> = renewals.iter().map(|r| r.keys.lock()).collect();
        let label = names.join(",");
        let result = self
            .call(
                "renew",
                &label,
                Some(ttl),
                |t| {
                    let scaled: Vec<Renewal> = renewals[..applied]
                        .iter()
                        .map(|r| {
                            Renewal::new(
                                r.keys.clone(),
                                r.token.clone(),
                                r.ttl.mul_f64(t.as_secs_f64() / ttl.as_secs_f64().max(1e-9)),
                                r.kind,
                            )
                        })
                        .collect();
                    async move { Ok(self.inner.extend_many(&scaled).await) }
                },
                |r: &Result<Vec<Result<bool>>>| match r {
                    Ok(v) => format!(
                        "{:?}",
                        v.iter()
                            .map(|x| x.as_ref().ok().copied())
                            .collect::<Vec<_>>()
                    ),
                    Err(e) => format!("error {e}"),
                },
            )
            .await;
        match result {
            Ok(v) => {
                if fate_short {
                    self.world.event(
                        &self.who(),
                        format_args!("renew reply short: {applied} of {}", renewals.len()),
                    );
                    self.world.lock().faults.add("short-batch");
                }
                v
            }
            Err(e) => renewals
                .iter()
                .map(|_| Err(Error::new(e.kind(), e.to_string())))
                .collect(),
        }
    }

    async fn watch(&self, keys: &LockKeys) -> Result<ReleaseWatch> {
        let w = self
            .call(
                "watch",
                keys.lock(),
                None,
                |_| self.inner.watch(keys),
                |_| String::from("ok"),
            )
            .await?;
        // A lock's release channel is announced to every subscribed client (a pub/sub
        // channel, with the network's faults); side channels (a read-write lock's
        // sides, a fair lock's waiters, an election's record) keep the in-process
        // store's own notifier and its semantics.
        let main = LockKeys::new("", keys.lock()).is_ok_and(|k| k.channel() == keys.channel());
        if main {
            drop(w);
            Ok(self.subscription(keys.channel()))
        } else {
            Ok(w)
        }
    }

    fn store_id(&self) -> String {
        self.inner.store_id()
    }

    fn store_label(&self) -> &'static str {
        self.inner.store_label()
    }

    fn engine(&self) -> &Engine {
        self.inner.engine()
    }
}

impl RawFencing for SimStore {}

impl RawInspect for SimStore {
    async fn inspect(&self, kind: Kind, keys: &LockKeys) -> Result<LockState> {
        let (op, describe): (&str, fn(&Result<LockState>) -> String) = match kind {
            Kind::Lock => ("inspect", |_| String::from("ok")),
            Kind::Semaphore => ("inspect-permits", ok),
            Kind::Reentrant => ("inspect-reentrant", ok),
            Kind::RwLock => ("inspect-rw", ok),
            Kind::Fair => ("inspect-fair", ok),
            _ => return Err(kind.unsupported(self.store_label())),
        };
        self.call(
            op,
            keys.lock(),
            None,
            |_| self.inner.inspect(kind, keys),
            describe,
        )
        .await
    }

    async fn force_unlock(&self, kind: Kind, keys: &LockKeys) -> Result<bool> {
        let op = match kind {
            Kind::Lock => "force-unlock",
            Kind::Semaphore => "force-unlock-permits",
            Kind::Reentrant => "force-unlock-reentrant",
            Kind::RwLock => "force-unlock-rw",
            Kind::Fair => "force-unlock-fair",
            _ => return Err(kind.unsupported(self.store_label())),
        };
        self.call(
            op,
            keys.lock(),
            None,
            |_| async move {
                let r = self.inner.force_unlock(kind, keys).await;
                if kind == Kind::Lock && matches!(r, Ok(true)) {
                    self.world.broadcast(keys.channel(), keys.lock());
                }
                r
            },
            yes,
        )
        .await
    }

    async fn list(&self, prefix: &str, pattern: &str, limit: usize) -> Result<Vec<String>> {
        self.call(
            "list",
            prefix,
            None,
            |_| self.inner.list(prefix, pattern, limit),
            |_| String::from("ok"),
        )
        .await
    }
}
