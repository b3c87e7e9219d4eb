//! The ZooKeeper backend against the lock conformance suite, plus what only ZooKeeper
//! has: sessions as leases (expiry by partition, by a frozen client), an ensemble's
//! leader killed mid-run, and one waiter woken per release (watches counted).

mod conformance {
    crate::all_conformance_tests!(dlock_test::targets::ZooKeeperTarget::start());
}

mod election {
    crate::election_tests!(dlock_test::targets::ZooKeeperTarget::start());
}

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use dlock_test::conformance::unique;
use dlock_test::proxy::{Fault, Proxy};
use dlock_test::zookeeper::ZooKeeper as Server;
use fencelock::backend::ZooKeeper;
use fencelock::raw::{Kind, RawInspect};
use fencelock::{ErrorKind, Lock};
use tokio::time::{Instant, sleep, timeout};

async fn connect(url: &str) -> ZooKeeper {
    let mut last = None;
    for _ in 0..50 {
        match ZooKeeper::connect(url).await {
            Ok(zk) => return zk,
            Err(e) => last = Some(e),
        }
        sleep(Duration::from_millis(100)).await;
    }
    panic!("connect to {url}: {last:?}");
}

/// A holder cut off from the ensemble (its connection goes through the kit's proxy, which
/// stops passing bytes) cannot prove its session alive: its guard reports `lost()` once
/// the validity of its last renewal (`min(ttl, session timeout)`) runs out — before the
/// session can expire and the next client be granted the lock, which it then is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_holder_is_lost_before_the_next_is_granted() {
    let server = Server::shared();
    let chroot = format!("/{}", unique("partition"));
    let proxy = Proxy::start(server.members[0].addr().parse().expect("addr"))
        .await
        .expect("proxy");
    let through = format!("zk://{}{chroot}?session_timeout=1500ms", proxy.addr());
    let holder = connect(&through).await;
    let other = connect(&server.url(&chroot, "?session_timeout=1500ms")).await;
    let name = unique("cut-off");
    let lock = Lock::builder(holder.clone(), &name)
        .ttl(Duration::from_secs(30))
        .build()
        .expect("valid");
    let guard = lock.try_lock().await.expect("store").expect("free");
    assert!(
        guard.remaining() <= holder.session_timeout(),
        "a hold's validity is capped at the session timeout ({:?}), not the ttl: {:?}",
        holder.session_timeout(),
        guard.remaining()
    );
    let contender = Lock::new(other.clone(), &name).expect("valid");
    proxy.set_fault(Fault::Blackhole);
    let waiting = tokio::spawn(async move {
        let g = contender
            .try_lock_for(Duration::from_secs(20))
            .await
            .expect("store")
            .expect("granted once the cut-off session expired");
        (Instant::now(), g)
    });
    timeout(Duration::from_secs(20), guard.lost())
        .await
        .expect("lost() fires while cut off");
    let lost_at = Instant::now();
    let (granted_at, next) = waiting.await.expect("task");
    assert!(
        lost_at <= granted_at,
        "the cut-off holder still thought it held the lock when the next was granted"
    );
    assert!(next.fencing_token() > guard.fencing_token());
    next.release().await.expect("release");
    proxy.set_fault(Fault::Pass);
}

/// The holder's session is closed on the server (while the holder's own connection is
/// held up in the kit's proxy, a second connection takes the session over and closes it):
/// its node goes at once, the next client is granted the lock, the old holder's `lost()`
/// fires and its release reports `LockLost` — and the client goes on with a new session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_closed_on_the_server_ends_its_holds_and_the_client_goes_on() {
    let server = Server::shared();
    let chroot = format!("/{}", unique("closed"));
    let proxy = Proxy::start(server.members[0].addr().parse().expect("addr"))
        .await
        .expect("proxy");
    let holder = connect(&format!("zk://{}{chroot}?session_timeout=3s", proxy.addr())).await;
    let other = connect(&server.url(&chroot, "?session_timeout=3s")).await;
    let name = unique("closed");
    let lock = Lock::new(holder.clone(), &name).expect("valid");
    let guard = lock.try_lock().await.expect("store").expect("free");
    let old_session = holder.session_id();
    let contender = Lock::new(other.clone(), &name).expect("valid");
    assert!(contender.try_lock().await.expect("store").is_none());

    proxy.set_fault(Fault::Blackhole);
    proxy.close_all();
    let session = holder.client().session().clone();
    let thief = zookeeper_client::Client::connector()
        .with_session(session)
        .connect(&server.hosts())
        .await
        .expect("take the session over");
    drop(thief); // closes the session on the server
    let next = contender
        .try_lock_for(Duration::from_secs(10))
        .await
        .expect("store")
        .expect("the closed session's node is gone");
    proxy.set_fault(Fault::Pass);
    timeout(Duration::from_secs(10), guard.lost())
        .await
        .expect("the old holder learns it");
    assert_eq!(
        guard.release().await.expect_err("gone").kind(),
        ErrorKind::LockLost
    );
    next.release().await.expect("release");
    let again = timeout(Duration::from_secs(20), lock.lock())
        .await
        .expect("a new session serves the client")
        .expect("lock");
    assert_ne!(holder.session_id(), old_session, "a new session");
    again.release().await.expect("release");
}

