//! The PostgreSQL backend against the lock conformance suite, plus what only it has.

mod conformance {
    crate::all_conformance_tests!(dlock_test::targets::PostgresTarget::start());
    crate::conformance_tests!(dlock_test::targets::PostgresTarget::start();
        lost_fires_when_the_store_is_frozen_past_the_ttl,
        a_partitioned_holder_loses_its_lease_and_closed_connections_recover,
    );
}

mod election {
    crate::election_tests!(dlock_test::targets::PostgresTarget::start());
}

use std::time::Duration;

use dlock_test::conformance::{Target, unique};
use dlock_test::server::free_port;
use dlock_test::targets::PostgresTarget;
use fencelock::backend::Postgres;
use fencelock::backend::postgres::schema_sql;
use fencelock::{ErrorKind, Lock};
use tokio::time::{Instant, sleep, timeout};

/// Each queued waiter's claim, by token: a waiter's every attempt rewrites its claim, so
/// claims that stay put prove that their waiters sent nothing.
async fn claims(admin: &tokio_postgres::Client, key: &str) -> Vec<(String, String)> {
    admin
        .query(
            "SELECT token, claim_until::text FROM dlock.waiters WHERE key = $1 ORDER BY arrival",
            &[&key],
        )
        .await
        .expect("waiters")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

/// Waiters on the name's gate inside the server (advisory lock waits not yet granted) and
/// sessions holding it.
async fn gate(admin: &tokio_postgres::Client, key: &str) -> (i64, i64) {
    gate_in(admin, "dlock", key).await
}

/// As [`gate`], for the name's gate in `schema` (each schema's gate keys are its own).
pub(crate) async fn gate_in(admin: &tokio_postgres::Client, schema: &str, key: &str) -> (i64, i64) {
    let row = admin
        .query_one(
            &format!(
                "SELECT count(*) FILTER (WHERE NOT granted), count(*) FILTER (WHERE granted)
                 FROM pg_locks p
                 WHERE p.locktype = 'advisory' AND p.objsubid = 1
                   AND ((p.classid::bigint << 32) | p.objid::bigint) = {schema}.gate_key($1)"
            ),
            &[&key],
        )
        .await
        .expect("pg_locks");
    (row.get(0), row.get(1))
}

/// Eight waiters in eight clients (`url_params` appended to each client's URL) behind one
/// holder; returns the holder's lock, its guard, the waiters' grants in the order they
/// come, and the lock's key. Each waiter starts once the one before it waits.
async fn eight_waiters(
    t: &PostgresTarget,
    name: &str,
    url_params: &str,
) -> (
    Lock<Postgres>,
    fencelock::LockGuard<Postgres>,
    tokio::sync::mpsc::UnboundedReceiver<(u32, fencelock::LockGuard<Postgres>)>,
    String,
) {
    let ttl = Duration::from_secs(30);
    let holder = Lock::builder(t.client().await, name)
        .ttl(ttl)
        .build()
        .expect("valid");
    let key = format!("{}{name}", fencelock::keys::DEFAULT_PREFIX);
    let guard = holder.try_lock().await.expect("store").expect("free");
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    for i in 0..8 {
        let client = Postgres::connect(&format!("{}{url_params}", t.server.url()))
            .await
            .expect("connect");
        let lock = Lock::builder(client, name).ttl(ttl).build().expect("valid");
        let tx = tx.clone();
        tokio::spawn(async move {
            let g = lock.lock().await.expect("lock");
            let _ = tx.send((i, g));
        });
        let queued = async {
            while holder.state().await.expect("store").queued != Some(i + 1) {
                sleep(Duration::from_millis(10)).await;
            }
        };
        timeout(Duration::from_secs(10), queued)
            .await
            .expect("the waiter waits (state() counts it)");
    }
    (holder, guard, rx, key)
}

/// Releases `g` and each grant after it; the order in which the waiters got the lock.
async fn pass_it_round(
    first: u32,
    mut g: fencelock::LockGuard<Postgres>,
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<(u32, fencelock::LockGuard<Postgres>)>,
) -> Vec<u32> {
    let mut order = vec![first];
    for _ in 1..8 {
        g.release().await.expect("release");
        let (next, ng) = timeout(Duration::from_secs(5), rx.recv())
            .await
            .expect("the next waiter woke")
            .expect("channel");
        order.push(next);
        g = ng;
    }
    g.release().await.expect("release");
    order
}

/// The default: waiters wait inside the server, on the name's gate (PostgreSQL's lock
/// manager queues them and wakes one per release); only the head is in the waiters table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_wait_in_the_server_and_one_release_wakes_one_in_arrival_order() {
    let t = PostgresTarget::start();
    let name = unique("gate");
    let (_holder, guard, mut rx, key) = eight_waiters(&t, &name, "").await;
    let admin = t.server.admin().await;
    assert_eq!(
        claims(&admin, &key).await.len(),
        1,
        "only the head is in the table"
    );
    assert_eq!(
        gate(&admin, &key).await,
        (7, 1),
        "seven wait for the head's gate"
    );
    guard.release().await.expect("release");
    let (first, g) = timeout(Duration::from_secs(5), rx.recv())
        .await
        .expect("the head got the lock on the release")
        .expect("channel");
    assert_eq!(first, 0, "the first waiter in line gets it");
    sleep(Duration::from_millis(300)).await;
    assert!(rx.try_recv().is_err(), "nobody else got in");
    // Nobody behind it woke: all seven still wait for the gate, which the head keeps.
    assert_eq!(
        gate(&admin, &key).await,
        (7, 1),
        "a release wakes one waiter"
    );
    assert!(
        claims(&admin, &key).await.is_empty(),
        "the head left the table"
    );
    let order = pass_it_round(first, g, &mut rx).await;
    assert_eq!(order, (0..8).collect::<Vec<_>>(), "FIFO across clients");
    assert!(
        claims(&admin, &key).await.is_empty(),
        "no place left behind"
    );
    assert_eq!(gate(&admin, &key).await, (0, 0), "no gate left held");
}

