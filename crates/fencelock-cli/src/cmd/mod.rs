//! The commands.

pub(crate) mod elect;
pub(crate) mod harness;
pub(crate) mod hold;
mod kinds;
pub(crate) mod quorum;
mod reaper;
mod run;
mod supervise;
pub(crate) mod top;

use std::fmt::Write as _;
use std::io::{BufRead, IsTerminal, Write};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

#[cfg(feature = "etcd")]
use fencelock::backend::Etcd;
use fencelock::backend::{Memcached, Memory, PgAdvisory, Postgres, Quorum, Redis, ZooKeeper};
use fencelock::keys::LockKeys;
use fencelock::raw::{RawInspect, RawLock, RawSemaphore};
use fencelock::{ErrorKind, HolderInfo, Lock, LockGuard, Token};
use serde::Serialize;

use crate::args::{
    AcquireArgs, ExtendArgs, ForceUnlockArgs, HolderArgs, Kind, ListArgs, SetPermitsArgs,
    StatusArgs, TokenArgs, Wait,
};
use crate::exit::{self, Failure};

pub(crate) use reaper::{ARG as REAPER_ARG, GATE_ARG, gate_main, main as reaper_main};
pub(crate) use run::{run, run_plain};
pub(crate) use supervise::write_from_the_background;

/// Acquires as `--wait` / `--no-wait` say: `None` on conflict.
pub(crate) async fn acquire<B: RawLock>(
    lock: &Lock<B>,
    wait: &Wait,
) -> fencelock::Result<Option<LockGuard<B>>> {
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

/// Enough of a token to tell holders apart, never enough to release their lock: at most 8
/// characters, and at most half, of its random part (the part before the holder's
/// metadata, which `status` shows on its own), always followed by `…`.
fn abbreviate(token: &str) -> String {
    let random = token.split_once('~').map_or(token, |(random, _)| random);
    let shown = (random.chars().count() / 2).min(8);
    // Another client's token can hold anything: no control characters or spaces.
    let short: String = random
        .chars()
        .take(shown)
        .map(|c| {
            if c.is_whitespace() || c.is_control() {
                '_'
            } else {
                c
            }
        })
        .collect();
    format!("{short}…")
}

/// What `dlock acquire` tells about its holder: this host, the process that called it
/// (the script that holds the lock from now on: dlock itself exits at once) and `--info`.
fn acquire_holder(args: &HolderArgs) -> Option<HolderInfo> {
    if args.no_info {
        return None;
    }
    let mut info = HolderInfo::current();
    info.pid = u32::try_from(nix::unistd::getppid().as_raw()).ok();
    Some(match &args.info {
        Some(value) => info.command(value),
        None => info,
    })
}

#[derive(Serialize)]
struct Acquired<'a> {
    name: &'a str,
    key: &'a str,
    token: &'a str,
    /// `None` (JSON null) on a store without fences (redlock://).
    fence: Option<u64>,
    ttl_ms: u64,
}

