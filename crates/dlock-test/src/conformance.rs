//! One behavioural suite that every backend must pass.
//!
//! Each function checks one behaviour against a [`Target`] and panics (fails the test) if
//! the backend misbehaves. Backends run it from the kit's integration tests; a new backend
//! is done when it passes all of it against a real server.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use fencelock::raw::{RawFencing, RawInspect, RawLock, RawSemaphore};
use fencelock::{ErrorKind, Lock, OtherCount, Retry, Semaphore};
use tokio::time::{Instant, sleep, timeout};

/// A store under test.
pub trait Target: Send + Sync + 'static {
    /// The backend type.
    type Backend: RawFencing;

    /// A new client of the store (as another process or machine would have).
    fn client(&self) -> impl Future<Output = Self::Backend> + Send;

    /// Deletes a key behind every holder's back, as an operator or eviction would.
    fn delete_key(&self, key: &str) -> impl Future<Output = ()> + Send;

    /// The ttl to test with where a behaviour wants `wanted`: stores with a coarse expiry
    /// clock (memcached: whole seconds) lengthen short ones. Tests measure against the
    /// returned value.
    fn ttl(&self, wanted: Duration) -> Duration {
        wanted
    }

    /// Whether a hold belongs to the client's session (ZooKeeper's ephemeral nodes): the
    /// store then keeps no remaining ttl to inspect, and only the holding client can
    /// extend a hold (another client's `extend_token` is refused as `InvalidArgument`).
    fn session_bound(&self) -> bool {
        false
    }
}

/// A store the test can freeze alone (SIGSTOP to its processes: connections stay open,
/// nothing answers). Not the in-process memory store, nor the ZooKeeper target, whose
/// server other tests share.
pub trait Freezable: Target {
    /// The store's processes.
    fn pids(&self) -> Vec<u32>;
}

/// A store a test can reach through a [`Proxy`](crate::proxy::Proxy) (to delay, cut or
/// close its connections): one server at a loopback port.
pub trait Proxied: Target {
    /// The server's port on 127.0.0.1.
    fn port(&self) -> u16;

    /// A client of the store that connects to `addr` (the proxy) instead, with requests
    /// that time out in a fraction of a second where the client lets the test choose.
    fn client_at(&self, addr: std::net::SocketAddr) -> impl Future<Output = Self::Backend> + Send;
}

/// A frozen store, continued (SIGCONT) when dropped.
#[derive(Debug)]
pub struct Frozen(Vec<u32>);

/// Freezes `target`'s processes until the returned guard is dropped.
///
/// # Panics
/// If the store runs no process, or `kill` fails.
pub fn freeze<T: Freezable>(target: &T) -> Frozen {
    let pids = target.pids();
    assert!(!pids.is_empty(), "the store runs no process to freeze");
    signal_all(&pids, "-STOP");
    Frozen(pids)
}

fn signal_all(pids: &[u32], signal: &str) {
    // A process that exited meanwhile (a backend) makes `kill` fail for it alone.
    let _ = std::process::Command::new("kill")
        .arg(signal)
        .arg("--")
        .args(pids.iter().map(u32::to_string))
        .stderr(std::process::Stdio::null())
        .status();
}

impl Drop for Frozen {
    fn drop(&mut self) {
        signal_all(&self.0, "-CONT");
    }
}

/// A lock name no other test uses.
pub fn unique(what: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let token = fencelock::Token::random().expect("os rng");
    format!(
        "{what}-{}-{}",
        N.fetch_add(1, Ordering::Relaxed),
        &token.as_str()[..8]
    )
}

/// Runs `work` as a process that dies right after it: on a runtime of its own thread,
/// which is then shut down without running anything more (no release, no renewal: its
/// watchdog task dies with it), as a SIGKILL would end it. Returns what `work` returned.
///
/// # Panics
/// If `work` panics.
pub fn dies_after<T: Send + 'static>(work: impl Future<Output = T> + Send + 'static) -> T {
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let out = rt.block_on(work);
        rt.shutdown_background();
        out
    })
    .join()
    .expect("the dying process's thread panicked")
}

/// What a read-sleep-write run of workers under some exclusion produced.
#[derive(Debug, Default)]
pub struct RmwOutcome {
    /// Increments the workers believed they made.
    pub acknowledged: u64,
    /// The counter's final value.
    pub final_value: u64,
    /// Times a worker entered while another was inside.
    pub overlaps: usize,
    /// Fences in grant order (empty when the run had none).
    pub fences: Vec<u64>,
}

impl RmwOutcome {
    /// Increments lost to overlapping read-modify-writes.
    pub fn lost(&self) -> u64 {
        self.acknowledged - self.final_value
    }
}

/// Shared state of the read-sleep-write checker.
#[derive(Default)]
struct Resource {
    value: AtomicU64,
    inside: AtomicUsize,
    overlaps: AtomicUsize,
    fences: std::sync::Mutex<Vec<u64>>,
}

