//! The Redis semaphore's running total of permits held (the `used` companion key): it
//! equals the sum of the holders' permits after every script — leases that ran out,
//! releases, hand-overs, count changes, a force-unlock — and a semaphore written before
//! the total was kept (no total stored) works and gains one.

use std::time::Duration;

use dlock_test::conformance::{Target, unique};
use dlock_test::targets::RedisTarget;
use fencelock::backend::Redis;
use fencelock::{OtherCount, Semaphore, SemaphorePermit};
use redis::aio::MultiplexedConnection;
use tokio::time::sleep;

/// What the store holds for a semaphore, read in one atomic step.
struct Snapshot {
    /// The stored running total, if any.
    total: Option<i64>,
    /// The sum of the holders' permit counts (expired leases not yet cleaned up included).
    counted: i64,
    /// The sum of the permits of leases still live by the server's clock.
    live: i64,
}

/// The server's time, the total, the holders' counts and their leases.
type Reads = (
    (i64, i64),
    Option<i64>,
    Vec<(String, i64)>,
    Vec<(String, i64)>,
);

async fn snapshot(admin: &mut MultiplexedConnection, sem: &Semaphore<Redis>) -> Snapshot {
    let keys = sem.keys();
    let (time, total, counts, leases): Reads = redis::pipe()
        .atomic()
        .cmd("TIME")
        .cmd("GET")
        .arg(keys.companion("used"))
        .cmd("HGETALL")
        .arg(keys.companion("holders"))
        .cmd("ZRANGE")
        .arg(keys.lock())
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query_async(admin)
        .await
        .expect("read the semaphore's keys");
    let now = time.0 * 1000 + time.1 / 1000;
    let counted = counts.iter().map(|(_, n)| n).sum();
    let live = leases
        .iter()
        .filter(|(_, expiry)| *expiry > now)
        .map(|(token, _)| {
            counts
                .iter()
                .find(|(t, _)| t == token)
                .map_or(0, |(_, n)| *n)
        })
        .sum();
    Snapshot {
        total,
        counted,
        live,
    }
}

/// The total, which must be stored and equal the holders' sum.
async fn stored_total(admin: &mut MultiplexedConnection, sem: &Semaphore<Redis>) -> i64 {
    let s = snapshot(admin, sem).await;
    assert_eq!(
        s.total,
        Some(s.counted),
        "the stored total is not the sum of the holders' permits"
    );
    s.counted
}

fn semaphore(redis: Redis, name: &str, permits: u32, ttl: Duration) -> Semaphore<Redis> {
    Semaphore::builder(redis, name, permits)
        .ttl(ttl)
        .watchdog(false)
        .on_other_count(OtherCount::Adopt)
        .build()
        .expect("valid")
}

/// Holders whose leases ran out give their permits back to the total, as they leave the
/// holders, in the script that finds them expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_holders_leave_the_running_total() {
    let t = RedisTarget::start();
    let mut admin = t.admin().await;
    let name = unique("sem-total");
    let short = semaphore(t.client().await, &name, 4, Duration::from_millis(200));
    let long = semaphore(t.client().await, &name, 4, Duration::from_secs(30));
    let a = short
        .try_acquire_many(2)
        .await
        .expect("store")
        .expect("free");
    let b = long.try_acquire().await.expect("store").expect("free");
    assert_eq!(stored_total(&mut admin, &long).await, 3);
    sleep(Duration::from_millis(350)).await;
    // a's lease ran out: nothing cleaned it up yet, so the total still counts it, as the
    // holders do.
    let s = snapshot(&mut admin, &long).await;
    assert_eq!((s.total, s.counted, s.live), (Some(3), 3, 1));
    // The next acquire drops it (and its permits from the total) and fits 3 more.
    let c = long
        .try_acquire_many(3)
        .await
        .expect("store")
        .expect("a's permits came back");
    assert_eq!(stored_total(&mut admin, &long).await, 4);
    assert!(long.try_acquire().await.expect("store").is_none());
    std::mem::forget(a);
    b.release().await.expect("live");
    assert_eq!(stored_total(&mut admin, &long).await, 3);
    c.release().await.expect("live");
    let s = snapshot(&mut admin, &long).await;
    assert_eq!(
        (s.total, s.counted),
        (None, 0),
        "an empty semaphore keeps no total"
    );
}

