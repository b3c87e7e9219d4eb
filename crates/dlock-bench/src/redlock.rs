//! Section 3, RedLock: dlock's `Quorum<Redis>` over 3 and 5 private `redis-server`s,
//! uncontended, beside
//!
//! * **limit**: the same bare commands (`SET NX PX`, then `EVALSHA` compare-and-delete)
//!   sent to every node at once: two round trips to the slowest node;
//! * **reference**: the same client on ONE node (dlock's single-node `Lock`);
//! * **peer**: rslock's `LockManager` over the same 3 or 5 servers (its RedLock).
//!
//! The target — RedLock over 5 nodes acquires within 1.5× the single node — is
//! read from the acquire p50 at one task.

use std::time::Duration;

use dlock_test::server::RedisServer;
use fencelock::backend::{Quorum, Redis};
use redis::aio::ConnectionManager;

use crate::Result;
use crate::contended::BoxWaiter;
use crate::measure;
use crate::report::fmt_dur;
use crate::stores::{self, BoxCycle, LockCycle, RedisLimit, Row, RslockCycle, Setup};
use crate::targets::{Goal, Targets, ratio_text, tasks_text};

/// Node counts of the quorums.
const NODES: [usize; 2] = [3, 5];

/// Every row, in run order within a round: each node count's limit, dlock and rslock.
const ROWS: [&str; 9] = [
    "limit-1", "dlock-1", "rslock-1", "limit-3", "dlock-3", "rslock-3", "limit-5", "dlock-5",
    "rslock-5",
];

fn nodes_of(id: &str) -> usize {
    id.rsplit('-')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1)
}

/// The section's servers and clients.
pub(crate) struct Clients {
    /// Five servers; node counts use the first 1, 3 or 5.
    servers: Vec<RedisServer>,
    urls: Vec<String>,
    limit: Vec<ConnectionManager>,
    release_sha: String,
    redis: Vec<Redis>,
    quorum3: Quorum<Redis>,
    quorum5: Quorum<Redis>,
    rslock: Vec<(usize, rslock::LockManager)>,
}

impl Setup for Clients {
    const SECTION: &'static str = "redlock";
    const ROWS: &'static [&'static str] = &ROWS;

    type Extra = ();

    async fn start() -> Result<Clients> {
        let mut servers = Vec::new();
        for _ in 0..5 {
            servers.push(RedisServer::start()?);
        }
        let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
        let mut limit = Vec::new();
        let mut release_sha = String::new();
        let mut redis = Vec::new();
        for url in &urls {
            let mut conn = measure::connection_manager(url).await?;
            release_sha = redis::cmd("SCRIPT")
                .arg("LOAD")
                .arg(stores::RELEASE)
                .query_async(&mut conn)
                .await?;
            limit.push(conn);
            redis.push(Redis::connect(url.as_str()).await?);
        }
        let quorum3 = Quorum::new(redis[..3].to_vec())?;
        let quorum5 = Quorum::new(redis.clone())?;
        let mut rslock = Vec::new();
        for n in [1, 3, 5] {
            rslock.push((n, stores::rslock_manager(&urls[..n]).await?));
        }
        Ok(Clients {
            servers,
            urls,
            limit,
            release_sha,
            redis,
            quorum3,
            quorum5,
            rslock,
        })
    }

    fn extra(&self) {}

    async fn tasks(&self, id: &'static str, n: usize, tag: &str) -> Result<Vec<BoxCycle>> {
        let nodes = nodes_of(id);
        let mut tasks = Vec::with_capacity(n);
        for t in 0..n {
            let name = format!("bench:q:{id}:{tag}:{n}:{t}");
            let token = format!("{:032x}", 0x0e0d_0000_0000_u128 + t as u128);
            tasks.push(match id {
                _ if id.starts_with("limit") => RedisLimit::boxed(
                    self.limit[..nodes].to_vec(),
                    &self.release_sha,
                    name,
                    token,
                    None,
                ),
                "dlock-1" => LockCycle::boxed(self.redis[0].clone(), name, stores::TTL)?,
                "dlock-3" => LockCycle::boxed(self.quorum3.clone(), name, stores::TTL)?,
                "dlock-5" => LockCycle::boxed(self.quorum5.clone(), name, stores::TTL)?,
                _ => {
                    let manager = self
                        .rslock
                        .iter()
                        .find(|(k, _)| *k == nodes)
                        .map(|(_, m)| m.clone())
                        .ok_or("no rslock manager")?;
                    RslockCycle::boxed(manager, name)
                }
            });
        }
        Ok(tasks)
    }

    async fn waiters(&self, _id: &'static str, _n: usize) -> Result<Vec<BoxWaiter>> {
        Err("the RedLock section has no contended runs".into())
    }

    async fn round_trips(&self) -> Result<Vec<Duration>> {
        Ok(vec![
            measure::round_trip(&self.urls[0], 1_000)
                .await?
                .quantile(0.5),
        ])
    }

    fn servers(&self) -> Vec<u32> {
        self.servers.iter().filter_map(RedisServer::pid).collect()
    }
}

