//! The simulated clients' tasks on the rest of the family: semaphores (one or several
//! permits, permit counts raised — and, in some seeds, lowered — while held), reentrant
//! locks (re-entry up to a limit, holds released in any order), read-write locks (reads,
//! writes, downgrades), fair locks, multi-locks over two or three plain locks, and
//! elections (campaigns, proclamations, resignations, observers). Every hold sits in a
//! slot the checkers watch; holds with a fence write the fenced resource while they
//! believe they hold. Each seed draws its mix ([`Family::draw`]).

use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use fencelock::backend::Memory;
use fencelock::keys::LockKeys;
use fencelock::raw::RawSemaphore;
use fencelock::{
    BoxFuture, Election, FairGuard, FairLock, Held, LeaderChange, Leadership, Lock, LockGuard,
    Lockable, MultiLock, OtherCount, Owner, ReadGuard, ReentrantGuard, ReentrantLock, Result,
    RwLock, Semaphore, SemaphorePermit, WriteGuard,
};
use tokio::time::Instant;

use crate::Plant;
use crate::rng::Rng;
use crate::store::SimStore;
use crate::workload::maybe_cancel;
use crate::world::{Belief, Shared, Slot};

fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The primitives a task can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Primitive {
    /// The plain lock ([`crate::workload::lock_task`]).
    Lock,
    /// A counting semaphore.
    Semaphore,
    /// A reentrant lock.
    Reentrant,
    /// A read-write lock.
    RwLock,
    /// A fair lock.
    Fair,
    /// A multi-lock over plain locks.
    Multi,
    /// An election.
    Election,
}

impl Primitive {
    /// Every primitive.
    pub const ALL: [Primitive; 7] = [
        Primitive::Lock,
        Primitive::Semaphore,
        Primitive::Reentrant,
        Primitive::RwLock,
        Primitive::Fair,
        Primitive::Multi,
        Primitive::Election,
    ];

    /// Its short name.
    pub fn id(self) -> &'static str {
        match self {
            Primitive::Lock => "lock",
            Primitive::Semaphore => "semaphore",
            Primitive::Reentrant => "reentrant",
            Primitive::RwLock => "rwlock",
            Primitive::Fair => "fair",
            Primitive::Multi => "multi",
            Primitive::Election => "election",
        }
    }

    /// The text of a trace line that shows a hold of this primitive granted (for the
    /// plain lock: a line of [`crate::workload`]'s).
    pub fn held_marker(self) -> String {
        match self {
            Primitive::Lock => String::from(" holds dlock:"),
            p => format!(" holds {} ", p.id()),
        }
    }
}

/// What the semaphores' permit checker knows.
#[derive(Default)]
struct Book {
    /// Every semaphore task's slot.
    slots: Vec<Slot<FamHeld>>,
    /// Every semaphore's keys, and whether its count may have been lowered in the run.
    sems: Vec<(LockKeys, bool)>,
    /// Restarts that lost the store's state, as last seen.
    restarts: u64,
    /// The check is excused until then (a restart forgot the permits and the count).
    excused_until: Option<Instant>,
}

/// One seed's family: its mix of primitives and their settings.
#[derive(Clone)]
pub struct Family {
    /// All tasks run this primitive, if set.
    mono: Option<Primitive>,
    /// Otherwise each task runs the plain lock or one of these.
    subset: Vec<Primitive>,
    ttl: Duration,
    names: usize,
    /// Writers' and fair waiters' grace.
    grace: Duration,
    /// The semaphores' permit count.
    permits: u32,
    /// Whether permit counts may be lowered (`set_permits`, negative `add_permits`).
    lowering: bool,
    /// The reentrant locks' limit.
    limit: u32,
    store: Memory,
    book: Arc<Mutex<Book>>,
}

impl Family {
    /// Draws the seed's mix: in about a third of the seeds every task runs one primitive
    /// (drawn from all seven); else each task runs the plain lock (40 %) or one of one or
    /// two other primitives the seed draws.
    pub(crate) fn draw(rng: &mut Rng, store: &Memory, ttl: Duration, names: usize) -> Family {
        let others = &Primitive::ALL[1..];
        let mono = rng
            .chance(0.3)
            .then(|| *rng.pick(&Primitive::ALL).expect("seven primitives"));
        let mut subset = vec![*rng.pick(others).expect("six primitives")];
        if rng.chance(0.5) {
            let second = *rng.pick(others).expect("six primitives");
            if !subset.contains(&second) {
                subset.push(second);
            }
        }
        Family {
            mono,
            subset,
            ttl,
            names,
            grace: rng.duration(ttl / 4, ttl * 2),
            permits: rng.range(1, 3) as u32,
            lowering: rng.chance(0.4),
            limit: if rng.chance(0.3) { 2 } else { 64 },
            store: store.clone(),
            book: Arc::default(),
        }
    }

    /// The primitive of the next task.
    pub(crate) fn pick(&self, rng: &mut Rng) -> Primitive {
        if let Some(p) = self.mono {
            return p;
        }
        if rng.chance(0.4) {
            return Primitive::Lock;
        }
        *rng.pick(&self.subset).unwrap_or(&Primitive::Lock)
    }

