//! The lock family on ZooKeeper, each in the layout of Curator's recipe for it, in one
//! directory per lock with the plain lock's rules for sessions, fences and cleanup:
//!
//! * **Reentrant lock** (Curator's `InterProcessMutex`, with the holds kept in the node
//!   rather than in one process): one node per owner and session, `h+<owner>@<session>-`,
//!   in the queue like a plain lock's; its data lists the owner's holds (one token per
//!   hold, changed by compare-and-set on the node's version). The owner holds the lock
//!   while its node is the lowest; a re-entry adds its token to that node, so it carries
//!   the first hold's fence, and the node goes with the owner's last hold — releases may
//!   come in any order, and no other owner's node can come first while one hold is left.
//! * **Read-write lock** (`InterProcessReadWriteLock`): readers' nodes `r+<token>-`,
//!   writers' `w+<token>-`, in one sequence. A writer holds when its node is the lowest;
//!   a reader when no writer's node is below its own (writers first: a waiting writer
//!   keeps later readers out). A writer waits for the node just before it, a reader for
//!   the nearest writer's node before it. Downgrade writes `r` into the writer's node:
//!   it keeps its place (no writer can come in between) and now counts as a reader.
//! * **Semaphore** (`InterProcessSemaphoreV2`'s leases): a node `<N>+<token>-` per holder
//!   or waiter of N permits; the directory's data is the permit count (the first client's,
//!   changed by `set_permits` / `add_permits` by compare-and-set; a client with another
//!   count is refused after reading it, its node deleted at once). The nodes are served
//!   in order: a node holds when the permits of the nodes up to and including it fit in
//!   the count. A waiter depends on every node below it, so it watches the directory's
//!   children and data and tries again when they change: a release wakes every waiting
//!   client of the semaphore (as Curator's does), not one.
//! * **Fair lock**: the plain lock is first come, first served already (nodes are served
//!   in sequence order), so the fair lock is the plain lock's recipe.

use std::time::Duration;

use tokio::time::Instant;
use zookeeper_client as zk;

use super::{NodeKind, Place, Session, ZooKeeper, dir_path, escape, in_line, is, node_prefix};
use super::{parse_node, unescape};
use crate::error::{Error, ErrorKind, Result};
use crate::keys::LockKeys;
use crate::raw::{
    Acquire, LockState, RawLock, RawReentrant, RawRwLock, RawSemaphore, ReleaseWatch,
};
use crate::token::Token;

/// How often a compare-and-set is tried before the call gives up as contended.
const CAS_TRIES: usize = 16;

/// The holds listed in a reentrant owner's node (escaped tokens, one per line).
fn holds(data: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(data)
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect()
}

/// A reentrant owner's node name part: `<owner>@<session id>` (escaped when named).
fn owner_in(owner: &str, session: i64) -> String {
    format!("{owner}@{session:x}")
}

impl ZooKeeper {
    /// Our node for `token` of `kind` in the lock's directory (the one this session made,
    /// one found by token after a lost reply, or a new one holding `data`), and the
    /// directory's children as read after it.
    async fn enter(
        &self,
        keys: &LockKeys,
        token: &Token,
        kind: NodeKind,
        data: &str,
        ttl: Duration,
    ) -> Result<(Session, Place, Vec<String>)> {
        let s = self.live().await?;
        self.note_ttl(ttl);
        let dir = dir_path(keys);
        let prefix = node_prefix(&dir, token);
        let known = self.place(&prefix).filter(|p| p.session == s.id);
        let mut place = match known {
            Some(p) => p,
            None => {
                let name = kind.name(token.as_str());
                let unsure = format!("{dir}/{name}");
                let found = if self.unsure().contains(&unsure) {
                    let found = self
                        .find(&s, &dir, token)
                        .await?
                        .filter(|p| p.session == s.id);
                    self.unsure().remove(&unsure);
                    found
                } else {
                    None
                };
                match found {
                    Some(p) => p,
                    None => {
                        let (node, seq, czxid) = self.create(&s, &dir, &name, data).await?;
                        Place {
                            node,
                            kind,
                            seq,
                            czxid,
                            session: s.id,
                            ttl,
                            moved: std::sync::Arc::default(),
                        }
                    }
                }
            }
        };
        place.ttl = ttl;
        let mut place = self.placed(&prefix, place);
        let mut children = self.children(&s, &dir).await?;
        if !in_line(&children).iter().any(|(seq, _)| *seq == place.seq) {
            // Our node is gone: deleted by an operator (`deleteall` takes the directory
            // too). Queue again, at the back of the line (`create` makes the directory
            // anew).
            let name = kind.name(token.as_str());
            let (node, seq, czxid) = self.create(&s, &dir, &name, data).await?;
            let again = Place {
                node,
                kind,
                seq,
                czxid,
                session: s.id,
                ttl,
                moved: std::sync::Arc::default(),
            };
            place = self.placed(&prefix, again);
            children = self.children(&s, &dir).await?;
        }
        self.drop_ghosts(
            &s,
            &dir,
            &in_line(&children),
            &escape(token.as_str()),
            place.seq,
        );
        Ok((s, place, children))
    }

