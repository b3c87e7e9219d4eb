//! Section 6.2, etcd: dlock's `Lock<Etcd>` on a private single-member etcd, beside
//!
//! * **limit**: the calls the backend needs, bare, with etcd-client: `LeaseGrant`, a
//!   create-if-absent transaction putting the key on that lease, `DeleteRange` (three
//!   round trips; the lease revoked in the background, as dlock does);
//! * **peer**: etcd's own lock service through etcd-client (`LeaseGrant`, `Lock`,
//!   `Unlock`; lease revoked in the background), which waits on the server;
//! * **reference**: dlock's `Lock<Redis>` on a private `redis-server` in the same run.
//!
//! Contended, both queue waiters by create revision: dlock's each watch their predecessor
//! key, etcd's `Lock` RPC does the same inside the server.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use dlock_test::server::{EtcdCluster, RedisServer};
use fencelock::backend::{Etcd, Redis};
use redis::aio::ConnectionManager;

use crate::Result;
use crate::contended::{self, BoxWaiter, LockWaiter, Waiter};
use crate::measure;
use crate::report::fmt_dur;
use crate::stores::{
    self, BoxCycle, EtcdLimit, EtcdNative, HandoffRow, LockCycle, RedisLimit, Row, Setup,
    revoke_later,
};
use crate::targets::{Goal, Targets, fairness_text};

/// Uncontended rows, in run order within a round.
const ROWS: [&str; 5] = ["limit", "dlock", "native", "redis-limit", "redis"];

/// Contended rows, in run order within a round.
const HANDOFF_ROWS: [&str; 3] = ["dlock", "native", "redis"];

/// A waiter on etcd's lock service.
///
/// Its `Lock` calls are never aborted: etcd's lock service can stop granting locks at all
/// after many waiting `Lock` calls are aborted at once (etcd issue 13336; seen here with
/// etcd 3.4.23 after a 64-waiter run ended), so a waiter that stops waiting (the end of a
/// run) leaves its call running in the background, and gives the lock on at once if it
/// gets it. The client has no per-request timeout for the same reason (a deadline is an
/// abort too); `pending` counts the calls still running, so a section can wait for them
/// to drain before measuring anything else.
struct EtcdNativeWaiter {
    /// A client of its own, without a request timeout.
    client: etcd_client::Client,
    /// `Lock` calls of this section still running.
    pending: Arc<AtomicUsize>,
}

impl Waiter for EtcdNativeWaiter {
    /// The lock's key and its lease.
    type Held = (Vec<u8>, i64);

    /// Grants a lease and waits for the lock `name` on it.
    async fn acquire(&mut self, name: &str) -> Result<(Vec<u8>, i64)> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let mut client = self.client.clone();
        let pending = Arc::clone(&self.pending);
        let name = name.to_owned();
        pending.fetch_add(1, Ordering::SeqCst);
        tokio::spawn(async move {
            let outcome = async {
                let lease = client
                    .lease_grant(contended::TTL.as_secs() as i64, None)
                    .await?
                    .id();
                let options = etcd_client::LockOptions::new().with_lease(lease);
                match client.lock(name.as_str(), Some(options)).await {
                    Ok(resp) => Ok((resp.key().to_vec(), lease)),
                    Err(err) => {
                        revoke_later(&client, lease);
                        Err(err)
                    }
                }
            }
            .await;
            if let Err(Ok((key, lease))) = tx.send(outcome) {
                // Nobody waits any more: give the lock on at once.
                let _ = client.unlock(key).await;
                revoke_later(&client, lease);
            }
            pending.fetch_sub(1, Ordering::SeqCst);
        });
        Ok(rx
            .await
            .map_err(|_| "etcd lock task ended without an answer")??)
    }

    async fn release(&mut self, (key, lease): (Vec<u8>, i64), _name: &str) -> Result<()> {
        self.client.unlock(key).await?;
        revoke_later(&self.client, lease);
        Ok(())
    }
}

/// The section's servers and clients.
pub(crate) struct Clients {
    /// Kept for its lifetime: dropping it kills the member.
    _etcd_server: EtcdCluster,
    etcd_pid: Option<u32>,
    redis_server: RedisServer,
    url: String,
    redis_url: String,
    bare: etcd_client::Client,
    etcd: Etcd,
    redis_limit: ConnectionManager,
    release_sha: String,
    redis: Redis,
    /// `Lock` calls of etcd's lock service still running (see [`EtcdNativeWaiter`]).
    native_pending: Arc<AtomicUsize>,
}