    /// The seed's mix, for the trace.
    pub(crate) fn describe(&self) -> String {
        let mix = match self.mono {
            Some(p) => format!("every task {}", p.id()),
            None => {
                let ids: Vec<&str> = self.subset.iter().map(|p| p.id()).collect();
                format!("lock and {}", ids.join(", "))
            }
        };
        format!(
            "{mix}; grace {:?}, {} permits (lowered: {}), reentrancy limit {}",
            self.grace, self.permits, self.lowering, self.limit
        )
    }

    /// Checks, every tenth of a ttl until `until`, that the believing holders of each
    /// semaphore believe in no more permits than its count.
    pub(crate) fn spawn_checker(&self, world: Shared, until: Instant) {
        let family = self.clone();
        tokio::spawn(async move {
            while Instant::now() < until {
                tokio::time::sleep(family.ttl / 10).await;
                family.check_permits(&world).await;
            }
        });
    }

    /// The permit check: the believed permits of every believing holder of a semaphore
    /// are within its count, while the count was never lowered in the run (holders above
    /// a lowered count keep their permits) and not within two ttls of a restart that lost
    /// the store's state (the count and the permits with it).
    async fn check_permits(&self, world: &Shared) {
        let restarts = world
            .lock()
            .faults
            .0
            .get("restart-lost")
            .copied()
            .unwrap_or(0);
        let now = Instant::now();
        let (slots, sems) = {
            let mut book = locked(&self.book);
            if restarts != book.restarts {
                book.restarts = restarts;
                book.excused_until = Some(now + self.ttl * 2);
            }
            if book.excused_until.is_some_and(|u| now < u) {
                return;
            }
            (book.slots.clone(), book.sems.clone())
        };
        for (keys, lowered) in sems {
            if lowered {
                continue;
            }
            let Ok((_, count)) = RawSemaphore::permits_in_use(&self.store, &keys, 0).await else {
                continue;
            };
            if count == 0 {
                continue;
            }
            let mut believed = 0;
            let mut who = Vec::new();
            for slot in &slots {
                if let Some(h) = locked(slot).as_ref()
                    && h.key == keys.lock()
                    && h.believes()
                {
                    believed += h.permits;
                    who.push(format!("{}×{}", h.writer, h.permits));
                }
            }
            if believed > count {
                world.violation(
                    "permits",
                    format!(
                        "{} permits of {} believed held ({}); its count is {count}",
                        believed,
                        keys.lock(),
                        who.join(", ")
                    ),
                );
            }
        }
    }

    /// Registers a semaphore task's slot and its semaphores with the permit checker.
    fn register(&self, slot: &Slot<FamHeld>, sems: &[Semaphore<SimStore>]) {
        let mut book = locked(&self.book);
        book.slots.push(slot.clone());
        for s in sems {
            if !book.sems.iter().any(|(k, _)| k.lock() == s.keys().lock()) {
                book.sems.push((s.keys().clone(), false));
            }
        }
    }

    /// The count of `key` may be lowered from now on: the permit check stops for it.
    fn lowering(&self, key: &str) {
        let mut book = locked(&self.book);
        for (k, lowered) in &mut book.sems {
            if k.lock() == key {
                *lowered = true;
            }
        }
    }
}

/// A hold of one of the family's primitives.
pub(crate) enum Guard {
    Permits(SemaphorePermit<SimStore>),
    Reentrant(ReentrantGuard<SimStore>),
    Read(ReadGuard<SimStore>),
    Write(WriteGuard<SimStore>),
    Fair(FairGuard<SimStore>),
    Lead(Leadership<SimStore>),
}

/// Applies `$e` to the [`LockGuard`] under a [`Guard`].
macro_rules! on_guard {
    ($g:expr, $x:ident => $e:expr) => {
        match $g {
            Guard::Permits($x) => $e,
            Guard::Reentrant($x) => $e,
            Guard::Read($x) => $e,
            Guard::Write($x) => $e,
            Guard::Fair($x) => $e,
            Guard::Lead(l) => {
                let $x = l.guard();
                $e
            }
        }
    };
}

impl Guard {
    fn kind(&self) -> &'static str {
        match self {
            Guard::Permits(_) => "semaphore",
            Guard::Reentrant(_) => "reentrant",
            Guard::Read(_) => "rwlock read",
            Guard::Write(_) => "rwlock write",
            Guard::Fair(_) => "fair",
            Guard::Lead(_) => "election",
        }
    }

    fn token(&self) -> String {
        on_guard!(self, g => g.token().as_str().to_owned())
    }

    fn believes(&self) -> bool {
        on_guard!(self, g => !g.is_lost() && !g.remaining().is_zero())
    }

    fn remaining(&self) -> Duration {
        on_guard!(self, g => g.remaining())
    }

    fn lease(&self) -> Duration {
        on_guard!(self, g => g.lease())
    }

    async fn extend(&self, ttl: Duration) -> Result<()> {
        on_guard!(self, g => g.extend(ttl).await)
    }

    async fn release(self) -> Result<()> {
        match self {
            Guard::Permits(g) => g.release().await,
            Guard::Reentrant(g) => g.release().await,
            Guard::Read(g) => g.release().await,
            Guard::Write(g) => g.release().await,
            Guard::Fair(g) => g.release().await,
            Guard::Lead(l) => l.resign().await,
        }
    }

    fn forget(self) {
        match self {
            Guard::Permits(g) => g.forget(),
            Guard::Reentrant(g) => g.forget(),
            Guard::Read(g) => g.forget(),
            Guard::Write(g) => g.forget(),
            Guard::Fair(g) => g.forget(),
            Guard::Lead(l) => l.into_guard().forget(),
        }
    }
}

