//! The memcached backend against the lock conformance suite, plus what only it has.

use std::time::Duration;

use dlock_test::conformance::{Target, unique};
use dlock_test::targets::MemcachedTarget;
use fencelock::raw::{Kind, RawElection};
use fencelock::{Election, ErrorKind, Lock};
use tokio::time::{Instant, sleep, timeout};

mod conformance {
    crate::lock_conformance_tests!(dlock_test::targets::MemcachedTarget::start());
    crate::conformance_tests!(dlock_test::targets::MemcachedTarget::start();
        lost_fires_when_the_store_is_frozen_past_the_ttl,
        a_partitioned_holder_loses_its_lease_and_closed_connections_recover,
        semaphore_never_exceeds_its_permits,
        semaphore_permits_of_a_dead_holder_come_back,
        semaphore_many_permits_and_counts,
        semaphore_waiters_wake_and_lost_permits_fire,
        semaphore_other_count_is_refused,
    );
}

mod family {
    crate::family_tests!(dlock_test::targets::MemcachedTarget::start();
        reentrant_excludes_other_owners,
        reentrant_counts_holds,
        reentrant_lost_cancel_and_expiry,
        owners_follow_tasks_not_threads,
        fair_lock_grants_in_arrival_order,
        fair_lock_cancelled_and_crashed_waiters,
        rwlock_readers_share_writers_exclude,
        rwlock_writer_is_not_starved,
        rwlock_downgrade_expiry_and_cancel,
        multi_lock_is_all_or_nothing,
        multi_locks_on_overlapping_sets_do_not_deadlock,
    );
}

