//! A closed key namespace on a real Redis server (issue 25 part 3, DESIGN.md principle 9):
//! no lock name reaches another lock's fence counter or companion keys, and a fence counter
//! of the layout before it carries over.

use std::time::Duration;

use dlock_test::conformance::Target;
use dlock_test::targets::RedisTarget;
use fencelock::backend::Redis;
use fencelock::{ErrorKind, FairLock, Lock, Owner, ReentrantLock, RwLock, Semaphore};
use tokio::time::timeout;

async fn cmd<T: redis::FromRedisValue>(
    conn: &mut redis::aio::MultiplexedConnection,
    args: &[&str],
) -> T {
    let mut c = redis::cmd(args[0]);
    for a in &args[1..] {
        c.arg(*a);
    }
    c.query_async(conn).await.expect("admin command")
}

/// The fence of one fresh hold of `name`, released at once.
async fn fence_of(client: &Redis, name: &str) -> u64 {
    let guard = Lock::new(client.clone(), name)
        .expect("valid")
        .try_lock()
        .await
        .expect("acquire")
        .expect("free");
    let fence = guard.fencing_token().get();
    guard.release().await.expect("release");
    fence
}

/// The reproduction: `{o}` three times, a force-unlock of the name `{o}:fence`
/// (whose lock key was `{o}`'s fence counter), then `{o}` again must get fence 4, not 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_unlocking_the_name_of_a_fence_counter_does_not_reset_the_fence() {
    let t = RedisTarget::start();
    let client = t.client().await;
    let fences = [
        fence_of(&client, "{o}").await,
        fence_of(&client, "{o}").await,
        fence_of(&client, "{o}").await,
    ];
    assert_eq!(fences, [1, 2, 3]);
    // Whatever it deletes, it is not `{o}`'s counter (nothing is held there).
    let _ = Lock::new(client.clone(), "{o}:fence")
        .expect("valid")
        .force_unlock()
        .await
        .expect("force-unlock");
    assert_eq!(fence_of(&client, "{o}").await, 4, "a fence was reused");
}

/// Holding `{u}:fence` (a token at the key that was `{u}`'s fence counter) must not make
/// `{u}` fail ("value is not an integer"): nobody who may name a lock can deny another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holding_the_name_of_a_fence_counter_denies_nobody() {
    let t = RedisTarget::start();
    let client = t.client().await;
    let squatter = Lock::new(client.clone(), "{u}:fence")
        .expect("valid")
        .try_lock()
        .await
        .expect("acquire {u}:fence")
        .expect("free");
    assert_eq!(fence_of(&client, "{u}").await, 1);
    assert_eq!(fence_of(&client, "{u}").await, 2);
    assert!(!squatter.is_lost());
    squatter
        .release()
        .await
        .expect("the squatter's hold is intact");
}

/// Every primitive, every companion suffix: a hold of `{t}:<suffix>` under the same
/// primitive leaves `{t}` working (on the old layout, each such hold sat at one of `{t}`'s
/// companion keys: WRONGTYPE errors, or a counter gone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_of_any_companion_name_leaves_every_primitive_working() {
    let t = RedisTarget::start();
    let client = t.client().await;
    let owner = Owner::new("namespace-test").expect("owner");
    for suffix in fencelock::keys::COMPANION_SUFFIXES {
        let squat = format!("{{t}}:{suffix}");
        let what = |kind: &str| format!("{kind} {{t}} beside a held {squat}");

        let sq = Lock::new(client.clone(), &squat).expect("valid");
        let held = sq.try_lock().await.expect("squat").expect("free");
        let g = Lock::new(client.clone(), "{t}")
            .expect("valid")
            .try_lock()
            .await;
        g.unwrap_or_else(|e| panic!("{}: {e}", what("lock")))
            .expect("free")
            .release()
            .await
            .expect("release");
        held.release().await.expect("release");

        let sq = Semaphore::new(client.clone(), &squat, 2).expect("valid");
        let held = sq.try_acquire().await.expect("squat").expect("free");
        let s = Semaphore::new(client.clone(), "{t}", 2).expect("valid");
        let g = s
            .try_acquire()
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", what("semaphore")))
            .expect("free");
        g.release().await.expect("release");
        held.release().await.expect("release");

        let sq = RwLock::new(client.clone(), &squat).expect("valid");
        let held = sq.try_write().await.expect("squat").expect("free");
        let rw = RwLock::new(client.clone(), "{t}").expect("valid");
        let r = rw
            .try_read()
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", what("read")))
            .expect("free");
        r.release().await.expect("release");
        let w = rw
            .try_write()
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", what("write")))
            .expect("free");
        w.release().await.expect("release");
        held.release().await.expect("release");
        let held = sq.try_read().await.expect("squat").expect("free");
        let w = rw
            .try_write()
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", what("write")))
            .expect("free");
        w.release().await.expect("release");
        held.release().await.expect("release");

        let sq = FairLock::new(client.clone(), &squat).expect("valid");
        let held = sq.try_lock().await.expect("squat").expect("free");
        let f = FairLock::new(client.clone(), "{t}").expect("valid");
        let g = f
            .try_lock()
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", what("fair")))
            .expect("free");
        g.release().await.expect("release");
        held.release().await.expect("release");

        let sq = ReentrantLock::new(client.clone(), &squat).expect("valid");
        let held = sq.try_lock(&owner).await.expect("squat").expect("free");
        let other = Owner::new("namespace-other").expect("owner");
        let re = ReentrantLock::new(client.clone(), "{t}").expect("valid");
        let g = re
            .try_lock(&other)
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", what("reentrant")))
            .expect("free");
        g.release().await.expect("release");
        held.release().await.expect("release");
    }
}

