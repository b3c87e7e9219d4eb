//! A Redis Cluster on loopback: N masters (and replicas), made with `redis-cli --cluster
//! create`; every node is killed when the cluster is dropped.

use std::io;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::server::RedisServer;

/// A running cluster. `nodes[..masters]` start as masters.
#[derive(Debug)]
pub struct RedisCluster {
    /// Every node (public so tests can kill, freeze or restart them).
    pub nodes: Vec<RedisServer>,
    masters: usize,
}

impl RedisCluster {
    /// Starts `masters` masters with `replicas` replicas each and waits until every node
    /// reports `cluster_state:ok` and knows every other node.
    ///
    /// # Errors
    /// A node did not start, `redis-cli --cluster create` failed, or the cluster did not
    /// converge within 30 s.
    pub fn start(masters: usize, replicas: usize) -> io::Result<RedisCluster> {
        let count = masters * (1 + replicas);
        let mut nodes = Vec::with_capacity(count);
        for _ in 0..count {
            nodes.push(RedisServer::start_with(&[
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                "2000",
            ])?);
        }
        let mut create = Command::new("redis-cli");
        create.arg("--cluster").arg("create");
        for n in &nodes {
            create.arg(format!("127.0.0.1:{}", n.port()));
        }
        let out = create
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdin(Stdio::null())
            .output()?;
        if !out.status.success() {
            return Err(io::Error::other(format!(
                "redis-cli --cluster create failed: {}",
                String::from_utf8_lossy(&out.stdout)
            )));
        }
        let cluster = RedisCluster { nodes, masters };
        cluster.wait_ok(Duration::from_secs(30))?;
        Ok(cluster)
    }

    /// Waits until every running node says `cluster_state:ok` and knows every node.
    ///
    /// # Errors
    /// Not converged within `limit`.
    pub fn wait_ok(&self, limit: Duration) -> io::Result<()> {
        let deadline = Instant::now() + limit;
        loop {
            // Converged, and every replica has finished its first sync (a replica that
            // never synced cannot take over from a failed master).
            let ok = self.nodes.iter().filter(|n| n.pid().is_some()).all(|n| {
                let info = cluster_info(n).unwrap_or_default();
                let replication = info_section(n, "replication").unwrap_or_default();
                info.contains("cluster_state:ok")
                    && info.contains(&format!("cluster_known_nodes:{}", self.nodes.len()))
                    && (replication.contains("role:master")
                        || replication.contains("master_link_status:up"))
            });
            if ok {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the cluster did not converge",
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// How many nodes started as masters.
    pub fn masters(&self) -> usize {
        self.masters
    }

    /// `redis+cluster://` URL with every node as a seed.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        format!("redis+cluster://{}", hosts.join(","))
    }

    /// A redis-rs cluster client for the test's own commands.
    ///
    /// # Panics
    /// Never for loopback seed URLs.
    pub fn client(&self) -> redis::cluster::ClusterClient {
        let seeds: Vec<String> = self.nodes.iter().map(RedisServer::url).collect();
        #[allow(clippy::unwrap_used)]
        redis::cluster::ClusterClient::new(seeds).unwrap()
    }

    /// The index of the node that is master of `key`'s slot now.
    ///
    /// # Errors
    /// No node could say.
    pub fn master_of(&self, key: &str) -> io::Result<usize> {
        let slot = i64::from(fencelock::keys::cluster_slot(key.as_bytes()));
        for n in self.nodes.iter().filter(|n| n.pid().is_some()) {
            let Ok(mut c) = n.client().get_connection() else {
                continue;
            };
            let Ok(slots) = redis::cmd("CLUSTER")
                .arg("SLOTS")
                .query::<Vec<redis::Value>>(&mut c)
            else {
                continue;
            };
            for range in slots {
                let redis::Value::Array(parts) = range else {
                    continue;
                };
                let (
                    Some(redis::Value::Int(lo)),
                    Some(redis::Value::Int(hi)),
                    Some(redis::Value::Array(master)),
                ) = (parts.first(), parts.get(1), parts.get(2))
                else {
                    continue;
                };
                if (*lo..=*hi).contains(&slot)
                    && let Some(redis::Value::Int(port)) = master.get(1)
                    && let Some(i) = self.nodes.iter().position(|n| i64::from(n.port()) == *port)
                {
                    return Ok(i);
                }
            }
        }
        Err(io::Error::other("no node knows the slot's master"))
    }
}

fn cluster_info(node: &RedisServer) -> Option<String> {
    let mut c = node
        .client()
        .get_connection_with_timeout(Duration::from_secs(1))
        .ok()?;
    redis::cmd("CLUSTER").arg("INFO").query(&mut c).ok()
}

fn info_section(node: &RedisServer, section: &str) -> Option<String> {
    let mut c = node
        .client()
        .get_connection_with_timeout(Duration::from_secs(1))
        .ok()?;
    redis::cmd("INFO").arg(section).query(&mut c).ok()
}