impl Setup for Clients {
    const SECTION: &'static str = "etcd";
    const STARTING: Option<&'static str> = Some("etcd: starting a member");
    const ROWS: &'static [&'static str] = &ROWS;
    const HANDOFF_ROWS: &'static [&'static str] = &HANDOFF_ROWS;

    /// Whether etcd's CPU was measured (its PID found).
    type Extra = bool;

    async fn start() -> Result<Clients> {
        let etcd_server = EtcdCluster::start(1)?;
        let etcd_pid = etcd_server
            .members
            .first()
            .and_then(|m| stores::child_pid(&m.addr()));
        let url = etcd_server.url();
        // The member elects itself first: both clients retry until it serves.
        let bare = stores::etcd_client(&url).await?;
        let etcd = stores::etcd_connect(&url).await?;
        let redis_server = RedisServer::start()?;
        let redis_url = redis_server.url();
        let mut redis_limit = measure::connection_manager(&redis_url).await?;
        let release_sha: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(stores::RELEASE)
            .query_async(&mut redis_limit)
            .await?;
        let redis = Redis::connect(redis_url.as_str()).await?;
        Ok(Clients {
            _etcd_server: etcd_server,
            etcd_pid,
            redis_server,
            url,
            redis_url,
            bare,
            etcd,
            redis_limit,
            release_sha,
            redis,
            native_pending: Arc::new(AtomicUsize::new(0)),
        })
    }

    fn extra(&self) -> bool {
        self.etcd_pid.is_some()
    }

    async fn tasks(&self, id: &'static str, n: usize, tag: &str) -> Result<Vec<BoxCycle>> {
        let mut tasks = Vec::with_capacity(n);
        for t in 0..n {
            let name = format!("bench:e:{id}:{tag}:{n}:{t}");
            let token = format!("{:032x}", 0xe7cd_0000_0000_u128 + t as u128);
            tasks.push(match id {
                "limit" => EtcdLimit::boxed(self.bare.clone(), name, token),
                "dlock" => LockCycle::boxed(self.etcd.clone(), name, stores::TTL)?,
                "native" => EtcdNative::boxed(self.bare.clone(), name),
                "redis-limit" => RedisLimit::boxed(
                    vec![self.redis_limit.clone()],
                    &self.release_sha,
                    name,
                    token,
                    None,
                ),
                _ => LockCycle::boxed(self.redis.clone(), name, stores::TTL)?,
            });
        }
        Ok(tasks)
    }

    async fn waiters(&self, id: &'static str, n: usize) -> Result<Vec<BoxWaiter>> {
        let mut waiters = Vec::with_capacity(n);
        match id {
            "redis" => {
                return contended::make_waiters(
                    contended::Client::DlockPerWaiter,
                    n,
                    &self.redis_url,
                    "",
                )
                .await;
            }
            "native" => {
                for _ in 0..n {
                    waiters.push(contended::boxed(EtcdNativeWaiter {
                        client: stores::etcd_client_with(&self.url, None).await?,
                        pending: Arc::clone(&self.native_pending),
                    }));
                }
            }
            _ => {
                for _ in 0..n {
                    waiters.push(contended::boxed(LockWaiter(
                        stores::etcd_connect(&self.url).await?,
                    )));
                }
            }
        }
        Ok(waiters)
    }

    async fn round_trips(&self) -> Result<Vec<Duration>> {
        Ok(vec![
            stores::etcd_round_trip(&self.bare, 300)
                .await?
                .quantile(0.5),
            measure::round_trip(&self.redis_url, 1_000)
                .await?
                .quantile(0.5),
        ])
    }

    /// Waits until the `Lock` calls that waiters of etcd's lock service left running have
    /// each got the lock and given it on.
    async fn settle(&self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.native_pending.load(Ordering::SeqCst) > 0 {
            if Instant::now() > deadline {
                return Err(format!(
                    "{} waits on etcd's lock service did not end within 60 s",
                    self.native_pending.load(Ordering::SeqCst)
                )
                .into());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(())
    }

    fn servers(&self) -> Vec<u32> {
        self.etcd_pid
            .into_iter()
            .chain(self.redis_server.pid())
            .collect()
    }
}

/// The section's results.
pub(crate) type Section = stores::Section<Clients>;

fn rows() -> Vec<Row> {
    vec![
        Row {
            id: "limit",
            label: "limit: bare `LeaseGrant` + create-if-absent `Txn` + `DeleteRange`".to_owned(),
            round_trips: "3".to_owned(),
            limit: Some("limit"),
            reference: None,
            peer: None,
        },
        Row {
            id: "dlock",
            label: "**dlock** `Lock<Etcd>`, one shared client".to_owned(),
            round_trips: "3".to_owned(),
            limit: Some("limit"),
            reference: Some("redis"),
            peer: Some("native"),
        },
        Row {
            id: "native",
            label: "etcd's lock service (etcd-client: `LeaseGrant` + `Lock` + `Unlock`)".to_owned(),
            round_trips: "3".to_owned(),
            limit: Some("limit"),
            reference: None,
            peer: None,
        },
        Row {
            id: "redis-limit",
            label: "Redis limit: bare `SET NX PX` + `EVALSHA`".to_owned(),
            round_trips: "2".to_owned(),
            limit: Some("redis-limit"),
            reference: None,
            peer: None,
        },
        Row {
            id: "redis",
            label: "dlock `Lock<Redis>`, one shared client (reference)".to_owned(),
            round_trips: "2".to_owned(),
            limit: Some("redis-limit"),
            reference: None,
            peer: None,
        },
    ]
}

impl Section {
    fn handoff_rows(&self) -> Vec<HandoffRow> {
        let etcd = self.rtts.first().copied().unwrap_or_default();
        let redis = self.rtts.get(1).copied().unwrap_or(etcd);
        vec![
            HandoffRow {
                id: "dlock",
                label: "**dlock** `Lock<Etcd>`, a client per waiter (create-revision queue)"
                    .to_owned(),
                rtt: etcd,
                limit: None,
                reference: Some("redis"),
                peer: Some("native"),
            },
            HandoffRow {
                id: "native",
                label: "etcd's lock service, a client per waiter (server-side queue)".to_owned(),
                rtt: etcd,
                limit: None,
                reference: Some("redis"),
                peer: None,
            },
            HandoffRow {
                id: "redis",
                label: "dlock `Lock<Redis>`, a client per waiter (reference)".to_owned(),
                rtt: redis,
                limit: None,
                reference: None,
                peer: None,
            },
        ]
    }

    /// The row 6: dlock's etcd hand-off against etcd's lock service at 8 and 64
    /// waiters (a client per waiter), and its fairness.
    pub(crate) fn targets(&self, targets: &mut Targets) {
        for n in [8, 64] {
            let what = format!("etcd, {n} waiters, a client per waiter");
            let (Some(dlock), Some(native), Some(fairness)) = (
                stores::handoff_p50(&self.handoffs, "dlock", n),
                stores::handoff_p50(&self.handoffs, "native", n),
                stores::handoff_fairness(&self.handoffs, "dlock", n),
            ) else {
                targets.not_judged(
                    6,
                    what,
                    "",
                    "≤ 1.0× / ≤ 1.5",
                    "not in this profile's waiter counts",
                );
                continue;
            };
            targets.judge(
                6,
                format!("{what}: hand-off p50 × etcd's lock service"),
                Some(dlock / native),
                format!(
                    "{:.2}× ({} vs {})",
                    dlock / native,
                    fmt_dur(Duration::from_secs_f64(dlock)),
                    fmt_dur(Duration::from_secs_f64(native))
                ),
                Goal::AtMost(1.0),
                "≤ 1.0×",
            );
            targets.judge(
                6,
                format!("{what}: fairness max/min"),
                Some(fairness),
                fairness_text(fairness),
                Goal::AtMost(1.5),
                "≤ 1.5",
            );
        }
    }

    /// The section's Markdown.
    pub(crate) fn markdown(&self) -> String {
        let etcd = self.rtts.first().copied().unwrap_or_default();
        let redis = self.rtts.get(1).copied().unwrap_or(etcd);
        let mut md = format!(
            "\n## 6.2 etcd\n\n\
             A private single-member etcd ({}; data directory in the system temp directory) \
             and a private `redis-server`, on loopback. **dlock** = \
             `Lock::builder(Etcd::connect(url)?, name).ttl(30 s)` (watchdog on): the \
             client's session lease (one per client and ttl, shared by its holds and \
             waits, granted once), one create-if-absent transaction, release by a \
             compare-on-token delete transaction. **limit** = \
             etcd-client's bare `LeaseGrant`, create-if-absent `Txn` on that lease, \
             `DeleteRange`, lease revoked in the background. **peer** = etcd's own lock \
             service via etcd-client (`LeaseGrant`, `Lock`, `Unlock`, lease revoked in the \
             background). **reference** = dlock's `Lock<Redis>` in the same run. Tasks of \
             a client share its gRPC channel. Median of {} rounds: uncontended runs of \
             {:.2} s, contended runs of {:.2} s (step-aside mode as in section 2, a client \
             per waiter, ttl 10 s). Server CPU = {}. Round trip: etcd `Range` p50 {}, Redis \
             PING p50 {}.\n\n### Uncontended\n\n",
            etcd_version(),
            self.rounds,
            self.run.as_secs_f64(),
            self.contended_run.as_secs_f64(),
            if self.extra {
                "etcd + redis-server"
            } else {
                "redis-server only (etcd's PID was not found)"
            },
            fmt_dur(etcd),
            fmt_dur(redis),
        );
        md.push_str(&stores::uncontended_table(&rows(), &self.cells));
        md.push_str(
            "\n### Contended hand-off on one hot name\n\n\
             Both queue waiters on the server in create-revision order: dlock puts each \
             acquirer's key `<lock key>/<token>` on its client's session lease and each \
             waiter watches only its predecessor, so a release wakes one waiter; etcd's `Lock` RPC \
             does the same inside the server. `p50 × peer` = dlock's hand-off p50 over etcd's \
             lock service's in the same run.\n\n",
        );
        md.push_str(&stores::handoff_table(&self.handoff_rows(), &self.handoffs));
        md
    }
}

/// `etcd 3.4.23`, from `etcd --version`.
fn etcd_version() -> String {
    std::process::Command::new("etcd")
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("etcd Version: "))
                .map(|v| format!("etcd {}", v.trim()))
        })
        .unwrap_or_else(|| "etcd".to_owned())
}