/// Upgrade: a counter at the old layout's place (`<lock key>:fence`) starts the moved one,
/// so the next grant's fence is higher, for every primitive that mints fences; the old key
/// is left as it was (it is another lock's key now).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_counter_of_the_old_layout_carries_over() {
    let t = RedisTarget::start();
    let client = t.client().await;
    let mut admin = t.admin().await;
    let owner = Owner::new("upgrade").expect("owner");
    for prefix in [
        fencelock::keys::DEFAULT_PREFIX,
        fencelock::DEFAULT_FAIR_PREFIX,
        fencelock::DEFAULT_RWLOCK_PREFIX,
        fencelock::DEFAULT_REENTRANT_PREFIX,
    ] {
        let old = format!("{prefix}{{m}}:fence");
        let _: () = cmd(&mut admin, &["SET", &old, "41"]).await;
        let fence = if prefix == fencelock::DEFAULT_FAIR_PREFIX {
            let l = FairLock::new(client.clone(), "{m}").expect("valid");
            let g = l.try_lock().await.expect("acquire").expect("free");
            let f = g.fencing_token().get();
            g.release().await.expect("release");
            f
        } else if prefix == fencelock::DEFAULT_RWLOCK_PREFIX {
            let l = RwLock::new(client.clone(), "{m}").expect("valid");
            let g = l.try_write().await.expect("acquire").expect("free");
            let f = g.fencing_token().get();
            g.release().await.expect("release");
            f
        } else if prefix == fencelock::DEFAULT_REENTRANT_PREFIX {
            let l = ReentrantLock::new(client.clone(), "{m}").expect("valid");
            let g = l.try_lock(&owner).await.expect("acquire").expect("free");
            let f = g.fencing_token().get();
            g.release().await.expect("release");
            f
        } else {
            fence_of(&client, "{m}").await
        };
        assert_eq!(fence, 42, "{prefix}: the old counter did not carry over");
        let kept: String = cmd(&mut admin, &["GET", &old]).await;
        assert_eq!(kept, "41", "{prefix}: the old place was written");
    }
    // Started once only: the new counter goes on from itself.
    let _: () = cmd(&mut admin, &["SET", "dlock:{m}:fence", "1000"]).await;
    assert_eq!(fence_of(&client, "{m}").await, 43);
}

/// The hand-over path mints too: a hold granted under the old layout (its counter at the
/// old place), a waiter of this version queued behind it, a force-unlock that hands the
/// lock to that waiter — the waiter's fence is above the old counter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_over_after_an_old_layout_hold_carries_the_counter_over() {
    let t = RedisTarget::start();
    let client = t.client().await;
    let mut admin = t.admin().await;
    // What an older client left: its hold of `{h}` and its counter at 7.
    let _: () = cmd(
        &mut admin,
        &["SET", "dlock:{h}", "old-holder", "PX", "60000"],
    )
    .await;
    let _: () = cmd(&mut admin, &["SET", "dlock:{h}:fence", "7"]).await;
    let lock = Lock::new(client.clone(), "{h}").expect("valid");
    let waiter = tokio::spawn(async move { lock.lock().await });
    // Let the waiter queue (bounded), then force the old hold out.
    let queue = fencelock::keys::LockKeys::new(fencelock::keys::DEFAULT_PREFIX, "{h}")
        .expect("valid")
        .companion("waiters");
    for _ in 0..100 {
        let n: i64 = cmd(&mut admin, &["ZCARD", &queue]).await;
        if n > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let forced = Lock::new(client.clone(), "{h}").expect("valid");
    assert!(forced.force_unlock().await.expect("force-unlock"));
    let guard = timeout(Duration::from_secs(30), waiter)
        .await
        .expect("the waiter is granted")
        .expect("task")
        .expect("lock");
    assert_eq!(
        guard.fencing_token().get(),
        8,
        "the hand-over reused a fence"
    );
    guard.release().await.expect("release");
}