/// 64 waiters queue behind one holder; each release wakes exactly the next one (one node
/// watch fired per hand-over, counted by the clients), in arrival order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_waiters_are_woken_one_at_a_time_in_order() {
    let server = Server::shared();
    let url = server.url(&format!("/{}", unique("herd")), "?session_timeout=20s");
    let name = unique("herd");
    let mut clients = Vec::new();
    for _ in 0..8 {
        clients.push(connect(&url).await);
    }
    let first = Lock::new(clients[0].clone(), &name).expect("valid");
    let holder = first.try_lock().await.expect("store").expect("free");
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..64 {
        let lock = Lock::new(clients[i % 8].clone(), &name).expect("valid");
        let order = Arc::clone(&order);
        tasks.push(tokio::spawn(async move {
            let guard = lock.lock().await.expect("lock");
            order.lock().expect("order").push(i);
            sleep(Duration::from_millis(2)).await;
            guard.release().await.expect("release");
        }));
        // Queue in a known order: wait until this waiter's node is in line.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let state = clients[0]
                .inspect(Kind::Lock, first.keys())
                .await
                .expect("inspect");
            if state.queued == Some(u32::try_from(i + 1).expect("small")) {
                break;
            }
            assert!(Instant::now() < deadline, "waiter {i} never queued");
            sleep(Duration::from_millis(5)).await;
        }
    }
    let before: u64 = clients.iter().map(ZooKeeper::watches_fired).sum();
    holder.release().await.expect("release");
    for t in tasks {
        timeout(Duration::from_secs(60), t)
            .await
            .expect("every waiter is granted")
            .expect("task");
    }
    let fired: u64 = clients.iter().map(ZooKeeper::watches_fired).sum::<u64>() - before;
    assert_eq!(fired, 64, "one watch fired per hand-over, no herd");
    let order = order.lock().expect("order").clone();
    assert_eq!(
        order,
        (0..64).collect::<Vec<_>>(),
        "first come, first served"
    );
}

/// A 3-server ensemble whose leader is killed mid-run: workers keep taking the lock
/// through the election; no two valid holds overlap, no fence is handed out twice, fences
/// increase in grant order, and locks are granted after the election (their zxid carries
/// the new leader's epoch).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ensemble_s_leader_killed_mid_run_breaks_nothing() {
    let mut ensemble = tokio::task::spawn_blocking(|| Server::start(3))
        .await
        .expect("task")
        .expect("start a 3-server ensemble");
    let url = ensemble.url("/leader-kill", "?session_timeout=4s");
    let name = unique("leader-kill");
    let inside = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let grants = Arc::new(std::sync::Mutex::new(Vec::<u64>::new()));
    let stop = Arc::new(AtomicU64::new(0));
    let mut workers = Vec::new();
    for _ in 0..3 {
        let lock = Lock::builder(connect(&url).await, &name)
            .ttl(Duration::from_secs(4))
            .build()
            .expect("valid");
        let (inside, overlaps, grants, stop) = (
            Arc::clone(&inside),
            Arc::clone(&overlaps),
            Arc::clone(&grants),
            Arc::clone(&stop),
        );
        workers.push(tokio::spawn(async move {
            while stop.load(Ordering::SeqCst) == 0 {
                let Ok(Some(guard)) = lock.try_lock_for(Duration::from_secs(2)).await else {
                    sleep(Duration::from_millis(20)).await;
                    continue;
                };
                let entered = inside.fetch_add(1, Ordering::SeqCst);
                grants
                    .lock()
                    .expect("grants")
                    .push(guard.fencing_token().get());
                sleep(Duration::from_millis(5)).await;
                // An overlap counts if both holds were valid through it.
                if entered != 0 && !guard.is_lost() {
                    overlaps.fetch_add(1, Ordering::SeqCst);
                }
                inside.fetch_sub(1, Ordering::SeqCst);
                let _ = guard.release().await;
            }
        }));
    }
    sleep(Duration::from_secs(1)).await;
    let leader = ensemble.leader().expect("a leader");
    let before = grants.lock().expect("grants").len();
    let epoch_before = grants.lock().expect("grants").last().map_or(0, |f| f >> 32);
    ensemble.members[leader].kill();
    // Until a few locks were granted under the new leader (bounded: 30 s).
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut after_election = 0;
    while after_election < 5 && Instant::now() < deadline {
        sleep(Duration::from_millis(100)).await;
        after_election = grants
            .lock()
            .expect("grants")
            .iter()
            .filter(|f| *f >> 32 > epoch_before)
            .count();
    }
    stop.store(1, Ordering::SeqCst);
    for w in workers {
        timeout(Duration::from_secs(30), w)
            .await
            .expect("workers stop")
            .expect("task");
    }
    let _ = tokio::task::spawn_blocking(move || drop(ensemble)).await;
    let grants = grants.lock().expect("grants").clone();
    assert!(before > 0, "grants before the kill");
    assert!(
        after_election > 0,
        "locks granted after the election (epoch > {epoch_before}): {grants:?}"
    );
    assert_eq!(
        overlaps.load(Ordering::SeqCst),
        0,
        "two valid holds at once"
    );
    assert!(
        grants.windows(2).all(|w| w[0] < w[1]),
        "fences strictly increase in grant order, none twice: {grants:?}"
    );
}

