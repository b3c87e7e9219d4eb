//! The simulator's omniscient view: the fault schedule in force, the trace, what every
//! task believes it holds, and the checkers that compare beliefs with the store.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use fencelock::backend::Memory;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::rng::Rng;
use crate::{Fault, Plant};

/// What one hold looks like to the checkers.
pub trait Belief: Send {
    /// The store key of the hold (the lock key, or a semaphore's / rwlock's key).
    fn key(&self) -> String;
    /// The token the store must hold the key under.
    fn token(&self) -> String;
    /// Whether the task believes it holds, by the library's own validity accounting
    /// (not lost, validity left).
    fn believes(&self) -> bool;
}

/// A task's current hold, if any, where the checkers can see it.
pub type Slot<G> = Arc<Mutex<Option<G>>>;

/// A slot seen through [`Belief`].
trait SlotView: Send + Sync {
    fn belief(&self) -> Option<(String, String)>;
}

impl<G: Belief> SlotView for Mutex<Option<G>> {
    fn belief(&self) -> Option<(String, String)> {
        let slot = self.lock().unwrap_or_else(PoisonError::into_inner);
        slot.as_ref()
            .filter(|g| g.believes())
            .map(|g| (g.key(), g.token()))
    }
}

/// A broken promise the checkers found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// Which checker: `holder`, `fence`, `stale-write`, `permits`, `observe`, `lost`,
    /// `ghost`, `wakeup`, `liveness`, `leak` (SAFETY.md's simulation section says what
    /// each checks).
    pub checker: &'static str,
    /// When, from the run's start.
    pub at: Duration,
    /// What was seen.
    pub what: String,
}

/// How many faults of each kind were injected.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FaultCounts(pub BTreeMap<&'static str, u64>);

impl FaultCounts {
    /// Counts one fault of `kind`.
    pub fn add(&mut self, kind: &'static str) {
        *self.0.entry(kind).or_default() += 1;
    }

    /// Adds another run's counts.
    pub fn merge(&mut self, other: &FaultCounts) {
        for (k, v) in &other.0 {
            *self.0.entry(k).or_default() += v;
        }
    }
}

/// The trace: every event hashed, the last ones kept as text.
#[derive(Debug)]
pub struct Trace {
    hash: u64,
    events: u64,
    tail: std::collections::VecDeque<String>,
    keep: usize,
    /// Every line kept (`--trace`), not only the tail.
    all: bool,
}

impl Trace {
    fn new(keep: usize, all: bool) -> Trace {
        Trace {
            hash: 0xcbf2_9ce4_8422_2325,
            events: 0,
            tail: std::collections::VecDeque::new(),
            keep,
            all,
        }
    }

    fn push(&mut self, line: String) {
        for b in line.as_bytes().iter().chain(b"\n") {
            self.hash ^= u64::from(*b);
            self.hash = self.hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
        self.events += 1;
        if !self.all && self.tail.len() == self.keep {
            self.tail.pop_front();
        }
        self.tail.push_back(line);
    }
}

/// One client's network, as the fault schedule has it.
#[derive(Debug)]
struct Link {
    rng: Rng,
    /// Cut off from the store until then.
    cut_until: Option<Instant>,
    /// Its notifications lost until then (a reset channel that lost them).
    deaf_until: Option<Instant>,
    /// The store's clock runs this much faster than this client's (0.01 = 1 %).
    drift: f64,
    /// Every notifier this client's waiters sleep on (woken at a reconnect).
    notifiers: Vec<Weak<Notify>>,
}

/// What the network does to one request.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Fate {
    pub(crate) there: Duration,
    pub(crate) back: Duration,
    pub(crate) lose_request: bool,
    pub(crate) lose_reply: bool,
    pub(crate) duplicate: bool,
    pub(crate) short_batch: bool,
}