/// `dlock acquire`; `fence` reads the grant's fence where the store mints one. Prints
/// `TOKEN FENCE`, or `TOKEN -` without a fence.
pub(crate) async fn acquire_cmd<B: Holders>(
    backend: B,
    args: AcquireArgs,
    fence: impl Fn(&LockGuard<B>) -> Option<u64>,
) -> Result<u8, Failure> {
    let mut builder = Lock::builder(backend, &args.name)
        .prefix(args.store.lock_prefix())
        .ttl(args.ttl)
        .watchdog(false);
    if let Some(info) = acquire_holder(&args.holder) {
        builder = builder.holder_info(info);
    }
    let lock = builder.build()?;
    let Some(guard) = acquire(&lock, &args.wait).await? else {
        let held = lock
            .backend()
            .lock_status(args.store.lock_prefix(), &args.name)
            .await;
        eprintln!("dlock: {}", conflict(&args.name, &args.wait, held));
        return Ok(args.wait.conflict_exit_code);
    };
    let fence = fence(&guard);
    if args.json {
        print_json(&Acquired {
            name: &args.name,
            key: lock.keys().lock(),
            token: guard.token().as_str(),
            fence,
            ttl_ms: millis(args.ttl),
        })?;
    } else {
        println!("{} {}", guard.token(), or_dash(fence));
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
        .prefix(args.store.lock_prefix())
        .build()?;
    Ok((lock, Token::from_string(args.token.clone())?))
}

pub(crate) async fn release_cmd<B: Holders>(backend: B, args: TokenArgs) -> Result<u8, Failure> {
    let (lock, token) = token_lock(backend, &args)?;
    match lock.release_token(&token).await {
        Err(e) if e.kind() == ErrorKind::LockLost => {
            return Err(not_ours(lock.backend(), &args, "release", "released").await);
        }
        result => result?,
    }
    if args.json {
        print_json(&Done {
            name: &args.name,
            ok: true,
            action: "released",
        })?;
    }
    Ok(exit::SUCCESS)
}

pub(crate) async fn extend_cmd<B: Holders>(backend: B, args: ExtendArgs) -> Result<u8, Failure> {
    let (lock, token) = token_lock(backend, &args.held)?;
    match lock.extend_token(&token, args.ttl).await {
        Err(e) if e.kind() == ErrorKind::LockLost => {
            return Err(not_ours(lock.backend(), &args.held, "extend", "extended").await);
        }
        result => result?,
    }
    if args.held.json {
        print_json(&Done {
            name: &args.held.name,
            ok: true,
            action: "extended",
        })?;
    }
    Ok(exit::SUCCESS)
}

/// Why `release` or `extend` under `args.token` found the lock not held under it: held
/// under another token ([`exit::NOT_OURS`], naming its holder), or by nobody
/// ([`exit::NOT_HELD`]). The store cannot tell a mistyped token from one whose lease ran
/// out; the message says both.
async fn not_ours<B: Holders>(backend: &B, args: &TokenArgs, verb: &str, done: &str) -> Failure {
    let name = shown(&args.name);
    match backend
        .lock_status(args.store.lock_prefix(), &args.name)
        .await
    {
        Ok(s) if s.held => Failure::new(
            exit::NOT_OURS,
            format!(
                "{name} is held under another token, by {}: not {done}; if this token held \
                 it, its lease ran out and another holder took the lock",
                held_by(&s)
            ),
        ),
        Ok(_) => Failure::new(
            exit::NOT_HELD,
            format!(
                "{name} is not held, under this token or any other: nothing to {verb}; if this \
                 token held it, its lease ran out or it was force-unlocked"
            ),
        ),
        Err(f) => f,
    }
}

/// A store whose plain lock can be looked up (as `status` does), to say who holds it
/// when it is not ours: a conflict, a `release` or `extend` under a token that does not
/// hold it.
pub(crate) trait Holders: RawLock {
    /// The plain lock `name`'s status under `prefix`.
    async fn lock_status(&self, prefix: &str, name: &str) -> Result<Status, Failure>;
}

/// [`Holders`] for stores that inspect a plain lock themselves, keeping it as `layout`.
macro_rules! holders {
    ($($store:ty => $layout:expr),* $(,)?) => {$(
        impl Holders for $store {
            async fn lock_status(&self, prefix: &str, name: &str) -> Result<Status, Failure> {
                lock_status_of(self.clone(), $layout, prefix, name).await
            }
        }
    )*};
}

holders! {
    Redis => Layout::AtKey,
    Memory => Layout::AtKey,
    Postgres => Layout::AtKey,
    Memcached => Layout::AtKey,
    ZooKeeper => Layout::Znodes,
    PgAdvisory => Layout::Session,
}

#[cfg(feature = "etcd")]
holders! {
    Etcd => Layout::QueueUnder,
}

impl Holders for Quorum<Redis> {
    async fn lock_status(&self, prefix: &str, name: &str) -> Result<Status, Failure> {
        quorum::status_of(self, prefix, name).await
    }
}

/// What `run` and `acquire` say when `name` is held (`--no-wait`, or `--wait` ran out):
/// who holds it, as `status` shows it (`held`), and what to do.
pub(crate) fn conflict(name: &str, wait: &Wait, held: Result<Status, Failure>) -> String {
    let (by, semaphore) = match &held {
        Ok(s) if s.held => (held_by(s), s.kind == Kind::Semaphore.name()),
        Ok(s) => (
            "another process".to_owned(),
            s.kind == Kind::Semaphore.name(),
        ),
        Err(_) => ("another process".to_owned(), false),
    };
    let name = shown(name);
    // A semaphore is full, not held.
    let (what, is) = if semaphore {
        (format!("every permit of semaphore {name}"), "taken")
    } else {
        (name, "held")
    };
    match wait.wait {
        Some(d) => format!(
            "{what} is still {is} after --wait {}, by {by}: a longer --wait waits longer, \
             and without --wait dlock waits until it is free",
            humantime::format_duration(d)
        ),
        None => format!(
            "{what} is {is} by {by}: not waiting (--no-wait); --wait D waits up to D for it"
        ),
    }
}

/// Who holds a lock, in words: the holder's host, pid, command and since when, as it told
/// them; else its session, owner, abbreviated token or number of holders.
fn held_by(s: &Status) -> String {
    if let Some(pid) = s.backend_pid {
        return format!("{} {pid}", BACKEND_PID);
    }
    match s.holders {
        Some(n) if n > 1 => return format!("{n} holders"),
        _ => {}
    }
    if let Some(h) = &s.holder_info {
        let mut told = Vec::new();
        if let Some(host) = &h.host {
            told.push(format!("host {}", plain_text(host)));
        }
        if let Some(pid) = h.pid {
            told.push(format!("pid {pid}"));
        }
        if let Some(command) = &h.command {
            told.push(format!("command {:?}", plain_text(command)));
        }
        if let Some(since) = &h.since {
            told.push(format!("since {since}"));
        }
        if !told.is_empty() {
            return told.join(", ");
        }
    }
    match &s.holder {
        Some(h) if s.holder_is_token => {
            format!(
                "token {} (a holder that told nothing about itself)",
                plain_text(h)
            )
        }
        Some(h) => plain_text(h),
        None if s.holders == Some(1) => "1 holder".to_owned(),
        None => "another process".to_owned(),
    }
}

/// How `status` and messages name an advisory lock's holder: a server process of
/// PostgreSQL's, not a process of the holder's.
const BACKEND_PID: &str = "a PostgreSQL session, backend pid";

#[derive(Serialize)]
pub(crate) struct Status {
    name: String,
    /// Which kind of lock (each kind is a separate lock, even under one name).
    kind: &'static str,
    key: String,
    held: bool,
    holder: Option<String>,
    /// Who the holder said it is (`None`: it told nothing, or nobody holds it).
    holder_info: Option<Holder>,
    remaining_ms: Option<u64>,
    last_fence: Option<u64>,
    waiting_clients: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    hold_count: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    holders: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    queued: Option<u32>,
    /// A semaphore's stored permit count (JSON null: none stored); absent for other kinds.
    #[serde(skip_serializing_if = "Option::is_none")]
    permits: Option<Option<u32>>,
    /// RedLock: every node's view.
    #[serde(skip_serializing_if = "Option::is_none")]
    quorum: Option<quorum::View>,
    /// Advisory mode: the process id of the PostgreSQL server process (backend) whose
    /// session holds the lock, not of a process of the holder's.
    #[serde(skip_serializing_if = "Option::is_none")]
    backend_pid: Option<u32>,
    /// Whether `holder` is an abbreviated token (else an owner or a session, shown whole).
    #[serde(skip)]
    holder_is_token: bool,
}

/// A holder's metadata as `status` and `list` show it.
#[derive(Serialize)]
struct Holder {
    host: Option<String>,
    pid: Option<u32>,
    command: Option<String>,
    /// When it asked for the lock: RFC 3339, UTC, whole seconds.
    since: Option<String>,
    /// The same, in milliseconds since the Unix epoch.
    since_ms: Option<u64>,
}

impl Holder {
    fn of(info: &HolderInfo) -> Holder {
        Holder {
            host: info.host.clone(),
            pid: info.pid,
            command: info.command.clone(),
            since: info
                .since
                .map(|t| humantime::format_rfc3339_seconds(t).to_string()),
            since_ms: info
                .since
                .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                .map(millis),
        }
    }

    /// How long ago, by this machine's clock, compactly.
    fn age(&self) -> Option<String> {
        let since = UNIX_EPOCH.checked_add(Duration::from_millis(self.since_ms?))?;
        SystemTime::now().duration_since(since).ok().map(compact)
    }
}

/// A semaphore's status shows its stored permit count: the one thing beyond
/// [`RawInspect`] that status asks of a store.
async fn status_of<B: RawInspect + RawSemaphore>(
    backend: B,
    kind: Kind,
    prefix: Option<&str>,
    name: &str,
) -> Result<Status, Failure> {
    let permits = match kind {
        Kind::Semaphore => Some(kinds::stored_permits(backend.clone(), prefix, name).await?),
        _ => None,
    };
    let (key, state) = kinds::state_of(backend, kind, prefix, name).await?;
    let mut status = Status::new(name, key, kind, &state);
    status.permits = permits;
    Ok(status)
}

/// Where a store keeps a plain lock: what `status` and `list` show as its key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Layout {
    /// At the lock key itself (Redis, memcached).
    AtKey,
    /// In a queue under `<lock key>/`, one key `<lock key>/<token>` per holder or waiter,
    /// nothing at the lock key (etcd): shown as the prefix `<lock key>/`.
    #[cfg_attr(not(feature = "etcd"), allow(dead_code, reason = "etcd:// only"))]
    QueueUnder,
    /// Ephemeral sequential nodes in the directory `/<lock key, escaped>/` under the
    /// chroot (ZooKeeper).
    Znodes,
    /// A session lock on a hash of the lock key (PostgreSQL advisory locks): the holder
    /// is a session (`pid N`), no secret, shown whole.
    Session,
}

