//! One connection type for a single Redis (behind a `ConnectionManager`) and a Redis
//! Cluster (redis-rs's cluster connection, which follows `MOVED` / `ASK` and topology
//! changes by itself).

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{Cmd, Pipeline, RedisFuture, Value};

/// The data connection of a [`Redis`](super::Redis) client.
#[derive(Clone)]
pub(super) enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

impl Conn {
    /// Runs `cmd` on `node` (a cluster node's address), or as routed when `None`.
    pub(super) async fn query_on<T: redis::FromRedisValue>(
        &mut self,
        node: Option<&(String, u16)>,
        cmd: Cmd,
    ) -> redis::RedisResult<T> {
        match (self, node) {
            (Conn::Cluster(c), Some((host, port))) => {
                let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                    host: host.clone(),
                    port: *port,
                });
                let value = c.route_command(cmd, route).await?;
                Ok(redis::from_redis_value(value)?)
            }
            (conn, _) => cmd.query_async(conn).await,
        }
    }

    /// Runs the `count` commands of `pipe` on `node`, or as routed when `None`.
    pub(super) async fn pipe_on<T: redis::FromRedisValue>(
        &mut self,
        node: Option<&(String, u16)>,
        pipe: Pipeline,
        count: usize,
    ) -> redis::RedisResult<Vec<T>> {
        match (self, node) {
            (Conn::Cluster(c), Some((host, port))) => {
                let route = SingleNodeRoutingInfo::ByAddress {
                    host: host.clone(),
                    port: *port,
                };
                let values = c.route_pipeline(pipe, 0, count, route).await?;
                values
                    .into_iter()
                    .map(|v| redis::from_redis_value(v).map_err(Into::into))
                    .collect()
            }
            (conn, _) => pipe.query_async(conn).await,
        }
    }
}

/// A parsed `redis+cluster://[user[:password]@]host:port[,host:port…][/]` URL: the seed
/// nodes as `redis://` URLs carrying the credentials.
pub(super) fn cluster_nodes(url: &str) -> crate::Result<Vec<String>> {
    let bad = |why: &str| {
        crate::Error::invalid(format!("bad cluster URL {:?}: {why}", super::redact(url)))
    };
    let rest = url
        .strip_prefix("redis+cluster://")
        .ok_or_else(|| bad("expected redis+cluster://"))?;
    let authority = rest.split('/').next().unwrap_or_default();
    if !rest[authority.len()..].trim_matches('/').is_empty() {
        return Err(bad(
            "a cluster has no databases: nothing may follow the hosts",
        ));
    }
    let (auth, hosts) = match authority.rsplit_once('@') {
        Some((auth, hosts)) => (format!("{auth}@"), hosts),
        None => (String::new(), authority),
    };
    let nodes: Vec<String> = hosts
        .split(',')
        .filter(|h| !h.is_empty())
        .map(|h| format!("redis://{auth}{h}/"))
        .collect();
    if nodes.is_empty() {
        return Err(bad("no seed node"));
    }
    Ok(nodes)
}

#[cfg(test)]
mod tests {
    use super::cluster_nodes;

    #[test]
    fn urls() {
        assert_eq!(
            cluster_nodes("redis+cluster://u:p@a:1,b:2").expect("valid"),
            ["redis://u:p@a:1/", "redis://u:p@b:2/"]
        );
        assert_eq!(
            cluster_nodes("redis+cluster://a:1/").expect("valid"),
            ["redis://a:1/"]
        );
        assert!(cluster_nodes("redis+cluster://").is_err());
        assert!(cluster_nodes("redis+cluster://a:1/0").is_err());
    }
}
