//! Redis Sentinel: find the master by name, and follow it through failovers.
//!
//! URL: `redis+sentinel://[user:password@]host:port[,host:port…]/master-name[/db]
//! [?min_replicas=N]`. The hosts are sentinels; the credentials and db are the data
//! nodes'. A follower task asks
//! a sentinel every [`POLL`] which address the master has; when it changes (after
//! `+switch-master`), it verifies the new master, moves the client's connection and its
//! pub/sub subscriptions there, and waiters retry at once.

use std::sync::{PoisonError, Weak};
use std::time::Duration;

use redis::aio::{ConnectionManager, MultiplexedConnection};
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};

use super::{Inner, decode, map_err, redact};
use crate::error::{Error, Result};

/// How often the follower asks a sentinel for the master's address.
pub(super) const POLL: Duration = Duration::from_millis(250);

/// A parsed `redis+sentinel://` URL. (No `Debug`: it holds the password.)
#[derive(Clone)]
pub(super) struct SentinelUrl {
    sentinels: Vec<String>,
    master: String,
    db: i64,
    username: Option<String>,
    password: Option<String>,
}

impl SentinelUrl {
    /// Parses `redis+sentinel://[user[:password]@]host:port[,…]/master[/db]`.
    pub(super) fn parse(url: &str) -> Result<SentinelUrl> {
        let bad = |why: &str| Error::invalid(format!("bad sentinel URL {:?}: {why}", redact(url)));
        let rest = url
            .strip_prefix("redis+sentinel://")
            .ok_or_else(|| bad("expected redis+sentinel://"))?;
        let (authority, path) = rest.split_once('/').ok_or_else(|| bad("no master name"))?;
        let (auth, hosts) = match authority.rsplit_once('@') {
            Some((auth, hosts)) => (Some(auth), hosts),
            None => (None, authority),
        };
        let (username, password) = match auth {
            Some(a) => match a.split_once(':') {
                Some((u, p)) => ((!u.is_empty()).then(|| u.to_owned()), Some(p.to_owned())),
                None => ((!a.is_empty()).then(|| a.to_owned()), None),
            },
            None => (None, None),
        };
        let sentinels: Vec<String> = hosts
            .split(',')
            .filter(|h| !h.is_empty())
            .map(|h| {
                if h.contains(':') {
                    h.to_owned()
                } else {
                    format!("{h}:26379")
                }
            })
            .collect();
        if sentinels.is_empty() {
            return Err(bad("no sentinel address"));
        }
        let mut parts = path.split('/').filter(|p| !p.is_empty());
        let master = parts
            .next()
            .ok_or_else(|| bad("no master name"))?
            .to_owned();
        let db = match parts.next() {
            Some(db) => db.parse().map_err(|_| bad("the db must be a number"))?,
            None => 0,
        };
        if parts.next().is_some() {
            return Err(bad("expected /master-name[/db]"));
        }
        Ok(SentinelUrl {
            sentinels,
            master,
            db,
            username,
            password,
        })
    }

    /// The master's name.
    pub(super) fn master(&self) -> &str {
        &self.master
    }

    /// Checks what `redis::sentinel` would refuse (a sentinel address it cannot parse),
    /// without connecting.
    pub(super) fn check(&self) -> Result<()> {
        self.client().map(|_| ())
    }

    fn client(&self) -> Result<SentinelClient> {
        let mut info = redis::RedisConnectionInfo::default().set_db(self.db);
        if let Some(u) = &self.username {
            info = info.set_username(u);
        }
        if let Some(p) = &self.password {
            info = info.set_password(p);
        }
        let node = SentinelNodeConnectionInfo::default().set_redis_connection_info(info);
        let urls: Vec<String> = self
            .sentinels
            .iter()
            .map(|h| format!("redis://{h}/"))
            .collect();
        SentinelClient::build(
            urls,
            self.master.clone(),
            Some(node),
            SentinelServerType::Master,
        )
        .map_err(|e| Error::invalid(format!("bad sentinel configuration: {e}")).with_source(e))
    }

    /// Asks the sentinels for the master and checks that it is one.
    pub(super) async fn resolve(&self, timeout: Duration) -> Result<redis::Client> {
        let mut client = self.client()?;
        tokio::time::timeout(timeout, client.async_get_client())
            .await
            .map_err(|_| {
                Error::new(
                    crate::ErrorKind::Unavailable,
                    format!(
                        "no sentinel named a reachable master {:?} within {timeout:?}",
                        self.master
                    ),
                )
            })?
            .map_err(|e| {
                map_err(
                    e,
                    &format!("asking the sentinels for master {:?}", self.master),
                )
            })
    }

