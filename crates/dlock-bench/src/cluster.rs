//! Section 9, Redis Cluster: dlock's plain `Lock` on a 3-master cluster (`redis+cluster://`,
//! redis-rs's cluster connection; release announcements on shard channels) beside a
//! single server, each with its bare-command limit and rslock (`LockManager::new_cluster`
//! on the cluster) as the peer; and the contended hand-off on one hot name (sharded
//! pub/sub) on both.

use std::time::Duration;

use dlock_test::cluster::RedisCluster;
use dlock_test::server::RedisServer;
use fencelock::backend::Redis;
use redis::aio::ConnectionManager;
use redis::cluster_async::ClusterConnection;

use crate::Result;
use crate::contended::{self, BoxWaiter};
use crate::measure;
use crate::report::fmt_dur;
use crate::stores::{self, BoxCycle, HandoffRow, LockCycle, RedisLimit, Row, RslockCycle, Setup};

/// Masters of the cluster (no replicas).
const MASTERS: usize = 3;

/// Uncontended rows, in run order within a round.
const ROWS: [&str; 6] = [
    "limit-1",
    "dlock-1",
    "rslock-1",
    "limit-cluster",
    "dlock-cluster",
    "rslock-cluster",
];

/// Contended rows, in run order within a round.
const HANDOFF_ROWS: [&str; 4] = ["each-1", "shared-1", "each-cluster", "shared-cluster"];

/// The section's servers and clients.
pub(crate) struct Clients {
    cluster: RedisCluster,
    single: RedisServer,
    cluster_url: String,
    single_url: String,
    single_limit: ConnectionManager,
    cluster_limit: ClusterConnection,
    release_sha: String,
    single_dlock: Redis,
    cluster_dlock: Redis,
    single_rslock: rslock::LockManager,
    cluster_rslock: rslock::LockManager,
}

impl Setup for Clients {
    const SECTION: &'static str = "cluster";
    const STARTING: Option<&'static str> = Some("cluster: starting a 3-master Redis Cluster");
    const ROWS: &'static [&'static str] = &ROWS;
    const HANDOFF_ROWS: &'static [&'static str] = &HANDOFF_ROWS;

    type Extra = ();

    async fn start() -> Result<Clients> {
        let cluster = RedisCluster::start(MASTERS, 0)?;
        let single = RedisServer::start()?;
        let (cluster_url, single_url) = (cluster.url(), single.url());
        let mut single_limit = measure::connection_manager(&single_url).await?;
        let release_sha: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(stores::RELEASE)
            .query_async(&mut single_limit)
            .await?;
        // EVALSHA goes to the master of the key's slot: load the script on every node.
        for node in &cluster.nodes {
            let mut conn = node.client().get_multiplexed_async_connection().await?;
            let _: String = redis::cmd("SCRIPT")
                .arg("LOAD")
                .arg(stores::RELEASE)
                .query_async(&mut conn)
                .await?;
        }
        let cluster_limit = cluster.client().get_async_connection().await?;
        let single_dlock = Redis::connect(single_url.as_str()).await?;
        let cluster_dlock = Redis::connect(cluster_url.as_str()).await?;
        let single_rslock = stores::rslock_manager(std::slice::from_ref(&single_url)).await?;
        let seeds: Vec<String> = cluster.nodes.iter().map(RedisServer::url).collect();
        let cluster_rslock = rslock::LockManager::new_cluster(seeds)?;
        cluster_rslock
            .query_redis_for_key_value(b"bench:warmup")
            .await
            .map_err(|e| format!("rslock on the cluster: {e}"))?;
        Ok(Clients {
            cluster,
            single,
            cluster_url,
            single_url,
            single_limit,
            cluster_limit,
            release_sha,
            single_dlock,
            cluster_dlock,
            single_rslock,
            cluster_rslock,
        })
    }

    fn extra(&self) {}

    async fn tasks(&self, id: &'static str, n: usize, tag: &str) -> Result<Vec<BoxCycle>> {
        let mut tasks = Vec::with_capacity(n);
        for t in 0..n {
            let name = format!("bench:c:{id}:{tag}:{n}:{t}");
            let token = format!("{:032x}", 0xc105_0000_0000_u128 + t as u128);
            let sha = &self.release_sha;
            tasks.push(match id {
                "limit-1" => {
                    RedisLimit::boxed(vec![self.single_limit.clone()], sha, name, token, None)
                }
                "limit-cluster" => {
                    RedisLimit::boxed(vec![self.cluster_limit.clone()], sha, name, token, None)
                }
                "dlock-1" => LockCycle::boxed(self.single_dlock.clone(), name, stores::TTL)?,
                "dlock-cluster" => LockCycle::boxed(self.cluster_dlock.clone(), name, stores::TTL)?,
                "rslock-1" => RslockCycle::boxed(self.single_rslock.clone(), name),
                _ => RslockCycle::boxed(self.cluster_rslock.clone(), name),
            });
        }
        Ok(tasks)
    }

    async fn waiters(&self, id: &'static str, n: usize) -> Result<Vec<BoxWaiter>> {
        let url = if id.ends_with("cluster") {
            &self.cluster_url
        } else {
            &self.single_url
        };
        let client = if id.starts_with("each") {
            contended::Client::DlockPerWaiter
        } else {
            contended::Client::DlockShared
        };
        contended::make_waiters(client, n, url, "").await
    }

    async fn round_trips(&self) -> Result<Vec<Duration>> {
        let node = self
            .cluster
            .nodes
            .first()
            .map(RedisServer::url)
            .ok_or("empty cluster")?;
        Ok(vec![
            measure::round_trip(&self.single_url, 1_000)
                .await?
                .quantile(0.5),
            measure::round_trip(&node, 1_000).await?.quantile(0.5),
        ])
    }

    fn servers(&self) -> Vec<u32> {
        self.cluster
            .nodes
            .iter()
            .chain(std::iter::once(&self.single))
            .filter_map(RedisServer::pid)
            .collect()
    }
}

