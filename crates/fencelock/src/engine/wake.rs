//! The engine's wake registry: which local waiter a store's notification is for.
//!
//! Every store that tells a waiter its turn came — a Redis release's message on a pub/sub
//! channel, a PostgreSQL `NOTIFY`, an etcd or ZooKeeper waiter's task seeing the entry
//! ahead of it deleted — feeds ONE kind of registry, [`Wakes`]. Per name (a waiter's token,
//! a name several local waiters share, a queue entry) it keeps a notifier, a
//! [`GrantSlot`] where a hand-over's fence waits for the waiting call, and a count of the
//! registrations that share the name; the name goes with its last registration.
//!
//! The transports (the stores' connections) stay in the stores; what a message means is
//! decided here, once:
//!
//! * `<name>` wakes one waiter registered under `name` (it attempts again);
//! * `!<fence>:<name>` hands the lock over: the release already granted it to `name`'s
//!   token with that fence (a positive number; anything else after the `!` is a plain
//!   wake-up of `name`, whose next attempt finds out);
//! * [`Wakes::disconnected`]: the connection that carried the messages dropped — hand-overs
//!   not yet taken are forgotten (the store may have lost them with a restart) and every
//!   waiter is woken to attempt again (a message may have been missed).

// Each notifying store uses its part of the registry.
#![cfg_attr(
    not(all(
        feature = "redis",
        feature = "etcd",
        feature = "postgres",
        feature = "zookeeper"
    )),
    allow(dead_code)
)]

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use tokio::sync::Notify;

use super::wait::GrantSlot;
use crate::raw::ReleaseWatch;

/// How long a queued waiter's place in a store's queue outlives its next expected attempt:
/// ttl / 3, within 200 ms ..= 5 s. A crashed waiter leaves the queue by itself after that.
#[cfg_attr(not(any(feature = "redis", feature = "postgres")), allow(dead_code))]
pub(crate) fn waiter_grace(ttl: Duration) -> Duration {
    (ttl / 3).clamp(Duration::from_millis(200), Duration::from_secs(5))
}

/// How long the waiter a release woke has to come and take the lock before its place
/// lapses (it crashed, or its process stalls) and the others' fallback timers take over.
#[cfg_attr(not(any(feature = "redis", feature = "postgres")), allow(dead_code))]
pub(crate) const WAKE_GRACE: Duration = Duration::from_secs(1);

/// A client's local waiters by name (`K`: the name, or a store's richer key such as a
/// channel and a name). Clones share the registry.
pub(crate) struct Wakes<K = String> {
    map: Arc<Mutex<HashMap<K, Entry>>>,
}

impl<K> Clone for Wakes<K> {
    fn clone(&self) -> Self {
        Wakes {
            map: Arc::clone(&self.map),
        }
    }
}

impl<K> Default for Wakes<K> {
    fn default() -> Self {
        Wakes {
            map: Arc::default(),
        }
    }
}

/// The local waiters registered under one name.
struct Entry {
    /// Wakes one of them (the one woken passes it on if it cannot use it).
    notify: Arc<Notify>,
    /// Where a hand-over to the name is left.
    grants: Arc<GrantSlot>,
    /// How many registrations share the name.
    count: usize,
}

/// What a notification's payload says (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Message<'a> {
    /// `name` may attempt again.
    Wake(&'a str),
    /// The lock was handed to `name` with `fence`.
    HandOver {
        /// The waiter's name (its token).
        name: &'a str,
        /// The fence the release minted for it.
        fence: u64,
    },
}

impl<'a> Message<'a> {
    /// Reads a payload: `!<fence>:<name>` is a hand-over (a fence that is no positive
    /// number — a tampered counter — makes it a wake-up of `name`), anything else names
    /// the waiter to wake.
    pub(crate) fn parse(payload: &'a str) -> Message<'a> {
        let Some((fence, name)) = payload
            .strip_prefix('!')
            .and_then(|rest| rest.split_once(':'))
        else {
            return Message::Wake(payload);
        };
        match fence.parse::<u64>() {
            Ok(fence) if fence > 0 => Message::HandOver { name, fence },
            _ => Message::Wake(name),
        }
    }

    /// The hand-over message for `name` with `fence` (what a release publishes; the
    /// scripts build the same text).
    #[cfg(test)]
    pub(crate) fn hand_over(fence: u64, name: &str) -> String {
        format!("!{fence}:{name}")
    }

    /// The waiter the message is for.
    pub(crate) fn name(&self) -> &'a str {
        match self {
            Message::Wake(name) | Message::HandOver { name, .. } => name,
        }
    }

