//! The resource side of fencing: dlock::fenced on real Redis and PostgreSQL servers.

use dlock::fenced::{PgFencedTable, RedisFenced, StaleFence};
use dlock::{FencingToken, Lock};
use dlock_test::conformance::{Target, unique};
use dlock_test::targets::{PostgresTarget, RedisTarget};

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
