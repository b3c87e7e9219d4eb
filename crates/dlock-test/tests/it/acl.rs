//! Redis ACLs: dlock under a least-privilege user, with exactly the `ACL SETUSER` lines of
//! `docs/redis-acl.md` (read from the file, so the page and the test cannot drift apart).
//!
//! Every behaviour runs as that user against a real server, and each test then asserts that
//! `ACL LOG` recorded no denial at all: a command that failed quietly (and was retried, or
//! fell back to something slower) would show there. Negative controls remove one
//! permission and expect the matching operation to fail with a typed error.

use std::collections::HashMap;
use std::time::Duration;

use dlock_test::cluster::RedisCluster;
use dlock_test::conformance::{Target, unique};
use dlock_test::server::{RedisServer, SentinelServer};
use fencelock::backend::Redis;
use fencelock::{ErrorKind, Lock, Semaphore};

/// The page the ACL lines come from.
const DOC: &str = include_str!("../../../../docs/redis-acl.md");

/// The password the tests give the users (the page says `CHANGE-ME`).
const PASSWORD: &str = "acl-test-pw";

/// The documented `ACL SETUSER <user> …` line, its password replaced by the tests'.
fn documented(user: &str) -> Vec<String> {
    let prefix = format!("ACL SETUSER {user} ");
    let line = DOC
        .lines()
        .map(str::trim_start)
        .find(|l| l.starts_with(&prefix))
        .unwrap_or_else(|| panic!("docs/redis-acl.md has no `{prefix}…` line"));
    let rules: Vec<String> = line
        .split_whitespace()
        .skip(2)
        .map(|rule| {
            if rule == ">CHANGE-ME" {
                format!(">{PASSWORD}")
            } else {
                rule.to_owned()
            }
        })
        .collect();
    assert!(
        rules.iter().any(|r| r == &format!(">{PASSWORD}")) && rules[1] == "reset",
        "the documented line does not start from nothing with a password: {line}"
    );
    assert!(
        !rules
            .iter()
            .any(|r| r.contains("@all") || r == "allkeys" || r == "allchannels"),
        "the documented line grants everything: {line}"
    );
    rules
}

/// The line for "all of dlock".
fn full() -> Vec<String> {
    documented("dlock")
}

/// The line for the plain lock only.
pub(crate) fn plain() -> Vec<String> {
    documented("dlock-lock")
}

/// The page's extra patterns for names with a hash tag of their own, for prefix `prefix`
/// (the page writes it `P`).
pub(crate) fn tagged(prefix: &str) -> Vec<String> {
    let line = DOC
        .lines()
        .map(str::trim_start)
        .find(|l| l.starts_with("ACL SETUSER <user> "))
        .expect("docs/redis-acl.md has the hash-tagged names' patterns");
    line.split_whitespace()
        .skip(3)
        .map(|rule| {
            assert!(rule.ends_with(":P*"), "{rule}");
            format!("{}{prefix}*", &rule[..rule.len() - 2])
        })
        .collect()
}

/// The line for all of dlock on a Redis Cluster.
fn cluster() -> Vec<String> {
    documented("dlock-cluster")
}

/// The rules of the documented add-on `ACL SETUSER dlock <first> …`.
fn add_on(first: &str) -> Vec<String> {
    let prefix = format!("ACL SETUSER dlock {first}");
    let line = DOC
        .lines()
        .map(str::trim_start)
        .find(|l| l.starts_with(&prefix))
        .unwrap_or_else(|| panic!("docs/redis-acl.md has no `{prefix}…` line"));
    line.split_whitespace().skip(3).map(str::to_owned).collect()
}

/// `rules` without `rule` (which must be there).
fn without(mut rules: Vec<String>, rule: &str) -> Vec<String> {
    let before = rules.len();
    rules.retain(|r| r != rule);
    assert_eq!(rules.len(), before - 1, "{rule} is not in the line");
    rules
}

