//! Edges of the stores, each found by a user: PostgreSQL's `text` and a NUL in a name,
//! PostgreSQL's waiter rows left by killed clients, a ZooKeeper lock directory deleted
//! under its waiters, and a ZooKeeper holder that crashes.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use dlock_test::conformance::unique;
use dlock_test::postgres::PostgresServer;
use dlock_test::proxy::{Fault, Proxy};
use fencelock::backend::{PgAdvisory, Postgres, ZooKeeper};
use fencelock::{Election, ErrorKind, FairLock, Lock, Owner, ReentrantLock, RwLock, Semaphore};
use tokio::time::{Instant, sleep, timeout};
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

/// The kind of `result`'s error (`None`: it succeeded).
fn kind_of<T>(result: fencelock::Result<T>) -> Option<ErrorKind> {
    result.err().map(|e| e.kind())
}

/// A NUL byte in a name (or a prefix) is `InvalidArgument`, as every other limit on names,
/// for every primitive in lease mode and for advisory mode: PostgreSQL's `text` cannot
/// hold it, and the server's "invalid byte sequence" is not the caller's answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_refuses_a_nul_in_a_name_before_the_store_is_touched() {
    let server = PostgresServer::start().expect("postgres");
    let pg = Postgres::connect(&server.url()).await.expect("connect");
    let bad = format!("{}\0tail", unique("nul"));
    let invalid = Some(ErrorKind::InvalidArgument);

    let lock = Lock::new(pg.clone(), &bad).expect("a name's bytes are the store's to judge");
    assert_eq!(kind_of(lock.try_lock().await), invalid, "lock");
    assert_eq!(kind_of(lock.state().await), invalid, "state");
    assert_eq!(kind_of(lock.force_unlock().await), invalid, "force_unlock");
    let prefixed = Lock::builder(pg.clone(), "plain")
        .prefix("pre\0fix:")
        .build()
        .expect("valid");
    assert_eq!(kind_of(prefixed.try_lock().await), invalid, "prefix");

    let fair = FairLock::new(pg.clone(), &bad).expect("valid");
    assert_eq!(kind_of(fair.try_lock().await), invalid, "fair lock");
    let sem = Semaphore::new(pg.clone(), &bad, 2).expect("valid");
    assert_eq!(kind_of(sem.try_acquire().await), invalid, "semaphore");
    assert_eq!(kind_of(sem.available_permits().await), invalid, "permits");
    let rw = RwLock::new(pg.clone(), &bad).expect("valid");
    assert_eq!(kind_of(rw.try_read().await), invalid, "read lock");
    assert_eq!(kind_of(rw.try_write().await), invalid, "write lock");
    let re = ReentrantLock::new(pg.clone(), &bad).expect("valid");
    let owner = Owner::new("edges").expect("owner");
    assert_eq!(kind_of(re.try_lock(&owner).await), invalid, "reentrant");
    let election = Election::new(pg.clone(), &bad).expect("valid");
    assert_eq!(
        kind_of(election.try_campaign("v").await),
        invalid,
        "campaign"
    );
    assert_eq!(kind_of(election.leader().await), invalid, "leader");

    let advisory = PgAdvisory::connect(&server.url()).await.expect("advisory");
    let lock = Lock::new(advisory, &bad).expect("valid");
    assert_eq!(kind_of(lock.try_lock().await), invalid, "advisory lock");
    assert_eq!(kind_of(lock.state().await), invalid, "advisory state");

    // The same names without the NUL work: the refusal is the NUL's alone.
    let good = bad.replace('\0', "-");
    let guard = Lock::new(pg.clone(), &good)
        .expect("valid")
        .try_lock()
        .await
        .expect("store")
        .expect("free");
    guard.release().await.expect("release");
}

/// Connects to `url`, trying again while a shared server is still starting.
async fn zk_connect(url: &str) -> ZooKeeper {
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

/// An operator's `deleteall` of every lock directory under `admin`'s chroot: its nodes,
/// then the directory, in one multi-op (as zkCli's `deleteall` batches them).
async fn delete_all(admin: &ZooKeeper) {
    let client = admin.client();
    for dir in client.list_children("/").await.expect("list the chroot") {
        let dir = format!("/{dir}");
        let mut multi = client.new_multi_writer();
        for node in client.list_children(&dir).await.unwrap_or_default() {
            multi
                .add_delete(&format!("{dir}/{node}"), None)
                .expect("a delete");
        }
        multi.add_delete(&dir, None).expect("a delete");
        multi.commit().await.expect("deleteall");
    }
}

/// Waits until the chroot of `admin` has `n` lock nodes in all (the waiters queued).
async fn wait_for_nodes(admin: &ZooKeeper, n: usize) {
    let client = admin.client();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut count = 0;
        for dir in client.list_children("/").await.unwrap_or_default() {
            count += client
                .list_children(&format!("/{dir}"))
                .await
                .map_or(0, |c| c.len());
        }
        if count >= n {
            return;
        }
        assert!(Instant::now() < deadline, "{count} nodes, waiting for {n}");
        sleep(Duration::from_millis(50)).await;
    }
}