/// A bounded random walk over acquires (short and long leases), releases, hand-overs to
/// blocked waiters, count changes and lapses: after every step the stored total (when
/// stored) is the holders' sum, and the live permits never exceed the highest count set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_running_total_never_drifts() {
    let t = RedisTarget::start();
    let mut admin = t.admin().await;
    let name = unique("sem-walk");
    let mut sems = Vec::new();
    for ttl in [120, 30_000, 150, 30_000] {
        sems.push(semaphore(
            t.client().await,
            &name,
            4,
            Duration::from_millis(ttl),
        ));
    }
    let mut held: Vec<SemaphorePermit<Redis>> = Vec::new();
    let mut waiters = Vec::new();
    let mut rng: u64 = 0x5eed_1234_abcd_0001;
    let mut next = move |n: u64| {
        rng = rng
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (rng >> 33) % n
    };
    let mut count = 4_i64;
    // Lowering the count takes no permits back from their holders: the live permits stay
    // within the highest count set.
    let mut most = count;
    let mut seen_stored = 0;
    for step in 0..120 {
        let sem = &sems[usize::try_from(next(4)).expect("small")];
        match next(7) {
            0 | 1 => {
                let n = u32::try_from(next(3) + 1).expect("small");
                if let Some(p) = sem.try_acquire_many(n).await.expect("store") {
                    held.push(p);
                }
            }
            2 if !held.is_empty() => {
                let p = held.swap_remove(usize::try_from(next(held.len() as u64)).expect("i"));
                // A lapsed lease reports lost; either way the permits leave.
                let _ = p.release().await;
            }
            3 => {
                // A waiter that blocks until a release (or a lapse) hands it a permit.
                let sem = sem.clone();
                waiters.push(tokio::spawn(async move {
                    sem.try_acquire_for(Duration::from_millis(400)).await
                }));
            }
            4 => {
                // Between 3 (the most one acquire asks for) and 6.
                let delta = if count < 6 && next(2) == 0 { 1 } else { -1 };
                if count + delta >= 3 {
                    count = i64::from(sem.add_permits(delta).await.expect("in range"));
                    most = most.max(count);
                }
            }
            5 => sleep(Duration::from_millis(60)).await,
            _ => {
                let mut still = Vec::new();
                for w in waiters.drain(..) {
                    if w.is_finished() {
                        if let Some(p) = w.await.expect("task").expect("store") {
                            held.push(p);
                        }
                    } else {
                        still.push(w);
                    }
                }
                waiters = still;
            }
        }
        let s = snapshot(&mut admin, &sems[0]).await;
        if let Some(total) = s.total {
            assert_eq!(total, s.counted, "step {step}: the total drifted");
            seen_stored += 1;
        }
        assert!(
            s.live <= most,
            "step {step}: {} live permits, more than any count set ({most})",
            s.live
        );
    }
    for w in waiters {
        if let Some(p) = w.await.expect("task").expect("store") {
            held.push(p);
        }
    }
    for p in held {
        let _ = p.release().await;
    }
    let s = snapshot(&mut admin, &sems[0]).await;
    assert_eq!(s.total.unwrap_or(s.counted), s.counted);
    assert!(seen_stored > 0, "no step ever stored a total");
}

/// A semaphore as a version without the running total wrote it (holders and counts, no
/// total) is honoured: its holder's permits count, and the first script stores the
/// total. A force-unlock drops the total with the holders.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_without_a_total_is_summed_once_and_kept() {
    let t = RedisTarget::start();
    let mut admin = t.admin().await;
    let name = unique("sem-old");
    let sem = semaphore(t.client().await, &name, 3, Duration::from_secs(30));
    let keys = sem.keys();
    let (secs, micros): (i64, i64) = redis::cmd("TIME")
        .query_async(&mut admin)
        .await
        .expect("TIME");
    let now = secs * 1000 + micros / 1000;
    let () = redis::pipe()
        .cmd("ZADD")
        .arg(keys.lock())
        .arg(now + 30_000)
        .arg("old-holder")
        .ignore()
        .cmd("HSET")
        .arg(keys.companion("holders"))
        .arg("old-holder")
        .arg(2)
        .ignore()
        .cmd("SET")
        .arg(keys.companion("permits"))
        .arg(3)
        .ignore()
        .query_async(&mut admin)
        .await
        .expect("write the old layout");
    assert!(
        sem.try_acquire_many(2).await.expect("store").is_none(),
        "the old holder's 2 permits must count"
    );
    let mine = sem.try_acquire().await.expect("store").expect("1 left");
    assert_eq!(stored_total(&mut admin, &sem).await, 3);
    // The old holder's lease runs out: its permits leave the total.
    let () = redis::cmd("ZADD")
        .arg(keys.lock())
        .arg("XX")
        .arg(now - 1)
        .arg("old-holder")
        .query_async(&mut admin)
        .await
        .expect("ZADD");
    let two = sem
        .try_acquire_many(2)
        .await
        .expect("store")
        .expect("2 free");
    assert_eq!(stored_total(&mut admin, &sem).await, 3);
    assert!(sem.force_unlock().await.expect("store"));
    let s = snapshot(&mut admin, &sem).await;
    assert_eq!((s.total, s.counted), (None, 0));
    let all = sem.try_acquire_many(3).await.expect("store").expect("free");
    assert_eq!(stored_total(&mut admin, &sem).await, 3);
    all.release().await.expect("live");
    std::mem::forget((mine, two));
}
