//! The commands.

pub(crate) mod elect;
pub(crate) mod harness;
mod kinds;
mod run;

use std::io::{BufRead, IsTerminal, Write};
use std::time::Duration;

use dlock::keys::LockKeys;
use dlock::raw::{RawFencing, RawInspect, RawLock};
use dlock::{Lock, LockGuard, Token};
use serde::Serialize;

use crate::args::{
    AcquireArgs, ExtendArgs, ForceUnlockArgs, Kind, ListArgs, StatusArgs, TokenArgs, Wait,
};
use crate::exit::{self, Failure};

pub(crate) use run::{run, run_plain};

/// Acquires as `--wait` / `--no-wait` say: `None` on conflict.
pub(crate) async fn acquire<B: RawLock>(
    lock: &Lock<B>,
    wait: &Wait,
) -> dlock::Result<Option<LockGuard<B>>> {
    if wait.no_wait {
        lock.try_lock().await
    } else if let Some(d) = wait.wait {
        lock.try_lock_for(d).await
    } else {
        lock.lock().await.map(Some)
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn print_json(value: &impl Serialize) -> Result<(), Failure> {
    let text = serde_json::to_string(value)
        .map_err(|e| Failure::new(exit::UNAVAILABLE, format!("encoding JSON: {e}")))?;
    println!("{text}");
    Ok(())
}

/// Enough of a token to tell holders apart, not enough to release their lock.
fn abbreviate(token: &str) -> String {
    let short: String = token.chars().take(8).collect();
    if short.len() < token.len() {
        format!("{short}…")
    } else {
        short
    }
}

#[derive(Serialize)]
struct Acquired<'a> {
    name: &'a str,
    key: &'a str,
    token: &'a str,
    fence: u64,
    ttl_ms: u64,
}

pub(crate) async fn acquire_cmd<B: RawFencing>(
    backend: B,
    args: AcquireArgs,
) -> Result<u8, Failure> {
    let lock = Lock::builder(backend, &args.name)
        .prefix(&args.store.prefix)
        .ttl(args.ttl)
        .watchdog(false)
        .build()?;
    let Some(guard) = acquire(&lock, &args.wait).await? else {
        eprintln!("dlock: {:?} is held by another process", args.name);
        return Ok(args.wait.conflict_exit_code);
    };
    let fence = guard.fencing_token().get();
    if args.json {
        print_json(&Acquired {
            name: &args.name,
            key: lock.keys().lock(),
            token: guard.token().as_str(),
            fence,
            ttl_ms: millis(args.ttl),
        })?;
    } else {
        println!("{} {fence}", guard.token());
    }
    // The lease outlives this process until its ttl, or `dlock release`.
    guard.forget();
    Ok(exit::SUCCESS)
}

#[derive(Serialize)]
struct Done<'a> {
    name: &'a str,
    ok: bool,
    action: &'a str,
}

fn token_lock<B: RawLock>(backend: B, args: &TokenArgs) -> Result<(Lock<B>, Token), Failure> {
    let lock = Lock::builder(backend, &args.name)
        .prefix(&args.store.prefix)
        .build()?;
    Ok((lock, Token::from_string(args.token.clone())?))
}

pub(crate) async fn release_cmd<B: RawLock>(backend: B, args: TokenArgs) -> Result<u8, Failure> {
    let (lock, token) = token_lock(backend, &args)?;
    lock.release_token(&token).await?;
    if args.json {
        print_json(&Done {
            name: &args.name,
            ok: true,
            action: "released",
        })?;
    }
    Ok(exit::SUCCESS)
}

pub(crate) async fn extend_cmd<B: RawLock>(backend: B, args: ExtendArgs) -> Result<u8, Failure> {
    let (lock, token) = token_lock(backend, &args.held)?;
    lock.extend_token(&token, args.ttl).await?;
    if args.held.json {
        print_json(&Done {
            name: &args.held.name,
            ok: true,
            action: "extended",
        })?;
    }
    Ok(exit::SUCCESS)
}

#[derive(Serialize)]
struct Status {
    name: String,
    key: String,
    held: bool,
    holder: Option<String>,
    remaining_ms: Option<u64>,
    last_fence: Option<u64>,
    waiting_clients: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    hold_count: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    holders: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    queued: Option<u32>,
}