/// `?wait_connections=0`: every waiter queues in the waiters table and sleeps; a release
/// hands the lock to the head with NOTIFY and the others send nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_wait_sessions_one_release_wakes_the_head_only_in_arrival_order() {
    let t = PostgresTarget::start();
    let name = unique("herd");
    let (_holder, guard, mut rx, key) = eight_waiters(&t, &name, "?wait_connections=0").await;
    let admin = t.server.admin().await;
    let before = claims(&admin, &key).await;
    assert_eq!(before.len(), 8);
    assert_eq!(
        gate(&admin, &key).await,
        (0, 0),
        "nobody waits in the server"
    );
    guard.release().await.expect("release");
    let (first, g) = timeout(Duration::from_secs(5), rx.recv())
        .await
        .expect("the head woke on the release")
        .expect("channel");
    assert_eq!(first, 0, "the first waiter in line gets it");
    sleep(Duration::from_millis(300)).await;
    assert!(rx.try_recv().is_err(), "nobody else got in");
    // The seven behind it did not attempt again: their claims are untouched.
    assert_eq!(
        claims(&admin, &key).await,
        before[1..].to_vec(),
        "a release must wake the head only, not the herd"
    );
    let order = pass_it_round(first, g, &mut rx).await;
    assert_eq!(order, (0..8).collect::<Vec<_>>(), "FIFO across clients");
    assert!(
        claims(&admin, &key).await.is_empty(),
        "no place left behind"
    );
}

