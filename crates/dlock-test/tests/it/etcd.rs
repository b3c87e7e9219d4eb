//! The etcd backend against the conformance suite (every primitive), plus leader loss, leases that run
//! out while waiting, and the waiter queue: first come first served, one waiter woken per
//! release, waiters that leave or die passing the turn on, and etcd's own lock service on
//! the same keys.

use std::io::{Read, Write};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock_test::conformance::unique;
use dlock_test::server::EtcdCluster;
use etcd_client::{GetOptions, LockOptions, SortOrder, SortTarget};
use fencelock::backend::Etcd;
use fencelock::keys::LockKeys;
use fencelock::raw::{Acquire, RECORD, RawElection, RawFencing, RawLock, ReleaseWatch};
use fencelock::{Election, ErrorKind, Lock, Token};
use tokio::time::{Instant, sleep, timeout};

mod conformance {
    crate::all_conformance_tests!(dlock_test::targets::EtcdTarget::start());
    crate::conformance_tests!(dlock_test::targets::EtcdTarget::start();
        lost_fires_when_the_store_is_frozen_past_the_ttl,
        a_partitioned_holder_loses_its_lease_and_closed_connections_recover,
    );
}

mod election {
    crate::election_tests!(dlock_test::targets::EtcdTarget::start());
}

async fn admin(cluster: &EtcdCluster) -> etcd_client::Client {
    etcd_client::Client::connect([format!("http://{}", cluster.members[0].addr())], None)
        .await
        .expect("etcd admin")
}

/// The keys of `lock`'s queue in line order: (key, value, lease).
async fn queue_of<B: RawLock>(cluster: &EtcdCluster, lock: &Lock<B>) -> Vec<(String, String, i64)> {
    let prefix = format!("{}/", lock.keys().lock());
    admin(cluster)
        .await
        .get(
            prefix,
            Some(
                GetOptions::new()
                    .with_prefix()
                    .with_sort(SortTarget::Create, SortOrder::Ascend),
            ),
        )
        .await
        .expect("read the queue")
        .kvs()
        .iter()
        .map(|kv| {
            (
                String::from_utf8_lossy(kv.key()).into_owned(),
                String::from_utf8_lossy(kv.value()).into_owned(),
                kv.lease(),
            )
        })
        .collect()
}

/// Transactions etcd has answered (its `/metrics`: gRPC `Txn` calls handled with `OK`).
fn txns_handled(addr: &str) -> u64 {
    let mut conn = std::net::TcpStream::connect(addr).expect("metrics");
    write!(conn, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").expect("metrics request");
    let mut text = String::new();
    conn.read_to_string(&mut text).expect("metrics reply");
    let series = "grpc_server_handled_total{grpc_code=\"OK\",grpc_method=\"Txn\",\
                  grpc_service=\"etcdserverpb.KV\",grpc_type=\"unary\"} ";
    text.lines()
        .find_map(|l| l.strip_prefix(series))
        .map_or(0, |n| n.trim().parse().expect("a count"))
}

/// Waits until `done` holds, for at most 10 s.
async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        sleep(Duration::from_millis(10)).await;
    }
}

/// An `Etcd` client that counts its acquire attempts.
#[derive(Clone)]
struct Counted {
    inner: Etcd,
    attempts: Arc<AtomicU32>,
}

impl Counted {
    fn new(inner: Etcd) -> Counted {
        Counted {
            inner,
            attempts: Arc::default(),
        }
    }

    fn attempts(&self) -> u32 {
        self.attempts.load(Ordering::SeqCst)
    }
}

impl RawLock for Counted {
    const QUEUES_WAITERS: bool = Etcd::QUEUES_WAITERS;

    async fn acquire(
        &self,
        keys: &LockKeys,
        token: &Token,
        ttl: Duration,
    ) -> fencelock::Result<Acquire> {
        self.attempts.fetch_add(1, Ordering::SeqCst);
        self.inner.acquire(keys, token, ttl).await
    }

    async fn release(&self, keys: &LockKeys, token: &Token) -> fencelock::Result<bool> {
        self.inner.release(keys, token).await
    }

    async fn extend(
        &self,
        keys: &LockKeys,
        token: &Token,
        ttl: Duration,
    ) -> fencelock::Result<bool> {
        self.inner.extend(keys, token, ttl).await
    }