async fn status_of<B: kinds::AnyKind>(
    backend: B,
    kind: Kind,
    prefix: &str,
    name: &str,
) -> Result<Status, Failure> {
    let (key, state) = kinds::state_of(backend, kind, prefix, name).await?;
    Ok(Status::new(name, key, kind, &state))
}

/// Where a store keeps a plain lock: what `status` and `list` show as its key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Layout {
    /// At the lock key itself (Redis, memcached).
    AtKey,
    /// In a queue under `<lock key>/`, one key `<lock key>/<token>` per holder or waiter,
    /// nothing at the lock key (etcd): shown as the prefix `<lock key>/`.
    QueueUnder,
    /// Ephemeral sequential nodes in the directory `/<lock key, escaped>/` under the
    /// chroot (ZooKeeper).
    Znodes,
}

impl Layout {
    fn key(self, keys: &LockKeys) -> String {
        match self {
            Layout::AtKey => keys.lock().to_owned(),
            Layout::QueueUnder => format!("{}/", keys.lock()),
            Layout::Znodes => format!("/{}/", dlock::backend::zookeeper::escape(keys.lock())),
        }
    }
}

/// A plain lock's status, on any store that can be inspected.
async fn lock_status_of<B: RawInspect>(
    backend: B,
    layout: Layout,
    prefix: &str,
    name: &str,
) -> Result<Status, Failure> {
    let lock = Lock::builder(backend, name).prefix(prefix).build()?;
    let state = lock.state().await?;
    Ok(Status::new(
        name,
        layout.key(lock.keys()),
        Kind::Lock,
        &state,
    ))
}

impl Status {
    fn new(name: &str, key: String, kind: Kind, state: &dlock::raw::LockState) -> Status {
        Status {
            name: name.to_owned(),
            key,
            held: kinds::is_held(state),
            // Reentrant holders are owners, not secret tokens: shown whole.
            holder: state.holder.as_deref().map(|h| {
                if kind == Kind::Reentrant {
                    h.to_owned()
                } else {
                    abbreviate(h)
                }
            }),
            remaining_ms: state.remaining.map(millis),
            last_fence: state.last_fence,
            waiting_clients: state.waiting_clients,
            hold_count: state.hold_count,
            holders: state.holders,
            queued: state.queued,
        }
    }
}

/// The stores with the plain lock only (memcached, etcd) know no other kind.
fn lock_kind_only(kind: Kind) -> Result<(), Failure> {
    if kind == Kind::Lock {
        Ok(())
    } else {
        Err(Failure::usage(
            "this store has the plain lock only: --kind lock",
        ))
    }
}