/// A waiter inside the server honours its deadline and its cancellation: nothing stays
/// waiting for the gate, and the lock goes on to the next waiter at the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_in_the_server_ends_at_its_deadline_or_cancellation_and_leaves_nothing() {
    let t = PostgresTarget::start();
    let name = unique("gate-cancel");
    let ttl = Duration::from_secs(60);
    let lock = |client| {
        Lock::builder(client, &name)
            .ttl(ttl)
            .build()
            .expect("valid")
    };
    let holder = lock(t.client().await);
    let key = format!("{}{name}", fencelock::keys::DEFAULT_PREFIX);
    let admin = t.server.admin().await;
    let guard = holder.try_lock().await.expect("store").expect("free");
    // The head takes the gate and queues; the second waits for the gate in the server.
    let head = lock(t.client().await);
    let head_wait = tokio::spawn(async move { head.lock().await });
    let second = lock(t.client().await);
    let waiting = async {
        while gate(&admin, &key).await != (0, 1) {
            sleep(Duration::from_millis(10)).await;
        }
    };
    timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the head has the gate");
    // A deadline well inside the holder's lease. The server would end this gate wait only
    // after ttl / 2 = 30 s, so returning before the 20 s guard means the deadline ended it.
    let got = timeout(
        Duration::from_secs(20),
        second.try_lock_for(Duration::from_millis(500)),
    )
    .await
    .expect("the deadline ends the wait in the server")
    .expect("store");
    assert!(got.is_none(), "the lock stayed held");
    let left = async {
        while gate(&admin, &key).await != (0, 1) {
            sleep(Duration::from_millis(10)).await;
        }
    };
    timeout(Duration::from_secs(10), left)
        .await
        .expect("the timed-out waiter left the server's queue");
    // Cancelled while waiting in the server: dropped mid-wait.
    let third = lock(t.client().await);
    let cancelled = tokio::spawn(async move { third.lock().await });
    let blocked = async {
        while gate(&admin, &key).await != (1, 1) {
            sleep(Duration::from_millis(10)).await;
        }
    };
    timeout(Duration::from_secs(10), blocked)
        .await
        .expect("the third waits in the server");
    cancelled.abort();
    let gone = async {
        while gate(&admin, &key).await != (0, 1) {
            sleep(Duration::from_millis(10)).await;
        }
    };
    timeout(Duration::from_secs(10), gone)
        .await
        .expect("the cancelled wait leaves the server's queue");
    assert_eq!(
        holder.state().await.expect("store").queued,
        Some(1),
        "the head alone"
    );
    guard.release().await.expect("release");
    let g = timeout(Duration::from_secs(5), head_wait)
        .await
        .expect("the head got it")
        .expect("task")
        .expect("lock");
    g.release().await.expect("release");
    let idle = async {
        while gate(&admin, &key).await != (0, 0)
            || !claims(&admin, &key).await.is_empty()
            || holder.state().await.expect("store").holder.is_some()
        {
            sleep(Duration::from_millis(10)).await;
        }
    };
    timeout(Duration::from_secs(10), idle)
        .await
        .expect("nothing left: no gate, no place, no holder");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holds_and_fences_survive_a_server_crash() {
    let mut t = PostgresTarget::start();
    let client = t.client().await;
    let lock = Lock::builder(client.clone(), unique("crash"))
        .ttl(Duration::from_secs(30))
        .build()
        .expect("valid");
    let guard = lock.try_lock().await.expect("store").expect("free");
    let fence = guard.fencing_token();
    t.server
        .restart()
        .expect("restart (SIGKILL, then start on the same data)");
    // The same client reconnects by itself; the hold is still there, still ours.
    let deadline = Instant::now() + Duration::from_secs(10);
    let state = loop {
        match lock.state().await {
            Ok(s) => break s,
            Err(e) if e.is_retryable() && Instant::now() < deadline => {
                sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("client did not recover: {e}"),
        }
    };
    assert_eq!(state.holder.as_deref(), Some(guard.token().as_str()));
    assert_eq!(state.last_fence, Some(fence.get()));
    guard
        .extend(Duration::from_secs(30))
        .await
        .expect("still ours after the crash");
    guard.release().await.expect("release");
    let next = lock.try_lock().await.expect("store").expect("free");
    assert!(
        next.fencing_token().get() > fence.get(),
        "fences must grow across a crash: {} after {}",
        next.fencing_token().get(),
        fence.get()
    );
    next.release().await.expect("release");
}

/// The other half of a restart: a lease that lapsed while the server was down (frozen for
/// three ttls, then killed and started again on its data) is lost — `lost()` fires, the
/// renewal does not bring it back, the old guard's release is `LockLost` — while the
/// name's fence counter survived: the next grant's fence is higher than the lapsed one's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_that_lapsed_while_the_server_was_down_is_lost_and_fences_still_grow() {
    let mut t = PostgresTarget::start();
    let ttl = Duration::from_millis(1000);
    let lock = Lock::builder(t.client().await, unique("lapsed-crash"))
        .ttl(ttl)
        .build()
        .expect("valid");
    let guard = lock.try_lock().await.expect("store").expect("free");
    let fence = guard.fencing_token().get();
    t.server.freeze();
    sleep(ttl * 3).await;
    t.server
        .restart()
        .expect("restart (SIGKILL, then start on the same data)");
    timeout(Duration::from_secs(10), guard.lost())
        .await
        .expect("lost() fires: the lease lapsed while the server was down");
    assert!(guard.is_lost());
    // The same client reconnects by itself; give a renewal round time to (wrongly) revive
    // the lease, then look: nobody holds it, and the fence is the one granted before.
    let deadline = Instant::now() + Duration::from_secs(10);
    let state = loop {
        match lock.state().await {
            Ok(s) => break s,
            Err(e) if e.is_retryable() && Instant::now() < deadline => {
                sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("client did not recover: {e}"),
        }
    };
    assert_eq!(
        state.last_fence,
        Some(fence),
        "the fence survived the crash"
    );
    sleep(ttl).await;
    let state = lock.state().await.expect("store");
    assert_eq!(
        state.holder, None,
        "a lease that lapsed by the server's clock must stay lapsed after the restart"
    );
    let other = Lock::builder(t.client().await, lock.name())
        .ttl(Duration::from_secs(30))
        .build()
        .expect("valid");
    let next = other
        .try_lock()
        .await
        .expect("store")
        .expect("free at once: the lapsed lease holds nothing");
    assert!(
        next.fencing_token().get() > fence,
        "fences must grow across a crash that outlasted the lease: {} after {fence}",
        next.fencing_token().get()
    );
    assert!(
        lock.try_lock().await.expect("store").is_none(),
        "the new holder excludes the old client"
    );
    let err = guard.release().await.expect_err("a lapsed lease");
    assert_eq!(err.kind(), ErrorKind::LockLost, "{err}");
    assert_eq!(
        lock.state().await.expect("store").holder.as_deref(),
        Some(next.token().as_str()),
        "the stale release left the new holder's lock alone"
    );
    next.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminated_connections_are_replaced_and_the_lease_kept() {
    let t = PostgresTarget::start();
    let lock = Lock::builder(t.client().await, unique("terminate"))
        .ttl(Duration::from_secs(2))
        .build()
        .expect("valid");
    let guard = lock.try_lock().await.expect("store").expect("free");
    let admin = t.server.admin().await;
    let killed: i64 = admin
        .query_one(
            "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
             WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()) t",
            &[],
        )
        .await
        .expect("terminate")
        .get(0);
    assert!(killed >= 1, "the client's connection was terminated");
    // Through two renewals (every ~650 ms), on fresh connections.
    sleep(Duration::from_millis(2500)).await;
    assert!(
        timeout(Duration::from_millis(10), guard.lost())
            .await
            .is_err(),
        "a terminated connection must not cost the lease"
    );
    guard.release().await.expect("still ours");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_credentials_read_only_servers_and_missing_privileges_are_clear_errors() {
    let t = PostgresTarget::start();
    let err = Postgres::connect(&t.server.url_as("dlock", "not-the-password"))
        .await
        .expect_err("wrong password");
    assert_eq!(err.kind(), ErrorKind::Backend, "{err}");
    assert!(err.to_string().contains("authentication"), "{err}");
    assert!(
        !err.to_string().contains("not-the-password"),
        "password leaked: {err}"
    );

    let admin = t.server.admin().await;
    admin
        .batch_execute(
            "CREATE ROLE reader LOGIN PASSWORD 'r';
             ALTER ROLE reader SET default_transaction_read_only = on;
             CREATE ROLE plain LOGIN PASSWORD 'p';",
        )
        .await
        .expect("roles");
    let err = Postgres::connect(&t.server.url_as("reader", "r"))
        .await
        .expect_err("read-only");
    assert_eq!(err.kind(), ErrorKind::Backend, "{err}");
    assert!(err.to_string().contains("read-only"), "{err}");

    // A role that may not create the schema: a clear error, nothing created.
    let err = Postgres::connect(&format!("{}?schema=fresh", t.server.url_as("plain", "p")))
        .await
        .expect_err("no CREATE");
    assert_eq!(err.kind(), ErrorKind::Backend, "{err}");
    assert!(err.to_string().contains("privilege"), "{err}");
    let made: bool = admin
        .query_one("SELECT to_regnamespace('fresh') IS NOT NULL", &[])
        .await
        .expect("query")
        .get(0);
    assert!(!made, "a failed first use leaves nothing behind");
    // Once a DBA made the schema (schema_sql) and granted its use, the role locks.
    admin
        .batch_execute(&format!(
            "{}GRANT USAGE ON SCHEMA fresh TO plain;
             GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA fresh TO plain;",
            schema_sql("fresh").expect("valid")
        ))
        .await
        .expect("schema by hand");
    let pg = Postgres::connect(&format!("{}?schema=fresh", t.server.url_as("plain", "p")))
        .await
        .expect("a pre-made schema needs no CREATE");
    let lock = Lock::new(pg, unique("granted")).expect("valid");
    lock.try_lock()
        .await
        .expect("store")
        .expect("free")
        .release()
        .await
        .expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_server_and_malformed_urls_fail_clearly() {
    let port = free_port().expect("port");
    let err = Postgres::connect(&format!("postgres://u:secret@127.0.0.1:{port}/db"))
        .await
        .expect_err("nobody listens");
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(err.is_retryable());
    assert!(
        !err.to_string().contains("secret"),
        "password leaked: {err}"
    );
    for url in [
        "postgres://h/db?schema=Upper",
        "postgres://h/db?max_connections=0",
        "postgres://h:notaport/db",
        "mysql://h/db",
    ] {
        let err = Postgres::connect(url).await.expect_err(url);
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{url}: {err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_unix_socket_url_and_many_first_clients_at_once_work() {
    let t = PostgresTarget::start();
    let pg = Postgres::connect(&t.server.socket_url())
        .await
        .expect("unix socket");
    let lock = Lock::new(pg, unique("socket")).expect("valid");
    lock.try_lock()
        .await
        .expect("store")
        .expect("free")
        .release()
        .await
        .expect("release");
    // Twenty clients creating a new schema at once: one creates it, none fails.
    let url = format!("{}?schema=together", t.server.url());
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..20 {
        let url = url.clone();
        tasks.spawn(async move { Postgres::connect(&url).await.map(|_| ()) });
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("task").expect("concurrent first use");
    }
}

/// `?schema=` isolates: the same name in two schemas is two locks — both held at once,
/// fences counted apart, each schema's waiters on a gate of their own (a waiter in one
/// schema never queues behind a waiter in the other) — while each stays exclusive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_name_in_two_schemas_is_two_locks() {
    let t = PostgresTarget::start();
    let name = unique("schemas");
    let ttl = Duration::from_secs(30);
    let url = t.server.url();
    let in_schema = |schema: &'static str| {
        let url = format!("{url}?schema={schema}");
        let name = name.clone();
        async move {
            let pg = Postgres::connect(&url).await.expect("connect");
            assert_eq!(pg.schema(), schema);
            Lock::builder(pg, name).ttl(ttl).build().expect("valid")
        }
    };
    let a = in_schema("iso_a").await;
    let b = in_schema("iso_b").await;
    let ga = a.try_lock().await.expect("store").expect("free in iso_a");
    let gb = b
        .try_lock()
        .await
        .expect("store")
        .expect("the same name in another schema is another lock");
    assert_eq!(
        (ga.fencing_token().get(), gb.fencing_token().get()),
        (1, 1),
        "each schema counts its own fences"
    );
    let default = Lock::new(t.client().await, &name).expect("valid");
    default
        .try_lock()
        .await
        .expect("store")
        .expect("free in the default schema too")
        .release()
        .await
        .expect("release");
    let a2 = in_schema("iso_a").await;
    let b2 = in_schema("iso_b").await;
    assert!(
        a2.try_lock().await.expect("store").is_none(),
        "exclusive within iso_a"
    );
    assert!(
        b2.try_lock().await.expect("store").is_none(),
        "exclusive within iso_b"
    );
    let admin = t.server.admin().await;
    let key = a.keys().lock().to_owned();
    let until_gate = |schema: &'static str, want: (i64, i64)| {
        let (admin, key) = (&admin, &key);
        async move {
            let reached = async {
                while gate_in(admin, schema, key).await != want {
                    sleep(Duration::from_millis(10)).await;
                }
            };
            timeout(Duration::from_secs(10), reached)
                .await
                .unwrap_or_else(|_| panic!("{schema}'s gate never reached {want:?}"));
        }
    };
    // A waiter in each schema takes its own schema's gate (none waits for the other's).
    let wa = tokio::spawn(async move { a2.lock().await });
    until_gate("iso_a", (0, 1)).await;
    let wb = tokio::spawn(async move { b2.lock().await });
    until_gate("iso_b", (0, 1)).await;
    until_gate("iso_a", (0, 1)).await;
    gb.release().await.expect("release in iso_b");
    let got_b = timeout(Duration::from_secs(5), wb)
        .await
        .expect("iso_b's waiter gets iso_b's lock while iso_a's stays held")
        .expect("task")
        .expect("lock");
    assert!(!wa.is_finished(), "iso_a's lock is still held");
    let state_a = a.state().await.expect("store");
    assert_eq!(state_a.holder.as_deref(), Some(ga.token().as_str()));
    assert_eq!(state_a.queued, Some(1), "iso_a's waiter alone");
    assert_eq!(got_b.fencing_token().get(), 2);
    ga.release().await.expect("release in iso_a");
    let got_a = timeout(Duration::from_secs(5), wa)
        .await
        .expect("iso_a's waiter gets in at iso_a's release")
        .expect("task")
        .expect("lock");
    assert_eq!(got_a.fencing_token().get(), 2);
    got_a.release().await.expect("release");
    got_b.release().await.expect("release");
    for schema in ["iso_a", "iso_b"] {
        until_gate(schema, (0, 0)).await;
    }
}

/// Advisory-lock mode: PostgreSQL's session locks behind dlock's API.
mod advisory {
    use std::time::Duration;

    use dlock_test::conformance::unique;
    use dlock_test::targets::PostgresTarget;
    use fencelock::backend::PgAdvisory;
    use fencelock::{ErrorKind, Lock};
    use tokio::time::{sleep, timeout};

    async fn client(t: &PostgresTarget) -> PgAdvisory {
        PgAdvisory::connect(&t.server.url()).await.expect("connect")
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn excludes_across_clients_and_shares_when_shared() {
        let t = PostgresTarget::start();
        let name = unique("adv");
        let ttl = Duration::from_secs(3);
        let a = Lock::builder(client(&t).await, &name)
            .ttl(ttl)
            .build()
            .expect("valid");
        let b = Lock::builder(client(&t).await, &name)
            .ttl(ttl)
            .build()
            .expect("valid");
        let held = a.try_lock().await.expect("store").expect("free");
        assert!(b.try_lock().await.expect("store").is_none(), "exclusive");
        let state = b.state().await.expect("store");
        assert!(
            state
                .holder
                .as_deref()
                .is_some_and(|h| h.starts_with("pid ")),
            "{state:?}"
        );
        // A waiter gets in once the holder lets go.
        let waiting = tokio::spawn(async move { b.lock().await.expect("lock") });
        sleep(Duration::from_millis(100)).await;
        held.release().await.expect("release");
        let got = timeout(Duration::from_secs(5), waiting)
            .await
            .expect("the waiter gets in")
            .expect("task");
        got.release().await.expect("release");

        // Shared: two at once; an exclusive one waits for both.
        let r1 = Lock::builder(client(&t).await.shared(), &name)
            .ttl(ttl)
            .build()
            .expect("valid");
        let r2 = Lock::builder(client(&t).await.shared(), &name)
            .ttl(ttl)
            .build()
            .expect("valid");
        let g1 = r1.try_lock().await.expect("store").expect("shared");
        let g2 = r2.try_lock().await.expect("store").expect("shared too");
        assert!(
            a.try_lock().await.expect("store").is_none(),
            "readers exclude a writer"
        );
        assert_eq!(a.state().await.expect("store").holders, Some(2));
        g1.release().await.expect("release");
        g2.release().await.expect("release");
        a.try_lock()
            .await
            .expect("store")
            .expect("free again")
            .release()
            .await
            .expect("release");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_terminated_session_fires_lost_and_frees_the_lock() {
        let t = PostgresTarget::start();
        let name = unique("adv-lost");
        let ttl = Duration::from_millis(900);
        let a = Lock::builder(client(&t).await, &name)
            .ttl(ttl)
            .build()
            .expect("valid");
        let guard = a.try_lock().await.expect("store").expect("free");
        // force_unlock terminates the holding session.
        let other = Lock::builder(client(&t).await, &name)
            .ttl(ttl)
            .build()
            .expect("valid");
        assert!(
            other.force_unlock().await.expect("store"),
            "a holder was there"
        );
        timeout(ttl * 3, guard.lost())
            .await
            .expect("lost() fires at the next check");
        let g = other
            .try_lock_for(Duration::from_secs(5))
            .await
            .expect("store")
            .expect("free once the session is gone");
        let err = guard.release().await.expect_err("gone");
        assert_eq!(err.kind(), ErrorKind::LockLost, "{err}");
        g.release().await.expect("release");
    }

    /// No ttl: a hold lasts as long as its session, however many "ttls" go by — renewed
    /// (the ttl is only how often the session is checked) or not renewed at all — and
    /// others stay excluded all along, a waiter too.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_hold_has_no_ttl_and_excludes_past_it() {
        let t = PostgresTarget::start();
        let ttl = Duration::from_millis(300);
        let name = unique("adv-no-ttl");
        let checked = Lock::builder(client(&t).await, &name)
            .ttl(ttl)
            .build()
            .expect("valid");
        let unchecked_name = unique("adv-no-watchdog");
        let unchecked = Lock::builder(client(&t).await, &unchecked_name)
            .ttl(ttl)
            .watchdog(false)
            .build()
            .expect("valid");
        let guard = checked.try_lock().await.expect("store").expect("free");
        let unrenewed = unchecked.try_lock().await.expect("store").expect("free");
        let other = Lock::builder(client(&t).await, &name)
            .ttl(ttl)
            .build()
            .expect("valid");
        let other_unchecked = Lock::builder(client(&t).await, &unchecked_name)
            .ttl(ttl)
            .build()
            .expect("valid");
        // A waiter for ten ttls gets nothing.
        assert!(
            other.try_lock_for(ttl * 10).await.expect("store").is_none(),
            "a waiter stays excluded past the ttl"
        );
        assert!(
            timeout(Duration::from_millis(10), guard.lost())
                .await
                .is_err(),
            "lost() must not fire while the session holds the lock"
        );
        assert!(!guard.is_lost());
        assert!(
            other.try_lock().await.expect("store").is_none(),
            "still held after ten ttls"
        );
        assert!(
            other_unchecked.try_lock().await.expect("store").is_none(),
            "not renewed for ten ttls, still held: the server has no expiry"
        );
        assert!(
            other.state().await.expect("store").holder.is_some(),
            "the server shows the holder"
        );
        guard.release().await.expect("release");
        let g = other
            .try_lock()
            .await
            .expect("store")
            .expect("free at the release");
        g.release().await.expect("release");
        // The guard without renewals cannot vouch for its hold any more (is_lost), but
        // its release still ends the session's lock.
        let _ = unrenewed.release().await;
        other_unchecked
            .try_lock()
            .await
            .expect("store")
            .expect("free once released")
            .release()
            .await
            .expect("release");
    }

    /// A server restart (SIGKILL, started again on its data) ends every session, and with
    /// it every advisory hold: `lost()` fires at the next check and the lock is free.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_server_restart_fires_lost_and_frees_the_lock() {
        let mut t = PostgresTarget::start();
        let name = unique("adv-restart");
        let ttl = Duration::from_millis(900);
        let a = Lock::builder(client(&t).await, &name)
            .ttl(ttl)
            .build()
            .expect("valid");
        let guard = a.try_lock().await.expect("store").expect("free");
        let other = Lock::builder(client(&t).await, &name)
            .ttl(ttl)
            .build()
            .expect("valid");
        assert!(other.try_lock().await.expect("store").is_none(), "held");
        t.server.restart().expect("restart");
        timeout(ttl * 3, guard.lost())
            .await
            .expect("lost() fires: the session holding the lock died with the server");
        let g = other
            .try_lock()
            .await
            .expect("store")
            .expect("free after the restart: no session holds it");
        assert!(
            a.try_lock().await.expect("store").is_none(),
            "the old holder's client is excluded by the new holder"
        );
        let err = guard.release().await.expect_err("gone");
        assert_eq!(err.kind(), ErrorKind::LockLost, "{err}");
        assert!(
            a.try_lock().await.expect("store").is_none(),
            "the stale release left the new holder's lock alone"
        );
        g.release().await.expect("release");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn other_code_shares_the_key_and_names_cannot_be_listed() {
        let t = PostgresTarget::start();
        let name = unique("adv-interop");
        let lock = Lock::new(client(&t).await, &name).expect("valid");
        // Another program holds the same lock by its documented key.
        let admin = t.server.admin().await;
        let key = format!("dlock:{name}");
        let got: bool = admin
            .query_one(
                "SELECT pg_try_advisory_lock(hashtextextended($1, 0))",
                &[&key],
            )
            .await
            .expect("lock")
            .get(0);
        assert!(got);
        assert!(
            lock.try_lock().await.expect("store").is_none(),
            "excluded by the other program"
        );
        let _: bool = admin
            .query_one(
                "SELECT pg_advisory_unlock(hashtextextended($1, 0))",
                &[&key],
            )
            .await
            .expect("unlock")
            .get(0);
        let guard = lock.try_lock().await.expect("store").expect("free");
        guard.release().await.expect("release");
        let err = fencelock::backend::PgAdvisory::connect("postgres://h/db?max_connections=0")
            .await
            .expect_err("bad URL");
        assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    }
}

/// A release hands the lock over to the queue's head in its own call: the head gets it
/// without calling `acquire` again — proven by taking that right away from it once it
/// queued (a woken head would then fail to get in).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_waiter_is_handed_the_lock_without_asking() {
    let t = PostgresTarget::start();
    let name = unique("hand");
    let ttl = Duration::from_secs(20);
    let holder = Lock::builder(t.client().await, &name)
        .ttl(ttl)
        .build()
        .expect("valid");
    let guard = holder.try_lock().await.expect("store").expect("free");
    let admin = t.server.admin().await;
    admin
        .batch_execute(
            "CREATE ROLE waiter LOGIN PASSWORD 'w';
             GRANT USAGE ON SCHEMA dlock TO waiter;
             GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA dlock TO waiter;",
        )
        .await
        .expect("role");
    let waiter = Lock::builder(
        Postgres::connect(&t.server.url_as("waiter", "w"))
            .await
            .expect("connect as waiter"),
        &name,
    )
    .ttl(ttl)
    .build()
    .expect("valid");
    let waiting = tokio::spawn(async move { waiter.lock().await });
    let queued = async {
        while holder.state().await.expect("store").queued != Some(1) {
            sleep(Duration::from_millis(10)).await;
        }
    };
    timeout(Duration::from_secs(10), queued)
        .await
        .expect("the waiter queues");
    admin
        .batch_execute(
            "REVOKE EXECUTE ON FUNCTION dlock.acquire(text, text, bigint, boolean, text, text,
                 bigint, boolean, integer) FROM PUBLIC",
        )
        .await
        .expect("revoke");
    let fence = guard.fencing_token().get();
    guard.release().await.expect("release");
    let got = timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the head gets the lock at once")
        .expect("task")
        .expect("handed over, not attempted");
    assert_eq!(got.fencing_token().get(), fence + 1, "the next fence");
    assert_eq!(
        holder.state().await.expect("store").holder.as_deref(),
        Some(got.token().as_str())
    );
    got.release().await.expect("release");
}

/// `sslmode=require` (or `verify-*`) connects over TLS and verifies the server's
/// certificate: against `sslrootcert`, or the platform's roots, which do not know this
/// self-signed one; `sslmode=disable` stays plain on the same server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_verifies_the_server_certificate() {
    let server = dlock_test::postgres::PostgresServer::start_tls().expect("postgres with TLS");
    let url = server.url();
    let ca = server.certificate();
    for mode in ["require", "verify-full"] {
        let pg = Postgres::connect(&format!(
            "{url}?sslmode={mode}&sslrootcert={}",
            ca.display()
        ))
        .await
        .expect("TLS with the server's CA");
        let lock = Lock::new(pg.clone(), unique("tls")).expect("valid");
        let guard = lock.try_lock().await.expect("store").expect("free");
        // The waiter's LISTEN connection is TLS too: a release reaches it.
        let waiter = Lock::new(pg, lock.name()).expect("valid");
        let waiting = tokio::spawn(async move { waiter.lock().await.expect("lock") });
        sleep(Duration::from_millis(200)).await;
        guard.release().await.expect("release");
        timeout(Duration::from_secs(5), waiting)
            .await
            .expect("woken over TLS")
            .expect("task")
            .release()
            .await
            .expect("release");
    }
    // Which sessions use TLS, as the server sees them.
    let admin = server.admin().await;
    let encrypted: i64 = admin
        .query_one(
            "SELECT count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid)
             WHERE s.ssl AND a.pid <> pg_backend_pid()",
            &[],
        )
        .await
        .expect("pg_stat_ssl")
        .get(0);
    assert!(encrypted > 0, "no TLS session seen by the server");
    let err = Postgres::connect(&format!("{url}?sslmode=require"))
        .await
        .expect_err("a self-signed certificate the platform does not trust");
    assert_eq!(err.kind(), ErrorKind::Backend, "{err}");
    assert!(err.to_string().contains("TLS"), "{err}");
    Postgres::connect(&format!("{url}?sslmode=disable"))
        .await
        .expect("plain on the same server");
    let err = Postgres::connect(&format!("{url}?sslmode=sometimes"))
        .await
        .expect_err("unknown sslmode");
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    let err = fencelock::backend::PgAdvisory::connect(&format!(
        "{url}?sslmode=require&sslrootcert={}",
        ca.display()
    ))
    .await
    .map(|_| ())
    .map_err(|e| e.kind());
    assert_eq!(err, Ok(()), "advisory mode over TLS");
}

/// A schema an older dlock made (its version function missing, a function body of its
/// own) is brought up to date by the next client that connects; the current one is left
/// alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_schema_is_brought_up_to_date_on_connect() {
    let t = PostgresTarget::start();
    let _first = t.client().await;
    let admin = t.server.admin().await;
    admin
        .batch_execute(
            "DROP FUNCTION dlock.schema_version_4();
             CREATE OR REPLACE FUNCTION dlock.gate_busy(k text) RETURNS boolean
             LANGUAGE sql AS 'SELECT true';",
        )
        .await
        .expect("an older schema");
    let _second = t.client().await;
    let row = admin
        .query_one(
            "SELECT dlock.schema_version_4(), dlock.gate_busy('nobody-waits')",
            &[],
        )
        .await
        .expect("the current schema");
    assert_eq!((row.get::<_, i32>(0), row.get::<_, bool>(1)), (4, false));
    // Up to date: the next client creates nothing (a body changed by hand stays).
    admin
        .batch_execute(
            "CREATE OR REPLACE FUNCTION dlock.gate_busy(k text) RETURNS boolean
             LANGUAGE sql AS 'SELECT true';",
        )
        .await
        .expect("a hand-made change");
    let _third = t.client().await;
    let row = admin
        .query_one("SELECT dlock.gate_busy('nobody-waits')", &[])
        .await
        .expect("gate_busy");
    assert!(row.get::<_, bool>(0), "a current schema is not re-created");
}