/// The section's results.
pub(crate) type Section = stores::Section<Clients>;

fn rows() -> Vec<Row> {
    let mut rows = Vec::new();
    for (on, limit, dlock, rslock, single) in [
        ("one server", "limit-1", "dlock-1", "rslock-1", true),
        (
            "3-master cluster",
            "limit-cluster",
            "dlock-cluster",
            "rslock-cluster",
            false,
        ),
    ] {
        rows.push(Row {
            id: limit,
            label: format!("limit: bare `SET NX PX` + `EVALSHA`, {on}"),
            round_trips: "2".to_owned(),
            limit: Some(limit),
            reference: (!single).then_some("limit-1"),
            peer: None,
        });
        rows.push(Row {
            id: dlock,
            label: if single {
                "dlock `Lock`, one server (reference)".to_owned()
            } else {
                format!("**dlock** `Lock`, {on}")
            },
            round_trips: "2".to_owned(),
            limit: Some(limit),
            reference: (!single).then_some("dlock-1"),
            peer: Some(rslock),
        });
        rows.push(Row {
            id: rslock,
            label: format!("rslock 0.10, {on}"),
            round_trips: "2".to_owned(),
            limit: Some(limit),
            reference: (!single).then_some("rslock-1"),
            peer: None,
        });
    }
    rows
}

impl Section {
    fn handoff_rows(&self) -> Vec<HandoffRow> {
        let single = self.rtts.first().copied().unwrap_or_default();
        let node = self.rtts.get(1).copied().unwrap_or(single);
        vec![
            HandoffRow {
                id: "each-1",
                label: "dlock `Lock`, one server, a client per waiter (reference)".to_owned(),
                rtt: single,
                limit: None,
                reference: None,
                peer: None,
            },
            HandoffRow {
                id: "shared-1",
                label: "dlock `Lock`, one server, one shared client (reference)".to_owned(),
                rtt: single,
                limit: None,
                reference: None,
                peer: None,
            },
            HandoffRow {
                id: "each-cluster",
                label: "**dlock** `Lock`, cluster, a client per waiter".to_owned(),
                rtt: node,
                limit: None,
                reference: Some("each-1"),
                peer: None,
            },
            HandoffRow {
                id: "shared-cluster",
                label: "**dlock** `Lock`, cluster, one shared client".to_owned(),
                rtt: node,
                limit: None,
                reference: Some("shared-1"),
                peer: None,
            },
        ]
    }

    /// The section's Markdown.
    pub(crate) fn markdown(&self) -> String {
        let single = self.rtts.first().copied().unwrap_or_default();
        let node = self.rtts.get(1).copied().unwrap_or(single);
        let mut md = format!(
            "\n## 9. Redis Cluster (3 masters)\n\n\
             A 3-master cluster without replicas (`redis-cli --cluster create`) and one \
             plain server, on loopback. **dlock** = `Redis::connect(\"redis+cluster://…\")` \
             (redis-rs's cluster connection; releases announced with `SPUBLISH` on the \
             name's shard channel, waiters `SSUBSCRIBE`). **limit** = the bare commands of \
             section 1 on redis-rs's cluster connection (or on one `ConnectionManager`); \
             **reference** = the same client on the single server; **peer** = rslock \
             (`LockManager::new_cluster` on the cluster). Each task's name lands on \
             whichever master owns its slot. Median of {} rounds: uncontended runs of {:.2} s, \
             contended runs of {:.2} s (step-aside mode as in section 2, after a warm-up on \
             another name). Server CPU = all four redis-servers. PING round trip: p50 {} \
             (single server), {} (a cluster node).\n\n### Uncontended\n\n",
            self.rounds,
            self.run.as_secs_f64(),
            self.contended_run.as_secs_f64(),
            fmt_dur(single),
            fmt_dur(node),
        );
        md.push_str(&stores::uncontended_table(&rows(), &self.cells));
        md.push_str("\n### Contended hand-off on one hot name\n\n");
        md.push_str(&stores::handoff_table(&self.handoff_rows(), &self.handoffs));
        md
    }
}