fn or_dash<T: ToString>(v: Option<T>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

fn remaining(ms: Option<u64>) -> String {
    or_dash(ms.map(|ms| humantime::format_duration(Duration::from_millis(ms)).to_string()))
}

pub(crate) async fn status_cmd<B: kinds::AnyKind>(
    backend: B,
    args: StatusArgs,
) -> Result<u8, Failure> {
    let s = status_of(backend, args.kind, &args.store.prefix, &args.name).await?;
    print_status(&s, &args)
}

/// `dlock status` on a store with the plain lock only.
pub(crate) async fn lock_status_cmd<B: RawInspect>(
    backend: B,
    layout: Layout,
    args: StatusArgs,
) -> Result<u8, Failure> {
    lock_kind_only(args.kind)?;
    let s = lock_status_of(backend, layout, &args.store.prefix, &args.name).await?;
    print_status(&s, &args)
}

fn print_status(s: &Status, args: &StatusArgs) -> Result<u8, Failure> {
    if args.json {
        print_json(s)?;
    } else {
        println!("name:            {}", s.name);
        println!("key:             {}", s.key);
        println!(
            "held:            {}",
            match (&s.holder, s.holders) {
                (Some(h), _) if args.kind == Kind::Reentrant => format!("yes, by owner {h}"),
                (Some(h), _) => format!("yes, token {h}"),
                (None, Some(n)) if n > 0 => format!("yes, by {n} holders"),
                _ => "no".to_owned(),
            }
        );
        println!("remaining:       {}", remaining(s.remaining_ms));
        println!("last fence:      {}", or_dash(s.last_fence));
        println!("waiting clients: {}", or_dash(s.waiting_clients));
        match args.kind {
            Kind::Reentrant => println!("hold count:      {}", or_dash(s.hold_count)),
            Kind::Semaphore => {
                println!("permits in use:  {}", or_dash(s.hold_count));
                println!("holders:         {}", or_dash(s.holders));
            }
            Kind::Rwlock => {
                println!("readers:         {}", or_dash(s.holders));
                println!("waiting writers: {}", or_dash(s.queued));
            }
            Kind::Fair => println!("queued:          {}", or_dash(s.queued)),
            // A plain lock's waiters in the store's queue, where it keeps one (Redis, etcd).
            Kind::Lock => {
                if let Some(n) = s.queued {
                    println!("queued:          {n}");
                }
            }
        }
    }
    Ok(exit::SUCCESS)
}

pub(crate) async fn list_cmd<B: RawInspect>(
    backend: B,
    layout: Layout,
    args: ListArgs,
) -> Result<u8, Failure> {
    let mut names = backend
        .list(&args.store.prefix, &args.pattern, args.limit)
        .await?;
    names.sort();
    let mut rows = Vec::with_capacity(names.len());
    for name in &names {
        let s = lock_status_of(backend.clone(), layout, &args.store.prefix, name).await?;
        if s.held {
            rows.push(s);
        }
    }
    if args.json {
        print_json(&rows)?;
    } else {
        let width = rows.iter().map(|r| r.name.len()).max().unwrap_or(4).max(4);
        println!(
            "{:<width$}  {:<10}  {:>12}  {:>10}",
            "NAME", "HOLDER", "REMAINING", "FENCE"
        );
        for r in &rows {
            println!(
                "{:<width$}  {:<10}  {:>12}  {:>10}",
                r.name,
                or_dash(r.holder.clone()),
                remaining(r.remaining_ms),
                or_dash(r.last_fence)
            );
        }
    }
    Ok(exit::SUCCESS)
}

pub(crate) async fn force_unlock_cmd<B: kinds::AnyKind>(
    backend: B,
    args: ForceUnlockArgs,
) -> Result<u8, Failure> {
    if !confirm_force_unlock(
        &args,
        status_of(backend.clone(), args.kind, &args.store.prefix, &args.name),
    )
    .await?
    {
        return Ok(exit::CONFLICT);
    }
    let done = kinds::force_unlock(backend, args.kind, &args.store.prefix, &args.name).await?;
    report_force_unlock(&args, done)
}

/// `dlock force-unlock` on a store with the plain lock only.
pub(crate) async fn lock_force_unlock_cmd<B: RawInspect>(
    backend: B,
    layout: Layout,
    args: ForceUnlockArgs,
) -> Result<u8, Failure> {
    lock_kind_only(args.kind)?;
    if !confirm_force_unlock(
        &args,
        lock_status_of(backend.clone(), layout, &args.store.prefix, &args.name),
    )
    .await?
    {
        return Ok(exit::CONFLICT);
    }
    let lock = Lock::builder(backend, &args.name)
        .prefix(&args.store.prefix)
        .build()?;
    let done = lock.force_unlock().await?;
    report_force_unlock(&args, done)
}

/// Asks on the terminal (unless `--yes`); `Ok(false)` if the operator said no.
async fn confirm_force_unlock(
    args: &ForceUnlockArgs,
    status: impl Future<Output = Result<Status, Failure>>,
) -> Result<bool, Failure> {
    if args.yes {
        return Ok(true);
    }
    let stdin = std::io::stdin();
    if !stdin.is_terminal() {
        return Err(Failure::usage(
            "refusing to force-unlock without --yes (stdin is not a terminal to ask on)",
        ));
    }
    let s = status.await?;
    if !s.held {
        eprintln!("dlock: {:?} is not held", args.name);
        return Ok(true);
    }
    let by = match (&s.holder, s.holders) {
        (Some(h), _) => format!("held by {h}"),
        (None, n) => format!("held by {} holders", or_dash(n)),
    };
    eprint!(
        "Force-unlock {:?}, {by}? Its holders keep running until they notice. [y/N] ",
        args.name,
    );
    std::io::stderr().flush().ok();
    let mut answer = String::new();
    stdin.lock().read_line(&mut answer).ok();
    if matches!(answer.trim(), "y" | "Y" | "yes") {
        Ok(true)
    } else {
        eprintln!("dlock: not unlocked");
        Ok(false)
    }
}

fn report_force_unlock(args: &ForceUnlockArgs, done: bool) -> Result<u8, Failure> {
    if done {
        eprintln!("dlock: {:?} force-unlocked", args.name);
    } else {
        eprintln!("dlock: {:?} was not held", args.name);
    }
    Ok(exit::SUCCESS)
}