impl Resource {
    /// The unprotected critical section: read, pause, write back + 1.
    async fn read_sleep_write(&self, fence: Option<u64>) {
        if self.inside.fetch_add(1, Ordering::SeqCst) != 0 {
            self.overlaps.fetch_add(1, Ordering::SeqCst);
        }
        if let Some(f) = fence {
            self.fences.lock().expect("fences").push(f);
        }
        let v = self.value.load(Ordering::SeqCst);
        sleep(Duration::from_millis(1)).await;
        self.value.store(v + 1, Ordering::SeqCst);
        self.inside.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Runs `workers` × `rounds` read-sleep-write increments, each under `lock` when given
/// (one client per worker), with no exclusion at all when `None` (the negative control).
pub async fn run_rmw<T: Target>(
    target: &T,
    name: Option<&str>,
    workers: usize,
    rounds: usize,
) -> RmwOutcome {
    let resource = Arc::new(Resource::default());
    let mut tasks = Vec::new();
    for _ in 0..workers {
        let resource = Arc::clone(&resource);
        let lock = match name {
            Some(name) => Some(
                Lock::builder(target.client().await, name)
                    .ttl(Duration::from_secs(10))
                    .build()
                    .expect("valid lock"),
            ),
            None => None,
        };
        tasks.push(tokio::spawn(async move {
            for _ in 0..rounds {
                match &lock {
                    Some(lock) => {
                        let guard = lock.lock().await.expect("lock");
                        resource
                            .read_sleep_write(Some(guard.fencing_token().get()))
                            .await;
                        guard.release().await.expect("release of a held lock");
                    }
                    None => resource.read_sleep_write(None).await,
                }
            }
        }));
    }
    for t in tasks {
        t.await.expect("worker task");
    }
    let fences = resource.fences.lock().expect("fences").clone();
    RmwOutcome {
        acknowledged: (workers * rounds) as u64,
        final_value: resource.value.load(Ordering::SeqCst),
        overlaps: resource.overlaps.load(Ordering::SeqCst),
        fences,
    }
}

/// Many clients doing read-sleep-write on one name: no overlapping holders, no lost
/// increments, and fences strictly increase in grant order.
pub async fn mutual_exclusion<T: Target>(target: &T) {
    let name = unique("mutex");
    let out = run_rmw(target, Some(&name), 8, 12).await;
    assert_eq!(out.overlaps, 0, "two holders at once: {out:?}");
    assert_eq!(out.lost(), 0, "lost increments: {out:?}");
    assert!(
        out.fences.windows(2).all(|w| w[0] < w[1]),
        "fences not strictly increasing in grant order: {:?}",
        out.fences
    );
}

/// The checker itself must catch a run without exclusion (negative control).
pub async fn checker_catches_no_lock<T: Target>(target: &T) {
    let out = run_rmw(target, None, 8, 12).await;
    assert!(
        out.overlaps > 0 && out.lost() > 0,
        "the read-sleep-write checker saw nothing wrong without a lock: {out:?}"
    );
}

/// Fences strictly increase across grants by different clients, including a grant that
/// follows an expired (never released) holder.
pub async fn fences_strictly_increase<T: Target>(target: &T) {
    let name = unique("fence");
    let mut seen = Vec::new();
    for _ in 0..3 {
        let lock = Lock::new(target.client().await, &name).expect("valid");
        let guard = lock.try_lock().await.expect("store").expect("free");
        seen.push(guard.fencing_token());
        guard.release().await.expect("release");
    }
    let lock = Lock::builder(target.client().await, &name)
        .ttl(target.ttl(Duration::from_millis(200)))
        .watchdog(false)
        .build()
        .expect("valid");
    let guard = lock.try_lock().await.expect("store").expect("free");
    seen.push(guard.fencing_token());
    guard.forget();
    let next = lock
        .try_lock_for(Duration::from_secs(5))
        .await
        .expect("store")
        .expect("free after expiry");
    seen.push(next.fencing_token());
    next.release().await.expect("release");
    assert!(
        seen.windows(2).all(|w| w[0] < w[1]),
        "fences must strictly increase: {seen:?}"
    );
}

/// A holder that vanished without releasing (forgot its guard) blocks others for at most
/// its ttl; meanwhile nobody else gets the lock.
pub async fn forgotten_holder_frees_within_ttl<T: Target>(target: &T) {
    let name = unique("forgotten");
    let ttl = target.ttl(Duration::from_millis(500));
    let holder = Lock::builder(target.client().await, &name)
        .ttl(ttl)
        .build()
        .expect("valid");
    let guard = holder.try_lock().await.expect("store").expect("free");
    let lost = guard.lost();
    let forgotten_at = Instant::now();
    guard.forget();
    let lost_at = tokio::spawn(async move {
        lost.await;
        Instant::now()
    });
    let other = Lock::new(target.client().await, &name).expect("valid");
    assert!(
        other.try_lock().await.expect("store").is_none(),
        "a forgotten guard's lease must still exclude others"
    );
    let guard = other
        .try_lock_for(ttl * 10)
        .await
        .expect("store")
        .expect("the lease must expire by itself");
    let waited = forgotten_at.elapsed();
    assert!(
        waited >= ttl - Duration::from_millis(50),
        "lock freed after {waited:?}, before its ttl {ttl:?}"
    );
    let lost_after = lost_at.await.expect("task") - forgotten_at;
    assert!(
        lost_after >= ttl / 2,
        "lost() fired {lost_after:?} after forget(), though the lease was still held"
    );
    guard.release().await.expect("release");
}

/// A holder whose runtime died (its process, as far as the lock can tell) stops renewing:
/// the lock frees itself within ttl + ε, and no renewal outlives the holder.
pub async fn killed_holder_frees_within_ttl<T: Target>(target: &T) {
    let name = unique("killed");
    let ttl = target.ttl(Duration::from_millis(600));
    let backend = target.client().await;
    let lock = Lock::builder(backend, &name)
        .ttl(ttl)
        .build()
        .expect("valid");
    dies_after(async move {
        let guard = lock.try_lock().await.expect("store").expect("free");
        std::mem::forget(guard); // never dropped: no release is sent
    });
    let died = Instant::now();
    let other = Lock::new(target.client().await, &name).expect("valid");
    let guard = other
        .try_lock_for(ttl * 10)
        .await
        .expect("store")
        .expect("a dead holder's lease must expire");
    let waited = died.elapsed();
    assert!(
        waited <= ttl + Duration::from_secs(2),
        "freed only after {waited:?} (ttl {ttl:?})"
    );
    guard.release().await.expect("release");
}

/// The classic "GET then DEL" failure is impossible: releasing after our lease expired and
/// someone else acquired returns `LockLost` and leaves the new holder's lock intact.
pub async fn release_after_expiry_is_lock_lost<T: Target>(target: &T) {
    let name = unique("late-release");
    let a = Lock::builder(target.client().await, &name)
        .ttl(target.ttl(Duration::from_millis(200)))
        .watchdog(false)
        .build()
        .expect("valid");
    let stale = a.try_lock().await.expect("store").expect("free");
    let b = Lock::new(target.client().await, &name).expect("valid");
    let current = b
        .try_lock_for(Duration::from_secs(5))
        .await
        .expect("store")
        .expect("free after expiry");
    assert!(stale.is_lost(), "validity must have run out");
    let err = stale.release().await.expect_err("must not report success");
    assert_eq!(err.kind(), ErrorKind::LockLost, "{err}");
    let c = Lock::new(target.client().await, &name).expect("valid");
    assert!(
        c.try_lock().await.expect("store").is_none(),
        "the stale release must not have freed the new holder's lock"
    );
    assert!(!current.is_lost());
    current
        .release()
        .await
        .expect("the new holder still holds it");
}

/// With the watchdog on, a lock stays held across many ttls of work.
pub async fn watchdog_keeps_lock<T: Target>(target: &T) {
    let name = unique("watchdog");
    let ttl = target.ttl(Duration::from_millis(300));
    let backend = target.client().await;
    let lock = Lock::builder(backend.clone(), &name)
        .ttl(ttl)
        .build()
        .expect("valid");
    let guard = lock.try_lock().await.expect("store").expect("free");
    assert_eq!(backend.engine().leases(), 1);
    let other = Lock::new(target.client().await, &name).expect("valid");
    let until = Instant::now() + ttl * 6;
    while Instant::now() < until {
        assert!(
            other.try_lock().await.expect("store").is_none(),
            "lock lost although the watchdog renews it"
        );
        sleep(ttl / 4).await;
    }
    assert!(!guard.is_lost());
    assert!(guard.remaining() > Duration::ZERO);
    guard.release().await.expect("still ours");
    assert_eq!(
        backend.engine().leases(),
        0,
        "released lease still under renewal"
    );
}

/// Without the watchdog, the lease ends at its ttl and `lost()` fires then.
pub async fn without_watchdog_lease_ends_at_ttl<T: Target>(target: &T) {
    let name = unique("no-watchdog");
    let ttl = target.ttl(Duration::from_millis(300));
    let backend = target.client().await;
    let lock = Lock::builder(backend.clone(), &name)
        .ttl(ttl)
        .watchdog(false)
        .build()
        .expect("valid");
    let guard = lock.try_lock().await.expect("store").expect("free");
    assert_eq!(backend.engine().leases(), 0);
    timeout(ttl * 5, guard.lost())
        .await
        .expect("lost() must fire when the un-renewed lease runs out");
    assert!(guard.is_lost());
    assert_eq!(guard.remaining(), Duration::ZERO);
}

/// `lost()` fires when the key is deleted behind the holder's back, and release then
/// reports `LockLost`.
pub async fn lost_fires_on_external_delete<T: Target>(target: &T) {
    let name = unique("deleted");
    let ttl = target.ttl(Duration::from_millis(600));
    let lock = Lock::builder(target.client().await, &name)
        .ttl(ttl)
        .build()
        .expect("valid");
    let guard = lock.try_lock().await.expect("store").expect("free");
    let lost = guard.lost();
    target.delete_key(lock.keys().lock()).await;
    timeout(ttl * 3, lost)
        .await
        .expect("lost() must fire after the key was deleted");
    assert!(guard.is_lost());
    let err = guard.release().await.expect_err("must not report success");
    assert_eq!(err.kind(), ErrorKind::LockLost);
}

/// A renewal that finds the key gone ends the lease at once, well before its validity
/// would have run out.
pub async fn lost_fires_at_the_next_renewal<T: Target>(target: &T) {
    let name = unique("taken");
    let ttl = Duration::from_secs(3);
    let lock = Lock::builder(target.client().await, &name)
        .ttl(ttl)
        .build()
        .expect("valid");
    let guard = lock.try_lock().await.expect("store").expect("free");
    target.delete_key(lock.keys().lock()).await;
    timeout(ttl / 2, guard.lost())
        .await
        .expect("the renewal's refusal must end the lease, not its validity running out");
    assert_eq!(guard.remaining(), Duration::ZERO);
}

/// A lease that lapsed (validity ran out, watchdog off) cannot be extended back to life,
/// and releasing it reports `LockLost` even if the key happened to still be there.
pub async fn lapsed_lease_is_lost_for_good<T: Target>(target: &T) {
    let ttl = target.ttl(Duration::from_millis(400));
    for extend_first in [true, false] {
        let lock = Lock::builder(target.client().await, unique("lapsed"))
            .ttl(ttl)
            .watchdog(false)
            .build()
            .expect("valid");
        let guard = lock.try_lock().await.expect("store").expect("free");
        timeout(ttl * 3, guard.lost()).await.expect("lapses");
        if extend_first {
            let err = guard
                .extend(Duration::from_secs(5))
                .await
                .expect_err("a lapsed lease cannot be revived");
            assert_eq!(err.kind(), ErrorKind::LockLost);
            assert!(guard.is_lost(), "extend revived a lapsed lease");
        }
        let err = guard.release().await.expect_err("lapsed");
        assert_eq!(err.kind(), ErrorKind::LockLost, "{err}");
    }
}

/// Extending to a ttl shorter than the watchdog's schedule is renewed in time.
pub async fn shorter_extend_is_renewed_in_time<T: Target>(target: &T) {
    let name = unique("shorter");
    let lock = Lock::builder(target.client().await, &name)
        .ttl(Duration::from_secs(30))
        .build()
        .expect("valid");
    let guard = lock.try_lock().await.expect("store").expect("free");
    let short = target.ttl(Duration::from_millis(300));
    guard.extend(short).await.expect("ours");
    sleep(short * 4).await;
    assert!(!guard.is_lost(), "the watchdog kept the old 10 s schedule");
    let other = Lock::new(target.client().await, &name).expect("valid");
    assert!(other.try_lock().await.expect("store").is_none());
    assert!(guard.remaining() <= short);
    guard.release().await.expect("still ours");
}

/// `try_lock_for` with a zero or an enormous timeout: the first attempt always completes,
/// and no arithmetic overflows.
pub async fn extreme_waits<T: Target>(target: &T) {
    let lock = Lock::new(target.client().await, unique("extreme")).expect("valid");
    let g = lock
        .try_lock_for(Duration::ZERO)
        .await
        .expect("store")
        .expect("a free lock is acquired even with a zero wait");
    g.release().await.expect("release");
    let g = lock
        .try_lock_for(Duration::MAX)
        .await
        .expect("store")
        .expect("free");
    g.release().await.expect("release");
}

/// A grant whose reply arrives after the lease's validity is an error (`TimedOut`), not
/// a lock and not contention, and the grant is given back.
pub async fn late_grant_is_timed_out_and_given_back<T: Target>(target: &T) {
    let name = unique("late-grant");
    let ttl = target.ttl(fencelock::MIN_TTL);
    let slow = SlowReply {
        inner: target.client().await,
        delay: ttl + Duration::from_millis(150),
    };
    let lock = Lock::builder(slow, &name).ttl(ttl).build().expect("valid");
    let err = lock.try_lock().await.expect_err("no validity left");
    assert_eq!(err.kind(), ErrorKind::TimedOut, "{err}");
    let other = Lock::new(target.client().await, &name).expect("valid");
    let g = other
        .try_lock_for(Duration::from_secs(2))
        .await
        .expect("store")
        .expect("given back");
    g.release().await.expect("release");
}

/// A waiter wakes when the holder releases, long before the holder's ttl would run out.
pub async fn waiter_wakes_on_release<T: Target>(target: &T) {
    let name = unique("wake");
    let ttl = Duration::from_secs(20);
    let holder = Lock::builder(target.client().await, &name)
        .ttl(ttl)
        .build()
        .expect("valid");
    let guard = holder.try_lock().await.expect("store").expect("free");
    // A waiter that had to poll would sleep 5 s between attempts: only the release
    // announcement can wake it in time.
    let waiter = Lock::builder(target.client().await, &name)
        .ttl(ttl)
        .retry(Retry::exponential(
            Duration::from_secs(5),
            Duration::from_secs(5),
        ))
        .build()
        .expect("valid");
    let waiting = tokio::spawn(async move {
        let g = waiter.lock().await.expect("lock");
        let at = Instant::now();
        g.release().await.expect("release");
        at
    });
    sleep(Duration::from_millis(200)).await;
    assert!(!waiting.is_finished(), "waiter got a held lock");
    let released = Instant::now();
    guard.release().await.expect("release");
    let acquired = timeout(Duration::from_secs(2), waiting)
        .await
        .expect("the waiter must wake on the release announcement, not poll or wait out the ttl")
        .expect("waiter task");
    assert!(acquired >= released);
}

/// A cancelled acquire — at any point — leaves no hold and no renewal behind.
pub async fn cancelled_acquire_leaks_nothing<T: Target>(target: &T) {
    let name = unique("cancel");
    let backend = target.client().await;
    let lock = Lock::builder(backend.clone(), &name)
        .ttl(Duration::from_secs(20))
        .build()
        .expect("valid");
    let checker = Lock::builder(target.client().await, &name)
        .ttl(Duration::from_secs(20))
        .build()
        .expect("valid");
    // Cancel while waiting on a held lock.
    let held = checker.try_lock().await.expect("store").expect("free");
    assert!(
        timeout(Duration::from_millis(100), lock.lock())
            .await
            .is_err(),
        "acquired a held lock"
    );
    held.release().await.expect("release");
    // Cancel at every point of an attempt on a free lock, from before the request is sent
    // to after the reply: whatever the store granted must be given back.
    for micros in [0u64, 1, 5, 20, 50, 100, 200, 400, 800, 1500, 3000] {
        let _ = timeout(Duration::from_micros(micros), lock.lock()).await;
        let guard = checker
            .try_lock_for(Duration::from_secs(5))
            .await
            .expect("store")
            .unwrap_or_else(|| panic!("lock leaked by an acquire cancelled after {micros} µs"));
        guard.release().await.expect("release");
    }
    sleep(Duration::from_millis(50)).await;
    assert_eq!(
        backend.engine().leases(),
        0,
        "a cancelled acquire left a renewal"
    );
}

/// A backend whose acquire replies arrive `delay` after the store granted them: for
/// cancelling an acquire between the grant and the reply.
#[derive(Clone)]
pub struct SlowReply<B> {
    /// The wrapped backend.
    pub inner: B,
    /// How late each acquire reply arrives.
    pub delay: Duration,
}

impl<B: RawLock> RawLock for SlowReply<B> {
    async fn acquire(
        &self,
        keys: &fencelock::keys::LockKeys,
        token: &fencelock::Token,
        ttl: Duration,
    ) -> fencelock::Result<fencelock::raw::Acquire> {
        let granted = self.inner.acquire(keys, token, ttl).await;
        sleep(self.delay).await;
        granted
    }

    async fn release(
        &self,
        keys: &fencelock::keys::LockKeys,
        token: &fencelock::Token,
    ) -> fencelock::Result<bool> {
        self.inner.release(keys, token).await
    }

    async fn extend(
        &self,
        keys: &fencelock::keys::LockKeys,
        token: &fencelock::Token,
        ttl: Duration,
    ) -> fencelock::Result<bool> {
        self.inner.extend(keys, token, ttl).await
    }

    fn engine(&self) -> &fencelock::engine::Engine {
        self.inner.engine()
    }
}

/// An acquire cancelled after the store granted it, before the reply arrived, gives the
/// grant back: nobody waits out its ttl.
pub async fn cancelled_after_the_grant_gives_it_back<T: Target>(target: &T) {
    let name = unique("slow-reply");
    let slow = SlowReply {
        inner: target.client().await,
        delay: Duration::from_millis(300),
    };
    let lock = Lock::builder(slow, &name)
        .ttl(Duration::from_secs(20))
        .build()
        .expect("valid");
    assert!(
        timeout(Duration::from_millis(100), lock.lock())
            .await
            .is_err(),
        "the reply cannot have arrived yet"
    );
    let other = Lock::new(target.client().await, &name).expect("valid");
    let guard = other
        .try_lock_for(Duration::from_secs(2))
        .await
        .expect("store")
        .expect("a grant whose reply was never seen must be released, not leak for its ttl");
    guard.release().await.expect("release");
}

/// Dropping a guard without `release()` gives the lock back in the background.
pub async fn dropped_guard_releases<T: Target>(target: &T) {
    let name = unique("drop");
    let backend = target.client().await;
    let lock = Lock::builder(backend.clone(), &name)
        .ttl(Duration::from_secs(20))
        .build()
        .expect("valid");
    let guard = lock.try_lock().await.expect("store").expect("free");
    drop(guard);
    assert_eq!(backend.engine().leases(), 0, "dropped lease still renewed");
    let other = Lock::new(target.client().await, &name).expect("valid");
    let g = other
        .try_lock_for(Duration::from_secs(5))
        .await
        .expect("store")
        .expect("a dropped guard must release in the background, not wait out its ttl");
    g.release().await.expect("release");
}

/// `try_lock_for` gives up after its timeout on a held lock, and `try_lock` at once.
pub async fn bounded_waits_give_up<T: Target>(target: &T) {
    let name = unique("bounded");
    let holder = Lock::new(target.client().await, &name).expect("valid");
    let guard = holder.try_lock().await.expect("store").expect("free");
    let other = Lock::new(target.client().await, &name).expect("valid");
    assert!(other.try_lock().await.expect("store").is_none());
    let started = Instant::now();
    let got = other
        .try_lock_for(Duration::from_millis(300))
        .await
        .expect("store");
    assert!(got.is_none(), "acquired a held lock");
    assert!(started.elapsed() >= Duration::from_millis(300));
    guard.release().await.expect("release");
}

/// `extend` resets the lease; after the lock is gone it reports `LockLost`.
pub async fn extend_resets_lease<T: Target>(target: &T) {
    let name = unique("extend");
    let lock = Lock::builder(target.client().await, &name)
        .ttl(target.ttl(Duration::from_millis(300)))
        .watchdog(false)
        .build()
        .expect("valid");
    let guard = lock.try_lock().await.expect("store").expect("free");
    guard.extend(Duration::from_secs(10)).await.expect("ours");
    assert!(guard.remaining() > Duration::from_secs(5));
    sleep(Duration::from_millis(500)).await;
    assert!(!guard.is_lost(), "extended lease ran out at the old ttl");
    let err = guard
        .extend(Duration::ZERO)
        .await
        .expect_err("zero ttl refused");
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    guard.release().await.expect("still ours");

    let guard = lock.try_lock().await.expect("store").expect("free");
    target.delete_key(lock.keys().lock()).await;
    let err = guard
        .extend(target.ttl(Duration::from_secs(1)))
        .await
        .expect_err("not ours any more");
    assert_eq!(err.kind(), ErrorKind::LockLost);
    assert!(guard.is_lost());
}

/// Bad options get `InvalidArgument`, before anything reaches the store.
pub async fn bad_input_is_rejected<T: Target>(target: &T) {
    let b = target.client().await;
    let invalid = |r: fencelock::Result<Lock<T::Backend>>| match r {
        Ok(_) => panic!("accepted a bad option"),
        Err(e) => assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}"),
    };
    invalid(Lock::new(b.clone(), ""));
    invalid(Lock::new(
        b.clone(),
        "x".repeat(fencelock::keys::MAX_NAME_LEN + 1),
    ));
    invalid(Lock::builder(b.clone(), "n").ttl(Duration::ZERO).build());
    invalid(
        Lock::builder(b.clone(), "n")
            .ttl(Duration::from_millis(10))
            .build(),
    );
    invalid(
        Lock::builder(b.clone(), "n")
            .ttl(fencelock::MAX_TTL + Duration::from_secs(1))
            .build(),
    );
    invalid(
        Lock::builder(b.clone(), "n")
            .retry(Retry::exponential(Duration::ZERO, Duration::from_secs(1)))
            .build(),
    );
    invalid(
        Lock::builder(b.clone(), "n")
            .retry(Retry::exponential(
                Duration::from_secs(2),
                Duration::from_secs(1),
            ))
            .build(),
    );
    invalid(
        Lock::builder(b.clone(), "n")
            .prefix("p".repeat(300))
            .build(),
    );
    // At the limits, accepted.
    let lock = Lock::builder(b, "x".repeat(fencelock::keys::MAX_NAME_LEN))
        .ttl(target.ttl(fencelock::MIN_TTL))
        .build()
        .expect("limits are inclusive");
    let guard = lock.try_lock().await.expect("store").expect("free");
    guard.release().await.expect("release");
}

/// Inspection shows the holder, ttl and fence; `list` finds held locks only; a token
/// handed to another process releases and extends; `force_unlock` frees the lock, wakes a
/// waiter and makes the old holder's `lost()` fire.
pub async fn inspection_and_administration<T: Target>(target: &T)
where
    T::Backend: RawInspect,
{
    let name = unique("inspect");
    let ttl = target.ttl(Duration::from_millis(900));
    let lock = Lock::builder(target.client().await, &name)
        .ttl(ttl)
        .build()
        .expect("valid");
    let free = lock.state().await.expect("store");
    assert_eq!((free.holder.as_deref(), free.remaining), (None, None));
    assert!(!lock.is_locked().await.expect("store"));
    assert!(
        !lock.force_unlock().await.expect("store"),
        "nothing to delete"
    );

    let guard = lock.try_lock().await.expect("store").expect("free");
    let held = lock.state().await.expect("store");
    assert_eq!(held.holder.as_deref(), Some(guard.token().as_str()));
    if target.session_bound() {
        assert_eq!(held.remaining, None, "a session's hold has no stored ttl");
    } else {
        assert!(
            held.remaining
                .is_some_and(|r| r <= ttl && r > Duration::ZERO)
        );
    }
    assert_eq!(held.last_fence, Some(guard.fencing_token().get()));
    assert!(lock.is_locked().await.expect("store"));

    let admin = target.client().await;
    let prefix = fencelock::keys::DEFAULT_PREFIX;
    let listed = admin.list(prefix, "inspect-*", 1000).await.expect("store");
    assert!(listed.contains(&name), "{name} not in {listed:?}");
    assert!(
        listed.iter().all(|n| !n.contains(":fence")),
        "companion keys listed: {listed:?}"
    );
    let none = admin
        .list(prefix, "no-such-lock-*", 1000)
        .await
        .expect("store");
    assert!(none.is_empty(), "{none:?}");

    // Another process holding only the token can extend and release.
    let elsewhere = Lock::new(target.client().await, &name).expect("valid");
    let wrong = fencelock::Token::random().expect("rng");
    let err = elsewhere
        .extend_token(&wrong, ttl)
        .await
        .expect_err("wrong token");
    assert_eq!(err.kind(), ErrorKind::LockLost);
    if target.session_bound() {
        let err = elsewhere
            .extend_token(guard.token(), Duration::from_secs(5))
            .await
            .expect_err("another session's hold");
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    } else {
        elsewhere
            .extend_token(guard.token(), Duration::from_secs(5))
            .await
            .expect("right token extends");
    }
    elsewhere
        .release_token(guard.token())
        .await
        .expect("right token releases");
    assert_eq!(
        guard
            .release()
            .await
            .expect_err("released elsewhere")
            .kind(),
        ErrorKind::LockLost
    );

    // Force-unlock: the holder learns it, a waiter gets the lock.
    let guard = lock.try_lock().await.expect("store").expect("free");
    let lost = guard.lost();
    let waiter = Lock::builder(target.client().await, &name)
        .ttl(Duration::from_secs(20))
        .build()
        .expect("valid");
    let waiting = tokio::spawn(async move { waiter.lock().await.map(|g| g.fencing_token()) });
    sleep(Duration::from_millis(100)).await;
    assert!(
        lock.force_unlock().await.expect("store"),
        "a held lock was deleted"
    );
    let next = timeout(Duration::from_secs(5), waiting)
        .await
        .expect("force-unlock wakes a waiter")
        .expect("task")
        .expect("lock");
    assert!(next > guard.fencing_token());
    timeout(ttl * 3, lost)
        .await
        .expect("the old holder's lost() fires");
}

/// Many clients share a semaphore of 3 permits: never more than 3 holders at once, and
/// all 3 are used.
pub async fn semaphore_never_exceeds_its_permits<T: Target>(target: &T)
where
    T::Backend: RawSemaphore,
{
    let name = unique("sem");
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let sem = Semaphore::new(target.client().await, &name, 3).expect("valid");
        let (inside, most) = (Arc::clone(&inside), Arc::clone(&most));
        tasks.push(tokio::spawn(async move {
            for _ in 0..6 {
                let permit = sem.acquire().await.expect("acquire");
                let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                // Held long enough that a hand-over delayed by a loaded machine (two tests
                // at once on two cores) still finds the other permits in use: 5 ms once
                // saw at most 2 holders on a Redis Cluster in CI.
                sleep(Duration::from_millis(30)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                permit.release().await.expect("release");
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    let most = most.load(Ordering::SeqCst);
    assert!(most <= 3, "{most} holders of 3 permits at once");
    assert_eq!(most, 3, "the permits were never all in use");
    let sem = Semaphore::new(target.client().await, &name, 3).expect("valid");
    assert_eq!(sem.available_permits().await.expect("store"), 3);
}

/// A holder that vanished gives its permits back when its lease runs out.
pub async fn semaphore_permits_of_a_dead_holder_come_back<T: Target>(target: &T)
where
    T::Backend: RawSemaphore,
{
    let name = unique("sem-dead");
    let ttl = target.ttl(Duration::from_millis(400));
    let holder = Semaphore::builder(target.client().await, &name, 1)
        .ttl(ttl)
        .build()
        .expect("valid");
    let permit = holder.try_acquire().await.expect("store").expect("free");
    let gone = Instant::now();
    permit.forget();
    let other = Semaphore::new(target.client().await, &name, 1).expect("valid");
    assert!(other.try_acquire().await.expect("store").is_none());
    let permit = other
        .try_acquire_for(ttl * 10)
        .await
        .expect("store")
        .expect("the dead holder's permit comes back");
    assert!(gone.elapsed() >= ttl - Duration::from_millis(50));
    permit.release().await.expect("release");
}

/// `acquire_many` takes permits all at once; `available_permits` and `set_permits` agree.
pub async fn semaphore_many_permits_and_counts<T: Target>(target: &T)
where
    T::Backend: RawSemaphore,
{
    let sem = Semaphore::builder(target.client().await, unique("sem-many"), 5)
        .ttl(Duration::from_secs(3))
        .build()
        .expect("valid");
    let three = sem.acquire_many(3).await.expect("acquire 3");
    assert_eq!(sem.available_permits().await.expect("store"), 2);
    assert!(
        sem.try_acquire_many(3).await.expect("store").is_none(),
        "only 2 free"
    );
    let two = sem
        .try_acquire_many(2)
        .await
        .expect("store")
        .expect("2 free");
    assert_eq!(sem.available_permits().await.expect("store"), 0);
    // A cancelled wait takes nothing.
    assert!(
        timeout(Duration::from_millis(100), sem.acquire())
            .await
            .is_err()
    );
    assert_eq!(sem.available_permits().await.expect("store"), 0);
    three.release().await.expect("release");
    // The cancelled waiter leaves the queue in the background: until it has, the release
    // may hand it a permit, which it gives back. The three come back within a bound, and
    // no more than three are ever free.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let free = sem.available_permits().await.expect("store");
        assert!(free <= 3, "{free} permits free of 5 with 2 held");
        if free == 3 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the released permits were not free after 5 s: {free}"
        );
        sleep(Duration::from_millis(20)).await;
    }
    let err = sem.acquire_many(6).await.expect_err("more than exist");
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert_eq!(
        Semaphore::new(target.client().await, "x", 0)
            .map(|_| ())
            .map_err(|e| e.kind()),
        Err(ErrorKind::InvalidArgument)
    );
    sem.set_permits(6).await.expect("operator");
    assert_eq!(sem.available_permits().await.expect("store"), 4);
    assert_eq!(sem.add_permits(2).await.expect("operator"), 8);
    assert_eq!(sem.add_permits(-2).await.expect("operator"), 6);
    assert_eq!(
        sem.add_permits(-6).await.map_err(|e| e.kind()),
        Err(ErrorKind::InvalidArgument),
        "a semaphore keeps at least one permit"
    );
    assert_eq!(
        sem.available_permits().await.expect("store"),
        4,
        "refused: unchanged"
    );
    let state = sem.state().await.expect("store");
    assert_eq!((state.hold_count, state.holders), (Some(2), Some(1)));
    if target.session_bound() {
        assert_eq!(state.remaining, None, "a session's hold has no stored ttl");
    } else {
        assert!(state.remaining.is_some_and(|r| r > Duration::ZERO));
    }
    assert!(sem.is_locked().await.expect("store"));
    let lost = two.lost();
    assert!(sem.force_unlock().await.expect("operator"));
    assert!(!sem.is_locked().await.expect("store"));
    assert_eq!(sem.available_permits().await.expect("store"), 6);
    timeout(Duration::from_secs(15), lost)
        .await
        .expect("a force-unlocked holder's lost() fires");
    assert_eq!(
        two.release().await.expect_err("taken back").kind(),
        ErrorKind::LockLost
    );
    assert!(!sem.force_unlock().await.expect("operator"), "nothing held");
}

/// A waiter for a permit wakes on a release, not at the holder's ttl; a permit whose
/// holders were deleted behind its back fires `lost()` at its next renewal.
pub async fn semaphore_waiters_wake_and_lost_permits_fire<T: Target>(target: &T)
where
    T::Backend: RawSemaphore,
{
    let name = unique("sem-wake");
    let ttl = Duration::from_secs(3);
    let sem = Semaphore::builder(target.client().await, &name, 1)
        .ttl(ttl)
        .build()
        .expect("valid");
    let permit = sem.try_acquire().await.expect("store").expect("free");
    let waiter = Semaphore::builder(target.client().await, &name, 1)
        .ttl(ttl)
        .build()
        .expect("valid");
    let waiting = tokio::spawn(async move { waiter.acquire().await.expect("acquire") });
    sleep(Duration::from_millis(100)).await;
    permit.release().await.expect("release");
    let permit = timeout(Duration::from_secs(2), waiting)
        .await
        .expect("woken by the release")
        .expect("task");
    target.delete_key(sem.keys().lock()).await;
    timeout(ttl / 2, permit.lost())
        .await
        .expect("lost() fires at the next renewal");
    let err = permit.release().await.expect_err("gone");
    assert_eq!(err.kind(), ErrorKind::LockLost);
}

/// `lost()` fires by the end of the validity while the store is frozen (every renewal
/// meets silence): the watchdog's timer does not wait on the frozen store. After it
/// continues, the store has expired the lease: another client gets the lock, and the
/// stale guard's release is `LockLost`, leaving the new holder's lock alone.
pub async fn lost_fires_when_the_store_is_frozen_past_the_ttl<T: Freezable>(target: &T) {
    let ttl = target.ttl(Duration::from_millis(800));
    let lock = Lock::builder(target.client().await, unique("frozen"))
        .ttl(ttl)
        .build()
        .expect("valid");
    let guard = lock.try_lock().await.expect("store").expect("free");
    let frozen = freeze(target);
    let frozen_at = Instant::now();
    let fired = timeout(ttl * 4, guard.lost()).await;
    let fired_after = frozen_at.elapsed();
    drop(frozen);
    assert!(
        fired.is_ok(),
        "lost() did not fire while the store was frozen"
    );
    assert!(
        // Validity ends just before the ttl; the slack is for a loaded scheduler, below the
        // 4 ttl a timer waiting on the frozen store would take.
        fired_after <= ttl + ttl * 7 / 8,
        "lost() must fire by the end of the validity ({ttl:?}), fired after {fired_after:?}"
    );
    let other = Lock::new(target.client().await, lock.name()).expect("valid");
    let g = other
        .try_lock_for(Duration::from_secs(20))
        .await
        .expect("store")
        .expect("free after the frozen lease expired");
    // The frozen client's connection may take a moment to answer again: its next request
    // that the store answers is the release.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match lock.try_lock().await {
            Ok(None) => break,
            Ok(Some(_)) => panic!("granted while another client holds the lock"),
            Err(e) if Instant::now() < deadline => {
                tracing::debug!(error = %e, "the frozen client is not back yet");
                sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("the frozen client did not recover: {e}"),
        }
    }
    let err = guard.release().await.expect_err("stale release");
    assert_eq!(err.kind(), ErrorKind::LockLost, "{err}");
    g.release().await.expect("the new holder's lock is intact");
}

/// A holder cut off from the store (its connections blackholed) gets `lost()` by the end
/// of its validity, and a client that is not cut off gets the lock once the lease ran
/// out; delayed, the lock works; with its connections closed under it, the client opens
/// new ones by itself.
pub async fn a_partitioned_holder_loses_its_lease_and_closed_connections_recover<T: Proxied>(
    target: &T,
) {
    use crate::proxy::{Fault, Proxy};
    let proxy = Proxy::start(([127, 0, 0, 1], target.port()).into())
        .await
        .expect("proxy");
    let ttl = target.ttl(Duration::from_millis(800));
    let lock = Lock::builder(target.client_at(proxy.addr()).await, unique("partition"))
        .ttl(ttl)
        .build()
        .expect("valid");

    // Delayed, the lock still works.
    proxy.set_fault(Fault::Delay(Duration::from_millis(20)));
    let guard = lock.try_lock().await.expect("store").expect("free");
    guard.release().await.expect("release");

    // Partitioned, the holder's renewals cannot get through: lost() fires by the end of
    // its validity, and another client (not partitioned) gets the lock.
    proxy.set_fault(Fault::Pass);
    let guard = lock.try_lock().await.expect("store").expect("free");
    proxy.set_fault(Fault::Blackhole);
    timeout(ttl * 3, guard.lost())
        .await
        .expect("lost() fires while partitioned");
    let other = Lock::new(target.client().await, lock.name()).expect("valid");
    let g = other
        .try_lock_for(Duration::from_secs(10) + ttl * 2)
        .await
        .expect("store")
        .expect("free after the partitioned lease ran out");
    g.release().await.expect("release");
    drop(guard);

    // Connections dropped under it, the client opens new ones by itself.
    proxy.set_fault(Fault::Pass);
    proxy.close_all();
    let deadline = Instant::now() + Duration::from_secs(15);
    let guard = loop {
        match lock.try_lock().await {
            Ok(Some(g)) => break g,
            Ok(None) => sleep(Duration::from_millis(100)).await,
            Err(e) if e.is_retryable() && Instant::now() < deadline => {
                sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("did not recover after its connections were closed: {e}"),
        }
    };
    guard.release().await.expect("release");
}

/// Runs the whole suite against `target`.
pub async fn run_all<T: Target>(target: &T) {
    mutual_exclusion(target).await;
    checker_catches_no_lock(target).await;
    fences_strictly_increase(target).await;
    forgotten_holder_frees_within_ttl(target).await;
    killed_holder_frees_within_ttl(target).await;
    release_after_expiry_is_lock_lost(target).await;
    watchdog_keeps_lock(target).await;
    without_watchdog_lease_ends_at_ttl(target).await;
    lost_fires_on_external_delete(target).await;
    lost_fires_at_the_next_renewal(target).await;
    lapsed_lease_is_lost_for_good(target).await;
    shorter_extend_is_renewed_in_time(target).await;
    extreme_waits(target).await;
    late_grant_is_timed_out_and_given_back(target).await;
    waiter_wakes_on_release(target).await;
    cancelled_after_the_grant_gives_it_back(target).await;
    cancelled_acquire_leaks_nothing(target).await;
    dropped_guard_releases(target).await;
    bounded_waits_give_up(target).await;
    extend_resets_lease(target).await;
    bad_input_is_rejected(target).await;
}

/// Runs the whole suite, with the inspection behaviours, against `target`.
pub async fn run_all_with_inspection<T: Target>(target: &T)
where
    T::Backend: RawInspect,
{
    run_all(target).await;
    inspection_and_administration(target).await;
}

/// A semaphore whose permit count differs from the one stored for its name is refused
/// (`PermitsMismatch`, naming both counts; nothing taken, a wait ends at once), never run
/// under the stored count; `OtherCount::Set` sets the count instead, `OtherCount::Adopt`
/// uses the stored one; a semaphore's own `set_permits` makes the count its own.
pub async fn semaphore_other_count_is_refused<T: Target>(target: &T)
where
    T::Backend: RawSemaphore,
{
    let name = unique("sem-count");
    let five = Semaphore::new(target.client().await, &name, 5).expect("valid");
    assert_eq!(
        five.stored_permits().await.expect("store"),
        None,
        "none yet"
    );
    // Held throughout, so that ZooKeeper keeps the semaphore's directory (its count).
    let held = five.try_acquire().await.expect("store").expect("free");
    assert_eq!(five.stored_permits().await.expect("store"), Some(5));

    let one = Semaphore::new(target.client().await, &name, 1).expect("valid");
    let refused = |result: fencelock::Result<Option<fencelock::SemaphorePermit<T::Backend>>>,
                   stored: u32,
                   requested: u32| {
        let err = result
            .map(|p| p.map(|p| p.forget()))
            .expect_err(&format!("{stored} stored, {requested} refused"));
        assert_eq!(err.kind(), ErrorKind::PermitsMismatch, "{err}");
        let counts = std::error::Error::source(&err)
            .and_then(|s| s.downcast_ref::<fencelock::PermitCounts>())
            .copied()
            .expect("the counts");
        assert_eq!((counts.stored, counts.requested), (stored, requested));
        assert!(err.to_string().contains(&stored.to_string()), "{err}");
        assert!(!err.is_retryable());
    };
    refused(one.try_acquire().await, 5, 1);
    refused(one.try_acquire_many(1).await, 5, 1);
    refused(one.try_acquire_for(Duration::from_secs(30)).await, 5, 1);
    let waited = timeout(Duration::from_secs(10), one.acquire())
        .await
        .expect("a wait is refused at once, not left waiting");
    refused(waited.map(Some), 5, 1);
    assert_eq!(
        five.available_permits().await.expect("store"),
        4,
        "nothing taken"
    );

    // Adopt: the stored count is used.
    let adopt = Semaphore::builder(target.client().await, &name, 1)
        .on_other_count(OtherCount::Adopt)
        .build()
        .expect("valid");
    let adopted = adopt
        .try_acquire()
        .await
        .expect("store")
        .expect("4 free of 5");
    assert_eq!(five.available_permits().await.expect("store"), 3);
    adopted.release().await.expect("release");
    assert_eq!(five.stored_permits().await.expect("store"), Some(5));

    // Set: the stored count becomes this one, then a permit is taken under it.
    let two = Semaphore::builder(target.client().await, &name, 2)
        .on_other_count(OtherCount::Set)
        .build()
        .expect("valid");
    let second = two
        .try_acquire()
        .await
        .expect("store")
        .expect("1 free of 2");
    assert_eq!(five.stored_permits().await.expect("store"), Some(2));
    refused(five.try_acquire().await, 2, 5);
    second.release().await.expect("release");

    // An operator's set_permits through a semaphore makes the count its own.
    one.set_permits(3).await.expect("operator");
    assert_eq!(one.permits(), 3);
    let third = one
        .try_acquire()
        .await
        .expect("store")
        .expect("2 free of 3");
    let two = Semaphore::new(target.client().await, &name, 2).expect("valid");
    refused(two.try_acquire().await, 3, 2);
    third.release().await.expect("release");
    held.release().await.expect("release");
}