    /// The fence of a hand-over.
    pub(crate) fn fence(&self) -> Option<u64> {
        match self {
            Message::Wake(_) => None,
            Message::HandOver { fence, .. } => Some(*fence),
        }
    }
}

/// One registration under a name: its notifier and grant slot. Dropping it (with the
/// [`ReleaseWatch`] that owns it) ends the registration; the name goes with the last one.
pub(crate) struct Registration<K: Eq + Hash = String> {
    map: Weak<Mutex<HashMap<K, Entry>>>,
    key: Option<K>,
    notify: Arc<Notify>,
    grants: Arc<GrantSlot>,
}

impl<K: Eq + Hash> Registration<K> {
    /// The notifier the registration's waiter waits on.
    pub(crate) fn notify(&self) -> &Arc<Notify> {
        &self.notify
    }

    /// The slot where a hand-over to the name is left.
    #[cfg(test)]
    pub(crate) fn grants(&self) -> &Arc<GrantSlot> {
        &self.grants
    }
}

impl<K: Eq + Hash + Send + Sync + 'static> Registration<K> {
    /// A watch for the waiting call: woken through the registration's notifier, with its
    /// grant slot; the registration ends with the watch, and so does `also` (a store's
    /// task or subscription that must not outlive the waiter).
    pub(crate) fn into_watch(self, also: Option<crate::raw::Subscription>) -> ReleaseWatch {
        let notify = Arc::clone(&self.notify);
        let grants = Arc::clone(&self.grants);
        let keep: crate::raw::Subscription = match also {
            Some(also) => Box::new((self, also)),
            None => Box::new(self),
        };
        ReleaseWatch::new(notify, Some(keep)).with_grants(grants)
    }

    /// A watch woken through the registration's notifier that is never handed anything
    /// (an observer's); `also` ends with it.
    pub(crate) fn into_wake_only_watch(
        self,
        also: Option<crate::raw::Subscription>,
    ) -> ReleaseWatch {
        let notify = Arc::clone(&self.notify);
        let keep: crate::raw::Subscription = match also {
            Some(also) => Box::new((self, also)),
            None => Box::new(self),
        };
        ReleaseWatch::new(notify, Some(keep))
    }
}

impl<K: Eq + Hash> Drop for Registration<K> {
    fn drop(&mut self) {
        let (Some(map), Some(key)) = (self.map.upgrade(), self.key.take()) else {
            return;
        };
        let mut map = map.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(entry) = map.get_mut(&key) {
            entry.count -= 1;
            if entry.count == 0 {
                map.remove(&key);
            }
        }
    }
}

impl<K: Eq + Hash + Clone> Wakes<K> {
    fn map(&self) -> MutexGuard<'_, HashMap<K, Entry>> {
        self.map.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers a waiter under `key`: a message naming it wakes one of the local waiters
    /// registered under it, and a hand-over naming it leaves its fence in their grant slot.
    pub(crate) fn register(&self, key: K) -> Registration<K> {
        let mut map = self.map();
        let entry = map.entry(key.clone()).or_insert_with(|| Entry {
            notify: Arc::new(Notify::new()),
            grants: Arc::default(),
            count: 0,
        });
        entry.count += 1;
        Registration {
            map: Arc::downgrade(&self.map),
            key: Some(key),
            notify: Arc::clone(&entry.notify),
            grants: Arc::clone(&entry.grants),
        }
    }

    /// Delivers a message to the waiters under `key`: a hand-over leaves its fence (kept
    /// if it is newer than their latest attempt that found the lock held), and one of
    /// them is woken. Returns whether anyone was registered under `key`.
    pub(crate) fn deliver(&self, key: &K, fence: Option<u64>) -> bool {
        let map = self.map();
        let Some(entry) = map.get(key) else {
            return false;
        };
        if let Some(fence) = fence {
            entry.grants.offer(fence);
        }
        entry.notify.notify_one();
        true
    }

