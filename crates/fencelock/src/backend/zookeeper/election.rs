//! Elections' records: one persistent node per election, beside its lock's directory.

use zookeeper_client as zk;

use super::{
    CALL_TIMEOUT, FOLLOW_RETRY, NodeKind, Session, ZooKeeper, dir_path, escape, in_line, is,
    map_err, parse_node,
};
use crate::error::{Error, ErrorKind, Result};
use crate::keys::LockKeys;
use crate::raw::{RECORD, RawElection, ReleaseWatch};
use crate::token::Token;

/// How many times a publish writes again after the record node was created or deleted
/// under it (each time it switches between `setData` and `create`).
const PUBLISH_TRIES: usize = 4;

/// The record node of the election whose lock directory is `/<K>`: `/<K>-leader`. A
/// sibling, not a child: a persistent child would keep the directory (a container) alive
/// for good. [`escape`](super::escape) never writes `-`, so no lock directory has this
/// name, and [`list`](crate::raw::RawInspect::list) passes over it.
pub(super) fn record_path(keys: &LockKeys) -> String {
    format!("{}-{RECORD}", dir_path(keys))
}

/// The record is a persistent node's data (`<term>\n<data>`). A publish finds the
/// token's granted lock node (the head of the lock's line), then writes the record in one
/// multi-op with a check of that node: the holder's hold and the write are one atomic
/// step, and a node that is gone (released, expired with its session, deleted by an
/// operator) fails the whole multi-op — nothing is written. Terms are not compared.
/// Observers hold an `exists` watch on the node, armed again after each event.
impl RawElection for ZooKeeper {
    async fn publish(&self, keys: &LockKeys, token: &Token, term: u64, data: &str) -> Result<bool> {
        let s = self.live().await?;
        let Some(holder) = self.holder_node(&s, keys, token).await? else {
            return Ok(false);
        };
        let path = record_path(keys);
        let bytes = crate::backend::record_text(term, data).into_bytes();
        let options = zk::CreateMode::Persistent.with_acls(self.acls());
        let doing = "publishing an election's record";
        // The record exists after an election's first publish: `setData` first, `create`
        // when it is missing.
        let mut create = false;
        for _ in 0..PUBLISH_TRIES {
            let mut multi = s.client.new_multi_writer();
            // Version -1: any version, so this checks only that the node exists. That is
            // enough for the hold: the node was at the head of the line, and nodes made
            // later sort after it, so it holds the lock for as long as it exists.
            multi
                .add_check_version(&holder, -1)
                .map_err(|e| map_err(e, doing))?;
            if create {
                multi.add_create(&path, &bytes, &options)
            } else {
                multi.add_set_data(&path, &bytes, None)
            }
            .map_err(|e| map_err(e, doing))?;
            let committed = tokio::time::timeout(CALL_TIMEOUT, multi.commit()).await;
            match committed {
                Ok(Ok(_)) => return Ok(true),
                // The holder's node is gone: the lock is no longer the token's.
                Ok(Err(zk::MultiWriteError::OperationFailed {
                    index: 0,
                    source: zk::Error::NoNode,
                })) => return Ok(false),
                // The record is missing (an election's first publish, or deleted by
                // hand), or was created since we found it missing.
                Ok(Err(zk::MultiWriteError::OperationFailed {
                    index: 1,
                    source: zk::Error::NoNode,
                })) => create = true,
                Ok(Err(zk::MultiWriteError::OperationFailed {
                    index: 1,
                    source: zk::Error::NodeExists,
                })) => create = false,
                Ok(Err(e)) => return Err(map_err(e.into(), doing)),
                Err(_) => {
                    return Err(Error::new(
                        ErrorKind::TimedOut,
                        format!("{doing}: ZooKeeper did not answer in time"),
                    )
                    .retryable(true));
                }
            }
        }
        Err(Error::new(
            ErrorKind::Unavailable,
            format!(
                "publishing election {:?}'s record: its node was created and deleted under \
                 us {PUBLISH_TRIES} times",
                keys.name()
            ),
        )
        .retryable(true))
    }

    async fn record(&self, keys: &LockKeys) -> Result<Option<(u64, String)>> {
        let s = self.live().await?;
        let path = record_path(keys);
        match self
            .call("reading an election's record", s.client.get_data(&path))
            .await
        {
            Ok((bytes, _)) => {
                crate::backend::parse_record(&bytes, &format!("node {}", record_path(keys)))
                    .map(Some)
            }
            Err(e) if is(&e, &zk::Error::NoNode) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// An `exists` watch on the record node (it fires on its creation, a write and its
    /// deletion), set before this returns and armed again by a task after every event;
    /// one per election for all of this client's observers of it.
    async fn watch_record(&self, keys: &LockKeys) -> Result<ReleaseWatch> {
        let path = record_path(keys);
        let registration = match self.inner.records.join(&path) {
            Ok(watch) => return Ok(watch),
            Err(registration) => registration,
        };
        let watcher = self.watch_node(&path).await?;
        let wake = self.inner.records.waker(&path);
        let task = self.clone().follow_record(path.clone(), watcher, wake);
        Ok(self.inner.records.start(&path, registration, task))
    }
}

impl ZooKeeper {
    /// The path of `token`'s node if it holds the election's lock: a plain lock node of
    /// the token at the head of the lock's line (a waiting node of the token does not
    /// hold it). The listing is this session's, which has seen the grant, so it is not
    /// older than the grant; a node it shows that was deleted since fails the publish's
    /// check at the leader.
    async fn holder_node(
        &self,
        s: &Session,
        keys: &LockKeys,
        token: &Token,
    ) -> Result<Option<String>> {
        let dir = dir_path(keys);
        let children = self.children(s, &dir).await?;
        let want = escape(token.as_str());
        Ok(in_line(&children).first().and_then(|(_, name)| {
            parse_node(name)
                .is_some_and(|(kind, who, _)| kind == NodeKind::Plain && who == want)
                .then(|| format!("{dir}/{name}"))
        }))
    }

    /// Sets an `exists` watch on `path`, in the current session.
    async fn watch_node(&self, path: &str) -> Result<zk::OneshotWatcher> {
        let s = self.live().await?;
        let (_, watcher) = self
            .call(
                "watching an election's record",
                s.client.check_and_watch_stat(path),
            )
            .await?;
        Ok(watcher)
    }

    /// The task behind [`RawElection::watch_record`]: after each event of the record's
    /// watch, arms it again, then wakes an observer. Armed before the wake-up, a write
    /// after it fires the new watch, and one before it is seen by the observer's read.
    async fn follow_record(
        self,
        path: String,
        mut watcher: zk::OneshotWatcher,
        wake: impl Fn() + Send + Sync + 'static,
    ) {
        loop {
            let event = watcher.changed().await;
            if event.event_type == zk::EventType::Session {
                // The session expired or closed: the next one is opened to arm it again.
                tokio::time::sleep(FOLLOW_RETRY).await;
            }
            let mut told = false;
            watcher = loop {
                match self.watch_node(&path).await {
                    Ok(w) => break w,
                    Err(_) => {
                        // Not armed: the observer reads now (a write may be under way) and
                        // is woken again once the watch is set.
                        if !std::mem::replace(&mut told, true) {
                            wake();
                        }
                        tokio::time::sleep(FOLLOW_RETRY).await;
                    }
                }
            };
            wake();
        }
    }
}