/// Servers with one restricted user (the same on every node); clients connect as that
/// user.
pub(crate) struct AclTarget {
    /// What clients connect to, without the scheme and credentials (`host:port[,…]/…`).
    url: String,
    scheme: &'static str,
    user: String,
    /// Every node whose `ACL LOG` counts, reached as the default user.
    nodes: Vec<u16>,
    /// Set when a test expects denials (a negative control).
    pub(crate) denials_expected: bool,
    /// The servers (killed on drop, after the check).
    _servers: Box<dyn std::any::Any + Send + Sync>,
}

/// Gives the user `rules[0]` exactly `rules[1..]` on the server at `port`.
fn set_user(port: u16, rules: &[String]) {
    let mut admin = admin(port);
    let () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg(rules)
        .query(&mut admin)
        .expect("ACL SETUSER");
    let () = redis::cmd("ACL")
        .arg("LOG")
        .arg("RESET")
        .query(&mut admin)
        .expect("ACL LOG RESET");
}

/// A connection as the default user (the test's admin).
fn admin(port: u16) -> redis::Connection {
    redis::Client::open(format!("redis://127.0.0.1:{port}/"))
        .and_then(|c| c.get_connection())
        .expect("admin connection")
}

impl AclTarget {
    /// A server whose user `rules[0]` has exactly `rules[1..]`.
    pub(crate) fn start(rules: &[String]) -> AclTarget {
        let server = RedisServer::start().expect("redis-server");
        set_user(server.port(), rules);
        AclTarget {
            url: format!("127.0.0.1:{}/", server.port()),
            scheme: "redis",
            user: rules[0].clone(),
            nodes: vec![server.port()],
            denials_expected: false,
            _servers: Box::new(server),
        }
    }

    /// A master and a sentinel watching it; the user (on the master) has exactly `rules`.
    fn start_sentinel(rules: &[String]) -> AclTarget {
        let master = RedisServer::start().expect("master");
        set_user(master.port(), rules);
        let sentinel = SentinelServer::start(master.port(), "aclmaster", 1).expect("sentinel");
        AclTarget {
            url: format!("{}/aclmaster", sentinel.addr()),
            scheme: "redis+sentinel",
            user: rules[0].clone(),
            nodes: vec![master.port()],
            denials_expected: false,
            _servers: Box::new((master, sentinel)),
        }
    }

    /// A 3-master cluster; the user has exactly `rules` on every node.
    fn start_cluster(rules: &[String]) -> AclTarget {
        let cluster = RedisCluster::start(3, 0).expect("redis cluster");
        let nodes: Vec<u16> = cluster.nodes.iter().map(RedisServer::port).collect();
        for port in &nodes {
            set_user(*port, rules);
        }
        let hosts: Vec<String> = nodes.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        AclTarget {
            url: hosts.join(","),
            scheme: "redis+cluster",
            user: rules[0].clone(),
            nodes,
            denials_expected: false,
            _servers: Box::new(cluster),
        }
    }

    fn url(&self) -> String {
        format!("{}://{}:{PASSWORD}@{}", self.scheme, self.user, self.url)
    }

    /// A redis-rs connection as the restricted user (single server).
    async fn user_connection(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.url())
            .expect("url")
            .get_multiplexed_async_connection()
            .await
            .expect("connect as the user")
    }

    /// What `ACL LOG` recorded on every node: (reason, object) of each denial.
    fn denials(&self) -> Vec<(String, String)> {
        let text = |e: &HashMap<String, redis::Value>, k: &str| match e.get(k) {
            Some(redis::Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
            Some(other) => format!("{other:?}"),
            None => String::new(),
        };
        let mut all = Vec::new();
        for port in &self.nodes {
            let entries: Vec<HashMap<String, redis::Value>> = redis::cmd("ACL")
                .arg("LOG")
                .query(&mut admin(*port))
                .expect("ACL LOG");
            all.extend(
                entries
                    .iter()
                    .map(|e| (text(e, "reason"), text(e, "object"))),
            );
        }
        all
    }
}