    /// Leaves a hand-over's fence for the waiters under `key` without waking them (the
    /// store wakes them itself); whether anyone was registered.
    pub(crate) fn offer(&self, key: &K, fence: u64) -> bool {
        let map = self.map();
        let Some(entry) = map.get(key) else {
            return false;
        };
        entry.grants.offer(fence);
        true
    }

    /// Wakes one waiter under `key`; whether anyone was registered.
    pub(crate) fn wake(&self, key: &K) -> bool {
        self.deliver(key, None)
    }

    /// An attempt by the waiter(s) under `key` found the lock held when its fence counter
    /// stood at `counter`: hand-overs up to it are void ([`GrantSlot::raise_floor`]).
    pub(crate) fn raise_floor(&self, key: &K, counter: u64) {
        if let Some(entry) = self.map().get(key) {
            entry.grants.raise_floor(counter);
        }
    }

    /// The connection that carried the messages dropped: hand-overs not yet taken are
    /// forgotten, and every waiter is woken to attempt again.
    pub(crate) fn disconnected(&self) {
        for entry in self.map().values() {
            entry.grants.clear();
            entry.notify.notify_one();
        }
    }

    /// Wakes one waiter under every name (a message may have been missed).
    pub(crate) fn wake_all(&self) {
        for entry in self.map().values() {
            entry.notify.notify_one();
        }
    }

    /// Wakes one waiter under every name `which` picks.
    pub(crate) fn wake_where(&self, which: impl Fn(&K) -> bool) {
        for (key, entry) in self.map().iter() {
            if which(key) {
                entry.notify.notify_one();
            }
        }
    }

    /// Whether a waiter is registered under `key`.
    pub(crate) fn contains(&self, key: &K) -> bool {
        self.map().contains_key(key)
    }

    /// Whether a waiter is registered under a name `which` picks.
    pub(crate) fn any(&self, which: impl Fn(&K) -> bool) -> bool {
        self.map().keys().any(which)
    }
}

impl<K: Eq + Hash + Clone> Wakes<K> {
    /// Delivers a notification's payload to the waiter it names, `key_of` making the
    /// registry's key from the name (see the module docs); whether it named a registered
    /// waiter.
    pub(crate) fn deliver_message(&self, payload: &str, key_of: impl Fn(&str) -> K) -> bool {
        // A registered name that happens to look like a hand-over is taken as named.
        if self.wake(&key_of(payload)) {
            return true;
        }
        let message = Message::parse(payload);
        match message {
            Message::Wake(name) if name == payload => false,
            _ => self.deliver(&key_of(message.name()), message.fence()),
        }
    }
}

/// Store watches shared by a client's local listeners of one key (the observers of one
/// election, the waiters without a place of one lock): the first listener's call opens
/// the watch and starts its task, later ones join it, and the last one to go ends it.
/// The task wakes whoever listens under the key when it fires ([`Watches::waker`]), so a
/// listener that joins later is woken by the same watch.
#[derive(Default)]
pub(crate) struct Watches {
    wakes: Wakes,
    tasks: Arc<Mutex<HashMap<String, Weak<WatchTask>>>>,
    /// How many tasks run.
    running: Arc<AtomicUsize>,
}

/// A shared watch's task, aborted when its last listener goes.
pub(crate) struct WatchTask {
    task: tokio::task::JoinHandle<()>,
    running: Arc<AtomicUsize>,
}

