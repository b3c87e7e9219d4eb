//! `status`, `list` and `force-unlock` on `redlock://`: every node asked, the majority's
//! view shown beside each node's.
//!
//! A RedLock lock is held while a majority of the nodes hold one token, so that is what
//! `status` calls held, with the time until fewer than a majority will hold it as its
//! remaining ttl. When too few nodes answer to tell, it is an error, not a guess.
//! `force-unlock` deletes the key on every node; it succeeds once so many nodes no longer
//! hold it that no majority can.

use std::collections::BTreeSet;
use std::time::Duration;

use fencelock::backend::{Quorum, Redis};
use fencelock::raw::{LockState, RawInspect};
use fencelock::{Error, Lock};
use serde::Serialize;

use super::{
    Status, abbreviate, confirm_force_unlock, lock_kind_only, millis, plain_text, print_list,
    print_status, remaining, report_force_unlock,
};
use crate::args::{ForceUnlockArgs, Kind, ListArgs, StatusArgs};
use crate::exit::{self, Failure};

/// How the store is named in errors.
const STORE: &str = "redlock://";

/// Every node's view of one lock.
#[derive(Serialize)]
pub(crate) struct View {
    /// Nodes that must hold a token for the lock to be held.
    needed: usize,
    nodes: Vec<NodeView>,
}