/// A family hold, as the checkers see it.
pub(crate) struct FamHeld {
    guard: Guard,
    /// The store key it is held under.
    key: String,
    /// Who writes the fenced resource: the token, or a reentrant lock's owner (its
    /// holds share the tenure's fence).
    writer: String,
    /// Its fence (0: the hold has none: permits, readers).
    fence: u64,
    /// Permits it holds (1 for other primitives).
    permits: u32,
}

impl FamHeld {
    fn new(guard: Guard, key: &str, fence: u64) -> FamHeld {
        let writer = guard.token();
        FamHeld {
            guard,
            key: key.to_owned(),
            writer,
            fence,
            permits: 1,
        }
    }
}

impl Belief for FamHeld {
    fn key(&self) -> String {
        self.key.clone()
    }

    fn token(&self) -> String {
        self.guard.token()
    }

    fn believes(&self) -> bool {
        self.guard.believes()
    }
}

/// What a task's holds can do besides extend and release.
enum Ctx<'a> {
    Semaphore(&'a Semaphore<SimStore>),
    Reentrant(&'a ReentrantLock<SimStore>, &'a Owner),
    RwLock(&'a RwLock<SimStore>),
    Election,
    Fair,
}

/// How a task waits: at once, without a bound, or at most this long.
#[derive(Clone, Copy)]
enum Wait {
    Try,
    Forever,
    For(Duration),
}

impl Wait {
    fn draw(rng: &mut Rng, ttl: Duration) -> Wait {
        match rng.below(100) {
            0..35 => Wait::Forever,
            35..55 => Wait::Try,
            _ => Wait::For(rng.duration(Duration::ZERO, ttl * 2)),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Wait::Try => "try",
            Wait::Forever => "wait",
            Wait::For(_) => "timed",
        }
    }
}

/// Logs an attempt's outcome; the hold if one was granted.
fn outcome<G>(world: &Shared, who: &str, what: &str, r: Option<Result<Option<G>>>) -> Option<G> {
    match r {
        None => world.event(who, format_args!("{what}: cancelled")),
        Some(Err(e)) => world.event(who, format_args!("{what}: error {e}")),
        Some(Ok(None)) => world.event(who, format_args!("{what}: not granted")),
        Some(Ok(Some(g))) => return Some(g),
    }
    None
}

/// One task of one client on primitive `p` (not the plain lock), until `until`.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn task(
    p: Primitive,
    who: String,
    client: usize,
    store: SimStore,
    family: Family,
    world: Shared,
    rng: Rng,
    until: Instant,
) {
    let t = TaskCtx {
        who,
        client,
        store,
        family,
        world,
        rng,
        until,
    };
    match p {
        Primitive::Lock => {}
        Primitive::Semaphore => semaphore_task(t).await,
        Primitive::Reentrant => reentrant_task(t).await,
        Primitive::RwLock => rwlock_task(t).await,
        Primitive::Fair => fair_task(t).await,
        Primitive::Multi => multi_task(t).await,
        Primitive::Election => election_task(t).await,
    }
}

struct TaskCtx {
    who: String,
    client: usize,
    store: SimStore,
    family: Family,
    world: Shared,
    rng: Rng,
    until: Instant,
}

impl TaskCtx {
    fn ttl(&self) -> Duration {
        self.family.ttl
    }

    fn cancel(&mut self, p: f64, within: Duration) -> Option<Duration> {
        self.rng
            .chance(p)
            .then(|| self.rng.duration(Duration::ZERO, within))
    }

    fn slots(&self, n: usize) -> Vec<Slot<FamHeld>> {
        (0..n)
            .map(|_| {
                let slot: Slot<FamHeld> = Slot::default();
                self.world.watch_slot(&slot);
                slot
            })
            .collect()
    }

    async fn think(&mut self) {
        let think = self.rng.duration(Duration::ZERO, self.ttl() / 5);
        tokio::time::sleep(think).await;
    }

    fn held(&self, slot: &Slot<FamHeld>, held: FamHeld) {
        self.world.event(
            &self.who,
            format_args!(
                "holds {} {} fence {} token {} permits {}",
                held.guard.kind(),
                held.key,
                held.fence,
                held.writer,
                held.permits
            ),
        );
        self.world.known(&held.guard.token());
        *locked(slot) = Some(held);
    }
}