mod election {
    crate::election_tests!(dlock_test::targets::MemcachedTarget::start());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttls_memcached_cannot_express_are_refused_and_validity_is_a_second_shorter() {
    let target = MemcachedTarget::start();
    let mc = target.client().await;
    for ttl in [Duration::from_secs(1), Duration::from_millis(1999)] {
        let lock = Lock::builder(mc.clone(), unique("ttl"))
            .ttl(ttl)
            .build()
            .expect("valid for the lock itself");
        let err = lock
            .try_lock()
            .await
            .expect_err("below memcached's minimum");
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
        assert!(
            !lock.is_locked().await.expect("store"),
            "nothing was stored"
        );
    }
    let lock = Lock::builder(mc.clone(), unique("ttl"))
        .ttl(Duration::from_millis(2500))
        .build()
        .expect("valid");
    let guard = lock.try_lock().await.expect("store").expect("free");
    // Stored as 3 s (rounded up); relied on for at most 2.5 s − drift − 1 s.
    assert!(
        guard.remaining() <= Duration::from_millis(1500),
        "{:?}",
        guard.remaining()
    );
    let state = lock.state().await.expect("store");
    assert!(
        state.remaining.is_some_and(|r| r <= Duration::from_secs(3)),
        "{state:?}"
    );
    guard.release().await.expect("release");
    for bad in [Duration::ZERO, Duration::from_secs(30 * 24 * 3600 + 1)] {
        assert_eq!(
            Lock::builder(mc.clone(), "x")
                .ttl(bad)
                .build()
                .map(|_| ())
                .map_err(|e| e.kind()),
            Err(ErrorKind::InvalidArgument)
        );
    }
    assert_eq!(
        fencelock::backend::memcached::expiry_seconds(Duration::from_secs(30 * 24 * 3600 + 1))
            .map_err(|e| e.kind()),
        Err(ErrorKind::InvalidArgument),
        "30 days + 1 s would be read as an absolute time"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_name_works_even_10_kb_with_spaces_and_names_do_not_collide() {
    let target = MemcachedTarget::start();
    let mc = target.client().await;
    let long = format!("{} with spaces\tand tabs é", "x".repeat(10_000));
    let keys = fencelock::keys::LockKeys::new("", &long[..1000]).expect("keys");
    let mapped = fencelock::backend::memcached::memcached_key(keys.lock());
    assert!(mapped.len() <= 250, "{mapped}");
    let a = Lock::builder(mc.clone(), &long[..1000])
        .build()
        .expect("valid");
    let b = Lock::builder(mc.clone(), format!("{}!", &long[..999]))
        .build()
        .expect("valid");
    let ga = a.try_lock().await.expect("store").expect("free");
    let gb = b
        .try_lock()
        .await
        .expect("store")
        .expect("a different name is a different lock");
    assert!(a.try_lock().await.expect("store").is_none());
    ga.release().await.expect("release");
    gb.release().await.expect("release");
    // Names over the library's own 1024-byte limit are refused before the store.
    assert_eq!(
        Lock::new(mc, long).map(|_| ()).map_err(|e| e.kind()),
        Err(ErrorKind::InvalidArgument)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eviction_of_a_held_lock_fires_lost_and_a_waiter_polls_its_way_in() {
    let target = MemcachedTarget::start();
    let lock = Lock::builder(target.client().await, unique("evicted"))
        .ttl(Duration::from_secs(3))
        .build()
        .expect("valid");
    let guard = lock.try_lock().await.expect("store").expect("free");
    let lost = guard.lost();
    // flush_all stands in for an eviction under memory pressure.
    assert!(
        target
            .server
            .command("flush_all\r\n")
            .expect("flush")
            .starts_with("OK")
    );
    timeout(Duration::from_secs(3), lost)
        .await
        .expect("lost() fires at the next renewal once the key vanished");
    assert_eq!(
        guard.release().await.expect_err("gone").kind(),
        ErrorKind::LockLost
    );

    // No notification: a waiter backs off (at most 500 ms) and gets in soon after a
    // release, far before the holder's ttl.
    let holder = lock.try_lock().await.expect("store").expect("free again");
    let waiter = Lock::builder(target.client().await, lock.name())
        .ttl(Duration::from_secs(20))
        .build()
        .expect("valid");
    let waiting = tokio::spawn(async move {
        waiter
            .lock()
            .await
            .map(|g| (tokio::time::Instant::now(), g))
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released = tokio::time::Instant::now();
    holder.release().await.expect("release");
    let (at, g) = timeout(Duration::from_secs(3), waiting)
        .await
        .expect("the waiter polls its way in")
        .expect("task")
        .expect("lock");
    assert!(at >= released);
    g.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_forgets_locks_and_fences_as_documented() {
    let mut target = MemcachedTarget::start();
    let name = unique("restart");
    let lock = Lock::builder(target.client().await, &name)
        .ttl(Duration::from_secs(3))
        .build()
        .expect("valid");
    let g = lock.try_lock().await.expect("store").expect("free");
    let first = g.fencing_token();
    g.release().await.expect("release");
    let g = lock.try_lock().await.expect("store").expect("free");
    assert!(g.fencing_token() > first);
    let lost = g.lost();
    target.server.restart().expect("restart");
    timeout(Duration::from_secs(3), lost)
        .await
        .expect("lost() fires after the restart");
    drop(g);
    let again = lock
        .try_lock_for(Duration::from_secs(5))
        .await
        .expect("the client reconnects")
        .expect("free: the restart forgot the lock");
    assert_eq!(
        again.fencing_token().get(),
        1,
        "the counter restarted at 1 (documented)"
    );
    again.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_call_leaves_no_replies_for_the_next_one() {
    use dlock_test::proxy::{Fault, Proxy};
    let target = MemcachedTarget::start();
    let proxy = Proxy::start(
        format!("127.0.0.1:{}", target.server.port())
            .parse()
            .expect("addr"),
    )
    .await
    .expect("proxy");
    let mc = fencelock::backend::Memcached::connect(&format!("memcache://{}", proxy.addr()))
        .await
        .expect("connect");
    let name = unique("cancelled");
    let a = Lock::builder(mc.clone(), &name)
        .ttl(Duration::from_secs(3))
        .build()
        .expect("valid");
    proxy.set_fault(Fault::Delay(Duration::from_millis(300)));
    assert!(
        timeout(Duration::from_millis(100), a.lock()).await.is_err(),
        "answered through a 300 ms delay"
    );
    proxy.set_fault(Fault::Pass);
    tokio::time::sleep(Duration::from_millis(800)).await; // the delayed bytes arrive
    for i in 0..3 {
        let lock = Lock::builder(mc.clone(), format!("{name}-{i}"))
            .ttl(Duration::from_secs(3))
            .build()
            .expect("valid");
        let g = lock
            .try_lock()
            .await
            .expect("a later call reads its own replies")
            .expect("free");
        g.release().await.expect("release");
    }
    // The cancelled grant is given back in the background — or, if the delayed add lands
    // after that release, it expires by its ttl: either way it is free within the ttl.
    let other = Lock::builder(target.client().await, &name)
        .ttl(Duration::from_secs(3))
        .build()
        .expect("valid");
    let g = other
        .try_lock_for(Duration::from_secs(5))
        .await
        .expect("store")
        .expect("the cancelled grant was released or expired");
    g.release().await.expect("release");
}

/// A loopback TCP proxy that can hold back the server's replies, per connection: those
/// open when [`HoldProxy::hold_open`] is called, or every one ([`HoldProxy::hold_all`]).
/// Requests always pass, so held calls reach the server and wait only for their replies.
struct HoldProxy {
    addr: std::net::SocketAddr,
    state: std::sync::Arc<std::sync::Mutex<HoldState>>,
    acceptor: tokio::task::JoinHandle<()>,
}

#[derive(Default)]
struct HoldState {
    /// One "replies held" switch per accepted connection, in accept order.
    held: Vec<tokio::sync::watch::Sender<bool>>,
    hold_new: bool,
    /// Connections the client closed.
    closed: usize,
    pumps: tokio::task::JoinSet<()>,
}

impl HoldProxy {
    async fn start(port: u16) -> HoldProxy {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let state = std::sync::Arc::new(std::sync::Mutex::new(HoldState::default()));
        let acceptor = {
            let state = std::sync::Arc::clone(&state);
            tokio::spawn(async move {
                while let Ok((client, _)) = listener.accept().await {
                    let server = tokio::net::TcpStream::connect(("127.0.0.1", port))
                        .await
                        .expect("upstream");
                    let (mut cr, mut cw) = client.into_split();
                    let (mut sr, mut sw) = server.into_split();
                    let mut st = state.lock().expect("state");
                    let (tx, mut held) = tokio::sync::watch::channel(st.hold_new);
                    st.held.push(tx);
                    let on_close = std::sync::Arc::clone(&state);
                    st.pumps.spawn(async move {
                        let _ = tokio::io::copy(&mut cr, &mut sw).await;
                        on_close.lock().expect("state").closed += 1;
                    });
                    st.pumps.spawn(async move {
                        let mut buf = vec![0u8; 16 * 1024];
                        loop {
                            let n = match sr.read(&mut buf).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => n,
                            };
                            if held.wait_for(|h| !*h).await.is_err()
                                || cw.write_all(&buf[..n]).await.is_err()
                            {
                                return;
                            }
                        }
                    });
                }
            })
        };
        HoldProxy {
            addr,
            state,
            acceptor,
        }
    }

    fn url(&self, query: &str) -> String {
        format!("memcache://{}{query}", self.addr)
    }

    /// Connections accepted so far.
    fn connections(&self) -> usize {
        self.state.lock().expect("state").held.len()
    }

    /// Connections accepted and not closed by the client.
    fn open_connections(&self) -> usize {
        let st = self.state.lock().expect("state");
        st.held.len() - st.closed
    }

    /// Holds the replies of the connections open now; later ones pass.
    fn hold_open(&self) {
        for h in &self.state.lock().expect("state").held {
            h.send_replace(true);
        }
    }

    /// Holds the replies of every connection, open now or later.
    fn hold_all(&self) {
        let mut st = self.state.lock().expect("state");
        st.hold_new = true;
        for h in &st.held {
            h.send_replace(true);
        }
    }

    /// Lets every held reply through.
    fn release(&self) {
        let mut st = self.state.lock().expect("state");
        st.hold_new = false;
        for h in &st.held {
            h.send_replace(false);
        }
    }
}

impl Drop for HoldProxy {
    fn drop(&mut self) {
        self.acceptor.abort();
        if let Ok(mut st) = self.state.lock() {
            st.pumps.abort_all();
        }
    }
}

/// How many of `locks` the store shows held (asked directly, not through their client).
async fn held_count(
    direct: &fencelock::backend::Memcached,
    locks: &[Lock<fencelock::backend::Memcached>],
) -> usize {
    let mut n = 0;
    for lock in locks {
        let lock = Lock::new(direct.clone(), lock.name()).expect("valid");
        n += usize::from(lock.is_locked().await.expect("store"));
    }
    n
}

/// Polls the store (not through the client under test) until `name` is held.
async fn until_held(direct: &fencelock::backend::Memcached, name: &str) {
    let lock = Lock::new(direct.clone(), name).expect("valid");
    timeout(Duration::from_secs(5), async {
        while !lock.is_locked().await.expect("store") {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the request reached memcached");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_client_serves_a_call_while_another_waits_for_its_reply() {
    let target = MemcachedTarget::start();
    let direct = target.client().await;
    let proxy = HoldProxy::start(target.server.port()).await;
    let mc = fencelock::backend::Memcached::connect(&proxy.url(""))
        .await
        .expect("connect");
    assert_eq!(proxy.connections(), 1, "connect opens one connection");
    assert_eq!(
        mc.max_connections(),
        fencelock::backend::memcached::DEFAULT_MAX_CONNECTIONS
    );
    let slow = Lock::builder(mc.clone(), unique("slow"))
        .ttl(Duration::from_secs(10))
        .build()
        .expect("valid");
    let fast = Lock::builder(mc.clone(), unique("fast"))
        .ttl(Duration::from_secs(10))
        .build()
        .expect("valid");

    // The only connection so far answers nothing now: the slow acquire takes it, its add
    // lands, and its replies wait in the proxy.
    proxy.hold_open();
    let slow_call = tokio::spawn({
        let slow = slow.clone();
        async move { slow.try_lock().await }
    });
    until_held(&direct, slow.name()).await;

    // Another task's acquire on the same client goes ahead on a second connection.
    let g = timeout(Duration::from_secs(5), fast.try_lock())
        .await
        .expect("not queued behind the held call")
        .expect("store")
        .expect("free");
    assert!(
        !slow_call.is_finished(),
        "the first call still waits for its replies"
    );
    assert_eq!(
        (proxy.connections(), proxy.open_connections()),
        (2, 2),
        "one more connection, and the held one is still open (it did not time out first)"
    );
    g.release().await.expect("release");

    proxy.release();
    let slow_guard = slow_call
        .await
        .expect("task")
        .expect("its own replies, once let through")
        .expect("granted");
    assert_eq!(
        slow.state().await.expect("store").holder.as_deref(),
        Some(slow_guard.token().as_str())
    );
    slow_guard.release().await.expect("release");
    assert_eq!(
        (proxy.connections(), proxy.open_connections()),
        (2, 2),
        "both connections were kept and reused"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_are_bounded_by_max_connections_and_reused() {
    let target = MemcachedTarget::start();
    let direct = target.client().await;
    let proxy = HoldProxy::start(target.server.port()).await;
    let mc = fencelock::backend::Memcached::connect(&proxy.url("?max_connections=3"))
        .await
        .expect("connect");
    assert_eq!(mc.max_connections(), 3);
    let locks: Vec<_> = (0..10)
        .map(|i| {
            Lock::builder(mc.clone(), unique(&format!("bounded-{i}")))
                .ttl(Duration::from_secs(10))
                .build()
                .expect("valid")
        })
        .collect();
    proxy.hold_all();
    let calls: Vec<_> = locks
        .iter()
        .map(|lock| {
            let lock = lock.clone();
            tokio::spawn(async move { lock.try_lock().await })
        })
        .collect();
    // Three calls get a connection each and reach the server; the other seven wait for
    // one of them (nothing of theirs is sent).
    timeout(Duration::from_secs(5), async {
        while held_count(&direct, &locks).await < 3 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("three calls reached memcached");
    assert_eq!(proxy.connections(), 3, "at most max_connections");
    proxy.release();
    for (call, lock) in calls.into_iter().zip(&locks) {
        let g = call
            .await
            .expect("task")
            .expect("store")
            .expect("a fresh name is free");
        assert_eq!(
            Lock::new(direct.clone(), lock.name())
                .expect("valid")
                .state()
                .await
                .expect("store")
                .holder
                .as_deref(),
            Some(g.token().as_str()),
            "each call read its own replies"
        );
        g.release().await.expect("release");
    }
    assert_eq!(
        proxy.connections(),
        3,
        "the same three connections served all"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_calls_some_cancelled_mid_exchange_each_read_their_own_replies() {
    use dlock_test::proxy::{Fault, Proxy};
    let target = MemcachedTarget::start();
    let direct = target.client().await;
    let proxy = Proxy::start(
        format!("127.0.0.1:{}", target.server.port())
            .parse()
            .expect("addr"),
    )
    .await
    .expect("proxy");
    let mc = fencelock::backend::Memcached::connect(&format!(
        "memcache://{}?max_connections=4",
        proxy.addr()
    ))
    .await
    .expect("connect");
    let name = unique("mixed");
    let lock = |i: usize| {
        Lock::builder(mc.clone(), format!("{name}-{i}"))
            .ttl(Duration::from_secs(3))
            .build()
            .expect("valid")
    };
    // Each chunk takes 20 ms through the proxy, each way: every other call is cancelled
    // after 1 to 60 ms — before its request got through, at the server, or with its
    // replies on the way — while the others share the same four connections.
    proxy.set_fault(Fault::Delay(Duration::from_millis(20)));
    let calls: Vec<_> = (0..40)
        .map(|i| {
            let lock = lock(i);
            tokio::spawn(async move {
                if i % 2 == 0 {
                    let cancel_after = Duration::from_millis(1 + (i as u64 * 7) % 60);
                    let _ = timeout(cancel_after, lock.try_lock()).await;
                    None
                } else {
                    let got = lock.try_lock().await;
                    Some((lock, got))
                }
            })
        })
        .collect();
    let mut granted = Vec::new();
    for call in calls {
        if let Some((lock, got)) = call.await.expect("task") {
            granted.push((lock, got.expect("store").expect("a fresh name is free")));
        }
    }
    assert_eq!(granted.len(), 20);
    for (lock, g) in &granted {
        let state = Lock::new(direct.clone(), lock.name())
            .expect("valid")
            .state()
            .await
            .expect("store");
        assert_eq!(
            state.holder.as_deref(),
            Some(g.token().as_str()),
            "{state:?}"
        );
        assert_eq!(state.last_fence, Some(g.fencing_token().get()), "{state:?}");
    }
    let held: Vec<_> = granted.iter().map(|(lock, _)| lock.clone()).collect();
    for (_, g) in granted {
        g.release().await.expect("released through the same client");
    }
    assert_eq!(
        held_count(&direct, &held).await,
        0,
        "no grant outlives its release"
    );

    // Once the delayed bytes are through, a new wave on the same client: every call is
    // granted, with the store's own view of it.
    proxy.set_fault(Fault::Pass);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let calls: Vec<_> = (100..116)
        .map(|i| {
            let lock = lock(i);
            tokio::spawn(async move {
                let got = lock.try_lock().await;
                (lock, got)
            })
        })
        .collect();
    for call in calls {
        let (lock, got) = call.await.expect("task");
        let g = got.expect("store").expect("a fresh name is free");
        let state = Lock::new(direct.clone(), lock.name())
            .expect("valid")
            .state()
            .await
            .expect("store");
        assert_eq!(
            state.holder.as_deref(),
            Some(g.token().as_str()),
            "{state:?}"
        );
        g.release().await.expect("release");
    }
    // The cancelled acquires hold nothing for long: given back, or expired by their ttl.
    for i in (0..40).step_by(2) {
        let g = Lock::builder(direct.clone(), format!("{name}-{i}"))
            .ttl(Duration::from_secs(3))
            .build()
            .expect("valid")
            .try_lock_for(Duration::from_secs(5))
            .await
            .expect("store")
            .expect("free within the ttl");
        g.release().await.expect("release");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_many_renews_exactly_the_leases_still_ours() {
    use fencelock::Token;
    use fencelock::keys::LockKeys;
    use fencelock::raw::{Acquire, RawInspect, RawLock, Renewal};
    let target = MemcachedTarget::start();
    let mc = target.client().await;
    let short = Duration::from_secs(3);
    let long = Duration::from_secs(60);
    let mut renewals = Vec::new();
    for _ in 0..2000 {
        let keys = LockKeys::new("", &unique("many")).expect("keys");
        let token = Token::random().expect("rng");
        assert!(matches!(
            mc.acquire(&keys, &token, short).await.expect("store"),
            Acquire::Acquired { .. }
        ));
        renewals.push(Renewal::new(
            keys,
            token,
            long,
            fencelock::raw::LeaseKind::Lock,
        ));
    }
    let foreign = LockKeys::new("", &unique("foreign")).expect("keys");
    let holder = Token::random().expect("rng");
    assert!(matches!(
        mc.acquire(&foreign, &holder, short).await.expect("store"),
        Acquire::Acquired { .. }
    ));
    renewals.push(Renewal::new(
        foreign.clone(),
        Token::random().expect("rng"),
        long,
        fencelock::raw::LeaseKind::Lock,
    ));
    renewals.push(Renewal::new(
        LockKeys::new("", &unique("absent")).expect("keys"),
        Token::random().expect("rng"),
        long,
        fencelock::raw::LeaseKind::Lock,
    ));
    let mut bad_ttl = renewals[0].clone();
    bad_ttl.ttl = Duration::from_secs(1);
    renewals.push(bad_ttl);

    let results = mc.extend_many(&renewals).await;
    assert_eq!(results.len(), renewals.len());
    for r in &results[..2000] {
        assert!(matches!(r, Ok(true)), "{r:?}");
    }
    assert!(matches!(results[2000], Ok(false)), "someone else's lease");
    assert!(matches!(results[2001], Ok(false)), "no lease");
    assert_eq!(
        results[2002].as_ref().map_err(fencelock::Error::kind).err(),
        Some(ErrorKind::InvalidArgument)
    );
    for r in renewals.iter().take(2000).step_by(100) {
        let state = mc.inspect(Kind::Lock, &r.keys).await.expect("store");
        assert_eq!(state.holder.as_deref(), Some(r.token.as_str()));
        assert!(state.remaining > Some(short), "renewed: {state:?}");
    }
    let state = mc.inspect(Kind::Lock, &foreign).await.expect("store");
    assert_eq!(state.holder.as_deref(), Some(holder.as_str()));
    assert!(state.remaining <= Some(short), "not renewed: {state:?}");
}

/// A restart forgets the lock, the fence counter and the record: an announcement the old
/// leader repeats afterwards writes nothing (it would have left a record of a term the
/// fresh counter is far below), and the next leader leads with a term counted from 1 again
/// and is reported with its value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_restart_the_old_leader_writes_nothing_and_the_next_leads() {
    let mut target = MemcachedTarget::start();
    let name = unique("elect-restart");
    let ttl = Duration::from_secs(3);
    let a = Election::builder(target.client().await, &name)
        .ttl(ttl)
        .build()
        .expect("valid");
    a.campaign("first")
        .await
        .expect("campaign")
        .resign()
        .await
        .expect("resign");
    let old = a.campaign("old").await.expect("campaign");
    assert_eq!(old.term().get(), 2);
    target.server.restart().expect("restart");
    let stale = format!("{}\nstale", old.token().as_str());
    let deadline = Instant::now() + Duration::from_secs(5);
    let wrote = loop {
        match a
            .lock()
            .backend()
            .publish(a.lock().keys(), old.token(), old.term().get(), &stale)
            .await
        {
            Ok(wrote) => break wrote,
            Err(err) => assert!(
                Instant::now() < deadline,
                "no answer after the restart: {err}"
            ),
        }
        sleep(Duration::from_millis(100)).await;
    };
    assert!(!wrote, "the lock is gone, yet the old leader wrote");
    assert_eq!(
        a.lock()
            .backend()
            .record(a.lock().keys())
            .await
            .expect("read"),
        None
    );
    drop(old);

    let b = Election::builder(target.client().await, &name)
        .ttl(ttl)
        .build()
        .expect("valid");
    let new = timeout(Duration::from_secs(5), b.campaign("new"))
        .await
        .expect("leads")
        .expect("campaign");
    assert_eq!(
        new.term().get(),
        1,
        "the counter restarted at 1 (documented)"
    );
    let seen = a.leader().await.expect("read").expect("leader");
    assert_eq!(
        (seen.term, seen.value.as_deref()),
        (new.term(), Some("new"))
    );
    new.resign().await.expect("resign");
}