    async fn watch_for(&self, keys: &LockKeys, token: &Token) -> fencelock::Result<ReleaseWatch> {
        self.inner.watch_for(keys, token).await
    }

    async fn abandon(
        &self,
        keys: &LockKeys,
        token: &Token,
        ttl: std::time::Duration,
    ) -> fencelock::Result<()> {
        self.inner.abandon(keys, token, ttl).await
    }

    fn engine(&self) -> &fencelock::engine::Engine {
        self.inner.engine()
    }
}

impl RawFencing for Counted {}

async fn connect(url: &str) -> Etcd {
    let mut last = None;
    for _ in 0..100 {
        match Etcd::connect(url).await {
            Ok(c) => return c,
            Err(e) => last = Some(e),
        }
        sleep(Duration::from_millis(100)).await;
    }
    panic!("connect to etcd: {last:?}");
}

/// The index of the member that leads now.
async fn leader(cluster: &EtcdCluster) -> usize {
    for _ in 0..100 {
        for (i, m) in cluster.members.iter().enumerate() {
            if !m.is_running() {
                continue;
            }
            let Ok(mut c) =
                etcd_client::Client::connect([format!("http://{}", m.addr())], None).await
            else {
                continue;
            };
            if let Ok(status) = c.status().await
                && let Some(header) = status.header()
                && status.leader() == header.member_id()
            {
                return i;
            }
        }
        sleep(Duration::from_millis(100)).await;
    }
    panic!("no leader");
}