async fn semaphore_task(mut t: TaskCtx) {
    let f = t.family.clone();
    let rule = if f.lowering {
        *t.rng
            .pick(&[OtherCount::Adopt, OtherCount::Set, OtherCount::Refuse])
            .expect("three rules")
    } else {
        OtherCount::Adopt
    };
    let sems: Vec<Semaphore<SimStore>> = (0..f.names)
        .filter_map(|n| {
            Semaphore::builder(t.store.clone(), format!("s{n}"), f.permits)
                .ttl(f.ttl)
                .on_other_count(rule)
                .build()
                .ok()
        })
        .collect();
    let slots = t.slots(1);
    f.register(&slots[0], &sems);
    if rule == OtherCount::Set {
        // Every acquire sets the count (to this client's, which may be lower).
        for s in &sems {
            f.lowering(s.keys().lock());
        }
    }
    while Instant::now() < t.until {
        let Some(sem) = t.rng.pick(&sems).cloned() else {
            return;
        };
        let key = sem.keys().lock().to_owned();
        if t.rng.chance(0.1) {
            permit_change(&mut t, &sem).await;
            continue;
        }
        let local = sem.permits().min(f.permits);
        let n = if t.rng.chance(0.4) {
            t.rng.range(1, u64::from(local).min(3)) as u32
        } else {
            1
        };
        let mut wait = Wait::draw(&mut t.rng, f.ttl);
        if n > 1 && f.lowering && !matches!(wait, Wait::Try) {
            // A lowered count may never again leave room for n: no unbounded wait.
            wait = Wait::Try;
        }
        let cancel = t.cancel(0.2, f.ttl);
        let attempt = async {
            match (wait, n) {
                (Wait::Forever, 1) => sem.acquire().await.map(Some),
                (Wait::Forever, n) => sem.acquire_many(n).await.map(Some),
                (Wait::Try, 1) => sem.try_acquire().await,
                (Wait::Try, n) => sem.try_acquire_many(n).await,
                (Wait::For(d), 1) => sem.try_acquire_for(d).await,
                // No timed form for several permits: a wait cancelled at the timeout.
                (Wait::For(d), n) => Ok(maybe_cancel(Some(d), sem.acquire_many(n))
                    .await
                    .transpose()?),
            }
        };
        let what = format!("{} {n} of {key}", wait.name());
        let r = maybe_cancel(cancel, attempt).await;
        f.check_permits(&t.world).await;
        if let Some(g) = outcome(&t.world, &t.who, &what, r) {
            let mut held = FamHeld::new(Guard::Permits(g), &key, 0);
            held.permits = n;
            t.held(&slots[0], held);
            hold(&mut t, &slots, &Ctx::Semaphore(&sem)).await;
            f.check_permits(&t.world).await;
        }
        t.think().await;
    }
}

/// Raises the permit count, or (in seeds that allow it) sets or lowers it.
async fn permit_change(t: &mut TaskCtx, sem: &Semaphore<SimStore>) {
    let key = sem.keys().lock().to_owned();
    let cancel = t.cancel(0.2, t.ttl() / 2);
    let (what, r) = if t.family.lowering && t.rng.chance(0.6) {
        t.family.lowering(&key);
        if t.rng.chance(0.5) {
            let p = t.rng.range(1, u64::from(t.family.permits) + 1) as u32;
            let r = maybe_cancel(cancel, sem.set_permits(p)).await;
            (format!("set-permits {key} {p}"), r.map(|r| r.map(|()| p)))
        } else {
            let r = maybe_cancel(cancel, sem.add_permits(-1)).await;
            (format!("add-permits {key} -1"), r)
        }
    } else {
        let d = t.rng.range(1, 2) as i64;
        let r = maybe_cancel(cancel, sem.add_permits(d)).await;
        (format!("add-permits {key} +{d}"), r)
    };
    match r {
        None => t.world.event(&t.who, format_args!("{what}: cancelled")),
        Some(r) => t.world.event(
            &t.who,
            format_args!("{what}: {:?}", r.map_err(|e| e.to_string())),
        ),
    }
    t.family.check_permits(&t.world).await;
}

async fn reentrant_task(mut t: TaskCtx) {
    let f = t.family.clone();
    let locks: Vec<ReentrantLock<SimStore>> = (0..f.names)
        .filter_map(|n| {
            ReentrantLock::builder(t.store.clone(), format!("r{n}"))
                .ttl(f.ttl)
                .max_holds(f.limit)
                .build()
                .ok()
        })
        .collect();
    let Ok(owner) = Owner::with_client(format!("c{}", t.client), t.who.clone()) else {
        return;
    };
    let slots = t.slots(3);
    while Instant::now() < t.until {
        let Some(lock) = t.rng.pick(&locks).cloned() else {
            return;
        };
        if reenter(&mut t, &lock, &owner, &slots[0]).await {
            hold(&mut t, &slots, &Ctx::Reentrant(&lock, &owner)).await;
        }
        t.think().await;
    }
}

/// One attempt of `owner` on `lock`, its hold put in `slot`. Returns whether it holds.
async fn reenter(
    t: &mut TaskCtx,
    lock: &ReentrantLock<SimStore>,
    owner: &Owner,
    slot: &Slot<FamHeld>,
) -> bool {
    let key = lock.keys().lock().to_owned();
    let ttl = t.ttl();
    let wait = Wait::draw(&mut t.rng, ttl);
    let cancel = t.cancel(0.2, t.ttl());
    let attempt = async {
        match wait {
            Wait::Forever => lock.lock(owner).await.map(Some),
            Wait::Try => lock.try_lock(owner).await,
            Wait::For(d) => lock.try_lock_for(owner, d).await,
        }
    };
    let what = format!("{} {key}", wait.name());
    let r = maybe_cancel(cancel, attempt).await;
    match outcome(&t.world, &t.who, &what, r) {
        Some(g) => {
            let fence = g.fencing_token().get();
            let mut held = FamHeld::new(Guard::Reentrant(g), &key, fence);
            held.writer = owner.as_str().to_owned();
            t.held(slot, held);
            true
        }
        None => false,
    }
}