/// A waiter whose lock directory an operator deleted (`deleteall`: the holder's node, the
/// waiters' nodes and the directory) queues again — the directory and its node made anew —
/// and is granted the lock (its holder's node went too), rather than failing with "node
/// not exists". The plain lock and the read-write lock's writer (the family's way in).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zookeeper_waiter_whose_directory_was_deleted_queues_again() {
    let server = dlock_test::zookeeper::ZooKeeper::shared();
    let url = server.url(&format!("/{}", unique("deleted")), "?session_timeout=4s");
    let (holder, waiter, admin) = (
        zk_connect(&url).await,
        zk_connect(&url).await,
        zk_connect(&url).await,
    );

    let name = unique("plain");
    let held = Lock::new(holder.clone(), &name)
        .expect("valid")
        .try_lock()
        .await
        .expect("store")
        .expect("free");
    let lock = Lock::new(waiter.clone(), &name).expect("valid");
    let waiting = tokio::spawn(async move { lock.try_lock_for(Duration::from_secs(30)).await });
    wait_for_nodes(&admin, 2).await;
    delete_all(&admin).await;
    let granted = timeout(Duration::from_secs(40), waiting)
        .await
        .expect("the waiter's wait ends")
        .expect("task")
        .expect("no error: the waiter queues again")
        .expect("granted: nobody else is left");
    assert!(granted.fencing_token() > held.fencing_token());
    timeout(Duration::from_secs(20), held.lost())
        .await
        .expect("the deleted holder learns it lost the lock");
    granted.release().await.expect("release");

    let name = unique("rw");
    let read = RwLock::new(holder.clone(), &name)
        .expect("valid")
        .try_read()
        .await
        .expect("store")
        .expect("free");
    let rw = RwLock::new(waiter.clone(), &name).expect("valid");
    let waiting = tokio::spawn(async move { rw.try_write_for(Duration::from_secs(30)).await });
    wait_for_nodes(&admin, 2).await;
    delete_all(&admin).await;
    let write = timeout(Duration::from_secs(40), waiting)
        .await
        .expect("the writer's wait ends")
        .expect("task")
        .expect("no error: the writer queues again")
        .expect("granted: the reader's node went too");
    drop(read);
    write.release().await.expect("release");
}

/// The messages of the `WARN` events the test's code logged.
#[derive(Clone, Default)]
struct Warnings(Arc<Mutex<Vec<String>>>);

struct Message<'a>(&'a mut String);

impl Visit for Message<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            *self.0 = format!("{value:?}");
        }
    }
}

impl<S: tracing::Subscriber> Layer<S> for Warnings {
    fn on_event(&self, event: &tracing::Event<'_>, _ctx: Context<'_, S>) {
        if *event.metadata().level() == tracing::Level::WARN {
            let mut message = String::new();
            event.record(&mut Message(&mut message));
            self.0
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(message);
        }
    }
}

impl Warnings {
    fn about_the_session(&self) -> usize {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter(|m| m.contains("session timeout"))
            .count()
    }
}