/// `zk://user:password@…` adds a digest identity: the chroot and the lock nodes it creates
/// are that identity's alone, so an anonymous client can neither take the lock there nor
/// force it open (a typed `Backend` error that says why) — and no error, `Debug` or
/// message shows the password. A malformed URL and an unreachable server are typed errors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn digest_identities_own_their_nodes_and_passwords_are_never_printed() {
    let server = Server::shared();
    let chroot = format!("/{}", unique("digest"));
    let alice = connect(&format!(
        "zk://alice:s3cret-pw@{}{chroot}?session_timeout=5s",
        server.hosts()
    ))
    .await;
    assert!(!format!("{alice:?}").contains("s3cret-pw"), "{alice:?}");
    let name = unique("owned");
    let lock = Lock::new(alice.clone(), &name).expect("valid");
    let guard = lock.try_lock().await.expect("store").expect("free");

    let anonymous = connect(&server.url(&chroot, "?session_timeout=5s")).await;
    let theirs = Lock::new(anonymous.clone(), &name).expect("valid");
    let err = theirs.try_lock().await.expect_err("no right to the chroot");
    assert_eq!(err.kind(), ErrorKind::Backend, "{err}");
    assert!(err.to_string().contains("permission"), "{err}");
    let err = anonymous
        .force_unlock(Kind::Lock, lock.keys())
        .await
        .expect_err("no right to alice's nodes");
    assert_eq!(err.kind(), ErrorKind::Backend, "{err}");
    assert!(!guard.is_lost());
    guard.release().await.expect("alice releases");

    let wrong = connect(&format!(
        "zk://alice:not-it@{}{chroot}?session_timeout=5s",
        server.hosts()
    ))
    .await;
    let err = Lock::new(wrong, &name)
        .expect("valid")
        .try_lock()
        .await
        .expect_err("another identity");
    assert!(!err.to_string().contains("not-it"), "{err}");

    for bad in [
        "zk://alice:pw@nohostport",
        "zk://h:1/a//b",
        "zk://h:1?ttl=3",
    ] {
        let err = ZooKeeper::connect(bad).await.expect_err(bad);
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{bad}: {err}");
        assert!(!err.to_string().contains(":pw@"), "{err}");
    }
    let port = dlock_test::server::free_port().expect("port");
    let err = ZooKeeper::connect(&format!("zk://u:hidden@127.0.0.1:{port}/x"))
        .await
        .expect_err("nobody listens");
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(!err.to_string().contains("hidden"), "{err}");
}

/// A lock's directory is a container node: once its last lock node is gone, the server
/// deletes it (the kit's server looks every second), so directories of unused locks do
/// not pile up; the lock works again afterwards (the directory is made anew).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unused_lock_directories_are_removed_by_the_server() {
    let server = Server::shared();
    let url = server.url(&format!("/{}", unique("containers")), "?session_timeout=5s");
    let zk = connect(&url).await;
    let names: Vec<String> = (0..5).map(|i| unique(&format!("gone{i}"))).collect();
    for name in &names {
        let guard = Lock::new(zk.clone(), name)
            .expect("valid")
            .try_lock()
            .await
            .expect("store")
            .expect("free");
        guard.release().await.expect("release");
    }
    let client = zk.client();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let left = client.list_children("/").await.expect("list the chroot");
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "directories of released locks still there: {left:?}"
        );
        sleep(Duration::from_millis(200)).await;
    }
    let again = Lock::new(zk.clone(), &names[0])
        .expect("valid")
        .try_lock()
        .await
        .expect("store")
        .expect("free");
    again.release().await.expect("release");
}
