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
                // As `query_async` does: an error reply is an error, never a value.
                Ok(redis::from_redis_value(value.extract_error()?)?)
            }
            (conn, _) => cmd.query_async(conn).await,
        }
    }

    /// `INFO` of the one server, or of every master of a cluster at once: each node's
    /// address (`single` names the one server) and its reply.
    pub(super) async fn info_everywhere(
        &mut self,
        single: &str,
    ) -> redis::RedisResult<Vec<(String, redis::RedisResult<String>)>> {
        match self {
            Conn::Cluster(c) => {
                let route = RoutingInfo::MultiNode((
                    redis::cluster_routing::MultipleNodeRoutingInfo::AllMasters,
                    None,
                ));
                let value = c.route_command(redis::cmd("INFO"), route).await?;
                let Value::Map(pairs) = value else {
                    return Err(redis::RedisError::from((
                        redis::ErrorKind::UnexpectedReturnType,
                        "INFO of every master: not a map of nodes",
                    )));
                };
                Ok(pairs
                    .into_iter()
                    .map(|(node, reply)| {
                        let node: String = redis::from_redis_value(node)
                            .unwrap_or_else(|_| "a cluster node".to_owned());
                        let text = reply
                            .extract_error()
                            .and_then(|v| Ok(redis::from_redis_value::<String>(v)?));
                        (node, text)
                    })
                    .collect())
            }
            Conn::Single(c) => {
                let text = redis::cmd("INFO").query_async::<String>(c).await;
                Ok(vec![(single.to_owned(), text)])
            }
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
                    .map(|v| Ok(redis::from_redis_value(v.extract_error()?)?))
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

/// The `host:port` of each seed node of [`cluster_nodes`], without the credentials, for
/// messages and the client's address.
pub(super) fn cluster_hosts(nodes: &[String]) -> Vec<&str> {
    nodes
        .iter()
        .map(|node| {
            let rest = node.strip_prefix("redis://").unwrap_or(node);
            let host = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
            host.trim_end_matches('/')
        })
        .collect()
}

/// Connections for requests followed by `WAIT` (`min_replicas`). `WAIT` blocks the
/// connection it is sent on until enough replicas acknowledged (or its timeout), so each
/// such request takes a connection of its own from this pool: the client's shared
/// connection, and every other request on it, never waits behind a `WAIT`.
///
/// A connection goes back to the pool only after its request completed; one whose
/// request failed or was cancelled (a `WAIT` may still be pending on it) is dropped.
pub(super) struct WaitPool {
    client: std::sync::Mutex<redis::Client>,
    config: redis::AsyncConnectionConfig,
    idle: std::sync::Mutex<Vec<redis::aio::MultiplexedConnection>>,
    /// Bounds the connections in use at once.
    permits: tokio::sync::Semaphore,
}

/// At most this many `WAIT`s of one client run at once (each on its own connection).
pub(super) const MAX_WAIT_CONNECTIONS: usize = 64;

/// A pooled connection, returned to the pool by [`WaitPool::put_back`].
pub(super) struct Pooled<'a> {
    pub(super) conn: redis::aio::MultiplexedConnection,
    _permit: tokio::sync::SemaphorePermit<'a>,
}

impl WaitPool {
    pub(super) fn new(client: redis::Client, config: redis::AsyncConnectionConfig) -> WaitPool {
        WaitPool {
            client: std::sync::Mutex::new(client),
            config,
            idle: std::sync::Mutex::new(Vec::new()),
            permits: tokio::sync::Semaphore::new(MAX_WAIT_CONNECTIONS),
        }
    }

    /// An idle connection, or a new one.
    pub(super) async fn take(&self) -> redis::RedisResult<Pooled<'_>> {
        let permit = self.permits.acquire().await.map_err(|_| {
            redis::RedisError::from((redis::ErrorKind::Io, "the WAIT pool is closed"))
        })?;
        let idle = self
            .idle
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .pop();
        let conn = match idle {
            Some(conn) => conn,
            None => {
                let client = self
                    .client
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .clone();
                client
                    .get_multiplexed_async_connection_with_config(&self.config)
                    .await?
            }
        };
        Ok(Pooled {
            conn,
            _permit: permit,
        })
    }

    /// Returns a connection whose request completed.
    pub(super) fn put_back(&self, pooled: Pooled<'_>) {
        self.idle
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(pooled.conn);
    }

    /// After a failover: new connections go to `client`'s server, idle ones are dropped.
    pub(super) fn switch(&self, client: redis::Client) {
        *self
            .client
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = client;
        self.idle
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clear();
    }
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