impl Drop for AclTarget {
    fn drop(&mut self) {
        if self.denials_expected || std::thread::panicking() {
            return;
        }
        // redis-rs names itself with `CLIENT SETINFO` (Redis 7.2+) and ignores a refusal;
        // the page says so.
        let denials: Vec<_> = self
            .denials()
            .into_iter()
            .filter(|(_, what)| what != "client|setinfo")
            .collect();
        assert!(
            denials.is_empty(),
            "the documented ACL of {} lacks what dlock used: {denials:?}",
            self.user
        );
    }
}

impl Target for AclTarget {
    type Backend = Redis;

    async fn client(&self) -> Redis {
        Redis::connect(self.url())
            .await
            .expect("connect as the restricted user")
    }

    async fn delete_key(&self, key: &str) {
        // On a cluster, the node that owns the key's slot deletes it; the others answer
        // MOVED.
        let deleted = self.nodes.iter().any(|port| {
            redis::cmd("DEL")
                .arg(key)
                .query::<i64>(&mut admin(*port))
                .is_ok()
        });
        assert!(deleted, "no node deleted {key}");
    }
}

/// Every primitive's behaviours as the user of "all of dlock".
mod full_line {
    crate::conformance_tests!(super::AclTarget::start(&super::full());
        fences_strictly_increase,
        waiter_wakes_on_release,
        watchdog_keeps_lock,
        extend_resets_lease,
        lost_fires_on_external_delete,
        inspection_and_administration,
        semaphore_many_permits_and_counts,
        semaphore_waiters_wake_and_lost_permits_fire,
    );
    crate::family_tests!(super::AclTarget::start(&super::full());
        reentrant_counts_holds,
        rwlock_readers_share_writers_exclude,
        rwlock_downgrade_expiry_and_cancel,
        fair_lock_grants_in_arrival_order,
        fair_lock_cancelled_and_crashed_waiters,
    );
    crate::election_tests!(super::AclTarget::start(&super::full());
        election_leader_reports_term_and_value,
        election_resign_hands_over,
        election_observe_sees_every_change_in_order,
    );
}

/// The plain lock's behaviours as the user of "the plain lock only".
mod plain_line {
    crate::conformance_tests!(super::AclTarget::start(&super::plain());
        fences_strictly_increase,
        waiter_wakes_on_release,
        watchdog_keeps_lock,
        extend_resets_lease,
        lost_fires_on_external_delete,
        bounded_waits_give_up,
    );
}

/// Each primitive's behaviours as the user of that primitive's own line, which grants
/// nothing else: a command or key pattern the line lacks fails a behaviour or shows in
/// `ACL LOG` (checked on drop).
mod semaphore_line {
    fn target() -> super::AclTarget {
        super::AclTarget::start(&super::documented("dlock-semaphore"))
    }
    crate::conformance_tests!(target();
        semaphore_never_exceeds_its_permits,
        semaphore_permits_of_a_dead_holder_come_back,
        semaphore_many_permits_and_counts,
        semaphore_waiters_wake_and_lost_permits_fire,
        semaphore_other_count_is_refused,
    );
}

mod reentrant_line {
    fn target() -> super::AclTarget {
        super::AclTarget::start(&super::documented("dlock-reentrant"))
    }
    crate::family_tests!(target();
        reentrant_excludes_other_owners,
        reentrant_counts_holds,
        reentrant_lost_cancel_and_expiry,
    );
}

mod rwlock_line {
    fn target() -> super::AclTarget {
        super::AclTarget::start(&super::documented("dlock-rwlock"))
    }
    crate::family_tests!(target();
        rwlock_readers_share_writers_exclude,
        rwlock_writer_is_not_starved,
        rwlock_downgrade_expiry_and_cancel,
    );
}

mod fair_line {
    fn target() -> super::AclTarget {
        super::AclTarget::start(&super::documented("dlock-fair"))
    }
    crate::family_tests!(target();
        fair_lock_grants_in_arrival_order,
        fair_lock_cancelled_and_crashed_waiters,
    );
}