#[derive(Serialize)]
struct NodeView {
    node: String,
    held: bool,
    holder: Option<String>,
    remaining_ms: Option<u64>,
    /// Why the node did not answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

impl View {
    pub(super) fn print(&self) {
        println!(
            "quorum:          {} of {} nodes",
            self.needed,
            self.nodes.len()
        );
        for n in &self.nodes {
            match &n.error {
                Some(err) => println!("  node {}: error: {}", n.node, plain_text(err)),
                None => println!(
                    "  node {}: {}, remaining {}",
                    n.node,
                    n.holder
                        .as_deref()
                        .map_or_else(|| "free".to_owned(), |h| format!("token {}", plain_text(h))),
                    remaining(n.remaining_ms)
                ),
            }
        }
    }
}

/// One node's answer.
struct Answer {
    node: String,
    state: Result<LockState, Error>,
}

async fn ask_every_node(
    q: &Quorum<Redis>,
    prefix: &str,
    name: &str,
) -> Result<Vec<Answer>, Failure> {
    let mut answers = Vec::with_capacity(q.nodes().len());
    for node in q.nodes() {
        let lock = Lock::builder(node.clone(), name).prefix(prefix).build()?;
        answers.push(Answer {
            node: node.addr().to_owned(),
            state: lock.state().await,
        });
    }
    Ok(answers)
}

/// The token a majority holds and how long they all still will (the majority-th longest
/// remaining ttl); `None` if no token can be on a majority; an error if too few nodes
/// answered to tell.
fn majority(answers: &[Answer], needed: usize, name: &str) -> Result<Option<LockState>, Failure> {
    let held: Vec<(&str, Option<Duration>)> = answers
        .iter()
        .filter_map(|a| {
            let s = a.state.as_ref().ok()?;
            Some((s.holder.as_deref()?, s.remaining))
        })
        .collect();
    let tokens: BTreeSet<&str> = held.iter().map(|(t, _)| *t).collect();
    let unanswered = answers.iter().filter(|a| a.state.is_err()).count();
    let mut best = 0;
    for token in tokens {
        // A key without expiry (another client's) counts as lasting.
        let mut left: Vec<Duration> = held
            .iter()
            .filter(|(t, _)| *t == token)
            .map(|(_, r)| r.unwrap_or(Duration::MAX))
            .collect();
        best = best.max(left.len());
        if left.len() >= needed {
            left.sort_unstable_by(|a, b| b.cmp(a));
            let until = left[needed - 1];
            let until = (until != Duration::MAX).then_some(until);
            return Ok(Some(LockState::new(Some(token.to_owned()), until, None)));
        }
    }
    if best + unanswered >= needed {
        return Err(Failure::new(
            exit::UNAVAILABLE,
            format!(
                "only {} of {} nodes answered: cannot tell whether a majority holds {name:?}",
                answers.len() - unanswered,
                answers.len()
            ),
        ));
    }
    Ok(None)
}

fn view(answers: &[Answer], needed: usize) -> View {
    View {
        needed,
        nodes: answers
            .iter()
            .map(|a| match &a.state {
                Ok(s) => NodeView {
                    node: a.node.clone(),
                    held: s.holder.is_some(),
                    holder: s.holder.as_deref().map(abbreviate),
                    remaining_ms: s.remaining.map(millis),
                    error: None,
                },
                Err(e) => NodeView {
                    node: a.node.clone(),
                    held: false,
                    holder: None,
                    remaining_ms: None,
                    error: Some(e.to_string()),
                },
            })
            .collect(),
    }
}

pub(super) async fn status_of(
    q: &Quorum<Redis>,
    prefix: &str,
    name: &str,
) -> Result<Status, Failure> {
    let answers = ask_every_node(q, prefix, name).await?;
    let state =
        majority(&answers, q.quorum(), name)?.unwrap_or_else(|| LockState::new(None, None, None));
    let key = Lock::builder(q.clone(), name)
        .prefix(prefix)
        .build()?
        .keys()
        .lock()
        .to_owned();
    let mut status = Status::new(name, key, Kind::Lock, &state);
    status.quorum = Some(view(&answers, q.quorum()));
    Ok(status)
}

/// `dlock status` on RedLock.
pub(crate) async fn status_cmd(q: Quorum<Redis>, args: StatusArgs) -> Result<u8, Failure> {
    lock_kind_only(args.kind, STORE)?;
    let s = status_of(&q, args.store.lock_prefix(), &args.name).await?;
    print_status(&s, &args)
}

/// `dlock list` on RedLock: the names any node lists, shown if a majority holds them.
/// Every lock a majority holds is on some node that answered as long as a majority
/// answered.
pub(crate) async fn list_cmd(q: Quorum<Redis>, args: ListArgs) -> Result<u8, Failure> {
    let mut names = BTreeSet::new();
    let mut failed = Vec::new();
    for node in q.nodes() {
        match node
            .list(args.store.lock_prefix(), &args.pattern, args.limit)
            .await
        {
            Ok(found) => names.extend(found),
            Err(e) => failed.push(format!("{}: {e}", node.addr())),
        }
    }
    if q.nodes().len() - failed.len() < q.quorum() {
        return Err(Failure::new(
            exit::UNAVAILABLE,
            format!(
                "only {} of {} nodes answered, {} are needed to list: {}",
                q.nodes().len() - failed.len(),
                q.nodes().len(),
                q.quorum(),
                failed.join("; ")
            ),
        ));
    }
    let mut rows = Vec::new();
    for name in names.into_iter().take(args.limit) {
        let s = status_of(&q, args.store.lock_prefix(), &name).await?;
        if s.held {
            rows.push(s);
        }
    }
    print_list(&rows, args.json)
}

/// `dlock force-unlock` on RedLock: the key deleted on every node.
pub(crate) async fn force_unlock_cmd(
    q: Quorum<Redis>,
    args: ForceUnlockArgs,
) -> Result<u8, Failure> {
    lock_kind_only(args.kind, STORE)?;
    if !confirm_force_unlock(&args, status_of(&q, args.store.lock_prefix(), &args.name)).await? {
        return Ok(exit::CONFLICT);
    }
    let mut deleted = 0;
    let mut failed = Vec::new();
    for node in q.nodes() {
        let lock = Lock::builder(node.clone(), &args.name)
            .prefix(args.store.lock_prefix())
            .build()?;
        match lock.force_unlock().await {
            Ok(true) => deleted += 1,
            Ok(false) => {}
            Err(e) => failed.push(format!("{}: {e}", node.addr())),
        }
    }
    // The holder keeps the lock only if the nodes we could not reach make a majority.
    if failed.len() >= q.quorum() {
        return Err(Failure::new(
            exit::UNAVAILABLE,
            format!(
                "force-unlocked {:?} on {deleted} nodes, but {} of {} did not answer, and they \
                 may still hold it for a majority: {}",
                args.name,
                failed.len(),
                q.nodes().len(),
                failed.join("; ")
            ),
        ));
    }
    for f in &failed {
        eprintln!("dlock: warning: node {f} did not answer; too few nodes are left to hold it");
    }
    eprintln!(
        "dlock: deleted on {deleted} of {} nodes ({} needed to hold it)",
        q.nodes().len(),
        q.quorum()
    );
    report_force_unlock(&args, deleted > 0)
}