async fn rwlock_task(mut t: TaskCtx) {
    let f = t.family.clone();
    let locks: Vec<RwLock<SimStore>> = (0..f.names)
        .filter_map(|n| {
            RwLock::builder(t.store.clone(), format!("w{n}"))
                .ttl(f.ttl)
                .writer_grace(f.grace)
                .build()
                .ok()
        })
        .collect();
    let slots = t.slots(1);
    while Instant::now() < t.until {
        let Some(rw) = t.rng.pick(&locks).cloned() else {
            return;
        };
        let key = rw.keys().lock().to_owned();
        let write = t.rng.chance(0.5);
        let wait = Wait::draw(&mut t.rng, f.ttl);
        let cancel = t.cancel(0.2, f.ttl);
        let what = format!(
            "{} {} {key}",
            wait.name(),
            if write { "write" } else { "read" }
        );
        let held = if write {
            let attempt = async {
                match wait {
                    Wait::Forever => rw.write().await.map(Some),
                    Wait::Try => rw.try_write().await,
                    Wait::For(d) => rw.try_write_for(d).await,
                }
            };
            let r = maybe_cancel(cancel, attempt).await;
            outcome(&t.world, &t.who, &what, r).map(|g| {
                let fence = g.fencing_token().get();
                FamHeld::new(Guard::Write(g), &key, fence)
            })
        } else {
            let attempt = async {
                match wait {
                    Wait::Forever => rw.read().await.map(Some),
                    Wait::Try => rw.try_read().await,
                    Wait::For(d) => rw.try_read_for(d).await,
                }
            };
            let r = maybe_cancel(cancel, attempt).await;
            outcome(&t.world, &t.who, &what, r).map(|g| FamHeld::new(Guard::Read(g), &key, 0))
        };
        if let Some(held) = held {
            t.held(&slots[0], held);
            hold(&mut t, &slots, &Ctx::RwLock(&rw)).await;
        }
        t.think().await;
    }
}

async fn fair_task(mut t: TaskCtx) {
    let f = t.family.clone();
    let locks: Vec<FairLock<SimStore>> = (0..f.names)
        .filter_map(|n| {
            FairLock::builder(t.store.clone(), format!("f{n}"))
                .ttl(f.ttl)
                .waiter_grace(f.grace)
                .build()
                .ok()
        })
        .collect();
    let slots = t.slots(1);
    while Instant::now() < t.until {
        let Some(lock) = t.rng.pick(&locks).cloned() else {
            return;
        };
        let key = lock.keys().lock().to_owned();
        let wait = Wait::draw(&mut t.rng, f.ttl);
        let cancel = t.cancel(0.2, f.ttl);
        let attempt = async {
            match wait {
                Wait::Forever => lock.lock().await.map(Some),
                Wait::Try => lock.try_lock().await,
                Wait::For(d) => lock.try_lock_for(d).await,
            }
        };
        let what = format!("{} {key}", wait.name());
        let r = maybe_cancel(cancel, attempt).await;
        if let Some(g) = outcome(&t.world, &t.who, &what, r) {
            let fence = g.fencing_token().get();
            t.held(&slots[0], FamHeld::new(Guard::Fair(g), &key, fence));
            hold(&mut t, &slots, &Ctx::Fair).await;
        }
        t.think().await;
    }
}

async fn election_task(mut t: TaskCtx) {
    let f = t.family.clone();
    let elections: Vec<Election<SimStore>> = (0..f.names)
        .filter_map(|n| {
            Election::builder(t.store.clone(), format!("e{n}"))
                .ttl(f.ttl)
                .build()
                .ok()
        })
        .collect();
    let slots = t.slots(1);
    let mut values = 0u64;
    while Instant::now() < t.until {
        let Some(election) = t.rng.pick(&elections).cloned() else {
            return;
        };
        let key = election.lock().keys().lock().to_owned();
        if t.rng.chance(0.25) {
            observe(&mut t, &election).await;
            continue;
        }
        values += 1;
        let value = format!("{}-{values}", t.who);
        let wait = Wait::draw(&mut t.rng, f.ttl);
        let cancel = t.cancel(0.2, f.ttl);
        let attempt = async {
            match wait {
                Wait::Forever => election.campaign(value).await.map(Some),
                Wait::Try => election.try_campaign(value).await,
                Wait::For(d) => election.campaign_for(d, value).await,
            }
        };
        let what = format!("campaign ({}) {key}", wait.name());
        let r = maybe_cancel(cancel, attempt).await;
        if let Some(l) = outcome(&t.world, &t.who, &what, r) {
            let term = l.term().get();
            t.held(&slots[0], FamHeld::new(Guard::Lead(l), &key, term));
            hold(&mut t, &slots, &Ctx::Election).await;
        }
        t.think().await;
    }
}