impl Layout {
    fn key(self, keys: &LockKeys) -> String {
        match self {
            Layout::AtKey | Layout::Session => keys.lock().to_owned(),
            Layout::QueueUnder => format!("{}/", keys.lock()),
            Layout::Znodes => format!("/{}/", fencelock::backend::zookeeper::escape(keys.lock())),
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
    let mut status = Status::new(name, layout.key(lock.keys()), Kind::Lock, &state);
    if layout == Layout::Session {
        status.holder.clone_from(&state.holder);
        status.holder_is_token = false;
        status.backend_pid = state
            .holder
            .as_deref()
            .and_then(|h| h.strip_prefix("pid "))
            .and_then(|pid| pid.parse().ok());
    }
    Ok(status)
}

impl Status {
    fn new(name: &str, key: String, kind: Kind, state: &fencelock::raw::LockState) -> Status {
        Status {
            name: name.to_owned(),
            kind: kind.name(),
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
            // A reentrant lock's holder is its owner, whose token carries no metadata.
            holder_info: state.holder_info.as_ref().map(Holder::of),
            remaining_ms: state.remaining.map(millis),
            last_fence: state.last_fence,
            waiting_clients: state.waiting_clients,
            hold_count: state.hold_count,
            holders: state.holders,
            queued: state.queued,
            permits: None,
            quorum: None,
            backend_pid: None,
            holder_is_token: kind != Kind::Reentrant,
        }
    }

    fn host(&self) -> Option<&str> {
        self.holder_info.as_ref()?.host.as_deref()
    }

    fn pid(&self) -> Option<u32> {
        self.holder_info.as_ref()?.pid
    }

    fn command(&self) -> Option<&str> {
        self.holder_info.as_ref()?.command.as_deref()
    }

    fn since(&self) -> Option<&str> {
        self.holder_info.as_ref()?.since.as_deref()
    }
}

/// The stores with the plain lock only (advisory mode, RedLock) know no
/// other kind.
fn lock_kind_only(kind: Kind, store: &str) -> Result<(), Failure> {
    if kind == Kind::Lock {
        Ok(())
    } else {
        Err(Failure::usage(format!(
            "{store} has the plain lock only (no semaphore, reentrant, read-write or fair \
             lock): use --kind lock"
        )))
    }
}

fn or_dash<T: ToString>(v: Option<T>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

fn remaining(ms: Option<u64>) -> String {
    or_dash(ms.map(|ms| humantime::format_duration(Duration::from_millis(ms)).to_string()))
}

/// A duration in one word, to a tenth of a second under a minute: `850ms`, `12.3s`,
/// `4m59s`, `1h02m`, `2d03h`.
fn compact(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0 => format!("{}ms", d.subsec_millis()),
        1..60 => format!("{s}.{}s", d.subsec_millis() / 100),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        3600..86_400 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{:02}h", s / 86_400, s % 86_400 / 3600),
    }
}

/// A table cell in one word: no spaces or control characters (another holder's metadata
/// can hold anything), `-` for nothing.
fn cell(v: Option<&str>) -> String {
    match v {
        Some(v) if !v.is_empty() => v
            .chars()
            .map(|c| {
                if c.is_whitespace() || c.is_control() {
                    '_'
                } else {
                    c
                }
            })
            .collect(),
        _ => "-".to_owned(),
    }
}

/// Text from the store (another process wrote it: it can hold anything) as it may reach a
/// terminal: on one line, its control characters (C0, DEL, C1: escape sequences, carriage
/// returns, newlines) made spaces, so it cannot move the cursor, restyle or retitle the
/// screen, or fake a line of output. Every human-readable output of store-held text goes
/// through it (JSON output escapes instead).
pub(crate) fn plain_text(v: &str) -> String {
    v.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// A lock's name (or key) as `list`, `top`, `status` and messages show it: one shell word
/// that pastes back into a command line (bash, zsh, ksh) as the name itself. A name made
/// only of letters, digits and `-_.:/@+,%` is shown as it is; any other in single quotes
/// (`'a*b'`), or, when it has blanks, control or invisible characters, `'`, `\` or `!`,
/// as `$'…'` with those characters escaped: `\n`, `\t`, `\r`, `\'`, `\\`, `\xHH`
/// (a space is `\x20`, so that the name stays one word of a table) and `\uHHHH` /
/// `\UHHHHHHHH`. Nothing of it can reach a terminal as a control character.
pub(crate) fn shown(name: &str) -> String {
    let plain = |c: char| {
        c.is_alphanumeric() || matches!(c, '-' | '_' | '.' | ':' | '/' | '@' | '+' | ',' | '%')
    };
    let escaped = |c: char| {
        c.is_control() || c.is_whitespace() || invisible(c) || matches!(c, '\'' | '\\' | '!')
    };
    if !name.is_empty() && name.chars().all(|c| plain(c) && !invisible(c)) {
        return name.to_owned();
    }
    if !name.chars().any(escaped) {
        return format!("'{name}'");
    }
    let mut out = String::from("$'");
    for c in name.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            '\'' => out.push_str("\\'"),
            '\\' => out.push_str("\\\\"),
            c if c.is_ascii() && escaped(c) => {
                let _ = write!(out, "\\x{:02x}", u32::from(c));
            }
            c if escaped(c) && u32::from(c) <= 0xffff => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c if escaped(c) => {
                let _ = write!(out, "\\U{:08x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('\'');
    out
}

/// Characters that show as nothing, or change how the text around them shows, though
/// they are neither controls nor blanks: soft hyphens, zero-width and direction marks,
/// bidirectional overrides and isolates, variation selectors, byte-order marks, tags.
fn invisible(c: char) -> bool {
    matches!(
        u32::from(c),
        0x00ad
            | 0x034f
            | 0x061c
            | 0x115f..=0x1160
            | 0x17b4..=0x17b5
            | 0x180b..=0x180f
            | 0x200b..=0x200f
            | 0x2028..=0x202e
            | 0x2060..=0x206f
            | 0x3164
            | 0xfe00..=0xfe0f
            | 0xfeff
            | 0xffa0
            | 0xfff0..=0xfffb
            | 0x1d173..=0x1d17a
            | 0xe0000..=0xe0fff
    )
}

/// The last cell of a line: free text, on one line.
fn last_cell(v: Option<&str>) -> String {
    match v {
        Some(v) if !v.is_empty() => plain_text(v),
        _ => "-".to_owned(),
    }
}

pub(crate) async fn status_cmd<B: RawInspect + RawSemaphore>(
    backend: B,
    args: StatusArgs,
) -> Result<u8, Failure> {
    let s = status_of(backend, args.kind, args.store.prefix.as_deref(), &args.name).await?;
    print_status(&s, &args)
}

/// `dlock status` on a store with the plain lock only (`store` names it in errors).
pub(crate) async fn lock_status_cmd<B: RawInspect>(
    backend: B,
    layout: Layout,
    store: &str,
    args: StatusArgs,
) -> Result<u8, Failure> {
    lock_kind_only(args.kind, store)?;
    let s = lock_status_of(backend, layout, args.store.lock_prefix(), &args.name).await?;
    print_status(&s, &args)
}

fn print_status(s: &Status, args: &StatusArgs) -> Result<u8, Failure> {
    if args.json {
        print_json(s)?;
    } else {
        println!("name:            {}", shown(&s.name));
        println!("key:             {}", shown(&s.key));
        println!(
            "held:            {}",
            match (&s.holder, s.holders) {
                (Some(h), _) if args.kind == Kind::Reentrant => {
                    format!("yes, by owner {}", last_cell(Some(h)))
                }
                (Some(_), _) if s.backend_pid.is_some() => format!("yes, by {}", held_by(s)),
                (Some(h), _) if !s.holder_is_token => format!("yes, by {}", last_cell(Some(h))),
                (Some(h), _) => format!("yes, token {}", last_cell(Some(h))),
                (None, Some(n)) if n > 0 => format!("yes, by {n} holders"),
                _ => "no".to_owned(),
            }
        );
        if s.held {
            println!("host:            {}", last_cell(s.host()));
            println!("pid:             {}", or_dash(s.pid()));
            println!("command:         {}", last_cell(s.command()));
            let age = s.holder_info.as_ref().and_then(Holder::age);
            println!(
                "since:           {}",
                match (s.since(), age) {
                    (Some(since), Some(age)) => format!("{since} ({age} ago)"),
                    (since, _) => last_cell(since),
                }
            );
        }
        println!("remaining:       {}", remaining(s.remaining_ms));
        println!("last fence:      {}", or_dash(s.last_fence));
        println!("waiting clients: {}", or_dash(s.waiting_clients));
        match args.kind {
            Kind::Reentrant => println!("hold count:      {}", or_dash(s.hold_count)),
            Kind::Semaphore => {
                println!("permits in use:  {}", or_dash(s.hold_count));
                println!("holders:         {}", or_dash(s.holders));
                println!("permits:         {}", or_dash(s.permits.flatten()));
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
        if let Some(view) = &s.quorum {
            view.print();
        }
    }
    Ok(exit::SUCCESS)
}

/// `--kind` of `list` on a store with the plain lock only (`store` names it in errors).
pub(crate) fn only_locks(kinds: &[Kind], store: &str) -> Result<(), Failure> {
    kinds.iter().try_for_each(|k| lock_kind_only(*k, store))
}

/// The kinds `list` shows: `--kind`, else every kind; the plain lock only with a
/// `--prefix` of the user's (a prefix belongs to one kind).
fn listed_kinds(args: &ListArgs) -> Result<Vec<Kind>, Failure> {
    let custom_prefix = args.store.prefix.is_some();
    let mut kinds = if !args.kind.is_empty() {
        args.kind.clone()
    } else if custom_prefix {
        vec![Kind::Lock]
    } else {
        kinds::ALL.to_vec()
    };
    let mut seen = Vec::new();
    kinds.retain(|k| {
        let new = !seen.contains(k);
        seen.push(*k);
        new
    });
    if custom_prefix && kinds.len() > 1 {
        return Err(Failure::usage(
            "--prefix is the key prefix of one kind of lock: name that kind with --kind",
        ));
    }
    Ok(kinds)
}

/// `dlock list` on a store with every kind of lock: each held lock of each kind (one
/// name may be held as several kinds: separate locks), by name, then kind. `layout` is
/// where the store keeps a plain lock; `redis` where companion keys can look like locks.
pub(crate) async fn list_every_kind<B: RawInspect + RawSemaphore>(
    backend: B,
    layout: Layout,
    redis: bool,
    args: ListArgs,
) -> Result<u8, Failure> {
    let kinds = listed_kinds(&args)?;
    let prefix = args.store.prefix.as_deref();
    let mut wanted = Vec::new();
    for &kind in &kinds {
        let room = args.limit.saturating_sub(wanted.len());
        if room == 0 {
            break;
        }
        let names = top::names_of(&backend, redis, kind, prefix, &args.pattern, room).await?;
        wanted.extend(names.into_iter().map(|n| (n, kind)));
    }
    wanted.sort_by(|a, b| (&a.0, a.1 as u8).cmp(&(&b.0, b.1 as u8)));
    let mut rows = Vec::with_capacity(wanted.len());
    for (name, kind) in &wanted {
        let status = match kind {
            Kind::Lock => {
                lock_status_of(backend.clone(), layout, args.store.lock_prefix(), name).await
            }
            _ => status_of(backend.clone(), *kind, prefix, name).await,
        };
        match status {
            Ok(s) if s.held => rows.push(s),
            Ok(_) => {}
            // Another kind's key, or a companion key of a lock, under the prefix.
            Err(_) if top::is_companion(redis, *kind, prefix, name) => {}
            Err(f) if *kind != Kind::Lock => eprintln!(
                "dlock: warning: {} listed as {} but not readable as one: {}",
                shown(name),
                kind.described(),
                f.message
            ),
            Err(f) => return Err(f),
        }
    }
    print_list(&rows, args.json)
}

/// `dlock set-permits NAME N`: the semaphore's stored count, for every client.
pub(crate) async fn set_permits_cmd<B: RawSemaphore>(
    backend: B,
    args: SetPermitsArgs,
) -> Result<u8, Failure> {
    let sem = fencelock::Semaphore::builder(backend, &args.name, args.permits)
        .prefix(kinds::prefix_for(
            Kind::Semaphore,
            args.store.prefix.as_deref(),
        ))
        .build()?;
    let before = sem.stored_permits().await?;
    sem.set_permits(args.permits).await?;
    eprintln!(
        "dlock: semaphore {:?} has {} {} (was {})",
        args.name,
        args.permits,
        if args.permits == 1 {
            "permit"
        } else {
            "permits"
        },
        before.map_or_else(|| "none stored".to_owned(), |n| n.to_string())
    );
    Ok(exit::SUCCESS)
}

/// `list`'s rows: JSON (an array of `status` objects), or a table whose cells are one
/// word each but the last (COMMAND), so that `awk '{print $1}'` and friends keep working.
fn print_list(rows: &[Status], json: bool) -> Result<u8, Failure> {
    if json {
        print_json(&rows)?;
        return Ok(exit::SUCCESS);
    }
    // KIND goes last but one: the columns before it keep their places from before it
    // was added (`awk '{print $6}'` is still the PID).
    let lines: Vec<[String; 9]> = rows
        .iter()
        .map(|r| {
            [
                shown(&r.name),
                cell(r.holder.as_deref()),
                or_dash(r.remaining_ms.map(|ms| compact(Duration::from_millis(ms)))),
                or_dash(r.last_fence),
                cell(r.host()),
                or_dash(r.pid()),
                cell(r.since()),
                r.kind.to_owned(),
                last_cell(r.command()),
            ]
        })
        .collect();
    let header = [
        "NAME",
        "HOLDER",
        "REMAINING",
        "FENCE",
        "HOST",
        "PID",
        "SINCE",
        "KIND",
        "COMMAND",
    ]
    .map(str::to_owned);
    let mut widths = header.clone().map(|h| h.chars().count());
    for line in &lines {
        for (w, c) in widths.iter_mut().zip(line) {
            *w = (*w).max(c.chars().count());
        }
    }
    for line in std::iter::once(&header).chain(&lines) {
        let mut text = String::new();
        for (i, (c, w)) in line.iter().zip(widths).enumerate() {
            if i == line.len() - 1 {
                text.push_str(c);
            } else {
                // Counts are right-aligned.
                let pad = " ".repeat(w - c.chars().count());
                if matches!(i, 2 | 3 | 5) {
                    text.push_str(&pad);
                    text.push_str(c);
                } else {
                    text.push_str(c);
                    text.push_str(&pad);
                }
                text.push_str("  ");
            }
        }
        println!("{text}");
    }
    Ok(exit::SUCCESS)
}

pub(crate) async fn force_unlock_cmd<B: RawInspect + RawSemaphore>(
    backend: B,
    args: ForceUnlockArgs,
) -> Result<u8, Failure> {
    if !confirm_force_unlock(
        &args,
        status_of(
            backend.clone(),
            args.kind,
            args.store.prefix.as_deref(),
            &args.name,
        ),
    )
    .await?
    {
        return Ok(exit::CONFLICT);
    }
    let done =
        kinds::force_unlock(backend, args.kind, args.store.prefix.as_deref(), &args.name).await?;
    report_force_unlock(&args, done)
}

/// `dlock force-unlock` on a store with the plain lock only (`store` names it in errors).
pub(crate) async fn lock_force_unlock_cmd<B: RawInspect>(
    backend: B,
    layout: Layout,
    store: &str,
    args: ForceUnlockArgs,
) -> Result<u8, Failure> {
    lock_kind_only(args.kind, store)?;
    if !confirm_force_unlock(
        &args,
        lock_status_of(
            backend.clone(),
            layout,
            args.store.lock_prefix(),
            &args.name,
        ),
    )
    .await?
    {
        return Ok(exit::CONFLICT);
    }
    let lock = Lock::builder(backend, &args.name)
        .prefix(args.store.lock_prefix())
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
        // Nothing to ask about: the force-unlock finds nothing, and says so.
        return Ok(true);
    }
    // Who, as a conflict says it: host, pid, command, since.
    let by = format!("held by {}", held_by(&s));
    eprint!(
        "Force-unlock {}, {by}? Its holders keep running until they notice. [y/N] ",
        shown(&args.name),
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

/// `force-unlock`'s outcome: success, or [`exit::NOT_HELD`] when nothing was held (a
/// mistyped name, or its holder was done already).
fn report_force_unlock(args: &ForceUnlockArgs, done: bool) -> Result<u8, Failure> {
    let name = shown(&args.name);
    if !done {
        let kind = match args.kind {
            Kind::Lock => String::new(),
            kind => format!(" as {}", kind.described()),
        };
        return Err(Failure::new(
            exit::NOT_HELD,
            format!(
                "{name} is not held{kind}: nothing to force-unlock (dlock list shows the held \
                 locks, each name as it pastes back into a shell)"
            ),
        ));
    }
    eprintln!("dlock: {name} force-unlocked");
    Ok(exit::SUCCESS)
}

#[cfg(test)]
mod tests {
    use fencelock::backend::Memory;
    use proptest::prelude::*;

    use super::*;
    use crate::args::Store;
    use crate::hostile::cases;

    const KINDS: [Kind; 5] = [
        Kind::Lock,
        Kind::Semaphore,
        Kind::Reentrant,
        Kind::Rwlock,
        Kind::Fair,
    ];

    /// Runs `f` to its end on a runtime of its own.
    fn block_on<F: Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime")
            .block_on(f)
    }

    /// Names and prefixes as a command line or a store may give them: anything, hash
    /// tags and stray braces, the default prefix, too long.
    fn text() -> impl Strategy<Value = String> {
        prop_oneof![
            any::<String>(),
            "[a-z{}:*?/\\[\\] -]{0,12}",
            Just(fencelock::keys::DEFAULT_PREFIX.to_owned()),
            ".{300,1200}",
        ]
    }

    proptest! {
        #![proptest_config(cases(256))]

        /// Any name under any prefix, for every kind and every key layout: a status, or
        /// a usage error (a store that cannot fail fails no other way).
        #[test]
        fn any_name_and_prefix_is_a_status_or_a_usage_error(
            kind in prop::sample::select(&KINDS[..]),
            prefix in text(),
            name in text(),
        ) {
            let (by_kind, by_layout) = block_on(async {
                let kind_status = status_of(Memory::new(), kind, Some(&prefix), &name).await;
                let mut layouts = Vec::new();
                for layout in [Layout::AtKey, Layout::QueueUnder, Layout::Znodes, Layout::Session] {
                    layouts.push(lock_status_of(Memory::new(), layout, &prefix, &name).await);
                }
                (kind_status, layouts)
            });
            for status in std::iter::once(by_kind).chain(by_layout) {
                match status {
                    Ok(s) => {
                        prop_assert_eq!(&s.name, &name);
                        prop_assert!(!s.held && !s.key.is_empty());
                    }
                    Err(f) => prop_assert_eq!(f.code, exit::USAGE, "{}", f.message),
                }
            }
        }

        /// `dlock acquire` with any `--info` prints a token that `dlock release --token`
        /// takes back (the metadata is cut to fit the token, never past it), and status
        /// shows the holder as told.
        #[test]
        fn an_acquired_token_is_released_by_its_text(
            name in "[a-z0-9-]{1,20}",
            info in proptest::option::of(prop_oneof![any::<String>(), ".{200,600}"]),
            no_info in any::<bool>(),
        ) {
            let holder = HolderArgs { info: info.clone(), no_info };
            block_on(async {
                let store = Memory::new();
                let mut builder = Lock::builder(store.client(), &name);
                if let Some(info) = acquire_holder(&holder) {
                    builder = builder.holder_info(info);
                }
                let lock = builder.build().expect("a lock");
                let guard = lock.try_lock().await.expect("no failure").expect("free");
                let text = guard.token().as_str().to_owned();
                guard.forget();
                prop_assert!(!text.contains(char::is_whitespace), "{}", text);

                let prefix = fencelock::keys::DEFAULT_PREFIX;
                let s = lock_status_of(store.client(), Layout::AtKey, prefix, &name)
                    .await
                    .expect("a status");
                prop_assert!(s.held);
                match (&s.holder_info, no_info) {
                    (None, true) => {}
                    (Some(h), false) => {
                        let command = h.command.as_deref().unwrap_or_default();
                        prop_assert!(info.as_deref().unwrap_or_default().starts_with(command));
                    }
                    (h, _) => {
                        prop_assert!(false, "--no-info {}, holder {:?}", no_info, h.is_some());
                    }
                }

                let args = TokenArgs {
                    name: name.clone(),
                    store: store_of(),
                    token: text,
                    json: false,
                };
                let released = release_cmd(store.client(), args).await;
                prop_assert_eq!(released.map_err(|f| f.message), Ok(exit::SUCCESS));
                let after = lock_status_of(store.client(), Layout::AtKey, prefix, &name)
                    .await
                    .expect("a status");
                prop_assert!(!after.held);
                Ok::<(), TestCaseError>(())
            })?;
        }

        /// Any `--token` (`DLOCK_TOKEN`) text: released, or a usage error (not a token:
        /// empty, over 256 bytes) or "not held" (nobody holds it); extend likewise.
        #[test]
        fn any_token_text_is_a_token_or_a_typed_error(
            token in prop_oneof![any::<String>(), ".{250,260}", Just(String::new())],
            ttl_ms in 1_000..100_000u64,
        ) {
            let valid = fencelock::Token::from_string(token.clone()).is_ok();
            let args = |token: String| TokenArgs {
                name: "n".into(),
                store: store_of(),
                token,
                json: false,
            };
            let (released, extended) = block_on(async {
                let released = release_cmd(Memory::new(), args(token.clone())).await;
                let extend = ExtendArgs { held: args(token), ttl: Duration::from_millis(ttl_ms) };
                (released, extend_cmd(Memory::new(), extend).await)
            });
            for result in [released, extended] {
                let f = result.expect_err("nothing is held");
                let expected = if valid { exit::NOT_HELD } else { exit::USAGE };
                prop_assert_eq!(f.code, expected, "{}", f.message);
            }
        }

        /// Held locks of any name are all listed by `*`, each by its own name (when that
        /// has no wildcard), and any pattern lists without failing.
        #[test]
        fn any_pattern_lists_and_names_find_themselves(
            names in prop::collection::btree_set(
                prop_oneof!["[a-z:.-]{1,10}", any::<String>()],
                1..5,
            ),
            pattern in prop_oneof![any::<String>(), "[a-z*?\\[\\]\\\\]{0,8}"],
            limit in 1..10usize,
        ) {
            block_on(async {
                let store = Memory::new();
                let mut held = Vec::new();
                for name in &names {
                    if let Ok(lock) = Lock::builder(store.client(), name).build() {
                        let guard = lock.try_lock().await.expect("no failure").expect("free");
                        guard.forget();
                        held.push(name.clone());
                    }
                }
                let prefix = fencelock::keys::DEFAULT_PREFIX;
                let mut all = store.list(prefix, "*", 100).await.expect("a list");
                all.sort();
                held.sort();
                prop_assert_eq!(&all, &held);
                for name in held.iter().filter(|n| !n.contains(['*', '?'])) {
                    let found = store.list(prefix, name, 100).await.expect("a list");
                    prop_assert!(found.contains(name), "{:?} not in {:?}", name, found);
                }
                let args = ListArgs { pattern, store: store_of(), kind: Vec::new(), limit, json: false };
                let listed = list_every_kind(store.client(), Layout::AtKey, false, args).await;
                prop_assert_eq!(listed.map_err(|f| f.message), Ok(exit::SUCCESS));
                Ok::<(), TestCaseError>(())
            })?;
        }

        /// What another holder wrote, shown in a table: a cell is one word (no blanks or
        /// controls), the last cell one line (no controls), each as long as the text.
        #[test]
        fn cells_are_one_word_and_one_line(v in proptest::option::of(any::<String>())) {
            let word = cell(v.as_deref());
            let line = last_cell(v.as_deref());
            prop_assert!(!word.is_empty() && !line.is_empty());
            let blank = |c: char| c.is_whitespace() || c.is_control();
            prop_assert!(!word.contains(blank), "{:?}", word);
            prop_assert!(!line.contains(char::is_control), "{:?}", line);
            if let Some(v) = v.as_deref().filter(|v| !v.is_empty()) {
                prop_assert_eq!(word.chars().count(), v.chars().count());
                prop_assert_eq!(line.chars().count(), v.chars().count());
            }
        }

        /// An abbreviated token shows at most 8 characters, and at most half, of its
        /// random part (never enough to release the lock), then `…`; no blanks or
        /// controls.
        #[test]
        fn abbreviated_tokens_show_at_most_half(
            token in prop_oneof![any::<String>(), "[0-9a-f]{32}~.{0,40}"],
        ) {
            let short = abbreviate(&token);
            let shown = short.strip_suffix('…').expect("ends with …");
            let random = token.split_once('~').map_or(token.as_str(), |(r, _)| r);
            let n = shown.chars().count();
            prop_assert!(n <= 8 && 2 * n <= random.chars().count(), "{:?} of {:?}", short, token);
            prop_assert!(!shown.contains(|c: char| c.is_whitespace() || c.is_control()));
            prop_assert!(random.chars().zip(shown.chars()).all(|(r, s)| r == s || s == '_'));
        }

        /// Any duration, however long, is one compact word.
        #[test]
        fn compact_durations_are_one_word(secs in any::<u64>(), nanos in 0..1_000_000_000u32) {
            let text = compact(Duration::new(secs, nanos));
            prop_assert!(!text.is_empty() && !text.contains(' '), "{}", text);
            prop_assert!(!remaining(Some(secs)).is_empty());
        }
    }

    /// Shell words, read back by bash: `printf '%s\0' WORD…` prints each word's value.
    fn read_back_by_bash(words: &[String]) -> Vec<String> {
        let script = format!("printf '%s\\0' {}", words.join(" "));
        let out = std::process::Command::new("bash")
            .args(["-c", &script])
            .env("LC_ALL", "C.UTF-8")
            .output()
            .expect("bash");
        assert!(out.status.success(), "{script:?}: {out:?}");
        let text = String::from_utf8(out.stdout).expect("UTF-8 from bash");
        let mut values: Vec<String> = text.split('\0').map(str::to_owned).collect();
        values.pop();
        values
    }

    proptest! {
        #![proptest_config(cases(32))]

        /// Any name (but NUL, which no argument can hold) is shown as one word, without
        /// blanks or controls, that bash reads back as the name itself.
        #[test]
        fn shown_names_read_back_as_themselves(
            names in prop::collection::vec(
                prop_oneof![
                    any::<String>(),
                    "[a-z ,:/@%'\\\\!*?$`\"(){};&|<>#~=\t\n\r\u{1b}\u{7f}\u{85}\u{a0}\u{200b}\u{202e}é日🔒-]{0,12}",
                ]
                .prop_map(|n| n.replace('\0', "")),
                1..24,
            ),
        ) {
            let words: Vec<String> = names.iter().map(|n| shown(n)).collect();
            for word in &words {
                prop_assert!(
                    !word.contains(|c: char| c.is_whitespace() || c.is_control() || invisible(c)),
                    "{:?}", word
                );
            }
            prop_assert_eq!(read_back_by_bash(&words), names);
        }
    }

    #[test]
    fn names_are_shown_as_documented() {
        for (name, word) in [
            ("deploy-prod", "deploy-prod"),
            ("ns:job/1@host+x,y%", "ns:job/1@host+x,y%"),
            ("ünï", "ünï"),
            ("", "''"),
            ("a*b", "'a*b'"),
            ("-", "-"),
            ("my job", "$'my\\x20job'"),
            ("new\nline", "$'new\\nline'"),
            ("it's", "$'it\\'s'"),
            ("a\\b", "$'a\\\\b'"),
            ("hi!", "$'hi\\x21'"),
            ("\u{1b}[2J", "$'\\x1b[2J'"),
            ("\u{202e}txt", "$'\\u202etxt'"),
            ("tag\u{e0041}", "$'tag\\U000e0041'"),
        ] {
            assert_eq!(shown(name), word, "{name:?}");
        }
    }

    /// `--prefix` left at its default, no `--url`.
    fn store_of() -> Store {
        Store {
            url: None,
            prefix: None,
            allow_unsafe_store: false,
        }
    }
}