/// The fault rates of one run, drawn from its seed.
#[derive(Debug, Clone, Copy)]
pub struct Rates {
    /// A request lost before the store sees it.
    pub lose_request: f64,
    /// A reply lost after the store applied the request.
    pub lose_reply: f64,
    /// A request the store applies twice.
    pub duplicate: f64,
    /// A renewal batch whose reply lacks its last results.
    pub short_batch: f64,
    /// The long tail: a request slower than the ttl's tenth.
    pub slow: f64,
}

/// Everything the simulator knows.
pub struct World {
    pub(crate) start: Instant,
    pub(crate) ttl: Duration,
    pub(crate) plant: Option<Plant>,
    pub(crate) rates: Rates,
    pub(crate) store: Memory,
    links: Vec<Link>,
    paused_until: Option<Instant>,
    /// Checker 1 is excused until then (a restart that lost the store's holds: nothing
    /// but fences can protect a resource then).
    excused_until: Option<Instant>,
    /// Faults stop (the workload's end): no loss, no cut, no pause from then on.
    pub(crate) calm: bool,
    trace: Trace,
    slots: Vec<Arc<dyn SlotView>>,
    /// The latest grant of each key: (fence, token).
    grants: BTreeMap<String, (u64, String)>,
    /// The fenced resource of each key: highest accepted fence and who wrote under it.
    resource: BTreeMap<String, (u64, String)>,
    pub(crate) violations: Vec<Violation>,
    /// The trace's tail at the first violation.
    first_tail: Option<Vec<String>>,
    pub(crate) faults: FaultCounts,
    /// Keys the workload used (checked for leaks at the end).
    pub(crate) keys: std::collections::BTreeSet<String>,
    /// Tasks blocked in a wait without deadline: task → (key, since).
    waiting: BTreeMap<String, (String, Instant)>,
    /// When each key was last granted.
    granted_at: BTreeMap<String, Instant>,
    /// Every token that reached a task (held, or forgotten by it).
    known: std::collections::BTreeSet<String>,
    /// When each token was last granted.
    granted_token_at: BTreeMap<String, Instant>,
    /// Woken at every release of a key (tasks cancel their waits at such moments).
    release_signals: BTreeMap<String, Arc<Notify>>,
    /// The clients subscribed to each plain lock's release channel.
    subscribers: BTreeMap<String, Vec<(usize, Weak<Notify>)>>,
    /// When each client last sent an acquire of each key.
    attempted: BTreeMap<(usize, String), Instant>,
    /// Until when something disturbed the network or the store (a lost or duplicated
    /// request, a slow trip, a fault window): the wake-up checker looks only at quiet
    /// stretches.
    disturbed_until: Instant,
}

/// The world, shared by the stores, the tasks and the nemesis.
#[derive(Clone)]
pub struct Shared(Arc<Mutex<World>>);

impl Shared {
    pub(crate) fn new(
        store: Memory,
        clients: usize,
        rng: &mut Rng,
        ttl: Duration,
        rates: Rates,
        options: crate::Options,
    ) -> Shared {
        let plant = options.plant;
        let drift_beyond = plant == Some(Plant::DriftBeyond);
        let links = (0..clients)
            .map(|_| {
                let mut rng = rng.fork();
                // Within the allowance (1 % of the ttl plus 2 ms): up to 0.9 %; the
                // control goes beyond it.
                let drift = if drift_beyond {
                    0.03 + rng.unit() * 0.1
                } else {
                    rng.unit() * 0.009
                };
                Link {
                    rng,
                    cut_until: None,
                    deaf_until: None,
                    drift,
                    notifiers: Vec::new(),
                }
            })
            .collect();
        Shared(Arc::new(Mutex::new(World {
            start: Instant::now(),
            ttl,
            plant,
            rates,
            store,
            links,
            paused_until: None,
            excused_until: None,
            calm: false,
            trace: Trace::new(60, options.trace_all),
            slots: Vec::new(),
            grants: BTreeMap::new(),
            resource: BTreeMap::new(),
            violations: Vec::new(),
            first_tail: None,
            faults: FaultCounts::default(),
            keys: std::collections::BTreeSet::new(),
            waiting: BTreeMap::new(),
            granted_at: BTreeMap::new(),
            known: std::collections::BTreeSet::new(),
            granted_token_at: BTreeMap::new(),
            release_signals: BTreeMap::new(),
            subscribers: BTreeMap::new(),
            attempted: BTreeMap::new(),
            disturbed_until: Instant::now(),
        })))
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, World> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records an event in the trace.
    pub fn event(&self, who: &str, what: std::fmt::Arguments<'_>) {
        self.lock().event(who, what);
    }

    /// Makes a task's slot visible to the checkers.
    pub fn watch_slot<G: Belief + 'static>(&self, slot: &Slot<G>) {
        let view: Arc<dyn SlotView> = slot.clone();
        self.lock().slots.push(view);
    }