/// The section's results.
pub(crate) type Section = stores::Section<Clients>;

fn rows() -> Vec<Row> {
    let mut rows = Vec::new();
    for (nodes, limit, dlock, rslock) in [
        (1, "limit-1", "dlock-1", "rslock-1"),
        (3, "limit-3", "dlock-3", "rslock-3"),
        (5, "limit-5", "dlock-5", "rslock-5"),
    ] {
        let one = nodes == 1;
        let on = if one {
            "1 node".to_owned()
        } else {
            format!("{nodes} nodes")
        };
        let trips = if one {
            "2".to_owned()
        } else {
            format!("2, to {nodes} nodes at once")
        };
        rows.push(Row {
            id: limit,
            label: format!("limit: bare `SET NX PX` + `EVALSHA`, {on}"),
            round_trips: trips.clone(),
            limit: Some(limit),
            reference: (!one).then_some("limit-1"),
            peer: None,
        });
        rows.push(Row {
            id: dlock,
            label: if one {
                "dlock `Lock<Redis>`, 1 node (reference)".to_owned()
            } else {
                format!("**dlock** `Lock<Quorum<Redis>>`, {on}")
            },
            round_trips: trips.clone(),
            limit: Some(limit),
            reference: (!one).then_some("dlock-1"),
            peer: Some(rslock),
        });
        rows.push(Row {
            id: rslock,
            label: format!("rslock 0.10, {on}"),
            round_trips: trips,
            limit: Some(limit),
            reference: (!one).then_some("rslock-1"),
            peer: None,
        });
    }
    rows
}

impl Section {
    /// The row 7: dlock's RedLock over 3 and 5 nodes against rslock's, at each task
    /// count of the run.
    pub(crate) fn targets(&self, targets: &mut Targets) {
        let mut tasks: Vec<usize> = self.cells.iter().map(|c| c.n).collect();
        tasks.dedup();
        for n in tasks {
            for nodes in NODES {
                let (dlock, rslock) = (format!("dlock-{nodes}"), format!("rslock-{nodes}"));
                let (dlock, rslock) = (
                    stores::rate(&self.cells, &dlock, n),
                    stores::rate(&self.cells, &rslock, n),
                );
                targets.judge(
                    7,
                    format!(
                        "RedLock {nodes} nodes, {}: cycles/s × rslock",
                        tasks_text(n)
                    ),
                    dlock.zip(rslock).map(|(d, r)| d / r),
                    dlock
                        .zip(rslock)
                        .map(|(d, r)| ratio_text(d, r))
                        .unwrap_or_default(),
                    Goal::AtLeast(1.0),
                    "≥ 1.0×",
                );
            }
        }
    }

    /// `(RedLock-5 acquire p50, single-node acquire p50)` at one task, if measured.
    pub(crate) fn target(&self) -> Option<(Duration, Duration)> {
        Some((
            stores::acquire_p50(&self.cells, "dlock-5", 1)?,
            stores::acquire_p50(&self.cells, "dlock-1", 1)?,
        ))
    }

    /// The section's Markdown.
    pub(crate) fn markdown(&self) -> String {
        let mut md = format!(
            "\n## 3. RedLock over 3 and 5 nodes\n\n\
             Uncontended: each task locks and releases its own name in a loop, all tasks of \
             a client sharing its connections (one per node). **dlock** = \
             `Lock::builder(Quorum::new(nodes)?, name)` over {} and {} private \
             `redis-server`s (default options: 30 s ttl, watchdog on, node timeout 10 % of \
             the ttl). **limit** = the bare commands of section 1 (`SET NX PX`, then \
             `EVALSHA` compare-and-delete) sent to every node at once. **reference** \
             (`× reference`) = the same client on one node. **peer** = rslock's \
             `LockManager` over the same servers. Median of {} rounds of {:.2} s runs, every \
             row of a round one after another. Acquire = `lock()` alone; server CPU = all \
             five redis-servers' CPU time over the run per cycle. PING round trip: p50 {}.\n\n",
            NODES[0],
            NODES[1],
            self.rounds,
            self.run.as_secs_f64(),
            fmt_dur(self.rtts.first().copied().unwrap_or_default()),
        );
        md.push_str(&stores::uncontended_table(&rows(), &self.cells));
        if let Some((five, one)) = self.target() {
            let ratio = five.as_secs_f64() / one.as_secs_f64().max(1e-9);
            md.push_str(&format!(
                "\nTarget \"RedLock-5 acquire ≤ 1.5× single node\": acquire p50 at one task \
                 {} over 5 nodes against {} on one: {ratio:.2}× — **{}**.\n",
                fmt_dur(five),
                fmt_dur(one),
                if ratio <= 1.5 { "met" } else { "missed" },
            ));
        }
        md
    }
}