mod election_line {
    fn target() -> super::AclTarget {
        super::AclTarget::start(&super::documented("dlock-election"))
    }
    crate::election_tests!(target();
        election_one_leader_at_a_time,
        election_leader_reports_term_and_value,
        election_resign_hands_over,
        election_observe_sees_every_change_in_order,
        election_deposed_leader_is_refused,
    );
}

/// The per-primitive lines are confined to their own keys: a user of one line cannot
/// take another primitive's lock (the plain lock here), and the refusal is typed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primitive_s_line_grants_no_other_primitive() {
    for user in [
        "dlock-semaphore",
        "dlock-reentrant",
        "dlock-rwlock",
        "dlock-fair",
        "dlock-election",
    ] {
        let mut t = AclTarget::start(&documented(user));
        t.denials_expected = true;
        let lock = Lock::new(t.client().await, unique("acl-other")).expect("valid");
        let err = lock.try_lock().await.map(|_| ()).expect_err("not its keys");
        assert_eq!(err.kind(), ErrorKind::Backend, "{user}: {err}");
        assert!(
            t.denials().iter().any(|(reason, _)| reason == "key"),
            "{user}: {:?}",
            t.denials()
        );
    }
}

/// The plain lock's inspection and force-unlock, and RedLock members, as the plain user.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_plain_line_inspects_force_unlocks_and_serves_redlock() {
    let t = AclTarget::start(&plain());
    let lock = Lock::new(t.client().await, unique("acl-plain")).expect("valid");
    assert!(!lock.is_locked().await.expect("state"));
    let guard = lock.try_lock().await.expect("store").expect("free");
    let state = lock.state().await.expect("state");
    assert_eq!(state.holder.as_deref(), Some(guard.token().as_str()));
    assert_eq!(state.last_fence, Some(guard.fencing_token().get()));
    assert!(lock.force_unlock().await.expect("force-unlock"));
    assert_eq!(
        guard.release().await.expect_err("force-unlocked").kind(),
        ErrorKind::LockLost
    );

    // RedLock over three servers, each with the plain user.
    let nodes = [AclTarget::start(&plain()), AclTarget::start(&plain()), t];
    let mut members = Vec::new();
    for n in &nodes {
        members.push(n.client().await);
    }
    let quorum = fencelock::backend::Quorum::new(members).expect("quorum");
    let lock = Lock::new(quorum, unique("acl-redlock")).expect("valid");
    let guard = lock.try_lock().await.expect("store").expect("free");
    guard.extend(Duration::from_secs(5)).await.expect("extend");
    guard.release().await.expect("release");
}

/// The fenced resource helper with the documented add-on for its keys, and `WAIT` with
/// its add-on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_fenced_and_wait_with_their_add_ons() {
    let mut rules = full();
    rules.extend(add_on("~fenced:*"));
    rules.extend(add_on("+wait"));
    let t = AclTarget::start(&rules);
    let lock = Lock::new(t.client().await, unique("acl-fenced")).expect("valid");
    let guard = lock.try_lock().await.expect("store").expect("free");
    let fence = guard.fencing_token();
    let stock = fencelock::fenced::RedisFenced::new(format!("fenced:{}", unique("stock")))
        .journal(format!("fenced:{}", unique("journal")));
    let mut conn = t.user_connection().await;
    stock
        .write(&mut conn, fence, "7")
        .await
        .expect("store")
        .expect("fresh fence");
    let newer = fencelock::FencingToken::new(fence.get() + 1);
    stock
        .write(&mut conn, newer, "6")
        .await
        .expect("store")
        .expect("newer fence");
    let stale = stock.read(&mut conn, fence).await.expect("store");
    assert!(stale.is_err(), "{stale:?}");
    assert_eq!(
        stock.read(&mut conn, newer).await.expect("store"),
        Ok(Some("6".to_owned()))
    );
    guard.release().await.expect("release");

    // One replica required, none there: a typed NotReplicated, not a permission error.
    let waiting = Redis::builder(t.url())
        .min_replicas(1)
        .replica_timeout(Duration::from_millis(50))
        .connect()
        .await
        .expect("connect");
    let lock = Lock::new(waiting, unique("acl-wait")).expect("valid");
    let err = lock.try_lock().await.map(|_| ()).expect_err("no replica");
    assert_eq!(err.kind(), ErrorKind::NotReplicated, "{err}");
}

