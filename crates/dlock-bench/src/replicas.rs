//! Section 8, replica acknowledgement: dlock's `Lock` on a master with one replica, with
//! `Redis::builder(url).min_replicas(1)` (every grant and renewal followed by `WAIT 1
//! timeout` in the same round trip) beside the same lock without `WAIT` on the same
//! master, each beside its bare-command limit (`SET NX PX` [+ `WAIT`] + `EVALSHA`), and
//! rslock (which has no `WAIT`) as the peer of the plain lock.

use std::time::{Duration, Instant};

use dlock_test::server::RedisServer;
use fencelock::backend::Redis;
use redis::aio::ConnectionManager;

use crate::Result;
use crate::contended::BoxWaiter;
use crate::measure;
use crate::report::fmt_dur;
use crate::stores::{self, BoxCycle, LockCycle, RedisLimit, Row, RslockCycle, Setup};

/// `WAIT`'s timeout for dlock and the limit. Far above the replica's acknowledgement time
/// (it only bounds a failure), so that a busy shared machine does not fail the run.
const REPLICA_TIMEOUT: Duration = Duration::from_secs(1);

/// Every row, in run order within a round.
const ROWS: [&str; 5] = ["limit", "limit-wait", "dlock", "dlock-wait", "rslock"];

/// The section's servers and clients.
pub(crate) struct Clients {
    master: RedisServer,
    replica: RedisServer,
    url: String,
    limit: ConnectionManager,
    release_sha: String,
    plain: Redis,
    waiting: Redis,
    rslock: rslock::LockManager,
}

impl Setup for Clients {
    const SECTION: &'static str = "replicas";
    const ROWS: &'static [&'static str] = &ROWS;

    type Extra = ();

    async fn start() -> Result<Clients> {
        // Redis 7 waits 5 s before a diskless first sync, for more replicas to join.
        let master = RedisServer::start_with(&["--repl-diskless-sync-delay", "0"])?;
        let port = master.port().to_string();
        let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &port])?;
        // The replica must have finished its first sync, or WAIT counts nobody.
        let mut conn = measure::connection_manager(&replica.url()).await?;
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let info: String = redis::cmd("INFO")
                .arg("replication")
                .query_async(&mut conn)
                .await?;
            if info.contains("master_link_status:up") {
                break;
            }
            if Instant::now() > deadline {
                return Err("the replica did not sync within 20 s".into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let url = master.url();
        let mut limit = measure::connection_manager(&url).await?;
        let release_sha: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(stores::RELEASE)
            .query_async(&mut limit)
            .await?;
        let plain = Redis::connect(url.as_str()).await?;
        let waiting = Redis::builder(url.as_str())
            .min_replicas(1)
            .replica_timeout(REPLICA_TIMEOUT)
            .connect()
            .await?;
        let rslock = stores::rslock_manager(std::slice::from_ref(&url)).await?;
        Ok(Clients {
            master,
            replica,
            url,
            limit,
            release_sha,
            plain,
            waiting,
            rslock,
        })
    }

    fn extra(&self) {}

    async fn tasks(&self, id: &'static str, n: usize, tag: &str) -> Result<Vec<BoxCycle>> {
        let wait = Some((1, REPLICA_TIMEOUT.as_millis() as u64));
        let mut tasks = Vec::with_capacity(n);
        for t in 0..n {
            let name = format!("bench:w:{id}:{tag}:{n}:{t}");
            let token = format!("{:032x}", 0x3a17_0000_0000_u128 + t as u128);
            let conn = vec![self.limit.clone()];
            tasks.push(match id {
                "limit" => RedisLimit::boxed(conn, &self.release_sha, name, token, None),
                "limit-wait" => RedisLimit::boxed(conn, &self.release_sha, name, token, wait),
                "dlock" => LockCycle::boxed(self.plain.clone(), name, stores::TTL)?,
                "dlock-wait" => LockCycle::boxed(self.waiting.clone(), name, stores::TTL)?,
                _ => RslockCycle::boxed(self.rslock.clone(), name),
            });
        }
        Ok(tasks)
    }

    async fn waiters(&self, _id: &'static str, _n: usize) -> Result<Vec<BoxWaiter>> {
        Err("the replica section has no contended runs".into())
    }

    async fn round_trips(&self) -> Result<Vec<Duration>> {
        Ok(vec![
            measure::round_trip(&self.url, 1_000).await?.quantile(0.5),
        ])
    }

    fn servers(&self) -> Vec<u32> {
        [self.master.pid(), self.replica.pid()]
            .into_iter()
            .flatten()
            .collect()
    }
}

/// The section's results.
pub(crate) type Section = stores::Section<Clients>;

fn rows() -> Vec<Row> {
    vec![
        Row {
            id: "limit",
            label: "limit: bare `SET NX PX` + `EVALSHA`".to_owned(),
            round_trips: "2".to_owned(),
            limit: Some("limit"),
            reference: None,
            peer: None,
        },
        Row {
            id: "limit-wait",
            label: "limit: bare `SET NX PX` + `WAIT 1` pipelined, then `EVALSHA`".to_owned(),
            round_trips: "2 (+ the replica's ack)".to_owned(),
            limit: Some("limit-wait"),
            reference: Some("limit"),
            peer: None,
        },
        Row {
            id: "dlock",
            label: "dlock `Lock`, no `WAIT` (reference)".to_owned(),
            round_trips: "2".to_owned(),
            limit: Some("limit"),
            reference: None,
            peer: Some("rslock"),
        },
        Row {
            id: "dlock-wait",
            label: "**dlock** `Lock`, `min_replicas(1)`".to_owned(),
            round_trips: "2 (+ the replica's ack)".to_owned(),
            limit: Some("limit-wait"),
            reference: Some("dlock"),
            peer: None,
        },
        Row {
            id: "rslock",
            label: "rslock 0.10 (no `WAIT`)".to_owned(),
            round_trips: "2".to_owned(),
            limit: Some("limit"),
            reference: None,
            peer: None,
        },
    ]
}

impl Section {
    /// The section's Markdown.
    pub(crate) fn markdown(&self) -> String {
        let mut md = format!(
            "\n## 8. Replica acknowledgement (`WAIT`) on a master with one replica\n\n\
             A master and one replica (`--replicaof`, first sync done) on loopback. \
             **dlock, `min_replicas(1)`** = `Redis::builder(url).min_replicas(1)\
             .replica_timeout({} ms)`: every grant is followed by `WAIT 1 {}` in the same \
             round trip (releases are not). **reference** = the same lock without `WAIT` on \
             the same master; **limit** = the bare commands, with and without the pipelined \
             `WAIT`; rslock has no `WAIT`. Tasks share one client: `WAIT` blocks the \
             connection it is sent on, so the bare limit's tasks queue behind it on their \
             one connection, while dlock sends each grant + `WAIT` on a pooled connection \
             of its own. Median of {} rounds of {:.2} s runs; server CPU = master + replica. \
             PING round trip: p50 {}.\n\n",
            REPLICA_TIMEOUT.as_millis(),
            REPLICA_TIMEOUT.as_millis(),
            self.rounds,
            self.run.as_secs_f64(),
            fmt_dur(self.rtts.first().copied().unwrap_or_default()),
        );
        md.push_str(&stores::uncontended_table(&rows(), &self.cells));
        md
    }
}