    /// The master's address as one sentinel reports it now.
    async fn master_addr(
        &self,
        conns: &mut [Option<MultiplexedConnection>],
        timeout: Duration,
    ) -> Option<String> {
        for (host, slot) in self.sentinels.iter().zip(conns.iter_mut()) {
            if slot.is_none() {
                let client = redis::Client::open(format!("redis://{host}/")).ok()?;
                *slot = tokio::time::timeout(timeout, client.get_multiplexed_async_connection())
                    .await
                    .ok()
                    .and_then(std::result::Result::ok);
            }
            let Some(conn) = slot.as_mut() else { continue };
            let reply = tokio::time::timeout(
                timeout,
                redis::cmd("SENTINEL")
                    .arg("GET-MASTER-ADDR-BY-NAME")
                    .arg(&self.master)
                    .query_async::<redis::Value>(conn),
            )
            .await;
            let addr = match reply {
                Ok(Ok(reply)) => master_of(&reply).ok().flatten(),
                _ => None,
            };
            match addr {
                Some(addr) => return Some(addr),
                None => *slot = None, // try the next sentinel, reconnect next time
            }
        }
        None
    }
}

/// The master's `host:port` from a sentinel's `GET-MASTER-ADDR-BY-NAME` reply (`[host,
/// port]`, or nil for a master it does not know): as the client's address prints it, so
/// that a follower compares the two.
fn master_of(reply: &redis::Value) -> Result<Option<String>> {
    let addr: Option<(String, u16)> = decode::typed(reply, "asking a sentinel for the master")?;
    Ok(addr.map(|(host, port)| format!("{host}:{port}")))
}

/// Follows the master of `url` for the client behind `inner` until the client is gone.
pub(super) fn follow(inner: Weak<Inner>, url: SentinelUrl, mut current: String, timeout: Duration) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    runtime.spawn(async move {
        let mut conns: Vec<Option<MultiplexedConnection>> = url.sentinels.iter().map(|_| None).collect();
        loop {
            tokio::time::sleep(POLL).await;
            if inner.strong_count() == 0 {
                return;
            }
            let Some(addr) = url.master_addr(&mut conns, timeout).await else {
                continue;
            };
            if addr == current {
                continue;
            }
            let Ok(client) = url.resolve(timeout).await else {
                continue;
            };
            let Some(inner) = inner.upgrade() else { return };
            let conn = match tokio::time::timeout(
                timeout,
                ConnectionManager::new_with_config(client.clone(), inner.config.clone()),
            )
            .await
            {
                Ok(Ok(conn)) => conn,
                _ => continue,
            };
            tracing::info!(master = url.master(), from = %current, to = %addr, "following a sentinel failover");
            *inner.conn.write().unwrap_or_else(PoisonError::into_inner) = super::conn::Conn::Single(conn);
            if let Some(pool) = &inner.wait_pool {
                pool.switch(client.clone());
            }
            inner.pubsub.switch(&client).await;
            // The new master's configuration: what it can do to locks now.
            let redis = super::Redis { inner };
            let hazards = redis.read_hazards(&addr).await;
            redis.set_hazards(super::hazard::found(hazards));
            current = addr;
        }
    });
}

#[cfg(test)]
mod tests {
    use super::SentinelUrl;

    #[test]
    fn urls() {
        let u = SentinelUrl::parse("redis+sentinel://u:p@a:1,b:2/mymaster/3").expect("valid");
        assert_eq!(u.sentinels, ["a:1", "b:2"]);
        assert_eq!((u.master.as_str(), u.db), ("mymaster", 3));
        assert_eq!(
            (u.username.as_deref(), u.password.as_deref()),
            (Some("u"), Some("p"))
        );
        let u = SentinelUrl::parse("redis+sentinel://h/m").expect("valid");
        assert_eq!(u.sentinels, ["h:26379"]);
        assert_eq!(u.db, 0);
        for bad in [
            "redis+sentinel://h",
            "redis+sentinel:///m",
            "redis+sentinel://h/m/x",
            "redis+sentinel://h/m/1/2",
            "redis://h/m",
        ] {
            assert!(SentinelUrl::parse(bad).is_err(), "{bad}");
        }
    }
}

/// Hostile input: whatever a sentinel answers for the master's address.
#[cfg(test)]
mod props {
    use proptest::prelude::*;
    use redis::Value;

    use super::master_of;
    use crate::backend::redis::decode::strategy::{bulk, value};

    proptest! {
        #![proptest_config(crate::backend::hostile::cases(256))]

        #[test]
        fn any_reply_names_a_master_or_is_a_backend_error(reply in value()) {
            if let Err(e) = master_of(&reply) {
                prop_assert_eq!(e.kind(), crate::ErrorKind::Backend, "{}", e);
            }
        }

        #[test]
        fn addresses_round_trip(host in "[a-z0-9.]{1,20}|[0-9a-f:]{2,20}", port in any::<u16>()) {
            let reply = Value::Array(vec![bulk(&host), bulk(port)]);
            let addr = master_of(&reply).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(addr, Some(format!("{host}:{port}")));
            prop_assert_eq!(master_of(&Value::Nil).map_err(|e| TestCaseError::fail(e.to_string()))?, None);
        }
    }
}