impl Drop for WatchTask {
    fn drop(&mut self) {
        self.task.abort();
        self.running.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Watches {
    fn tasks(&self) -> MutexGuard<'_, HashMap<String, Weak<WatchTask>>> {
        self.tasks.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A listener of `key`: its watch if a task watches `key` already, else its
    /// registration, for the caller to open the store's watch and [`start`](Watches::start)
    /// its task.
    pub(crate) fn join(&self, key: &str) -> Result<ReleaseWatch, Registration> {
        let registration = self.wakes.register(key.to_owned());
        let running = self.tasks().get(key).and_then(Weak::upgrade);
        match running {
            Some(task) => Ok(registration.into_wake_only_watch(Some(Box::new(task)))),
            None => Err(registration),
        }
    }

    /// Starts the task that watches `key` for `registration` (and the listeners that join
    /// it later); the listener's watch.
    pub(crate) fn start(
        &self,
        key: &str,
        registration: Registration,
        task: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> ReleaseWatch {
        self.running.fetch_add(1, Ordering::Relaxed);
        let task = Arc::new(WatchTask {
            task: tokio::spawn(task),
            running: Arc::clone(&self.running),
        });
        let mut tasks = self.tasks();
        tasks.retain(|_, t| t.strong_count() > 0);
        tasks.insert(key.to_owned(), Arc::downgrade(&task));
        drop(tasks);
        registration.into_wake_only_watch(Some(Box::new(task)))
    }

    /// What a watch task calls when its watch fires: wakes one listener of `key` (who
    /// passes it on).
    pub(crate) fn waker(&self, key: &str) -> impl Fn() + Send + Sync + 'static {
        let wakes = self.wakes.clone();
        let key = key.to_owned();
        move || {
            wakes.wake(&key);
        }
    }

    /// How many store watches are open (tasks with a listener).
    pub(crate) fn open(&self) -> usize {
        self.running.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use proptest::prelude::*;

    use super::{Message, Wakes};

    fn deliver(wakes: &Wakes, payload: &str) -> bool {
        wakes.deliver_message(payload, str::to_owned)
    }

    #[test]
    fn a_name_lives_while_any_registration_does() {
        let wakes: Wakes = Wakes::default();
        let a = wakes.register("n".to_owned());
        let b = wakes.register("n".to_owned());
        assert!(Arc::ptr_eq(a.notify(), b.notify()), "one notifier per name");
        drop(a);
        assert!(wakes.contains(&"n".to_owned()));
        drop(b);
        assert!(!wakes.contains(&"n".to_owned()));
        assert!(!wakes.any(|_| true));
    }

    #[tokio::test]
    async fn a_hand_over_leaves_its_fence_and_wakes() {
        let wakes: Wakes = Wakes::default();
        let reg = wakes.register("tok".to_owned());
        assert!(deliver(&wakes, &Message::hand_over(7, "tok")));
        reg.notify().notified().await;
        assert_eq!(reg.grants().take(), Some(7));
        assert!(!deliver(&wakes, "other"), "nobody named");
    }

    #[tokio::test]
    async fn disconnected_forgets_hand_overs_and_wakes_everyone() {
        let wakes: Wakes = Wakes::default();
        let a = wakes.register("a".to_owned());
        let b = wakes.register("b".to_owned());
        wakes.deliver(&"a".to_owned(), Some(3));
        wakes.disconnected();
        a.notify().notified().await;
        b.notify().notified().await;
        assert_eq!(a.grants().take(), None, "the hand-over is forgotten");
    }

    #[test]
    fn a_floor_voids_older_hand_overs() {
        let wakes: Wakes = Wakes::default();
        let reg = wakes.register("tok".to_owned());
        wakes.raise_floor(&"tok".to_owned(), 10);
        deliver(&wakes, "!10:tok");
        assert_eq!(reg.grants().take(), None);
        deliver(&wakes, "!11:tok");
        assert_eq!(reg.grants().take(), Some(11));
    }

    proptest! {
        #![proptest_config(dlock_hostile::cases(256))]

        /// Hostile input: any payload names one waiter or nobody, and hands over only a
        /// positive fence.
        #[test]
        fn any_payload_names_a_waiter_or_nobody(payload in prop_oneof![any::<String>(), "!-?[0-9]{0,21}:tok|tok|!:tok|![0-9]{1,5}:"]) {
            let wakes: Wakes = Wakes::default();
            let reg = wakes.register("tok".to_owned());
            let handed = payload
                .strip_prefix('!')
                .and_then(|p| p.split_once(':'))
                .filter(|(_, token)| *token == "tok")
                .map(|(fence, _)| fence.parse::<u64>().ok().filter(|f| *f > 0));
            let expected = if payload == "tok" { Some(None) } else { handed };
            let named = deliver(&wakes, &payload);
            prop_assert_eq!(named, expected.is_some());
            prop_assert_eq!(reg.grants().take(), expected.flatten());
        }

        #[test]
        fn hand_overs_round_trip(fence in 1..u64::MAX, name in "[0-9a-f]{1,32}") {
            let text = Message::hand_over(fence, &name);
            prop_assert_eq!(Message::parse(&text), Message::HandOver { name: &name, fence });
        }
    }
}