    /// The fate of one request of `client`.
    pub(crate) fn fate(&self, client: usize) -> Fate {
        let mut w = self.lock();
        let ttl = w.ttl;
        let calm = w.calm;
        let rates = w.rates;
        let link = &mut w.links[client];
        let r = &mut link.rng;
        let one_way = |r: &mut Rng| {
            if r.chance(rates.slow) {
                r.duration(ttl / 10, ttl * 3 / 5)
            } else if r.chance(0.1) {
                r.duration(Duration::from_millis(2), Duration::from_millis(20))
            } else {
                r.duration(Duration::from_micros(100), Duration::from_millis(2))
            }
        };
        let there = one_way(r);
        let back = one_way(r);
        let faulty = |r: &mut Rng, p: f64| !calm && r.chance(p);
        let fate = Fate {
            there,
            back,
            lose_request: faulty(r, rates.lose_request),
            lose_reply: faulty(r, rates.lose_reply),
            duplicate: faulty(r, rates.duplicate),
            short_batch: faulty(r, rates.short_batch),
        };
        if fate.lose_request
            || fate.lose_reply
            || fate.duplicate
            || fate.short_batch
            || there + back > Duration::from_millis(40)
        {
            let end = Instant::now() + there + back;
            w.disturbed_until = w.disturbed_until.max(end);
        }
        fate
    }

    /// A task starts (`Some(key)`) or ends (`None`) a wait without deadline.
    pub(crate) fn waiting(&self, task: &str, key: Option<&str>) {
        let mut w = self.lock();
        match key {
            Some(k) => {
                w.waiting
                    .insert(task.to_owned(), (k.to_owned(), Instant::now()));
            }
            None => {
                w.waiting.remove(task);
            }
        }
    }

    /// `client` listens on `channel` through `notify`.
    pub(crate) fn subscribe(&self, channel: &str, client: usize, notify: &Arc<Notify>) {
        let mut w = self.lock();
        let list = w.subscribers.entry(channel.to_owned()).or_default();
        list.retain(|(_, n)| n.strong_count() > 0);
        list.push((client, Arc::downgrade(notify)));
    }

    /// `client` sends an acquire of `key`.
    pub(crate) fn attempt(&self, client: usize, key: &str) {
        self.lock()
            .attempted
            .insert((client, key.to_owned()), Instant::now());
    }

    /// A release of `key` announced to `heard`: on a quiet network, each of those
    /// clients that had a task waiting for `key` since before must send an attempt
    /// within a quarter of a ttl (100 ms at least) — the woken waiter's, or, if it left,
    /// the next one's it passed the wake-up on to.
    fn heard(&self, key: &str, heard: Vec<usize>) {
        let at = Instant::now();
        let within = (self.lock().ttl / 4).max(Duration::from_millis(100));
        let world = self.clone();
        let key = key.to_owned();
        tokio::spawn(async move {
            tokio::time::sleep(within).await;
            let mut w = world.lock();
            if w.disturbed_until + w.ttl >= at || w.calm {
                return;
            }
            for client in heard {
                let prefix = format!("c{client}t");
                let stuck = w
                    .waiting
                    .iter()
                    .find(|(t, (k, since))| t.starts_with(&prefix) && *k == key && *since < at)
                    .map(|(t, _)| t.clone());
                let tried = w
                    .attempted
                    .get(&(client, key.clone()))
                    .is_some_and(|&a| a >= at);
                if let Some(task) = stuck
                    && !tried
                {
                    let since = at - w.start;
                    w.violation(
                        "wakeup",
                        format!("client {client} heard {key} released at {since:?}, and none of its waiters tried (one is {task})"),
                    );
                }
            }
        });
    }