/// ZooKeeper: a ttl shorter than the session timeout cannot bound a crashed holder (its
/// node lives until its session expires). The hold's lease says what a living holder may
/// count on (`min(ttl, ⅔ session timeout)`), and the client warns, once, that the ttl is
/// not the crash bound; with a session no longer than the ttl, nothing is said.
#[test]
fn a_zookeeper_ttl_shorter_than_the_session_is_reported() {
    let server = dlock_test::zookeeper::ZooKeeper::shared();
    let chroot = format!("/{}", unique("short-ttl"));
    let warnings = Warnings::default();
    let subscriber = tracing_subscriber::registry().with(warnings.clone());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let ttl = Duration::from_secs(3);
    tracing::subscriber::with_default(subscriber, || {
        runtime.block_on(async {
            let long = zk_connect(&server.url(&chroot, "?session_timeout=10s")).await;
            assert!(long.session_timeout() > ttl, "{:?}", long.session_timeout());
            for _ in 0..2 {
                let guard = Lock::builder(long.clone(), unique("short"))
                    .ttl(ttl)
                    .build()
                    .expect("valid")
                    .try_lock()
                    .await
                    .expect("store")
                    .expect("free");
                assert!(guard.lease() <= ttl, "{:?}", guard.lease());
                guard.release().await.expect("release");
            }
            assert_eq!(warnings.about_the_session(), 1, "one warning per client");

            let fitting = zk_connect(&server.url(&chroot, "?session_timeout=3s")).await;
            assert!(fitting.session_timeout() <= ttl);
            let guard = Lock::builder(fitting.clone(), unique("fits"))
                .ttl(ttl)
                .build()
                .expect("valid")
                .try_lock()
                .await
                .expect("store")
                .expect("free");
            // The ⅔-of-session cap: the lease a renewal buys is shorter than the ttl.
            assert!(guard.lease() <= fitting.session_timeout() * 2 / 3);
            guard.release().await.expect("release");
            assert_eq!(
                warnings.about_the_session(),
                1,
                "a fitting session: no warning"
            );
        });
    });
}

/// ZooKeeper: a holder with `.ttl(3s)` on a 3 s session whose connection goes dead (its
/// process frozen or cut off: no release, no renewal) is replaced within the bound the
/// API states — the session timeout (`ZooKeeper::session_timeout`), plus a margin for the
/// server's tick and a busy machine. A liveness bound, not a speed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_zookeeper_holder_is_replaced_within_its_session_timeout() {
    let server = dlock_test::zookeeper::ZooKeeper::shared();
    let chroot = format!("/{}", unique("dead-holder"));
    let proxy = Proxy::start(server.members[0].addr().parse().expect("addr"))
        .await
        .expect("proxy");
    let holder = zk_connect(&format!("zk://{}{chroot}?session_timeout=3s", proxy.addr())).await;
    let other = zk_connect(&server.url(&chroot, "?session_timeout=3s")).await;
    let name = unique("dead");
    let ttl = Duration::from_secs(3);
    let guard = Lock::builder(holder.clone(), &name)
        .ttl(ttl)
        .build()
        .expect("valid")
        .try_lock()
        .await
        .expect("store")
        .expect("free");
    let bound = holder.session_timeout();
    assert!(bound <= ttl, "the session asked for is the ttl: {bound:?}");
    let next = Lock::builder(other, &name).ttl(ttl).build().expect("valid");
    let waiting = tokio::spawn(async move { next.try_lock_for(Duration::from_secs(30)).await });
    sleep(Duration::from_millis(200)).await;
    proxy.set_fault(Fault::Blackhole);
    let dead = Instant::now();
    let granted = waiting
        .await
        .expect("task")
        .expect("store")
        .expect("granted once the dead holder's session expired");
    let waited = dead.elapsed();
    assert!(
        waited <= bound + Duration::from_secs(3),
        "replaced after {waited:?}; the stated bound is the session timeout {bound:?}"
    );
    assert!(granted.fencing_token() > guard.fencing_token());
    granted.release().await.expect("release");
    proxy.set_fault(Fault::Pass);
}

/// How many rows of `dlock.waiters` match `filter` (an SQL condition on `q`).
async fn waiter_rows(admin: &tokio_postgres::Client, filter: &str, key: &str) -> i64 {
    admin
        .query_one(
            &format!("SELECT count(*) FROM dlock.waiters AS q WHERE {filter}"),
            &[&key],
        )
        .await
        .expect("count the waiters")
        .get(0)
}

/// A listener pid no session has (PostgreSQL's pids are far below it).
const DEAD_LISTENER: i32 = 2_147_483_000;