    /// The outcome of an attempt whose node is `place` (known by `prefix`): granted or
    /// waiting (both keep the node for one lease from `started`, see the plain lock), or an
    /// error if the node vanished from `children`.
    fn settle(
        &self,
        s: &Session,
        prefix: &str,
        place: &Place,
        children: &[String],
        granted: bool,
        started: Instant,
    ) -> Result<Acquire> {
        let line = in_line(children);
        if !line.iter().any(|(seq, _)| *seq == place.seq) {
            self.places().remove(prefix);
            return Err(Error::new(
                ErrorKind::Unavailable,
                "acquiring: our lock node vanished as it was made",
            )
            .retryable(true));
        }
        self.inner
            .reaper
            .set(&place.node, s.id, started + self.lease(place.ttl, s.id));
        if granted {
            Ok(Acquire::Acquired {
                fence: u64::try_from(place.czxid).unwrap_or(0),
            })
        } else {
            Ok(Acquire::Held {
                remaining: Some(s.timeout),
            })
        }
    }

    /// Takes `token`'s hold out of a reentrant owner's node (the node goes with the last
    /// hold). Returns whether the hold was there.
    pub(super) async fn release_hold(
        &self,
        s: &Session,
        place: &Place,
        token: &Token,
    ) -> Result<bool> {
        let mine = escape(token.as_str());
        for _ in 0..CAS_TRIES {
            let (data, stat) = match self
                .call("reading a reentrant lock", s.client.get_data(&place.node))
                .await
            {
                Ok(got) => got,
                Err(e) if is(&e, &zk::Error::NoNode) => return Ok(false),
                Err(e) => return Err(e),
            };
            let mut rest = holds(&data);
            let before = rest.len();
            rest.retain(|t| *t != mine);
            if rest.len() == before {
                return Ok(false);
            }
            let done = if rest.is_empty() {
                let deleted = self
                    .call(
                        "releasing a reentrant lock",
                        s.client.delete(&place.node, Some(stat.version)),
                    )
                    .await;
                if deleted.is_ok() {
                    self.inner.reaper.remove(&place.node);
                }
                deleted
            } else {
                self.call(
                    "releasing a reentrant hold",
                    s.client
                        .set_data(&place.node, rest.join("\n").as_bytes(), Some(stat.version)),
                )
                .await
                .map(|_| ())
            };
            match done {
                Ok(()) => return Ok(true),
                Err(e) if is(&e, &zk::Error::BadVersion) => {}
                Err(e) if is(&e, &zk::Error::NoNode) => return Ok(false),
                Err(e) => return Err(e),
            }
        }
        Err(Error::new(
            ErrorKind::Unavailable,
            "releasing a reentrant hold: contended",
        )
        .retryable(true))
    }