/// Under an empty prefix (or one that starts with `{`), a name whose lock key is another
/// lock's companion key is refused before the store is touched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_key_that_is_a_companion_key_is_refused() {
    let t = RedisTarget::start();
    let client = t.client().await;
    for (prefix, name) in [("", "{dlock:x}:fence"), ("{app}:", "waiters")] {
        let err = Lock::builder(client.clone(), name)
            .prefix(prefix)
            .build()
            .expect_err(name);
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    }
    // The lock key `{app}:x` itself is fine.
    assert_eq!(
        fence_of_with(&client, "{app}:", "x").await,
        1,
        "a tagged prefix works"
    );
}

async fn fence_of_with(client: &Redis, prefix: &str, name: &str) -> u64 {
    let guard = Lock::builder(client.clone(), name)
        .prefix(prefix)
        .build()
        .expect("valid")
        .try_lock()
        .await
        .expect("acquire")
        .expect("free");
    let fence = guard.fencing_token().get();
    guard.release().await.expect("release");
    fence
}

/// A listing names each held lock once, whatever its name: tagged or not, held by readers
/// alone (no lock key), with brackets and glob characters in it; and a name matches a
/// pattern exactly when the server's own glob (`KEYS`) matches its lock key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_names_each_held_lock_once_as_the_server_matches_it() {
    use fencelock::raw::RawInspect;
    let t = RedisTarget::start();
    let client = t.client().await;
    let mut admin = t.admin().await;
    let names = [
        "job",
        "jobs",
        "{o}",
        "{o}:fence",
        "{o}x",
        "a[b]c",
        "a*b",
        "q?",
        "x}y{z}",
        "{",
        "j:readers",
    ];
    let mut guards = Vec::new();
    for name in names {
        let l = Lock::new(client.clone(), name).expect("valid");
        guards.push(l.try_lock().await.expect("acquire").expect("free"));
    }
    // A second client queued on `job`: its waiter queue exists beside the lock key.
    let other = Lock::new(t.client().await, "job").expect("valid");
    let waiter = tokio::spawn(async move { other.try_lock_for(Duration::from_secs(5)).await });
    let rw_names = ["report", "{r}report"];
    let mut reads = Vec::new();
    for name in rw_names {
        let rw = RwLock::new(client.clone(), name).expect("valid");
        reads.push(rw.read().await.expect("read"));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    for pattern in [
        "*", "job", "jo?", "{o}*", "a[b]c", "a\\[b]c", "[aq]*", "[^j]*", "*:*", "x}*",
    ] {
        let mut listed = client
            .list(fencelock::keys::DEFAULT_PREFIX, pattern, 1000)
            .await
            .expect("list");
        listed.sort();
        let mut want: Vec<String> =
            cmd::<Vec<String>>(&mut admin, &["KEYS", &format!("dlock:{pattern}")])
                .await
                .into_iter()
                .filter_map(|k| k.strip_prefix("dlock:").map(str::to_owned))
                .collect();
        want.sort();
        assert_eq!(listed, want, "pattern {pattern:?}");
    }
    let mut listed = client
        .list(fencelock::DEFAULT_RWLOCK_PREFIX, "*", 1000)
        .await
        .expect("list");
    listed.sort();
    assert_eq!(listed, ["report", "{r}report"], "held by readers alone");
    for g in guards {
        g.release().await.expect("release");
    }
    for r in reads {
        r.release().await.expect("release");
    }
    let next = waiter
        .await
        .expect("join")
        .expect("store")
        .expect("handed over");
    next.release().await.expect("release");
}

/// docs/redis-acl.md's patterns for names with a hash tag of their own: with them, such a
/// name lives under the plain lock's line without a denial in `ACL LOG` (checked when the
/// target is dropped); without them, it is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hash_tagged_name_needs_and_has_its_documented_acl_patterns() {
    use crate::acl::{AclTarget, plain, plain_lock_life, tagged};
    let name = format!("{{{}}}:x", dlock_test::conformance::unique("acl-tag"));
    let t = AclTarget::start(&[plain(), tagged(fencelock::keys::DEFAULT_PREFIX)].concat());
    plain_lock_life(&t, &name)
        .await
        .expect("the tagged name's life");
    drop(t);
    let mut t = AclTarget::start(&plain());
    t.denials_expected = true;
    let err = plain_lock_life(&t, &name).await.expect_err("refused");
    let text = format!("{err} {err:?}").to_ascii_lowercase();
    assert!(
        text.contains("noperm") || text.contains("no permissions"),
        "{err}"
    );
}
