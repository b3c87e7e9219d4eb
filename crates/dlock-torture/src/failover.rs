//! The failover kinds' topologies and their one fault: a master + replica + sentinels
//! (`sentinel-fenced`, `sentinel-wait-fenced`) and a Redis Cluster with a replica per
//! master (`cluster-fenced`), and a failover *before replication*: the replica that will
//! be promoted is frozen, the next grant reaches the master alone, the master is killed,
//! the replica is thawed and promoted, and the old master comes back empty as its replica.
//!
//! Everything here talks to the servers straight, with the test kit's blocking loopback
//! calls (each bounded by a timeout); the nemesis calls it from the multi-threaded
//! runtime inside `block_in_place`.

use std::io;
use std::time::{Duration, Instant};

use dlock_test::cluster::RedisCluster;
use dlock_test::server::{RedisServer, SentinelServer};

use crate::model::{CLUSTER_MASTERS, SENTINEL_MASTER, SENTINELS};

/// How long a topology may take to form, and a promotion to happen.
const SETTLE: Duration = Duration::from_secs(30);

/// `INFO <section>` of a server, or `None` if it does not answer within a second.
fn info(server: &RedisServer, section: &str) -> Option<String> {
    let mut c = server
        .client()
        .get_connection_with_timeout(Duration::from_secs(1))
        .ok()?;
    c.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    redis::cmd("INFO").arg(section).query(&mut c).ok()
}

/// Calls `ready` every 50 ms until it says yes or `limit` passes.
fn wait_until(limit: Duration, mut ready: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if ready() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The port of the master `sentinel` names for [`SENTINEL_MASTER`], if it answers.
fn master_port_of(sentinel: &SentinelServer) -> Option<u16> {
    let mut c = sentinel
        .client()
        .get_connection_with_timeout(Duration::from_secs(1))
        .ok()?;
    c.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    let (_, port): (String, String) = redis::cmd("SENTINEL")
        .arg("get-master-addr-by-name")
        .arg(SENTINEL_MASTER)
        .query(&mut c)
        .ok()?;
    port.parse().ok()
}

/// Whether `master` is a master with a replica whose link is up and in sync.
fn has_online_replica(master: &RedisServer) -> bool {
    info(master, "replication")
        .is_some_and(|text| text.contains("role:master") && text.contains("state=online"))
}

/// A master, its replica and [`SENTINELS`] sentinels, all of our own.
pub(crate) struct Sentinel {
    /// The two data servers; `primary` indexes the master now.
    pub(crate) servers: Vec<RedisServer>,
    pub(crate) primary: usize,
    sentinels: Vec<SentinelServer>,
}

impl Sentinel {
    /// Starts the servers and sentinels, and waits until the replica is in sync and every
    /// sentinel knows the replica and the other sentinels.
    pub(crate) fn start() -> io::Result<Sentinel> {
        let master = RedisServer::start()?;
        let port = master.port().to_string();
        let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &port])?;
        if !wait_until(SETTLE, || has_online_replica(&master)) {
            return Err(io::Error::other("the replica did not link up"));
        }
        let quorum = u32::try_from(SENTINELS / 2 + 1).unwrap_or(2);
        let sentinels = (0..SENTINELS)
            .map(|_| SentinelServer::start(master.port(), SENTINEL_MASTER, quorum))
            .collect::<io::Result<Vec<_>>>()?;
        let discovered = wait_until(SETTLE, || {
            sentinels.iter().all(|s| {
                let Ok(mut c) = s
                    .client()
                    .get_connection_with_timeout(Duration::from_secs(1))
                else {
                    return false;
                };
                redis::cmd("INFO")
                    .arg("sentinel")
                    .query::<String>(&mut c)
                    .is_ok_and(|t| {
                        t.contains("slaves=1") && t.contains(&format!("sentinels={SENTINELS}"))
                    })
            })
        });
        if !discovered {
            return Err(io::Error::other(
                "the sentinels did not discover the replica and each other",
            ));
        }
        Ok(Sentinel {
            servers: vec![master, replica],
            primary: 0,
            sentinels,
        })
    }

    /// The `redis+sentinel://` URL the workers use.
    pub(crate) fn url(&self) -> String {
        let hosts: Vec<String> = self.sentinels.iter().map(SentinelServer::addr).collect();
        format!("redis+sentinel://{}/{SENTINEL_MASTER}", hosts.join(","))
    }

    /// The master now.
    pub(crate) fn master(&self) -> &RedisServer {
        &self.servers[self.primary]
    }

    /// The first step of a failover: freezes the replica, if it is in sync (else the
    /// fault cannot be injected now, and nothing is done).
    pub(crate) fn freeze_replica(&mut self) -> bool {
        if !has_online_replica(&self.servers[self.primary]) {
            return false;
        }
        self.servers[1 - self.primary].freeze().is_ok()
    }

    /// The second step: kills the master and thaws the replica.
    pub(crate) fn kill_master(&mut self) {
        self.servers[self.primary].kill();
        let _ = self.servers[1 - self.primary].thaw();
    }

    /// The last step: waits for the sentinels to promote the replica, then starts the old
    /// master again, empty, and waits until the sentinels have made it the new master's
    /// replica and it is in sync. Returns whether the promotion was seen.
    pub(crate) fn finish(&mut self) -> bool {
        let next = 1 - self.primary;
        // Promoted means the sentinels switched their configuration to it, not only that
        // it answers as a master: a failover whose leader timed out waiting for the
        // promotion is aborted, and the sentinels would make the replica follow the old
        // master again — which, restarted empty, would wipe it (a restart without
        // persistence of the whole store, not the failover this fault is).
        let port = self.servers[next].port();
        let promoted = wait_until(SETTLE, || {
            info(&self.servers[next], "replication").is_some_and(|t| t.contains("role:master"))
                && self
                    .sentinels
                    .iter()
                    .all(|s| master_port_of(s) == Some(port))
        });
        if promoted {
            self.primary = next;
        }
        // The old master comes back empty and, until the sentinels make it a replica, a
        // master of its own that clients which last asked a lagging sentinel still use:
        // part of the failover, so the window lasts until it replicates.
        if let Err(e) = self.servers[1 - next].restart() {
            eprintln!("dlock: torture: the old master did not start again: {e}");
        }
        // Sentinels look at replicas every 10 s: the demotion may take that long.
        let rejoined = wait_until(SETTLE, || {
            info(&self.servers[1 - next], "replication")
                .is_some_and(|t| t.contains("role:slave") && t.contains("master_link_status:up"))
        });
        if !rejoined {
            eprintln!(
                "dlock: torture: the old master did not become the new master's replica in time"
            );
        }
        promoted
    }
}