    /// One release of a reentrant hold (see `release_reentrant`).
    async fn release_reentrant_once(
        &self,
        keys: &LockKeys,
        owner: &str,
        token: &Token,
    ) -> Result<bool> {
        let s = self.live().await?;
        let dir = dir_path(keys);
        let prefix = node_prefix(&dir, token);
        let place = match self.place(&prefix).filter(|p| p.session == s.id) {
            Some(p) => Some(p),
            None => {
                let wanted = escape(&owner_in(owner, s.id));
                let children = self.children(&s, &dir).await?;
                in_line(&children)
                    .into_iter()
                    .find(|(_, name)| {
                        parse_node(name)
                            .is_some_and(|(k, w, _)| k == NodeKind::Holds && w == wanted)
                    })
                    .map(|(seq, name)| Place {
                        node: format!("{dir}/{name}"),
                        kind: NodeKind::Holds,
                        seq,
                        czxid: 0,
                        session: s.id,
                        ttl: Duration::ZERO,
                        moved: std::sync::Arc::default(),
                    })
            }
        };
        if let Some(p) = self.places().remove(&prefix) {
            p.moved.notify_one();
        }
        match place {
            Some(place) => self.release_hold(&s, &place, token).await,
            None => Ok(false),
        }
    }

    /// The directory's permit count, and its data version (`None` if it stores none).
    async fn permit_count(&self, s: &Session, dir: &str) -> Result<(Option<u32>, i32, bool)> {
        match self
            .call("reading a semaphore", s.client.get_data(dir))
            .await
        {
            Ok((data, stat)) => Ok((
                std::str::from_utf8(&data).ok().and_then(|t| t.parse().ok()),
                stat.version,
                true,
            )),
            Err(e) if is(&e, &zk::Error::NoNode) => Ok((None, -1, false)),
            Err(e) => Err(e),
        }
    }

    /// Sets the permit count to `f(current)` by compare-and-set (creating the directory
    /// when missing); `None` from `f` leaves it. Returns the new count.
    async fn update_count(
        &self,
        keys: &LockKeys,
        permits: u32,
        f: impl Fn(u32) -> Option<u32>,
    ) -> Result<Option<u32>> {
        let s = self.live().await?;
        let dir = dir_path(keys);
        for _ in 0..CAS_TRIES {
            let (count, version, exists) = self.permit_count(&s, &dir).await?;
            let Some(new) = f(count.unwrap_or(permits)) else {
                return Ok(None);
            };
            let written = if exists {
                self.call(
                    "setting a semaphore's permits",
                    s.client
                        .set_data(&dir, new.to_string().as_bytes(), Some(version)),
                )
                .await
                .map(|_| ())
            } else {
                let options = zk::CreateMode::Container.with_acls(self.acls());
                self.call(
                    "setting a semaphore's permits",
                    s.client.create(&dir, new.to_string().as_bytes(), &options),
                )
                .await
                .map(|_| ())
            };
            match written {
                Ok(()) => return Ok(Some(new)),
                Err(e)
                    if is(&e, &zk::Error::BadVersion)
                        || is(&e, &zk::Error::NodeExists)
                        || is(&e, &zk::Error::NoNode) => {}
                Err(e) => return Err(e),
            }
        }
        Err(Error::new(
            ErrorKind::Unavailable,
            "setting a semaphore's permits: contended",
        )
        .retryable(true))
    }

    /// A semaphore's nodes in line with their permits, and which hold (in order, while
    /// the permits up to each fit in `count`).
    fn permit_line(children: &[String], count: u32) -> Vec<(i64, String, u32, bool)> {
        let mut sum: u64 = 0;
        let mut fits = true;
        in_line(children)
            .into_iter()
            .filter_map(|(seq, name)| match parse_node(name) {
                Some((NodeKind::Permits(n), _, _)) => Some((seq, name.to_owned(), n)),
                _ => None,
            })
            .map(|(seq, name, n)| {
                sum += u64::from(n);
                fits = fits && sum <= u64::from(count);
                (seq, name, n, fits)
            })
            .collect()
    }