#[derive(Debug, Clone, Copy)]
struct Hold {
    from: Instant,
    to: Instant,
    fence: u64,
    valid: bool,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_leader_grants_no_lock_twice_and_locks_work_after_the_election() {
    let mut cluster = EtcdCluster::start(3).expect("3 etcd members");
    let url = cluster.url();
    let name = unique("leader-kill");
    let holds: Arc<Mutex<Vec<Hold>>> = Arc::default();
    let stop = Instant::now() + Duration::from_secs(10);
    let mut workers = Vec::new();
    for _ in 0..3 {
        let lock = Lock::builder(connect(&url).await, &name)
            .ttl(Duration::from_secs(3))
            .build()
            .expect("valid");
        let holds = Arc::clone(&holds);
        workers.push(tokio::spawn(async move {
            while Instant::now() < stop {
                let guard = match lock.try_lock_for(Duration::from_millis(500)).await {
                    Ok(Some(g)) => g,
                    Ok(None) => continue,
                    Err(_) => {
                        sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let from = Instant::now();
                let fence = guard.fencing_token().get();
                sleep(Duration::from_millis(20)).await;
                let to = Instant::now();
                let valid = guard.release().await.is_ok();
                holds.lock().expect("holds").push(Hold {
                    from,
                    to,
                    fence,
                    valid,
                });
            }
        }));
    }
    sleep(Duration::from_secs(2)).await;
    let victim = leader(&cluster).await;
    cluster.members[victim].kill();
    let killed = Instant::now();
    for w in workers {
        w.await.expect("worker");
    }
    let holds = holds.lock().expect("holds").clone();
    let valid: Vec<&Hold> = holds.iter().filter(|h| h.valid).collect();
    for (i, a) in valid.iter().enumerate() {
        for b in &valid[i + 1..] {
            assert!(
                a.to <= b.from || b.to <= a.from,
                "two holds reported valid overlapped: {a:?} {b:?}"
            );
        }
    }
    let mut fences: Vec<u64> = holds.iter().map(|h| h.fence).collect();
    let n = fences.len();
    fences.sort_unstable();
    fences.dedup();
    assert_eq!(fences.len(), n, "a fence was granted twice");
    let after: Vec<&&Hold> = valid.iter().filter(|h| h.from > killed).collect();
    println!(
        "{} holds, {} valid; first grant after the leader was killed: {:?} later",
        holds.len(),
        valid.len(),
        after.iter().map(|h| h.from - killed).min()
    );
    assert!(!after.is_empty(), "no lock after the election");
}

/// A semaphore of 2 permits on a 3-member cluster whose leader is killed and restarted
/// while 4 clients take and give back permits: no instant has more than 2 holds that
/// their release confirmed, and permits are granted after the restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_on_three_members_survives_a_leader_restart() {
    let mut cluster = EtcdCluster::start(3).expect("3 etcd members");
    let url = cluster.url();
    let name = unique("sem-restart");
    let holds: Arc<Mutex<Vec<Hold>>> = Arc::default();
    let stop = Instant::now() + Duration::from_secs(12);
    let mut workers = Vec::new();
    for _ in 0..4 {
        let sem = fencelock::Semaphore::builder(connect(&url).await, &name, 2)
            .ttl(Duration::from_secs(3))
            .build()
            .expect("valid");
        let holds = Arc::clone(&holds);
        workers.push(tokio::spawn(async move {
            while Instant::now() < stop {
                let permit = match sem.try_acquire_for(Duration::from_millis(500)).await {
                    Ok(Some(p)) => p,
                    Ok(None) => continue,
                    Err(_) => {
                        sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let from = Instant::now();
                sleep(Duration::from_millis(20)).await;
                let to = Instant::now();
                let valid = permit.release().await.is_ok();
                holds.lock().expect("holds").push(Hold {
                    from,
                    to,
                    fence: 0,
                    valid,
                });
            }
        }));
    }
    sleep(Duration::from_secs(2)).await;
    let victim = leader(&cluster).await;
    cluster.members[victim].kill();
    sleep(Duration::from_secs(2)).await;
    cluster.members[victim]
        .restart()
        .expect("restart the member");
    let restarted = Instant::now();
    for w in workers {
        w.await.expect("worker");
    }
    let holds = holds.lock().expect("holds").clone();
    let valid: Vec<&Hold> = holds.iter().filter(|h| h.valid).collect();
    for a in &valid {
        let at_once = valid
            .iter()
            .filter(|b| b.from <= a.from && a.from < b.to)
            .count();
        assert!(at_once <= 2, "{at_once} holds at once: {a:?}");
    }
    let after = valid.iter().filter(|h| h.from > restarted).count();
    println!(
        "{} holds, {} valid, {after} after the restart",
        holds.len(),
        valid.len()
    );
    assert!(after > 0, "no permit after the restart");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_wait_outlasts_its_ttl_is_never_told_it_holds_the_lock() {
    // etcd issue 11456: a waiter whose session lease expired while queued was told it
    // held the lock. Here a waiter's lease is kept alive while it waits (its place stays
    // over many of its ttls), and the granting attempt restarts it for the whole ttl.
    let cluster = EtcdCluster::start(1).expect("etcd");
    let url = cluster.url();
    let name = unique("wait-expired");
    let holder = Lock::builder(connect(&url).await, &name)
        .ttl(Duration::from_secs(2))
        .build()
        .expect("valid");
    let guard = holder.lock().await.expect("lock");
    let waiter = Lock::builder(connect(&url).await, &name)
        .ttl(Duration::from_secs(2))
        .build()
        .expect("valid");
    let waiting = tokio::spawn(async move { waiter.lock().await.map(|g| (Instant::now(), g)) });
    sleep(Duration::from_secs(5)).await; // more than twice the waiter's ttl
    assert!(!waiting.is_finished(), "granted while held");
    let released = Instant::now();
    guard.release().await.expect("release");
    let (at, g) = timeout(Duration::from_secs(3), waiting)
        .await
        .expect("the waiter wakes on the deletion (watch)")
        .expect("task")
        .expect("lock");
    assert!(at >= released);
    // The grant is a live lease of the full ttl, not one that ran out while waiting.
    assert!(
        g.remaining() > Duration::from_millis(900),
        "{:?}",
        g.remaining()
    );
    let state = holder.state().await.expect("store");
    assert_eq!(state.holder.as_deref(), Some(g.token().as_str()));
    assert!(
        state.remaining.is_some_and(|r| r >= Duration::from_secs(1)),
        "{state:?}"
    );
    sleep(Duration::from_secs(3)).await; // past the ttl: the watchdog kept it
    assert!(!g.is_lost());
    g.release().await.expect("still ours");
    let err = Etcd::connect("etcd://").await.expect_err("no endpoint");
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
}

/// A started waiter whose key is in the queue and whose watch is in effect: its first
/// attempt queued it, and the attempt made after subscribing found the lock held.
async fn queue_up(
    cluster: &EtcdCluster,
    name: &str,
    ttl: Duration,
) -> (
    Counted,
    tokio::task::JoinHandle<(Instant, fencelock::LockGuard<Counted>)>,
) {
    let backend = Counted::new(connect(&cluster.url()).await);
    let lock = Lock::builder(backend.clone(), name)
        .ttl(ttl)
        .build()
        .expect("valid");
    let task = tokio::spawn(async move {
        let guard = lock.lock().await.expect("lock");
        (Instant::now(), guard)
    });
    let counted = backend.clone();
    until("the waiter queued and subscribed", || {
        counted.attempts() == 2
    })
    .await;
    (backend, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_release_wakes_exactly_the_next_waiter_in_arrival_order() {
    let cluster = EtcdCluster::start(1).expect("etcd");
    let addr = cluster.members[0].addr();
    let name = unique("fifo");
    let ttl = Duration::from_secs(20);
    let holder = Lock::builder(connect(&cluster.url()).await, &name)
        .ttl(ttl)
        .build()
        .expect("valid");
    let first = holder.try_lock().await.expect("store").expect("free");
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut waiters = Vec::new();
    for i in 0..8 {
        let (backend, task) = queue_up(&cluster, &name, ttl).await;
        let tx = tx.clone();
        tokio::spawn(async move {
            let (_, guard) = task.await.expect("waiter");
            tx.send((i, guard)).expect("the test listens");
        });
        waiters.push(backend);
        assert_eq!(
            holder.state().await.expect("store").queued,
            Some(i + 1),
            "waiter {i} queued"
        );
    }
    let mut order = Vec::new();
    let mut fences = vec![first.fencing_token().get()];
    let mut txns = Vec::new();
    let mut before = txns_handled(&addr);
    first.release().await.expect("release");
    for k in 0..8 {
        let (i, guard) = timeout(Duration::from_secs(5), rx.recv())
            .await
            .expect("a release hands the lock on at once")
            .expect("a waiter");
        // Any other waiter woken by that release would have sent its attempt by now.
        sleep(Duration::from_millis(300)).await;
        txns.push(txns_handled(&addr) - before);
        // Its turn was handed over: no waiter attempted again, not even the next.
        let attempts: Vec<u32> = waiters.iter().map(Counted::attempts).collect();
        assert_eq!(
            attempts,
            vec![2; 8],
            "after release {k} no waiter may have attempted"
        );
        order.push(i);
        fences.push(guard.fencing_token().get());
        before = txns_handled(&addr);
        guard.release().await.expect("release");
    }
    println!("grant order {order:?}, fences {fences:?}, transactions per hand-over {txns:?}");
    assert_eq!(
        order,
        (0..8).collect::<Vec<u32>>(),
        "grants in arrival order"
    );
    assert!(fences.windows(2).all(|w| w[0] < w[1]), "{fences:?}");
    // The release's transaction alone: nobody else's.
    assert_eq!(txns, vec![1; 8]);
    assert_eq!(holder.state().await.expect("store").queued, Some(0));
    assert_eq!(queue_of(&cluster, &holder).await, Vec::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_cancelled_at_its_turn_passes_the_turn_on() {
    let cluster = EtcdCluster::start(1).expect("etcd");
    let name = unique("turn-cancelled");
    let ttl = Duration::from_secs(20);
    let holder = Lock::builder(connect(&cluster.url()).await, &name)
        .ttl(ttl)
        .build()
        .expect("valid");
    let guard = holder.try_lock().await.expect("store").expect("free");
    // The first waiter, by hand: queued, its task following the queue, the turn it will
    // be handed never taken — what a waiter cancelled at that moment leaves behind.
    let first = connect(&cluster.url()).await;
    let head = Token::random().expect("token");
    let reply = first
        .acquire(holder.keys(), &head, ttl)
        .await
        .expect("store");
    assert!(matches!(reply, Acquire::Held { .. }), "the lock is held");
    let head_watch = first.watch_for(holder.keys(), &head).await.expect("watch");
    let (second, second_task) = queue_up(&cluster, &name, ttl).await;
    let released = Instant::now();
    guard.release().await.expect("release");
    timeout(Duration::from_secs(5), head_watch.released())
        .await
        .expect("the release told the first waiter its turn came");
    sleep(Duration::from_millis(200)).await;
    assert!(
        !second_task.is_finished(),
        "the second waiter jumped the queue"
    );
    assert_eq!(second.attempts(), 2, "the second waiter was woken too");
    first
        .abandon(holder.keys(), &head, ttl)
        .await
        .expect("leave"); // what the cancelled waiter's clean-up does
    drop(head_watch);
    let (at, g) = timeout(Duration::from_secs(5), second_task)
        .await
        .expect("the turn passes on, long before the holder's 20 s ttl")
        .expect("waiter");
    println!(
        "the second waiter got the lock {:?} after the release",
        at - released
    );
    assert_eq!(second.attempts(), 2, "no attempt: its turn was handed over");
    g.release().await.expect("release");
    assert_eq!(
        queue_of(&cluster, &holder).await,
        Vec::new(),
        "nothing left"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_waiter_holds_up_the_next_for_at_most_its_lease() {
    let cluster = EtcdCluster::start(1).expect("etcd");
    let url = cluster.url();
    let name = unique("killed-waiter");
    let holder = Lock::builder(connect(&url).await, &name)
        .ttl(Duration::from_secs(20))
        .build()
        .expect("valid");
    let guard = holder.try_lock().await.expect("store").expect("free");
    let lease = Duration::from_secs(2);
    // The waiter lives in a runtime of its own, which then dies with its wait still
    // pending: no withdrawal, no more keep-alives, as if its process were killed.
    let (queued_tx, queued_rx) = std::sync::mpsc::channel();
    let (die_tx, die_rx) = std::sync::mpsc::channel::<()>();
    let dead = {
        let (url, name) = (url.clone(), name.clone());
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async {
                let backend = Counted::new(connect(&url).await);
                let lock = Lock::builder(backend.clone(), &name)
                    .ttl(lease)
                    .build()
                    .expect("valid");
                let mut wait = Box::pin(async move { lock.lock().await });
                tokio::select! {
                    _ = &mut wait => panic!("granted a held lock"),
                    () = until("the doomed waiter queued", || backend.attempts() == 2) => {}
                }
                queued_tx.send(()).expect("test");
                let _ = tokio::task::spawn_blocking(move || die_rx.recv()).await;
                std::mem::forget(wait); // never dropped: nothing is cleaned up
            });
            rt.shutdown_background();
        })
    };
    queued_rx.recv().expect("queued");
    let (next, next_task) = queue_up(&cluster, &name, Duration::from_secs(20)).await;
    assert_eq!(queue_of(&cluster, &holder).await.len(), 3);
    die_tx.send(()).expect("the doomed waiter listens");
    dead.join().expect("the doomed waiter's thread");
    let killed = Instant::now();
    guard.release().await.expect("release");
    // The dead waiter keeps its place (its lease still runs), so the next waits behind it.
    assert_eq!(
        queue_of(&cluster, &holder).await.len(),
        2,
        "the dead waiter's key left before its lease ran out"
    );
    assert!(!next_task.is_finished(), "the next waiter jumped the queue");
    // Liveness, not speed: the dead waiter's key goes with its lease (2 s).
    let (at, g) = timeout(Duration::from_secs(10), next_task)
        .await
        .expect("the dead waiter's key goes with its lease")
        .expect("waiter");
    println!(
        "the next waiter got in {:?} after the one before it was killed (lease {lease:?})",
        at - killed
    );
    assert_eq!(next.attempts(), 2, "no attempt: its turn was handed over");
    g.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_lease_ran_out_goes_to_the_back_and_is_never_granted_on_its_old_key() {
    let cluster = EtcdCluster::start(1).expect("etcd");
    let name = unique("vanished-waiter");
    let ttl = Duration::from_secs(20);
    let holder = Lock::builder(connect(&cluster.url()).await, &name)
        .ttl(ttl)
        .build()
        .expect("valid");
    let guard = holder.try_lock().await.expect("store").expect("free");
    let (first, mut first_task) = queue_up(&cluster, &name, Duration::from_secs(2)).await;
    let (_second, second_task) = queue_up(&cluster, &name, ttl).await;
    let queue = queue_of(&cluster, &holder).await;
    assert_eq!(queue.len(), 3);
    let (first_key, first_token, first_lease) = queue[1].clone();
    // Its lease ends while it waits (as after a partition longer than the lease).
    admin(&cluster)
        .await
        .lease_revoke(first_lease)
        .await
        .expect("revoke");
    // Its task notices at the next keep-alive and it attempts again: at the back now.
    until("the waiter attempted again", || first.attempts() == 3).await;
    let mut queue = queue_of(&cluster, &holder).await;
    let deadline = Instant::now() + Duration::from_secs(5);
    while queue.len() < 3 && Instant::now() < deadline {
        sleep(Duration::from_millis(10)).await; // its attempt is under way
        queue = queue_of(&cluster, &holder).await;
    }
    let values: Vec<&str> = queue.iter().map(|(_, v, _)| v.as_str()).collect();
    assert_eq!(values.len(), 3, "{queue:?}");
    assert_eq!(
        values[2], first_token,
        "the waiter that lost its key queued at the back"
    );
    assert_eq!(queue[2].0, first_key, "under the same key, created anew");
    assert_ne!(queue[2].2, first_lease, "on a new lease");
    guard.release().await.expect("release");
    let (_, g) = timeout(Duration::from_secs(5), second_task)
        .await
        .expect("the waiter now first is granted")
        .expect("waiter");
    sleep(Duration::from_millis(300)).await;
    assert!(
        !first_task.is_finished(),
        "granted on a key that had vanished"
    );
    let second_fence = g.fencing_token().get();
    g.release().await.expect("release");
    let (_, g) = timeout(Duration::from_secs(5), &mut first_task)
        .await
        .expect("then its turn comes")
        .expect("waiter");
    assert!(g.fencing_token().get() > second_fence);
    // Granted on a lease restarted by the granting attempt, not the one it waited on.
    assert!(
        g.remaining() > Duration::from_secs(1),
        "{:?}",
        g.remaining()
    );
    g.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waits_that_end_without_the_lock_leave_no_key_behind() {
    let cluster = EtcdCluster::start(1).expect("etcd");
    let name = unique("leaves-nothing");
    let ttl = Duration::from_secs(20);
    let holder = Lock::builder(connect(&cluster.url()).await, &name)
        .ttl(ttl)
        .build()
        .expect("valid");
    let guard = holder.try_lock().await.expect("store").expect("free");
    let other = Lock::builder(connect(&cluster.url()).await, &name)
        .ttl(ttl)
        .build()
        .expect("valid");
    assert!(other.try_lock().await.expect("store").is_none());
    assert_eq!(
        queue_of(&cluster, &holder).await.len(),
        1,
        "try_lock left its key"
    );
    assert!(
        other
            .try_lock_for(Duration::from_millis(300))
            .await
            .expect("store")
            .is_none()
    );
    assert_eq!(
        queue_of(&cluster, &holder).await.len(),
        1,
        "try_lock_for left its key"
    );
    assert!(
        timeout(Duration::from_millis(300), other.lock())
            .await
            .is_err()
    );
    // The withdrawal runs in the background; the key's lease would keep it for 20 s.
    timeout(Duration::from_secs(10), async {
        while queue_of(&cluster, &holder).await.len() != 1 {
            sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("a cancelled wait left its key, long before its 20 s lease");
    let state = holder.state().await.expect("store");
    assert_eq!(state.queued, Some(0));
    assert_eq!(state.holder.as_deref(), Some(guard.token().as_str()));
    guard.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcds_lock_service_and_dlock_exclude_each_other_in_one_queue() {
    let cluster = EtcdCluster::start(1).expect("etcd");
    let name = unique("lock-service");
    let lock = Lock::builder(connect(&cluster.url()).await, &name)
        .ttl(Duration::from_secs(20))
        .build()
        .expect("valid");
    let guard = lock.try_lock().await.expect("store").expect("free");
    // etcd's lock service (what `etcdctl lock` uses) on the lock key: it queues behind us.
    let mut service = admin(&cluster).await;
    let session = service.lease_grant(20, None).await.expect("lease").id();
    let key = lock.keys().lock().to_owned();
    let mut client = service.clone();
    let locking = tokio::spawn(async move {
        client
            .lock(key, Some(LockOptions::new().with_lease(session)))
            .await
            .expect("lock service")
            .key()
            .to_vec()
    });
    sleep(Duration::from_millis(500)).await;
    assert!(
        !locking.is_finished(),
        "etcd's lock service got a lock dlock holds"
    );
    assert_eq!(lock.state().await.expect("store").queued, Some(1));
    guard.release().await.expect("release");
    let held = timeout(Duration::from_secs(5), locking)
        .await
        .expect("our release lets the lock service in")
        .expect("task");
    let state = lock.state().await.expect("store");
    assert_eq!(state.holder, Some(format!("{session:x}")), "{state:?}");
    assert!(
        lock.try_lock().await.expect("store").is_none(),
        "dlock got a lock etcd's lock service holds"
    );
    let waiter = lock.clone();
    let waiting = tokio::spawn(async move { waiter.lock().await.expect("lock") });
    sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished());
    service.unlock(held).await.expect("unlock");
    let g = timeout(Duration::from_secs(5), waiting)
        .await
        .expect("its unlock wakes our waiter")
        .expect("task");
    g.release().await.expect("release");
}

/// An election's record is one key without a lease, outside the lock's queue; observers
/// sleep on an etcd watch of it, so they hear a proclaim at once (their fallback read is a
/// whole 30 s lease away) — and still do after etcd restarted under them (the watch is
/// opened again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn election_observers_hear_the_record_through_a_watch_that_survives_a_restart() {
    let mut cluster = EtcdCluster::start(1).expect("etcd");
    let url = cluster.url();
    let name = unique("elect-watch");
    let build = |client: Etcd| {
        Election::builder(client, &name)
            .ttl(Duration::from_secs(30))
            .build()
            .expect("valid")
    };
    let candidate = build(connect(&url).await);
    let watcher = build(connect(&url).await);
    let mut observer = watcher.observe();
    let quick = Duration::from_secs(5);
    let mut leadership = candidate.campaign("v1").await.expect("campaign");
    let seen = timeout(quick, observer.next())
        .await
        .expect("heard")
        .expect("observe");
    let seen = seen.leader().expect("a leader");
    assert_eq!(seen.value.as_deref(), Some("v1"));
    leadership.proclaim("v2").await.expect("proclaim");
    let seen = timeout(quick, observer.next())
        .await
        .expect("woken by the watch, not the lease-long fallback")
        .expect("observe");
    let seen = seen.leader().expect("a leader");
    assert_eq!(
        (seen.term, seen.value.as_deref()),
        (leadership.term(), Some("v2"))
    );

    let queue = queue_of(&cluster, candidate.lock()).await;
    assert_eq!(queue.len(), 1, "only the leader's key is queued: {queue:?}");
    let record = format!("{}/", candidate.lock().keys().companion(RECORD));
    let resp = admin(&cluster)
        .await
        .get(record.as_str(), None)
        .await
        .expect("read the record");
    let kv = resp.kvs().first().expect("the record is stored");
    assert_eq!(kv.lease(), 0, "the record outlives its leader");
    assert_eq!(
        kv.value_str().expect("utf-8"),
        format!("{}\n{}\nv2", leadership.term(), leadership.token().as_str())
    );

    cluster.members[0].restart().expect("restart etcd");
    // The same value again (no change to observe) until etcd answers.
    let deadline = Instant::now() + Duration::from_secs(15);
    while let Err(err) = leadership.proclaim("v2").await {
        assert!(
            Instant::now() < deadline,
            "no proclaim after the restart: {err}"
        );
        sleep(Duration::from_millis(100)).await;
    }
    // The observer waits from now on (it is polled only after etcd is back, so no failed
    // read of its own makes it subscribe again); only the watch can wake it in time.
    let waiting = tokio::spawn(async move { observer.next().await });
    sleep(Duration::from_millis(500)).await;
    leadership.proclaim("v3").await.expect("proclaim");
    let seen = timeout(quick, waiting)
        .await
        .expect("the watch works again after the restart")
        .expect("task")
        .expect("observe");
    let seen = seen.leader().expect("a leader");
    assert_eq!(
        (seen.term, seen.value.as_deref()),
        (leadership.term(), Some("v3"))
    );
    leadership.resign().await.expect("resign");
}

/// A publish checks in its one transaction that the publisher's queue key is the first of
/// the queue: a leader's announcement is that one transaction; a waiter's key, with its own
/// create revision as the term, writes nothing; and a key of a lock named below the
/// election's (`K/x/…`, older than the leader's) costs a read of the queue, not the write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn election_publish_checks_the_first_of_the_queue_in_its_transaction() {
    let cluster = EtcdCluster::start(1).expect("etcd");
    let addr = cluster.members[0].addr();
    let election = Election::builder(connect(&cluster.url()).await, unique("elect-first"))
        .ttl(Duration::from_secs(30))
        .build()
        .expect("valid");
    let keys = election.lock().keys().clone();
    let mut admin = admin(&cluster).await;
    let below = format!("{}/x/0123abcd", keys.lock());
    admin
        .put(below.as_str(), "a lock named below", None)
        .await
        .expect("put");
    let mut leadership = election.campaign("v1").await.expect("campaign");
    leadership
        .proclaim("v2")
        .await
        .expect("proclaim past the older key");
    let seen = election.leader().await.expect("read").expect("leader");
    assert_eq!(seen.value.as_deref(), Some("v2"));
    admin.delete(below.as_str(), None).await.expect("delete");

    let before = txns_handled(&addr);
    leadership.proclaim("v3").await.expect("proclaim");
    assert_eq!(txns_handled(&addr) - before, 1, "one transaction");

    let waiter = Token::random().expect("rng");
    let queued = format!("{}/{}", keys.lock(), waiter.as_str());
    let put = admin
        .put(queued.as_str(), waiter.as_str(), None)
        .await
        .expect("queue a waiter");
    let created = put.header().expect("header").revision();
    let forged = format!("{}\nforged", waiter.as_str());
    let wrote = election
        .lock()
        .backend()
        .publish(
            &keys,
            &waiter,
            u64::try_from(created).expect("revision"),
            &forged,
        )
        .await
        .expect("publish");
    assert!(!wrote, "a waiter wrote the record");
    let seen = election.leader().await.expect("read").expect("leader");
    assert_eq!(
        (seen.term, seen.value.as_deref()),
        (leadership.term(), Some("v3"))
    );
    admin.delete(queued.as_str(), None).await.expect("delete");
    leadership.resign().await.expect("resign");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_holds_share_one_session_lease_and_each_is_lost_when_it_lapses() {
    let cluster = EtcdCluster::start(1).expect("etcd");
    let etcd = connect(&cluster.url()).await;
    let ttl = Duration::from_secs(3);
    let lock = |name: &str, ttl: Duration| {
        Lock::builder(etcd.clone(), name)
            .ttl(ttl)
            .build()
            .expect("valid")
    };
    let (a, b) = (
        lock(&unique("session-a"), ttl),
        lock(&unique("session-b"), ttl),
    );
    // Another ttl: another session lease.
    let c = lock(&unique("session-c"), Duration::from_secs(6));
    let ga = a.lock().await.expect("lock");
    let gb = b.lock().await.expect("lock");
    let gc = c.lock().await.expect("lock");
    let lease = queue_of(&cluster, &a).await[0].2;
    assert_eq!(
        queue_of(&cluster, &b).await[0].2,
        lease,
        "one session lease"
    );
    assert_ne!(queue_of(&cluster, &c).await[0].2, lease, "one per ttl");
    // A release deletes the key alone: the lease stays, and the next hold goes on it.
    ga.release().await.expect("release");
    let ga = a.lock().await.expect("lock");
    assert_eq!(
        queue_of(&cluster, &a).await[0].2,
        lease,
        "the same lease again"
    );
    let mut admin = admin(&cluster).await;
    // The session lease lapses (as after a partition longer than the ttl): every hold on
    // it is lost, the hold on the other ttl's lease is not.
    admin.lease_revoke(lease).await.expect("revoke");
    until("both holds on the lapsed lease are lost", || {
        ga.is_lost() && gb.is_lost()
    })
    .await;
    assert!(!gc.is_lost());
    assert!(queue_of(&cluster, &a).await.is_empty());
    // The client goes on with a new session lease.
    let again = a.lock().await.expect("lock");
    let renewed = queue_of(&cluster, &a).await[0].2;
    assert_ne!(renewed, lease, "a new session lease");
    again.release().await.expect("release");
    gc.release().await.expect("release");
}