    /// A release of `key` announced on `channel`: every subscribed client hears it (one
    /// waiter of each is woken), unless its channel is deaf.
    pub(crate) fn broadcast(&self, channel: &str, key: &str) {
        let mut w = self.lock();
        let now = Instant::now();
        let mut heard = Vec::new();
        for (client, n) in w.subscribers.get(channel).into_iter().flatten() {
            if w.links[*client].deaf_until.is_some_and(|u| now < u) {
                continue;
            }
            if let Some(n) = n.upgrade() {
                n.notify_one();
                heard.push(*client);
            }
        }
        w.event(
            "store",
            format_args!("release announced on {channel} to clients {heard:?}"),
        );
        drop(w);
        self.heard(key, heard);
    }

    /// `token` reached a task (checker 3's ghost holds are tokens that never did).
    pub(crate) fn known(&self, token: &str) {
        self.lock().known.insert(token.to_owned());
    }

    /// Woken at the next release of `key`.
    pub(crate) fn release_signal(&self, key: &str) -> Arc<Notify> {
        let mut w = self.lock();
        Arc::clone(w.release_signals.entry(key.to_owned()).or_default())
    }

    /// An acquisition of `key` that began at `since` was cancelled or failed: on a quiet network, whatever the
    /// store granted it is given back within a round trip, so a quarter of a ttl later
    /// no token of `key` that never reached a task may still hold it (a ghost hold
    /// blocks everyone for the rest of its ttl).
    pub(crate) fn ghost_check(&self, key: &str, since: Instant) {
        let at = Instant::now();
        let after = self.lock().ttl / 4;
        let world = self.clone();
        let key = key.to_owned();
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            let now = Instant::now();
            let store = world.lock().store.clone();
            let holders = store.holders(&key);
            let mut w = world.lock();
            // Quiet from the acquisition's start to now; a ghost is a grant made while
            // it ran that no task ever got.
            let quiet = w.disturbed_until < since && !w.calm;
            let ghost = holders.iter().find(|(t, _)| {
                !w.known.contains(t)
                    && w.granted_token_at.get(t).is_some_and(|&g| {
                        g >= since && g <= at && g + Duration::from_millis(50) <= now
                    })
            });
            if quiet && let Some((token, _)) = ghost {
                let what = format!(
                    "{key} held by {token}, granted to an acquisition that never returned it and not given back"
                );
                w.violation("ghost", what);
            }
        });
    }

    /// The store released `key`: a task that waited for it since before, on a quiet
    /// network, must be granted it (or someone must) within a quarter of a ttl (100 ms
    /// at least: a few round trips) — a wake-up
    /// lost inside the client leaves the lock free until the waiter's fallback timer.
    pub(crate) fn released(&self, key: &str) {
        let at = Instant::now();
        let within = (self.lock().ttl / 4).max(Duration::from_millis(100));
        if let Some(n) = self.lock().release_signals.get(key) {
            n.notify_waiters();
        }
        let world = self.clone();
        let key = key.to_owned();
        tokio::spawn(async move {
            tokio::time::sleep(within).await;
            let mut w = world.lock();
            let quiet = w.disturbed_until + w.ttl < at && !w.calm;
            let granted = w.granted_at.get(&key).is_some_and(|&g| g >= at);
            let stuck = w
                .waiting
                .iter()
                .find(|(_, (k, since))| *k == key && *since < at)
                .map(|(t, _)| t.clone());
            if quiet
                && !granted
                && let Some(task) = stuck
            {
                let since = at - w.start;
                w.violation(
                    "wakeup",
                    format!(
                        "{key} released at {since:?} and free since, while {task} waited for it"
                    ),
                );
            }
        });
    }

    /// Whether `client` is cut off from the store now.
    pub(crate) fn cut(&self, client: usize) -> bool {
        let w = self.lock();
        w.links[client]
            .cut_until
            .is_some_and(|u| Instant::now() < u)
    }

    /// Until when the store is paused, if it is.
    pub(crate) fn paused_until(&self) -> Option<Instant> {
        self.lock().paused_until.filter(|&u| Instant::now() < u)
    }

    /// The ttl the store applies for a lease of `ttl` asked by `client`: its clock runs
    /// faster by the link's drift, so the lease ends sooner by the client's clock.
    pub(crate) fn store_ttl(&self, client: usize, ttl: Duration) -> Duration {
        let drift = self.lock().links[client].drift;
        ttl.div_f64(1.0 + drift)
    }

    /// Registers a notifier of `client` (woken when its channel reconnects).
    pub(crate) fn notifier(&self, client: usize, notify: &Arc<Notify>) {
        let mut w = self.lock();
        let list = &mut w.links[client].notifiers;
        list.retain(|n| n.strong_count() > 0);
        list.push(Arc::downgrade(notify));
    }

    /// The store granted `key` to `token` with `fence`: fences strictly increase in grant
    /// order (a repeat of the same grant excepted).
    pub(crate) fn granted(&self, key: &str, token: &str, fence: u64) {
        let mut w = self.lock();
        w.keys.insert(key.to_owned());
        if fence == 0 {
            return;
        }
        if let Some((last, by)) = w.grants.get(key).cloned()
            && fence <= last
            && !(fence == last && by == token)
        {
            w.violation(
                "fence",
                format!("{key} granted with fence {fence} to {token} after fence {last} to {by}"),
            );
        }
        w.grants.insert(key.to_owned(), (fence, token.to_owned()));
        w.granted_at.insert(key.to_owned(), Instant::now());
        w.granted_token_at.insert(token.to_owned(), Instant::now());
    }

    /// Checker 1, after the store changed (or a lease may have ended): every task that
    /// believes it holds is the store's holder.
    pub(crate) fn check_holders(&self) {
        let (slots, store, excused) = {
            let w = self.lock();
            let excused = w.excused_until.is_some_and(|u| Instant::now() < u);
            (w.slots.clone(), w.store.clone(), excused)
        };
        if excused {
            return;
        }
        for slot in slots {
            if let Some((key, token)) = slot.belief()
                && !store.holders(&key).iter().any(|(t, _)| *t == token)
            {
                let holders = store.holders(&key);
                self.lock().violation(
                    "holder",
                    format!("{token} believes it holds {key}; the store's holders: {holders:?}"),
                );
            }
        }
    }

    /// A write to `key`'s fenced resource under `fence` by `token`: refused below the
    /// highest fence accepted (the resource's check); two holders under one fence is a
    /// violation.
    pub(crate) fn write(&self, key: &str, token: &str, fence: u64) -> bool {
        let mut w = self.lock();
        let (highest, by) = w.resource.get(key).cloned().unwrap_or_default();
        if fence < highest {
            return false;
        }
        if fence == highest && by != token && highest != 0 {
            w.violation(
                "stale-write",
                format!("{key}'s resource: fence {fence} written by {token} after {by} wrote under the same fence"),
            );
        }
        w.resource.insert(key.to_owned(), (fence, token.to_owned()));
        true
    }

    /// `client` stalls for `length` (a GC pause, a stopped VM): nothing it sends gets
    /// through meanwhile, its renewals included.
    pub(crate) fn pause_client(&self, client: usize, length: Duration) {
        let mut w = self.lock();
        let until = Instant::now() + length;
        let link = &mut w.links[client];
        link.cut_until = Some(link.cut_until.map_or(until, |u| u.max(until)));
        w.disturbed_until = w.disturbed_until.max(until);
        w.faults.add("client-pause");
    }

    /// Injects `fault` now.
    pub(crate) fn inject(&self, fault: Fault) {
        let mut w = self.lock();
        let now = Instant::now();
        let window = match fault {
            Fault::Partition { length, .. } | Fault::Pause { length } => length,
            Fault::Reset { .. } | Fault::Restart { .. } => w.ttl,
        };
        w.disturbed_until = w.disturbed_until.max(now + window);
        match fault {
            Fault::Partition { client, length } => {
                w.links[client].cut_until = Some(now + length);
                w.faults.add("partition");
                w.event(
                    "nemesis",
                    format_args!("client {client} cut off for {length:?}"),
                );
            }
            Fault::Reset { client, lose } => {
                if lose {
                    let length = w.ttl;
                    w.links[client].deaf_until = Some(now + length);
                }
                for n in w.links[client].notifiers.iter().filter_map(Weak::upgrade) {
                    n.notify_waiters();
                }
                w.faults.add(if lose { "reset-lossy" } else { "reset" });
                w.event(
                    "nemesis",
                    format_args!("client {client}'s channel reset (notifications lost: {lose})"),
                );
            }
            Fault::Pause { length } => {
                w.paused_until = Some(now + length);
                w.faults.add("store-pause");
                w.event("nemesis", format_args!("store paused for {length:?}"));
            }
            Fault::Restart { keep_state } => {
                // The store is down a tenth of a ttl, and every client's release channel
                // is dropped (its waiters woken: they try again).
                let down = now + w.ttl / 10;
                w.paused_until = Some(w.paused_until.map_or(down, |u| u.max(down)));
                for n in w
                    .subscribers
                    .values()
                    .flatten()
                    .filter_map(|(_, n)| n.upgrade())
                {
                    n.notify_waiters();
                }
                if keep_state {
                    w.faults.add("restart-kept");
                } else {
                    // The holds are gone: until every belief from before has run out,
                    // nothing but the fences protects the resource.
                    let keep_fences = w.plant != Some(Plant::FenceReset);
                    w.store.restart(keep_fences);
                    w.excused_until = Some(now + w.ttl + w.ttl / 10);
                    w.faults.add("restart-lost");
                }
                w.event(
                    "nemesis",
                    format_args!("store restarted (state kept: {keep_state})"),
                );
            }
        }
    }

    /// The workload is over: every fault stops.
    pub(crate) fn calm(&self) {
        let mut w = self.lock();
        w.calm = true;
        for l in &mut w.links {
            l.cut_until = None;
            l.deaf_until = None;
        }
        w.paused_until = None;
        w.event("nemesis", format_args!("faults stop"));
    }

    /// Records a violation found by the caller.
    pub(crate) fn violation(&self, checker: &'static str, what: String) {
        self.lock().violation(checker, what);
    }
}

impl World {
    pub(crate) fn event(&mut self, who: &str, what: std::fmt::Arguments<'_>) {
        let at = Instant::now() - self.start;
        let mut line = String::with_capacity(64);
        let _ = write!(line, "{:>10.3}ms {who:<8} {what}", at.as_secs_f64() * 1e3);
        self.trace.push(line);
    }

    fn violation(&mut self, checker: &'static str, what: String) {
        let at = Instant::now() - self.start;
        self.event("CHECK", format_args!("VIOLATION [{checker}] {what}"));
        if self.violations.is_empty() {
            // The events that led to the first violation, not the run's end.
            self.first_tail = Some(self.trace.tail.iter().cloned().collect());
        }
        self.violations.push(Violation { checker, at, what });
    }

    pub(crate) fn trace_hash(&self) -> u64 {
        self.trace.hash
    }

    pub(crate) fn trace_events(&self) -> u64 {
        self.trace.events
    }

    /// The trace's last lines: up to the first violation if there was one (the whole
    /// trace when every line is kept).
    pub(crate) fn trace_tail(&self) -> Vec<String> {
        match &self.first_tail {
            Some(tail) if !self.trace.all => tail.clone(),
            _ => self.trace.tail.iter().cloned().collect(),
        }
    }
}