/// Follows `election` for a few changes: the terms it reports as leading never go down
/// (unless the fence counter was reset, the planted bug).
async fn observe(t: &mut TaskCtx, election: &Election<SimStore>) {
    let key = election.lock().keys().lock().to_owned();
    let mut observer = election.observe();
    let mut last: Option<u64> = None;
    let reset = t.world.lock().plant == Some(Plant::FenceReset);
    for _ in 0..t.rng.range(1, 4) {
        let within = t.rng.duration(t.ttl() / 10, t.ttl() * 2);
        match tokio::time::timeout(within, observer.next()).await {
            Err(_) => {
                t.world
                    .event(&t.who, format_args!("observes {key}: no change"));
            }
            Ok(Err(e)) => t
                .world
                .event(&t.who, format_args!("observes {key}: error {e}")),
            Ok(Ok(LeaderChange::Leader(l))) => {
                let term = l.term.get();
                t.world.event(
                    &t.who,
                    format_args!("observes {key}: leader term {term} {:?}", l.value),
                );
                if let Some(before) = last
                    && term < before
                    && !reset
                {
                    t.world.violation(
                        "observe",
                        format!("{key}: an observer reported term {term} after term {before}"),
                    );
                }
                last = Some(term);
            }
            Ok(Ok(LeaderChange::Vacant(v))) => {
                // Not its time of vacancy: the wall clock's.
                t.world.event(
                    &t.who,
                    format_args!("observes {key}: vacant after term {:?}", v.last_term),
                );
            }
        }
    }
}

/// Holds what `slots` hold for a few steps, writing the fenced resource while each hold
/// believes it holds, extending and doing the primitive's own moves (re-entry, downgrade,
/// proclamation, permit changes), then releases, drops or forgets each hold.
async fn hold(t: &mut TaskCtx, slots: &[Slot<FamHeld>], ctx: &Ctx<'_>) {
    let ttl = t.ttl();
    for _ in 0..t.rng.range(1, 6) {
        if t.rng.chance(0.03) {
            // A client pause longer than the lease (the whole client: its renewals stop too),
            // then writes that do not check.
            t.world.event(&t.who, format_args!("stalls past its lease"));
            t.world.pause_client(t.client, ttl * 3 / 2);
            tokio::time::sleep(ttl * 3 / 2).await;
            for slot in slots {
                let h = locked(slot)
                    .as_ref()
                    .map(|h| (h.key.clone(), h.writer.clone(), h.fence));
                if let Some((key, writer, fence)) = h
                    && fence > 0
                {
                    let ok = t.world.write(&key, &writer, fence);
                    t.world.event(
                        &t.who,
                        format_args!("stale write {key} fence {fence}: accepted {ok}"),
                    );
                }
            }
            continue;
        }
        let mut step = t.rng.duration(Duration::ZERO, ttl / 2);
        for slot in slots {
            if let Some(h) = locked(slot).as_ref()
                && h.guard.believes()
            {
                let left = h.guard.remaining();
                if left > Duration::from_millis(2) {
                    // Act just before the belief ends, where a wrong validity shows.
                    step = step.min(left - Duration::from_millis(1));
                }
            }
        }
        tokio::time::sleep(step).await;
        let mut any = false;
        for slot in slots {
            let h = locked(slot)
                .as_ref()
                .map(|h| (h.key.clone(), h.writer.clone(), h.fence, h.believes()));
            match h {
                Some((key, writer, fence, true)) => {
                    any = true;
                    if fence > 0 && !t.world.write(&key, &writer, fence) {
                        t.world.event(
                            &t.who,
                            format_args!("write {key} fence {fence} refused while believing"),
                        );
                    }
                }
                Some((key, ..)) => {
                    t.world.event(&t.who, format_args!("lease of {key} lost"));
                }
                None => {}
            }
        }
        if matches!(ctx, Ctx::Semaphore(_)) {
            t.family.check_permits(&t.world).await;
        }
        if !any {
            break;
        }
        let filled: Vec<usize> = (0..slots.len())
            .filter(|&i| locked(&slots[i]).is_some())
            .collect();
        if t.rng.chance(0.1)
            && let Some(&i) = t.rng.pick(&filled)
        {
            extend(t, &slots[i]).await;
        }
        if t.rng.chance(0.2) {
            special(t, slots, ctx).await;
        }
    }
    let mut order: Vec<usize> = (0..slots.len()).collect();
    for i in (1..order.len()).rev() {
        let j = t.rng.below(i as u64 + 1) as usize;
        order.swap(i, j);
    }
    for i in order {
        let Some(held) = locked(&slots[i]).take() else {
            continue;
        };
        end(t, held).await;
    }
}

/// Extends the hold in `slot` (taken out of the slot meanwhile; a cancelled extend drops
/// it: then the hold ends by drop).
async fn extend(t: &mut TaskCtx, slot: &Slot<FamHeld>) {
    let Some(h) = locked(slot).take() else {
        return;
    };
    let key = h.key.clone();
    let ttl = h.guard.lease();
    let cancel = t.cancel(0.3, ttl / 4);
    let extend = async {
        let r = h.guard.extend(ttl).await;
        (h, r)
    };
    match maybe_cancel(cancel, extend).await {
        Some((h, r)) => {
            t.world.event(
                &t.who,
                format_args!(
                    "extend {key}: {:?}",
                    r.as_ref().map_err(ToString::to_string)
                ),
            );
            *locked(slot) = Some(h);
        }
        None => t.world.event(
            &t.who,
            format_args!("extend {key}: cancelled (hold dropped)"),
        ),
    }
}

