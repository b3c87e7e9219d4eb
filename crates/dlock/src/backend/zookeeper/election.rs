//! Elections' records: one persistent node per election, beside its lock's directory.

use std::sync::Arc;

use tokio::sync::Notify;
use zookeeper_client as zk;

use super::{FOLLOW_RETRY, Following, ZooKeeper, dir_path, is};
use crate::error::{Error, ErrorKind, Result};
use crate::keys::LockKeys;
use crate::raw::{RECORD, RawElection, ReleaseWatch};

/// How many times a publish reads and writes again after losing a race for the node.
const PUBLISH_TRIES: usize = 8;

/// The record node of the election whose lock directory is `/<K>`: `/<K>-leader`. A
/// sibling, not a child: a persistent child would keep the directory (a container) alive
/// for good. [`escape`](super::escape) never writes `-`, so no lock directory has this
/// name, and [`list`](crate::raw::RawInspect::list) passes over it.
pub(super) fn record_path(keys: &LockKeys) -> String {
    format!("{}-{RECORD}", dir_path(keys))
}

/// The record is a persistent node's data (`<term>\n<data>`): a publish reads it with its
/// version and writes it only at that version (or creates it), so the term check and the
/// write are one step; a lost race reads again. Observers hold an `exists` watch on the
/// node, armed again after each event.
impl RawElection for ZooKeeper {
    async fn publish(&self, keys: &LockKeys, term: u64, data: &str) -> Result<bool> {
        let s = self.live().await?;
        let path = record_path(keys);
        let bytes = crate::backend::record_text(term, data).into_bytes();
        for _ in 0..PUBLISH_TRIES {
            match self
                .call("reading an election's record", s.client.get_data(&path))
                .await
            {
                Ok((stored, stat)) => {
                    let (stored, _) = crate::backend::parse_record(
                        &stored,
                        &format!("node {}", record_path(keys)),
                    )?;
                    if stored > term {
                        return Ok(false);
                    }
                    let written = s.client.set_data(&path, &bytes, Some(stat.version));
                    match self.call("publishing an election's record", written).await {
                        Ok(_) => return Ok(true),
                        // Written (or deleted) by someone else since the read: read again
                        // (the failed write's reply came after that change was applied
                        // on our server, so the next read sees it).
                        Err(e) if is(&e, &zk::Error::BadVersion) || is(&e, &zk::Error::NoNode) => {}
                        Err(e) => return Err(e),
                    }
                }
                Err(e) if is(&e, &zk::Error::NoNode) => {
                    let options = zk::CreateMode::Persistent.with_acls(self.acls());
                    let created = s.client.create(&path, &bytes, &options);
                    match self.call("publishing an election's record", created).await {
                        Ok(_) => return Ok(true),
                        Err(e) if is(&e, &zk::Error::NodeExists) => {}
                        Err(e) => return Err(e),
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Err(Error::new(
            ErrorKind::Unavailable,
            format!(
                "publishing election {:?}'s record: lost the race for its node {PUBLISH_TRIES} times",
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
    /// deletion), set before this returns and armed again by a task after every event.
    async fn watch_record(&self, keys: &LockKeys) -> Result<ReleaseWatch> {
        let path = record_path(keys);
        let watcher = self.watch_node(&path).await?;
        let wake = Arc::new(Notify::new());
        let task = tokio::spawn(self.clone().follow_record(path, watcher, Arc::clone(&wake)));
        Ok(ReleaseWatch::new(
            wake,
            Some(Box::new(Following { task, slot: None })),
        ))
    }
}

impl ZooKeeper {
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
    async fn follow_record(self, path: String, mut watcher: zk::OneshotWatcher, wake: Arc<Notify>) {
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
                            wake.notify_one();
                        }
                        tokio::time::sleep(FOLLOW_RETRY).await;
                    }
                }
            };
            wake.notify_one();
        }
    }
}