/// The controls: each documented permission taken away breaks what needs it, with a
/// typed error (so the tests above would have caught a missing one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_evalsha_nothing_is_released() {
    let mut t = AclTarget::start(&without(full(), "+evalsha"));
    t.denials_expected = true;
    let lock = Lock::new(t.client().await, unique("acl-no-evalsha")).expect("valid");
    // The uncontended grant is a transaction (SET NX PX, INCR), no script; its release is.
    let guard = lock.try_lock().await.expect("store").expect("free");
    let err = guard.release().await.expect_err("no EVALSHA");
    assert_eq!(err.kind(), ErrorKind::Backend, "{err}");
    assert!(err.message().contains("docs/redis-acl.md"), "{err}");
    assert!(t.denials().iter().any(|(_, what)| what == "evalsha"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_companion_key_pattern_the_script_is_refused() {
    let mut t = AclTarget::start(&without(full(), "~{dlock:*"));
    t.denials_expected = true;
    let lock = Lock::new(t.client().await, unique("acl-no-fence-key")).expect("valid");
    // The acquire script's first write is fine (dlock:<name>); its INCR of the fence
    // counter ({dlock:<name>}:fence) is refused inside the script.
    let err = lock
        .try_lock()
        .await
        .map(|_| ())
        .expect_err("fence key refused");
    assert_eq!(err.kind(), ErrorKind::Backend, "{err}");
    assert!(
        t.denials().iter().any(|(reason, _)| reason == "key"),
        "{:?}",
        t.denials()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_command_the_scripts_run_the_script_fails() {
    // `ZADD` only runs when a waiter queues (queue.lua's q_join): the uncontended path
    // works, the first wait does not.
    let mut t = AclTarget::start(&without(full(), "+zadd"));
    t.denials_expected = true;
    let name = unique("acl-no-zadd");
    let lock = Lock::new(t.client().await, &name).expect("valid");
    let guard = lock.try_lock().await.expect("store").expect("free");
    let waiter = Lock::new(t.client().await, &name).expect("valid");
    let err = waiter
        .try_lock_for(Duration::from_secs(2))
        .await
        .map(|_| ())
        .expect_err("queueing needs ZADD");
    assert_eq!(err.kind(), ErrorKind::Backend, "{err}");
    guard.release().await.expect("release");
    assert!(t.denials().iter().any(|(_, what)| what == "zadd"));
}

/// Without `SUBSCRIBE`, or without the release channels, a wait still ends (the waiter
/// falls back to its timer), so no call fails: only `ACL LOG` tells, which is why every
/// test above checks it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_subscription_shows_in_the_acl_log() {
    for (rules, expected) in [
        (without(full(), "+subscribe"), "subscribe"),
        (without(full(), "&{dlock:*"), "channel"),
    ] {
        let mut t = AclTarget::start(&rules);
        t.denials_expected = true;
        let name = unique("acl-no-subscribe");
        let lock = Lock::new(t.client().await, &name).expect("valid");
        let guard = lock.try_lock().await.expect("store").expect("free");
        let waiter = Lock::new(t.client().await, &name).expect("valid");
        let _ = waiter.try_lock_for(Duration::from_millis(300)).await;
        guard.release().await.expect("release");
        let denials = t.denials();
        assert!(
            denials
                .iter()
                .any(|(reason, what)| what == expected || reason == expected),
            "{expected}: {denials:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_wait_min_replicas_is_refused() {
    let mut t = AclTarget::start(&full());
    t.denials_expected = true;
    let waiting = Redis::builder(t.url())
        .min_replicas(1)
        .replica_timeout(Duration::from_millis(50))
        .connect()
        .await
        .expect("connect");
    let lock = Lock::new(waiting, unique("acl-no-wait")).expect("valid");
    let err = lock.try_lock().await.map(|_| ()).expect_err("no WAIT");
    assert_eq!(err.kind(), ErrorKind::Backend, "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_plain_line_grants_no_other_primitive() {
    let mut t = AclTarget::start(&plain());
    t.denials_expected = true;
    let sem = Semaphore::new(t.client().await, unique("acl-sem"), 2).expect("valid");
    let err = sem
        .try_acquire()
        .await
        .map(|_| ())
        .expect_err("not its keys");
    assert_eq!(err.kind(), ErrorKind::Backend, "{err}");
}

/// Every rule of the plain lock's line is needed: with any one of them taken away, the
/// plain lock's whole life (a grant and its fence, inspection, extend, a waiter queued
/// and woken by the release, force-unlock) fails somewhere or shows a denial in
/// `ACL LOG`. The rules a short run cannot reach are named here with the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rule_of_the_plain_line_is_needed() {
    // `PING`: sent only when a subscription connection comes back after a reconnect;
    // `UNSUBSCRIBE`: only once a channel has had no waiter for two seconds (a refusal
    // leaves the channel subscribed, harmless: `a_refused_subscription_shows_in_the_acl_log`
    // shows refusals of the subscription side in `ACL LOG`).
    // `ZREMRANGEBYSCORE`: only when a waiter's claim lapsed (its client died queued);
    // `ZSCORE`: only when the lock is free while another waiter heads the queue (a barger
    // refused) or a head that takes no hand-over is woken.
    const NOT_REACHED: &[&str] = &["+ping", "+unsubscribe", "+zremrangebyscore", "+zscore"];
    let line = plain();
    // rules[0..4]: the user, `reset`, `on`, the password.
    for rule in &line[4..] {
        if NOT_REACHED.contains(&rule.as_str()) {
            continue;
        }
        let mut t = AclTarget::start(&[without(line.clone(), rule), tagged("dlock:")].concat());
        t.denials_expected = true;
        // A plain name (companions and channels under `{dlock:…}`) and one with a hash tag
        // of its own (under `{…}<length>:dlock:{…}`, the page's patterns for such names).
        // Refused, not merely failed: a wait that timed out on a loaded machine proves
        // nothing about the rule.
        let refused = |r: fencelock::Result<()>| {
            r.err().is_some_and(|e| {
                let text = format!("{e} {e:?}").to_ascii_lowercase();
                text.contains("noperm") || text.contains("no permissions")
            })
        };
        let failed = refused(plain_lock_life(&t, &unique("acl-rule")).await)
            || refused(plain_lock_life(&t, &format!("{{{}}}:rule", unique("acl-tag"))).await);
        let denials = t.denials();
        assert!(
            failed || !denials.is_empty(),
            "without {rule} the plain lock was refused nothing: the page lists a rule dlock \
             does not need"
        );
    }
}

/// The plain lock's operations, each through the store; the first error ends it.
pub(crate) async fn plain_lock_life(t: &AclTarget, name: &str) -> fencelock::Result<()> {
    let client = Redis::connect(t.url()).await?;
    let lock = Lock::new(client.clone(), name)?;
    let guard = lock.try_lock().await?.ok_or_else(|| {
        fencelock::Error::new(ErrorKind::InvalidArgument, "the fresh name was held")
    })?;
    lock.state().await?;
    guard.extend(Duration::from_secs(10)).await?;
    // Two waiters, so that one queues behind the other: the release wakes the head, whose
    // release then wakes the second.
    let mut waits = Vec::new();
    for _ in 0..2 {
        let waiter = Lock::new(Redis::connect(t.url()).await?, name)?;
        waits.push(tokio::spawn(async move {
            let next = waiter.try_lock_for(Duration::from_secs(3)).await?;
            // A waiter that was never woken by the release still gets the lock from its
            // fallback timer later; only the release's wake-up comes within the bound.
            let next =
                next.ok_or_else(|| fencelock::Error::new(ErrorKind::TimedOut, "not woken"))?;
            tokio::time::sleep(Duration::from_millis(100)).await;
            next.release().await
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    guard.release().await?;
    for wait in waits {
        wait.await.expect("the waiting task")?;
    }
    let next = lock
        .try_lock()
        .await?
        .ok_or_else(|| fencelock::Error::new(ErrorKind::InvalidArgument, "released, yet held"))?;
    lock.force_unlock().await?;
    let _ = next.release().await;
    Ok(())
}

/// Sentinel mode with the documented add-on (`+role` on the data node): the plain lock
/// waits and wakes, the election publishes and is observed, through the master the
/// sentinel names.
mod sentinel_line {
    fn target() -> super::AclTarget {
        let mut rules = super::full();
        rules.extend(super::add_on("+role"));
        super::AclTarget::start_sentinel(&rules)
    }

    crate::conformance_tests!(target(); waiter_wakes_on_release, extend_resets_lease);
    crate::election_tests!(target(); election_observe_sees_every_change_in_order);
}

/// A Redis Cluster with the documented cluster line on every node: the primitives whose
/// waits use shard channels, inspection, and `list` over every master.
mod cluster_line {
    crate::conformance_tests!(super::AclTarget::start_cluster(&super::cluster());
        waiter_wakes_on_release,
        semaphore_waiters_wake_and_lost_permits_fire,
    );
    crate::family_tests!(super::AclTarget::start_cluster(&super::cluster());
        rwlock_readers_share_writers_exclude,
    );
    crate::election_tests!(super::AclTarget::start_cluster(&super::cluster());
        election_observe_sees_every_change_in_order,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_line_inspects_and_lists_every_master() {
    let t = AclTarget::start_cluster(&cluster());
    let redis = t.client().await;
    let mut names = Vec::new();
    let mut guards = Vec::new();
    for i in 0..6 {
        let name = unique(&format!("acl-cluster-{i}"));
        let lock = Lock::new(redis.clone(), &name).expect("valid");
        guards.push(lock.try_lock().await.expect("store").expect("free"));
        assert!(lock.is_locked().await.expect("state"));
        names.push(name);
    }
    let listed = fencelock::raw::RawInspect::list(
        &redis,
        fencelock::keys::DEFAULT_PREFIX,
        "acl-cluster-*",
        100,
    )
    .await
    .expect("list");
    for name in &names {
        assert!(listed.contains(name), "{name} not in {listed:?}");
    }
    for g in guards {
        g.release().await.expect("release");
    }
}

/// The control of the Sentinel add-on: without `ROLE` on the data node, the client cannot
/// check that the address the sentinel gave is a master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_role_sentinel_mode_is_refused() {
    // Without `INFO` too: redis-rs falls back to `INFO replication` where `ROLE` is refused
    // (the lines grant `+info` for dlock's configuration check).
    let rules: Vec<String> = full().into_iter().filter(|r| r != "+info").collect();
    let mut t = AclTarget::start_sentinel(&rules);
    t.denials_expected = true;
    let err = Redis::connect(t.url())
        .await
        .map(|_| ())
        .expect_err("ROLE refused");
    assert_eq!(err.kind(), ErrorKind::Backend, "{err}");
    assert!(err.message().contains("'role'"), "{err}");
    assert!(t.denials().iter().any(|(_, what)| what == "role"));
}

/// A database other than 0 in the URL: `SELECT` at connect, which the page says to add.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_in_the_url_needs_select() {
    let mut rules = full();
    rules.push("+select".to_owned());
    let t = AclTarget::start(&rules);
    let url = format!("{}3", t.url());
    let lock = Lock::new(
        Redis::connect(&url).await.expect("connect"),
        unique("acl-db"),
    )
    .expect("valid");
    let guard = lock.try_lock().await.expect("store").expect("free");
    guard.release().await.expect("release");

    let mut t = AclTarget::start(&full());
    t.denials_expected = true;
    let url = format!("{}3", t.url());
    let err = Redis::connect(&url)
        .await
        .map(|_| ())
        .expect_err("no SELECT");
    assert!(
        matches!(err.kind(), ErrorKind::Backend | ErrorKind::Unavailable),
        "{err}"
    );
    assert!(t.denials().iter().any(|(_, what)| what == "select"));
}
