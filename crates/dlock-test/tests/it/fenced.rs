//! The resource side of fencing: fencelock::fenced on real Redis and PostgreSQL servers.

use dlock_test::conformance::{Target, unique};
use dlock_test::targets::{PostgresTarget, RedisTarget};
use fencelock::fenced::{PgFencedTable, RedisFenced, StaleFence};
use fencelock::{FencingToken, Lock};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_value_refuses_fences_below_the_highest_it_saw() {
    let t = RedisTarget::start();
    let mut conn = t.admin().await;
    let key = unique("stock");
    let stock = RedisFenced::new(&key).journal(format!("{key}:journal"));
    let f = FencingToken::new;
    assert_eq!(stock.read(&mut conn, f(3)).await.expect("redis"), Ok(None));
    assert_eq!(
        stock.write(&mut conn, f(5), "10").await.expect("redis"),
        Ok(())
    );
    // The same holder again, then a newer one: accepted.
    assert_eq!(
        stock.write(&mut conn, f(5), "9").await.expect("redis"),
        Ok(())
    );
    assert_eq!(
        stock.read(&mut conn, f(6)).await.expect("redis"),
        Ok(Some("9".to_owned()))
    );
    // Older holders are turned away, reads and writes alike, and nothing changes.
    assert_eq!(
        stock.write(&mut conn, f(5), "0").await.expect("redis"),
        Err(StaleFence {
            fence: 5,
            highest: 6
        })
    );
    assert_eq!(
        stock.read(&mut conn, f(4)).await.expect("redis"),
        Err(StaleFence {
            fence: 4,
            highest: 6
        })
    );
    let value: String = redis::cmd("GET")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .expect("GET");
    assert_eq!(value, "9");
    let journal: Vec<u64> = redis::cmd("LRANGE")
        .arg(format!("{key}:journal"))
        .arg(0)
        .arg(-1)
        .query_async(&mut conn)
        .await
        .expect("LRANGE");
    assert_eq!(journal, vec![5, 5], "accepted writes only, in order");

    // With a real lock: the second holder's fence shuts the first one out.
    let lock = Lock::new(t.client().await, unique("fenced")).expect("valid");
    let first = lock.try_lock().await.expect("store").expect("free");
    let stale = first.fencing_token();
    first.release().await.expect("release");
    let second = lock.try_lock().await.expect("store").expect("free");
    assert_eq!(
        stock
            .write(&mut conn, second.fencing_token(), "8")
            .await
            .expect("redis"),
        Err(StaleFence {
            fence: second.fencing_token().get(),
            highest: 6
        }),
        "a fresh lock's fences start below this resource's"
    );
    let fresh = RedisFenced::new(unique("stock"));
    fresh
        .write(&mut conn, second.fencing_token(), "1")
        .await
        .expect("redis")
        .expect("the current holder writes");
    let refused = fresh.write(&mut conn, stale, "0").await.expect("redis");
    assert!(
        refused.is_err(),
        "the earlier holder is refused: {refused:?}"
    );
    second.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_row_refuses_fences_below_the_highest_it_saw() {
    let t = PostgresTarget::start();
    let admin = t.server.admin().await;
    admin
        .batch_execute(
            "CREATE SCHEMA shop;
             CREATE TABLE shop.stock (sku text PRIMARY KEY, qty int NOT NULL);
             INSERT INTO shop.stock VALUES ('sku-1', 2);",
        )
        .await
        .expect("table");
    let stock = PgFencedTable::new("shop.stock", "sku").expect("valid");
    admin
        .batch_execute(&stock.migration_sql())
        .await
        .expect("migration");
    admin
        .batch_execute(&stock.migration_sql())
        .await
        .expect("the migration is idempotent");
    let f = FencingToken::new;
    let sell = |fence| {
        let (stock, admin) = (&stock, &admin);
        async move {
            stock
                .update(admin, "qty = qty - 1", "qty > 0", &[], &"sku-1", f(fence))
                .await
                .expect("postgres")
        }
    };
    assert_eq!(sell(4).await, Ok(1));
    assert_eq!(sell(4).await, Ok(1), "the same holder twice");
    assert_eq!(sell(4).await, Ok(0), "sold out: the condition is false");
    assert_eq!(
        sell(3).await,
        Err(StaleFence {
            fence: 3,
            highest: 4
        })
    );
    // Parameters of your own, and a fenced read.
    let restock = stock
        .update(&admin, "qty = qty + $1", "", &[&5i32], &"sku-1", f(7))
        .await
        .expect("postgres");
    assert_eq!(restock, Ok(1));
    let row = stock
        .read(&admin, "qty", &"sku-1", f(7))
        .await
        .expect("postgres")
        .expect("current")
        .expect("the row");
    assert_eq!(row.get::<_, i32>(0), 5);
    assert_eq!(
        stock
            .read(&admin, "qty", &"sku-1", f(6))
            .await
            .expect("postgres")
            .map(|_| ()),
        Err(StaleFence {
            fence: 6,
            highest: 7
        })
    );
    assert_eq!(
        stock
            .update(&admin, "qty = 0", "", &[], &"sku-missing", f(9))
            .await
            .expect("postgres"),
        Ok(0),
        "no such row"
    );
    let qty: i32 = admin
        .query_one("SELECT qty FROM shop.stock WHERE sku = 'sku-1'", &[])
        .await
        .expect("select")
        .get(0);
    assert_eq!(qty, 5, "refused updates changed nothing");
    for bad in ["Stock", "a.b.c", "x; DROP TABLE y", ""] {
        assert!(PgFencedTable::new(bad, "sku").is_err(), "{bad}");
    }
}

/// The oversell demo's idea applied to terms: a leader that stalls past its lease (its
/// runtime blocked, as a GC pause would block it) is replaced, and when it wakes up its
/// writes under the old term are refused by a resource that checks the term.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deposed_leader_s_writes_are_refused_by_term() {
    use std::time::Duration;

    let t = RedisTarget::start();
    let name = unique("elect-fenced");
    let schedule = RedisFenced::new(unique("schedule"));
    let ttl = Duration::from_millis(600);

    // The old leader lives on a runtime of its own that we block.
    let old_client = t.client().await;
    let (name2, schedule2, url) = (name.clone(), schedule.clone(), t.server.url());
    let (led_tx, led_rx) = std::sync::mpsc::channel();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let old = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let mut conn = redis::Client::open(url)
                .expect("url")
                .get_multiplexed_async_connection()
                .await
                .expect("connection");
            let election = fencelock::Election::builder(old_client, &name2)
                .ttl(ttl)
                .build()
                .expect("valid");
            let leadership = election.campaign("old").await.expect("campaign");
            let term = leadership.term();
            schedule2
                .write(&mut conn, term, "run by old")
                .await
                .expect("redis")
                .expect("the leader writes");
            led_tx.send(term).expect("send");
            // A stall longer than the lease: nothing on this runtime runs, renewals
            // included.
            go_rx.recv().expect("go");
            let late = schedule2
                .write(&mut conn, term, "late write by old")
                .await
                .expect("redis");
            (term, late, leadership.is_lost())
        })
    });
    let old_term = led_rx.recv().expect("old leads");
    let election = fencelock::Election::builder(t.client().await, &name)
        .ttl(ttl)
        .build()
        .expect("valid");
    let new = tokio::time::timeout(Duration::from_secs(10), election.campaign("new"))
        .await
        .expect("the stalled leader's lease runs out")
        .expect("campaign");
    assert!(new.term() > old_term);
    let mut conn = t.admin().await;
    schedule
        .write(&mut conn, new.term(), "run by new")
        .await
        .expect("redis")
        .expect("the new leader writes");
    go_tx.send(()).expect("wake the old leader");
    let (term, late, lost) = old.join().expect("old leader thread");
    assert_eq!(term, old_term);
    assert_eq!(
        late,
        Err(StaleFence {
            fence: old_term.get(),
            highest: new.term().get()
        }),
        "the deposed leader's write was accepted"
    );
    assert!(lost, "the deposed leader knows it lost");
    let value: String = redis::cmd("GET")
        .arg(schedule.key())
        .query_async(&mut conn)
        .await
        .expect("GET");
    assert_eq!(value, "run by new");
    new.resign().await.expect("resign");
}