/// A Redis Cluster of [`CLUSTER_MASTERS`] masters with a replica each; the lock key's
/// slot is the one failed over.
pub(crate) struct Cluster {
    pub(crate) cluster: RedisCluster,
    /// During a failover: (the master killed, the replica to be promoted, the key whose
    /// slot it is).
    pending: Option<(usize, usize, String)>,
}

impl Cluster {
    /// Starts the cluster and waits until it is converged.
    pub(crate) fn start() -> io::Result<Cluster> {
        Ok(Cluster {
            cluster: RedisCluster::start(CLUSTER_MASTERS, 1)?,
            pending: None,
        })
    }

    /// `CLUSTER MYID` of node `i`.
    fn id(&self, i: usize) -> Option<String> {
        let mut c = self.cluster.nodes[i]
            .client()
            .get_connection_with_timeout(Duration::from_secs(1))
            .ok()?;
        redis::cmd("CLUSTER").arg("MYID").query(&mut c).ok()
    }

    /// The node replicating node `master`, as `CLUSTER NODES` on the master says.
    fn replica_of(&self, master: usize) -> Option<usize> {
        let id = self.id(master)?;
        let mut c = self.cluster.nodes[master]
            .client()
            .get_connection_with_timeout(Duration::from_secs(1))
            .ok()?;
        let nodes: String = redis::cmd("CLUSTER").arg("NODES").query(&mut c).ok()?;
        let line = nodes.lines().find(|l| {
            let fields: Vec<&str> = l.split_whitespace().collect();
            fields.get(3) == Some(&id.as_str()) && !fields[2].contains("fail")
        })?;
        let port: u16 = line
            .split_whitespace()
            .nth(1)?
            .split('@')
            .next()?
            .rsplit(':')
            .next()?
            .parse()
            .ok()?;
        self.cluster.nodes.iter().position(|n| n.port() == port)
    }

    /// The first step of a failover of `key`'s slot: freezes the replica of its master,
    /// if that replica is in sync.
    pub(crate) fn freeze_replica(&mut self, key: &str) -> Option<usize> {
        let master = self.cluster.master_of(key).ok()?;
        let replica = self.replica_of(master)?;
        if !has_online_replica(&self.cluster.nodes[master]) {
            return None;
        }
        self.cluster.nodes[replica].freeze().ok()?;
        self.pending = Some((master, replica, key.to_owned()));
        Some(master)
    }

    /// The second step: kills the master and thaws the replica.
    pub(crate) fn kill_master(&mut self) {
        if let Some((master, replica, _)) = &self.pending {
            self.cluster.nodes[*master].kill();
            let _ = self.cluster.nodes[*replica].thaw();
        }
    }

    /// The last step: waits for the replica to take the slot over, then starts the old
    /// master again (empty, with its cluster identity: it rejoins as the new master's
    /// replica) and waits for the cluster to converge. Returns whether the promotion was
    /// seen.
    pub(crate) fn finish(&mut self) -> bool {
        let Some((master, replica, key)) = self.pending.take() else {
            return false;
        };
        let promoted = wait_until(SETTLE, || {
            self.cluster.master_of(&key).is_ok_and(|m| m == replica)
        });
        if let Err(e) = self.cluster.nodes[master].restart() {
            eprintln!("dlock: torture: the old cluster master did not start again: {e}");
        }
        let _ = self.cluster.wait_ok(SETTLE);
        promoted
    }
}