/// PostgreSQL lease mode: the places killed clients left in the waiters table are cleaned
/// by the store's own calls, not by an operator. Lapsed places of the lock's name go at
/// its first call; lapsed places of names nobody asks for again go in bounded batches
/// (256 per call); places whose client's `LISTEN` session is gone go all at once at the
/// next hand-over. Rows are counted exactly before and after, and the live waiters are
/// granted in turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_cleans_the_waiter_rows_killed_clients_left() {
    let server = PostgresServer::start().expect("postgres");
    let url = server.url();
    let pg = Postgres::connect(&url).await.expect("connect");
    let admin = server.admin().await;
    let name = unique("stale");
    let ttl = Duration::from_secs(2);
    let lock = Lock::builder(pg.clone(), &name)
        .ttl(ttl)
        .build()
        .expect("valid");
    let key = lock.keys().lock().to_owned();
    admin
        .execute(
            "INSERT INTO dlock.waiters (key, token, claim_until, ttl_ms, channel, lpid)
             SELECT $1, 'lapsed-' || g, now() - interval '1 minute', 2000, 'dlk_gone', $2
             FROM generate_series(1, 3000) AS g",
            &[&key, &DEAD_LISTENER],
        )
        .await
        .expect("plant the name's lapsed places");
    admin
        .execute(
            "INSERT INTO dlock.waiters (key, token, claim_until, ttl_ms, channel, lpid)
             SELECT 'dlock:abandoned-' || (g % 100), 'lapsed-' || g,
                    now() - interval '1 minute', 2000, 'dlk_gone', $1
             FROM generate_series(1, 2000) AS g",
            &[&DEAD_LISTENER],
        )
        .await
        .expect("plant lapsed places of names nobody asks for");
    assert_eq!(waiter_rows(&admin, "q.key = $1", &key).await, 3000);
    assert_eq!(waiter_rows(&admin, "q.key <> $1", &key).await, 2000);

    // One call on the name: its lapsed places go, and one batch of the others.
    let holder = lock.try_lock().await.expect("store").expect("free");
    assert_eq!(waiter_rows(&admin, "q.key = $1", &key).await, 0);
    assert_eq!(waiter_rows(&admin, "q.key <> $1", &key).await, 2000 - 256);

    // Live waiters (a client each, as processes) queue behind the holder, between places
    // of killed clients whose claims have not lapsed but whose listeners are gone.
    let plant_dead = |count: i32| {
        let (admin, key) = (&admin, &key);
        async move {
            admin
                .execute(
                    "INSERT INTO dlock.waiters (key, token, claim_until, ttl_ms, channel, lpid)
                     SELECT $1, 'gone-' || gen_random_uuid(), now() + interval '1 hour',
                            2000, 'dlk_gone', $2
                     FROM generate_series(1, $3) AS g",
                    &[key, &DEAD_LISTENER, &count],
                )
                .await
                .expect("plant places of clients whose listener is gone");
        }
    };
    plant_dead(1000).await;
    // Each live waiter, once granted, says so and holds until told to go on.
    let (granted_tx, mut granted) = tokio::sync::mpsc::unbounded_channel();
    let (go_tx, go) = tokio::sync::watch::channel(false);
    let mut waiting = Vec::new();
    for _ in 0..3 {
        let client = Postgres::connect(&url).await.expect("connect");
        let lock = Lock::builder(client, &name)
            .ttl(ttl)
            .build()
            .expect("valid");
        let (granted_tx, mut go) = (granted_tx.clone(), go.clone());
        waiting.push(tokio::spawn(async move {
            let guard = lock
                .try_lock_for(Duration::from_secs(60))
                .await
                .expect("store")
                .expect("granted");
            let _ = granted_tx.send(());
            go.wait_for(|go| *go).await.expect("told to go on");
            guard.release().await.expect("release");
        }));
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while waiter_rows(&admin, "q.key = $1 AND q.token NOT LIKE 'gone-%'", &key).await < 3 {
        assert!(Instant::now() < deadline, "the waiters never queued");
        sleep(Duration::from_millis(50)).await;
    }
    plant_dead(1000).await;
    assert_eq!(
        waiter_rows(&admin, "q.key = $1 AND q.lpid = 2147483000", &key).await,
        2000
    );
    holder.release().await.expect("release");
    timeout(Duration::from_secs(60), granted.recv())
        .await
        .expect("the first live waiter is handed the lock")
        .expect("a waiter");
    // That one hand-over dropped every place whose listener is gone, behind the live
    // waiters as well as in front of them.
    assert_eq!(
        waiter_rows(&admin, "q.key = $1 AND q.lpid = 2147483000", &key).await,
        0
    );
    go_tx.send(true).expect("the waiters listen");
    for w in waiting {
        timeout(Duration::from_secs(90), w)
            .await
            .expect("every live waiter is granted in turn")
            .expect("waiter task");
    }
    assert_eq!(waiter_rows(&admin, "q.key = $1", &key).await, 0);

    // The abandoned names' lapsed places go in batches as calls go on.
    for _ in 0..20 {
        if waiter_rows(&admin, "true OR q.key = $1", &key).await == 0 {
            break;
        }
        let guard = lock.try_lock().await.expect("store").expect("free");
        guard.release().await.expect("release");
    }
    assert_eq!(waiter_rows(&admin, "true OR q.key = $1", &key).await, 0);
}