    /// Deletes the nodes named, in `dir`; returns whether any was there.
    async fn delete_all(&self, s: &Session, dir: &str, names: &[String]) -> Result<bool> {
        let mut any = false;
        for name in names {
            let node = format!("{dir}/{name}");
            self.inner.reaper.remove(&node);
            match self
                .call("force-unlocking", s.client.delete(&node, None))
                .await
            {
                Ok(()) => any = true,
                Err(e) if is(&e, &zk::Error::NoNode) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(any)
    }

    /// The creation zxid of `dir/name`, if it exists.
    async fn created(&self, s: &Session, dir: &str, name: &str) -> Result<Option<u64>> {
        Ok(self
            .call(
                "reading a lock node",
                s.client.check_stat(&format!("{dir}/{name}")),
            )
            .await?
            .map(|st| u64::try_from(st.czxid).unwrap_or(0)))
    }
}

impl RawReentrant for ZooKeeper {
    async fn acquire_reentrant(
        &self,
        keys: &LockKeys,
        owner: &str,
        token: &Token,
        ttl: Duration,
        limit: u32,
        _queue: bool,
    ) -> Result<Acquire> {
        let started = Instant::now();
        let s = self.live().await?;
        let dir = dir_path(keys);
        let prefix = node_prefix(&dir, token);
        let mine = escape(token.as_str());
        let who = owner_in(owner, s.id);
        let wanted = escape(&who);
        for _ in 0..CAS_TRIES {
            let children = self.children(&s, &dir).await?;
            let line = in_line(&children);
            let head = line.first().map(|(seq, _)| *seq);
            let ours = line.iter().find(|(_, name)| {
                parse_node(name).is_some_and(|(k, w, _)| k == NodeKind::Holds && w == wanted)
            });
            let place = match ours {
                Some((seq, name)) => {
                    let node = format!("{dir}/{name}");
                    let (data, stat) = match self
                        .call("reading a reentrant lock", s.client.get_data(&node))
                        .await
                    {
                        Ok(got) => got,
                        Err(e) if is(&e, &zk::Error::NoNode) => continue,
                        Err(e) => return Err(e),
                    };
                    let mut list = holds(&data);
                    if !list.contains(&mine) {
                        if head == Some(*seq)
                            && u32::try_from(list.len()).unwrap_or(u32::MAX) >= limit
                        {
                            return Err(Error::new(
                                ErrorKind::LimitReached,
                                format!(
                                    "owner {owner:?} already holds lock {:?} {limit} times",
                                    keys.name()
                                ),
                            ));
                        }
                        list.push(mine.clone());
                        match self
                            .call(
                                "re-entering a lock",
                                s.client.set_data(
                                    &node,
                                    list.join("\n").as_bytes(),
                                    Some(stat.version),
                                ),
                            )
                            .await
                        {
                            Ok(_) => {}
                            Err(e)
                                if is(&e, &zk::Error::BadVersion) || is(&e, &zk::Error::NoNode) =>
                            {
                                continue;
                            }
                            Err(e) => return Err(e),
                        }
                    }
                    Place {
                        node,
                        kind: NodeKind::Holds,
                        seq: *seq,
                        czxid: stat.czxid,
                        session: s.id,
                        ttl,
                        moved: std::sync::Arc::default(),
                    }
                }
                None => {
                    let name = NodeKind::Holds.name(&who);
                    let (node, seq, czxid) = self.create(&s, &dir, &name, &mine).await?;
                    Place {
                        node,
                        kind: NodeKind::Holds,
                        seq,
                        czxid,
                        session: s.id,
                        ttl,
                        moved: std::sync::Arc::default(),
                    }
                }
            };
            let children = self.children(&s, &dir).await?;
            let line = in_line(&children);
            let older_twin = line.iter().any(|(seq, name)| {
                *seq < place.seq
                    && parse_node(name).is_some_and(|(k, w, _)| k == NodeKind::Holds && w == wanted)
            });
            if older_twin {
                // Another task of this owner made its node first: join that one (the
                // next turn of the loop adds our token to it) and drop ours.
                self.release_hold(&s, &place, token).await?;
                continue;
            }
            let place = self.placed(&prefix, place);
            let granted = line.first().is_some_and(|(seq, _)| *seq == place.seq);
            return self.settle(&s, &prefix, &place, &children, granted, started);
        }
        Err(Error::new(ErrorKind::Unavailable, "re-entering a lock: contended").retryable(true))
    }

    /// Takes the hold back; a failed release is tried again in the background (see
    /// [`RawLock::release`] on this backend).
    async fn release_reentrant(&self, keys: &LockKeys, owner: &str, token: &Token) -> Result<bool> {
        match self.release_reentrant_once(keys, owner, token).await {
            Ok(released) => Ok(released),
            Err(err) => {
                let (keys, owner, token) = (keys.clone(), owner.to_owned(), token.clone());
                self.retry_release(move |zk| {
                    let (keys, owner, token) = (keys.clone(), owner.clone(), token.clone());
                    async move { zk.release_reentrant_once(&keys, &owner, &token).await }
                });
                Err(err)
            }
        }
    }

    async fn extend_reentrant(
        &self,
        keys: &LockKeys,
        token: &Token,
        ttl: Duration,
    ) -> Result<bool> {
        self.extend(keys, token, ttl).await
    }
}

/// Reentrant kind's inspection, for [`RawInspect`](crate::raw::RawInspect).
impl ZooKeeper {
    pub(crate) async fn inspect_reentrant(&self, keys: &LockKeys) -> Result<LockState> {
        let s = self.live().await?;
        let dir = dir_path(keys);
        let children = self.children(&s, &dir).await?;
        let line = in_line(&children);
        let Some((_, head)) = line.first() else {
            return Ok(LockState::new(None, None, None).with_queued(0));
        };
        let node = format!("{dir}/{head}");
        let (data, stat) = self
            .call("reading a reentrant lock", s.client.get_data(&node))
            .await?;
        let owner = parse_node(head)
            .and_then(|(_, w, _)| unescape(w))
            .map(|w| w.rsplit_once('@').map_or(w.clone(), |(o, _)| o.to_owned()));
        Ok(LockState::new(owner, None, u64::try_from(stat.czxid).ok())
            .with_hold_count(u32::try_from(holds(&data).len()).unwrap_or(u32::MAX))
            .with_queued(u32::try_from(line.len() - 1).unwrap_or(u32::MAX)))
    }

    pub(crate) async fn force_unlock_reentrant(&self, keys: &LockKeys) -> Result<bool> {
        self.force_unlock_plain(keys).await
    }
}

impl RawRwLock for ZooKeeper {
    const READERS_QUEUE: bool = true;

    async fn acquire_rw(
        &self,
        keys: &LockKeys,
        token: &Token,
        write: bool,
        ttl: Duration,
        _grace: Duration,
    ) -> Result<Acquire> {
        let started = Instant::now();
        let kind = if write {
            NodeKind::Write
        } else {
            NodeKind::Read
        };
        let (s, place, children) = self.enter(keys, token, kind, "", ttl).await?;
        let line = in_line(&children);
        let granted = if place.kind == NodeKind::Write {
            line.first().is_some_and(|(seq, _)| *seq == place.seq)
        } else {
            // No writer's node below ours, but for writers that downgraded.
            let dir = dir_path(keys);
            let writers: Vec<String> = line
                .iter()
                .filter(|(seq, name)| {
                    *seq < place.seq
                        && parse_node(name).is_some_and(|(k, _, _)| k == NodeKind::Write)
                })
                .map(|(_, name)| format!("{dir}/{name}"))
                .collect();
            let reads: Vec<_> = writers.iter().map(|w| s.client.get_data(w)).collect();
            let mut clear = true;
            for read in reads {
                match self.call("reading a writer's node", read).await {
                    Ok((data, _)) if data == b"r" => {}
                    Err(e) if is(&e, &zk::Error::NoNode) => {}
                    Ok(_) => clear = false,
                    Err(e) => return Err(e),
                }
            }
            clear
        };
        let prefix = node_prefix(&dir_path(keys), token);
        self.settle(&s, &prefix, &place, &children, granted, started)
    }

    async fn release_rw(&self, keys: &LockKeys, token: &Token) -> Result<bool> {
        self.release(keys, token).await
    }

    async fn extend_rw(&self, keys: &LockKeys, token: &Token, ttl: Duration) -> Result<bool> {
        self.extend(keys, token, ttl).await
    }

    async fn downgrade_rw(&self, keys: &LockKeys, token: &Token, ttl: Duration) -> Result<bool> {
        let s = self.live().await?;
        let Some(place) = self.our_node(&s, keys, token).await? else {
            return Ok(false);
        };
        if place.kind != NodeKind::Write || place.session != s.id {
            return Ok(false);
        }
        // Still the writer (the lowest node)?
        let children = self.children(&s, &dir_path(keys)).await?;
        if in_line(&children)
            .first()
            .is_none_or(|(seq, _)| *seq != place.seq)
        {
            return Ok(false);
        }
        if !self
            .inner
            .reaper
            .push(&place.node, Instant::now() + self.lease(ttl, s.id))
        {
            // Its lease ran out: this client is deleting it.
            return Ok(false);
        }
        match self
            .call("downgrading", s.client.set_data(&place.node, b"r", None))
            .await
        {
            Ok(stat) => Ok(stat.ephemeral_owner == s.id),
            Err(e) if is(&e, &zk::Error::NoNode) => Ok(false),
            Err(e) => Err(e),
        }
    }

    async fn abandon_rw(&self, keys: &LockKeys, token: &Token) -> Result<()> {
        self.release(keys, token).await.map(|_| ())
    }

    async fn watch_rw(&self, keys: &LockKeys, token: &Token, _write: bool) -> Result<ReleaseWatch> {
        self.watch_for(keys, token).await
    }
}

/// RwLock kind's inspection, for [`RawInspect`](crate::raw::RawInspect).
impl ZooKeeper {
    pub(crate) async fn inspect_rw(&self, keys: &LockKeys) -> Result<LockState> {
        let s = self.live().await?;
        let dir = dir_path(keys);
        let children = self.children(&s, &dir).await?;
        let line = in_line(&children);
        let mut writer = None;
        let mut readers = 0u32;
        let mut waiting = 0u32;
        let mut writer_below = false;
        for (i, (_, name)) in line.iter().enumerate() {
            match parse_node(name) {
                Some((NodeKind::Write, who, _)) => {
                    let downgraded = self
                        .call(
                            "reading a writer's node",
                            s.client.get_data(&format!("{dir}/{name}")),
                        )
                        .await
                        .is_ok_and(|(d, _)| d == b"r");
                    if downgraded && !writer_below {
                        readers += 1;
                    } else if i == 0 {
                        writer = Some(((*name).to_owned(), unescape(who)));
                        writer_below = true;
                    } else {
                        waiting += 1;
                        writer_below = true;
                    }
                }
                Some((NodeKind::Read, _, _)) if !writer_below => readers += 1,
                _ => {}
            }
        }
        let fence = match &writer {
            Some((name, _)) => self.created(&s, &dir, name).await?,
            None => None,
        };
        Ok(LockState::new(writer.and_then(|(_, w)| w), None, fence)
            .with_holders(readers)
            .with_queued(waiting))
    }

    pub(crate) async fn force_unlock_rw(&self, keys: &LockKeys) -> Result<bool> {
        let s = self.live().await?;
        let dir = dir_path(keys);
        let children = self.children(&s, &dir).await?;
        let names: Vec<String> = in_line(&children)
            .into_iter()
            .map(|(_, n)| n.to_owned())
            .collect();
        self.delete_all(&s, &dir, &names).await
    }
}

impl RawSemaphore for ZooKeeper {
    async fn acquire_permits(
        &self,
        keys: &LockKeys,
        token: &Token,
        n: u32,
        permits: u32,
        strict: bool,
        ttl: Duration,
        _queue: bool,
    ) -> Result<Acquire> {
        let started = Instant::now();
        let (s, place, children) = self
            .enter(keys, token, NodeKind::Permits(n), "", ttl)
            .await?;
        let dir = dir_path(keys);
        let (count, version, exists) = self.permit_count(&s, &dir).await?;
        let count = match count {
            Some(c) => c,
            None if exists => {
                // The first client's count is stored with the semaphore; if another client
                // stored one first, that one counts.
                match self
                    .call(
                        "setting a semaphore's permits",
                        s.client
                            .set_data(&dir, permits.to_string().as_bytes(), Some(version)),
                    )
                    .await
                {
                    Ok(_) => permits,
                    Err(_) => self.permit_count(&s, &dir).await?.0.unwrap_or(permits),
                }
            }
            None => permits,
        };
        if strict && count != permits {
            // Our node leaves the line: no permit was taken for us.
            self.release(keys, token).await?;
            return Err(Error::permits_mismatch(keys.name(), count, permits));
        }
        if n > count {
            // It could never be served, and would hold up every waiter behind it.
            self.release(keys, token).await?;
            return Err(Error::invalid(format!(
                "{n} permits asked of semaphore {:?}, which has {count}",
                keys.name()
            )));
        }
        let granted = Self::permit_line(&children, count)
            .iter()
            .any(|(seq, _, _, fits)| *seq == place.seq && *fits);
        let prefix = node_prefix(&dir_path(keys), token);
        self.settle(&s, &prefix, &place, &children, granted, started)
    }

    async fn abandon_permits(
        &self,
        keys: &LockKeys,
        token: &Token,
        _n: u32,
        _ttl: Duration,
    ) -> Result<()> {
        self.release(keys, token).await.map(|_| ())
    }

    async fn release_permits(&self, keys: &LockKeys, token: &Token) -> Result<bool> {
        self.release(keys, token).await
    }

    async fn extend_permits(&self, keys: &LockKeys, token: &Token, ttl: Duration) -> Result<bool> {
        self.extend(keys, token, ttl).await
    }

    async fn permits_in_use(&self, keys: &LockKeys, permits: u32) -> Result<(u32, u32)> {
        let s = self.live().await?;
        let dir = dir_path(keys);
        let count = self.permit_count(&s, &dir).await?.0.unwrap_or(permits);
        let children = self.children(&s, &dir).await?;
        let used = Self::permit_line(&children, count)
            .iter()
            .filter(|(_, _, _, fits)| *fits)
            .map(|(_, _, n, _)| *n)
            .sum();
        Ok((used, count))
    }

    async fn set_permits(&self, keys: &LockKeys, permits: u32) -> Result<()> {
        self.update_count(keys, permits, |_| Some(permits))
            .await
            .map(|_| ())
    }

    async fn add_permits(
        &self,
        keys: &LockKeys,
        delta: i64,
        permits: u32,
        max: u32,
    ) -> Result<Option<u32>> {
        self.update_count(keys, permits, |count| {
            crate::raw::added_permits(count, delta, max)
        })
        .await
    }
}

/// Semaphore kind's inspection, for [`RawInspect`](crate::raw::RawInspect).
impl ZooKeeper {
    pub(crate) async fn inspect_permits(&self, keys: &LockKeys) -> Result<LockState> {
        let s = self.live().await?;
        let dir = dir_path(keys);
        let count = self.permit_count(&s, &dir).await?.0;
        let children = self.children(&s, &dir).await?;
        let line = Self::permit_line(&children, count.unwrap_or(u32::MAX));
        let holding: Vec<_> = line.iter().filter(|(_, _, _, fits)| *fits).collect();
        let used: u32 = holding.iter().map(|(_, _, n, _)| *n).sum();
        let fence = match holding.last() {
            Some((_, name, _, _)) => self.created(&s, &dir, name).await?,
            None => None,
        };
        Ok(LockState::new(None, None, fence)
            .with_hold_count(used)
            .with_holders(u32::try_from(holding.len()).unwrap_or(u32::MAX))
            .with_queued(u32::try_from(line.len() - holding.len()).unwrap_or(u32::MAX)))
    }

    pub(crate) async fn force_unlock_permits(&self, keys: &LockKeys) -> Result<bool> {
        let s = self.live().await?;
        let dir = dir_path(keys);
        // Every node, waiters' too (they queue again): which nodes hold cannot be told
        // from the count alone once it was lowered below what is held.
        let children = self.children(&s, &dir).await?;
        let all: Vec<String> = Self::permit_line(&children, u32::MAX)
            .into_iter()
            .map(|(_, name, _, _)| name)
            .collect();
        self.delete_all(&s, &dir, &all).await
    }
}

crate::raw::fair_is_the_plain_lock!(ZooKeeper);