/// The primitive's own move.
async fn special(t: &mut TaskCtx, slots: &[Slot<FamHeld>], ctx: &Ctx<'_>) {
    match ctx {
        Ctx::Semaphore(sem) => permit_change(t, sem).await,
        Ctx::Reentrant(lock, owner) => {
            let held = slots.iter().any(|s| locked(s).is_some());
            let free = slots.iter().find(|s| locked(s).is_none());
            if let Some(slot) = free
                && held
            {
                // Re-entry while holding.
                reenter(t, lock, owner, slot).await;
            }
        }
        Ctx::RwLock(rw) => {
            let Some(h) = locked(&slots[0]).take() else {
                return;
            };
            let FamHeld {
                guard: Guard::Write(w),
                key,
                ..
            } = h
            else {
                *locked(&slots[0]) = Some(h);
                return;
            };
            let cancel = t.cancel(0.2, t.ttl() / 4);
            match maybe_cancel(cancel, rw.downgrade(w)).await {
                None => t.world.event(
                    &t.who,
                    format_args!("downgrade {key}: cancelled (hold lapses)"),
                ),
                Some(Err(e)) => t
                    .world
                    .event(&t.who, format_args!("downgrade {key}: error {e}")),
                Some(Ok(r)) => {
                    t.world.event(&t.who, format_args!("downgraded {key}"));
                    t.held(&slots[0], FamHeld::new(Guard::Read(r), &key, 0));
                }
            }
        }
        Ctx::Election => {
            let Some(h) = locked(&slots[0]).take() else {
                return;
            };
            let FamHeld {
                guard: Guard::Lead(mut l),
                key,
                writer,
                fence,
                permits,
            } = h
            else {
                *locked(&slots[0]) = Some(h);
                return;
            };
            let value = format!("{}-p{}", t.who, t.rng.below(1000));
            let cancel = t.cancel(0.2, t.ttl() / 4);
            let proclaim = async {
                let r = l.proclaim(value).await;
                (l, r)
            };
            match maybe_cancel(cancel, proclaim).await {
                None => t.world.event(
                    &t.who,
                    format_args!("proclaim {key}: cancelled (leadership dropped)"),
                ),
                Some((l, r)) => {
                    t.world.event(
                        &t.who,
                        format_args!("proclaim {key}: {:?}", r.map_err(|e| e.to_string())),
                    );
                    *locked(&slots[0]) = Some(FamHeld {
                        guard: Guard::Lead(l),
                        key,
                        writer,
                        fence,
                        permits,
                    });
                }
            }
        }
        Ctx::Fair => {}
    }
}

/// Releases (resigns), drops or forgets a hold.
async fn end(t: &mut TaskCtx, held: FamHeld) {
    let key = held.key.clone();
    let ttl = t.ttl();
    match t.rng.below(100) {
        0..65 => {
            let cancel = t.cancel(0.1, ttl / 4);
            match maybe_cancel(cancel, held.guard.release()).await {
                None => t
                    .world
                    .event(&t.who, format_args!("release {key}: cancelled")),
                Some(r) => t.world.event(
                    &t.who,
                    format_args!("release {key}: {:?}", r.map_err(|e| e.to_string())),
                ),
            }
        }
        65..92 => {
            t.world
                .event(&t.who, format_args!("drops {key} without releasing"));
            drop(held);
        }
        _ => {
            t.world.event(&t.who, format_args!("forgets {key}"));
            held.guard.forget();
        }
    }
}

/// A multi-lock member's guard, shared with the checkers' view of it.
type Cell = Arc<Mutex<Option<LockGuard<SimStore>>>>;

/// A member of a multi-lock as the checkers see it.
pub(crate) struct MemberBelief {
    key: String,
    token: String,
    fence: u64,
    cell: Weak<Mutex<Option<LockGuard<SimStore>>>>,
}

impl Belief for MemberBelief {
    fn key(&self) -> String {
        self.key.clone()
    }

    fn token(&self) -> String {
        self.token.clone()
    }

    fn believes(&self) -> bool {
        self.cell.upgrade().is_some_and(|c| {
            locked(&c)
                .as_ref()
                .is_some_and(|g| !g.is_lost() && !g.remaining().is_zero())
        })
    }
}

/// A plain lock as a multi-lock member whose grants the checkers see.
struct Member {
    lock: Lock<SimStore>,
    slot: Slot<MemberBelief>,
    world: Shared,
    who: String,
}

impl Lockable for Member {
    fn order_key(&self) -> (String, String) {
        Lockable::order_key(&self.lock)
    }

    fn acquire_until(
        &self,
        deadline: Option<Instant>,
    ) -> BoxFuture<'_, Result<Option<Box<dyn Held>>>> {
        Box::pin(async move {
            let guard = match deadline {
                Some(d) => self.lock.try_lock_until(d).await?,
                None => Some(self.lock.lock().await?),
            };
            Ok(guard.map(|g| {
                let key = self.lock.keys().lock().to_owned();
                let token = g.token().as_str().to_owned();
                let fence = g.fencing_token().get();
                let name = g.name().to_owned();
                self.world.event(
                    &self.who,
                    format_args!("member {key} fence {fence} token {token}"),
                );
                self.world.known(&token);
                let cell: Cell = Arc::new(Mutex::new(Some(g)));
                *locked(&self.slot) = Some(MemberBelief {
                    key,
                    token,
                    fence,
                    cell: Arc::downgrade(&cell),
                });
                Box::new(Tracked { name, cell }) as Box<dyn Held>
            }))
        })
    }
}

/// A member's hold inside a [`fencelock::MultiGuard`]: dropping it drops the guard.
struct Tracked {
    name: String,
    cell: Cell,
}

impl Held for Tracked {
    fn name(&self) -> &str {
        &self.name
    }

    fn is_lost(&self) -> bool {
        locked(&self.cell).as_ref().is_none_or(LockGuard::is_lost)
    }

    fn lost(&self) -> BoxFuture<'static, ()> {
        let lost = locked(&self.cell).as_ref().map(LockGuard::lost);
        Box::pin(async move {
            if let Some(lost) = lost {
                lost.await;
            }
        })
    }

    fn release(self: Box<Self>) -> BoxFuture<'static, Result<()>> {
        let guard = locked(&self.cell).take();
        Box::pin(async move {
            match guard {
                Some(g) => g.release().await,
                None => Ok(()),
            }
        })
    }
}

async fn multi_task(mut t: TaskCtx) {
    let f = t.family.clone();
    // Two locks of their own and the plain lock tasks' first.
    let locks: Vec<Lock<SimStore>> = ["m0", "m1", "l0"]
        .iter()
        .filter_map(|n| Lock::builder(t.store.clone(), *n).ttl(f.ttl).build().ok())
        .collect();
    let slots: Vec<Slot<MemberBelief>> = locks
        .iter()
        .map(|_| {
            let slot: Slot<MemberBelief> = Slot::default();
            t.world.watch_slot(&slot);
            slot
        })
        .collect();
    while Instant::now() < t.until {
        let mut builder = MultiLock::new();
        let mut names = Vec::new();
        let skip = if t.rng.chance(0.5) {
            Some(t.rng.below(locks.len() as u64) as usize)
        } else {
            None
        };
        let mut order: Vec<usize> = (0..locks.len()).collect();
        for i in (1..order.len()).rev() {
            let j = t.rng.below(i as u64 + 1) as usize;
            order.swap(i, j);
        }
        for i in order {
            if Some(i) == skip {
                continue;
            }
            names.push(locks[i].keys().lock().to_owned());
            builder = builder.with(Member {
                lock: locks[i].clone(),
                slot: slots[i].clone(),
                world: t.world.clone(),
                who: t.who.clone(),
            });
        }
        let Ok(multi) = builder.build() else {
            return;
        };
        let wait = Wait::draw(&mut t.rng, f.ttl);
        let cancel = t.cancel(0.2, f.ttl);
        let attempt = async {
            match wait {
                Wait::Forever => multi.lock().await.map(Some),
                Wait::Try => multi.try_lock().await,
                Wait::For(d) => multi.try_lock_for(d).await,
            }
        };
        let what = format!("{} multi {}", wait.name(), names.join("+"));
        let r = maybe_cancel(cancel, attempt).await;
        if let Some(guard) = outcome(&t.world, &t.who, &what, r) {
            t.world
                .event(&t.who, format_args!("holds multi {}", names.join("+")));
            hold_multi(&mut t, &slots, guard).await;
        }
        t.think().await;
    }
}

async fn hold_multi(t: &mut TaskCtx, slots: &[Slot<MemberBelief>], guard: fencelock::MultiGuard) {
    let ttl = t.ttl();
    let members = || {
        slots
            .iter()
            .filter_map(|s| {
                locked(s).as_ref().map(|m| {
                    (
                        m.key.clone(),
                        m.token.clone(),
                        m.fence,
                        m.believes(),
                        m.cell
                            .upgrade()
                            .and_then(|c| locked(&c).as_ref().map(LockGuard::remaining)),
                    )
                })
            })
            .collect::<Vec<_>>()
    };
    for _ in 0..t.rng.range(1, 6) {
        let mut step = t.rng.duration(Duration::ZERO, ttl / 2);
        for (.., believes, left) in members() {
            if let (true, Some(left)) = (believes, left)
                && left > Duration::from_millis(2)
            {
                step = step.min(left - Duration::from_millis(1));
            }
        }
        tokio::time::sleep(step).await;
        if guard.is_lost() {
            t.world.event(&t.who, format_args!("multi lost"));
            break;
        }
        for (key, token, fence, believes, _) in members() {
            if believes && !t.world.write(&key, &token, fence) {
                t.world.event(
                    &t.who,
                    format_args!("write {key} fence {fence} refused while believing"),
                );
            }
        }
    }
    if t.rng.chance(0.7) {
        let cancel = t.cancel(0.1, ttl / 4);
        match maybe_cancel(cancel, guard.release()).await {
            None => t
                .world
                .event(&t.who, format_args!("release multi: cancelled")),
            Some(r) => t.world.event(
                &t.who,
                format_args!("release multi: {:?}", r.map_err(|e| e.to_string())),
            ),
        }
    } else {
        t.world
            .event(&t.who, format_args!("drops multi without releasing"));
        drop(guard);
    }
}
