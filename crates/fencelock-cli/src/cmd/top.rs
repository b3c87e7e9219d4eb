//! `dlock top`: every held lock of every primitive, refreshed in place.
//!
//! Each refresh lists the names of every selected kind of primitive under its prefix
//! (SCAN, never KEYS), inspects them a few at a time, and shows one row per lock: holder
//! (abbreviated token) and what it said about itself ([`fencelock::HolderInfo`]: host, pid,
//! command, since), remaining ttl, last fence, holds, waiters. On a terminal the table is
//! redrawn in place on the alternate screen (plain ANSI; the keyboard in non-canonical mode
//! through termios, restored on exit); otherwise, or with `--json`, one JSON object per
//! refresh goes to stdout, one per line.

use std::collections::HashSet;
use std::fmt::Write as _;
use std::io::{IsTerminal, Read, Write};
use std::os::fd::AsFd;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fencelock::HolderInfo;
use fencelock::raw::{LockState, RawInspect};
use nix::sys::signal::Signal;
use nix::sys::termios::{
    LocalFlags, SetArg, SpecialCharacterIndices, Termios, tcgetattr, tcsetattr,
};
use serde::Serialize;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::{abbreviate, compact, kinds, last_cell, millis, or_dash, shown};
use crate::args::{Kind, SortBy, TopArgs};
use crate::exit::{self, Failure};

/// How many locks are inspected at once.
const CONCURRENCY: usize = 16;

/// The longest NAME shown in full on the terminal (JSON always has it whole).
const NAME_WIDTH: usize = 48;

impl SortBy {
    fn name(self) -> &'static str {
        match self {
            SortBy::Name => "name",
            SortBy::Ttl => "ttl",
            SortBy::Fence => "fence",
            SortBy::Waiters => "waiters",
            SortBy::Since => "since",
        }
    }

    fn next(self) -> SortBy {
        match self {
            SortBy::Name => SortBy::Ttl,
            SortBy::Ttl => SortBy::Fence,
            SortBy::Fence => SortBy::Waiters,
            SortBy::Waiters => SortBy::Since,
            SortBy::Since => SortBy::Name,
        }
    }
}

const ALL_KINDS: &[Kind] = &[
    Kind::Lock,
    Kind::Semaphore,
    Kind::Reentrant,
    Kind::Rwlock,
    Kind::Fair,
];

fn kind_name(kind: Kind) -> &'static str {
    match kind {
        Kind::Lock => "lock",
        Kind::Semaphore => "semaphore",
        Kind::Reentrant => "reentrant",
        Kind::Rwlock => "rwlock",
        Kind::Fair => "fair",
    }
}

/// `dlock top` on a store with every kind of primitive; `redis` where companion keys can
/// look like locks (see [`redis_companion`]).
pub(crate) async fn every_kind<B: RawInspect>(
    backend: B,
    redis: bool,
    args: TopArgs,
) -> Result<u8, Failure> {
    watch(EveryKind { backend, redis }, args).await
}

/// What `top` needs of a store: the names of one kind's held locks, and their state.
trait Inspector: Clone + Send + Sync + 'static {
    /// The kinds of primitive this store has.
    const KINDS: &'static [Kind];

    fn names(
        &self,
        kind: Kind,
        prefix: Option<&str>,
        pattern: &str,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<String>, Failure>> + Send;

    fn state(
        &self,
        kind: Kind,
        prefix: Option<&str>,
        name: &str,
    ) -> impl Future<Output = Result<LockState, Failure>> + Send;

    /// The store, as errors name it.
    fn store(&self) -> &'static str {
        "this store"
    }

    /// Whether `name`, listed under `prefix` but unreadable as a `kind`, is one of a lock's
    /// companion keys rather than a lock (not shown).
    fn companion(&self, _kind: Kind, _prefix: Option<&str>, _name: &str) -> bool {
        false
    }
}

/// A store with every kind of primitive.
#[derive(Clone)]
struct EveryKind<B> {
    backend: B,
    /// Where companion keys can look like locks (Redis; see [`redis_companion`]).
    redis: bool,
}

/// Redis keeps a lock's companion keys (waiters, readers, permit holders) beside the lock
/// key, in `{<lock key>}:<word>`, or in `<lock key>:<word>` when the lock key has a hash tag
/// of its own. The first kind is never under the prefix; the second is listed as the name
/// `<name>:<word>`: returns `(<name>, <word>)` for such a name.
fn redis_companion<'a>(prefix: &str, name: &'a str) -> Option<(&'a str, &'a str)> {
    let (base, word) = name.rsplit_once(':')?;
    let key = format!("{prefix}{base}");
    // Redis' hash tag: the first `{`, then the first `}` after it, something between.
    let tagged = key
        .split_once('{')
        .and_then(|(_, rest)| rest.find('}'))
        .is_some_and(|close| close > 0);
    (tagged && !word.is_empty() && word.bytes().all(|b| b.is_ascii_lowercase()))
        .then_some((base, word))
}

impl<B: RawInspect> Inspector for EveryKind<B> {
    const KINDS: &'static [Kind] = ALL_KINDS;

    async fn names(
        &self,
        kind: Kind,
        prefix: Option<&str>,
        pattern: &str,
        limit: usize,
    ) -> Result<Vec<String>, Failure> {
        let prefix = kinds::prefix_for(kind, prefix);
        let mut names = self.backend.list(&prefix, pattern, limit).await?;
        if kind == Kind::Rwlock && self.redis {
            // A read-write lock held by readers alone has no writer key: its readers'
            // `{<lock key>}:readers` is listed under `{<prefix>` as `<name>}:readers`, and
            // a hash-tagged name's `<lock key>:readers` as `<name>:readers`.
            const READERS: &str = "}:readers";
            for name in &mut names {
                if let Some((base, "readers")) = redis_companion(&prefix, name) {
                    *name = base.to_owned();
                }
            }
            if names.len() < limit {
                let readers = self
                    .backend
                    .list(
                        &format!("{{{prefix}"),
                        &format!("{pattern}{READERS}"),
                        limit - names.len(),
                    )
                    .await?;
                // (Listed as `<name>}` where the store maps a companion key to the
                // name it stands for: here the name is the tag's inside.)
                names.extend(
                    readers
                        .iter()
                        .filter_map(|n| n.strip_suffix(READERS).or_else(|| n.strip_suffix('}')))
                        .map(str::to_owned),
                );
            }
        }
        Ok(names)
    }

    async fn state(
        &self,
        kind: Kind,
        prefix: Option<&str>,
        name: &str,
    ) -> Result<LockState, Failure> {
        let (_, state) = kinds::state_of(self.backend.clone(), kind, prefix, name).await?;
        Ok(state)
    }

    fn companion(&self, kind: Kind, prefix: Option<&str>, name: &str) -> bool {
        self.redis && redis_companion(&kinds::prefix_for(kind, prefix), name).is_some()
    }
}

/// The names of the held locks of `kind` matching `pattern` (at most `limit`, sorted,
/// each once), as `top` finds them: for `dlock list`.
pub(crate) async fn names_of<B: RawInspect>(
    backend: &B,
    redis: bool,
    kind: Kind,
    prefix: Option<&str>,
    pattern: &str,
    limit: usize,
) -> Result<Vec<String>, Failure> {
    let src = EveryKind {
        backend: backend.clone(),
        redis,
    };
    let mut names = src.names(kind, prefix, pattern, limit).await?;
    // SCAN may return a key twice.
    names.sort();
    names.dedup();
    names.truncate(limit);
    Ok(names)
}

/// Whether `name`, listed as a `kind` under `prefix` but unreadable as one, is one of a
/// lock's companion keys (see [`redis_companion`]), not a lock.
pub(crate) fn is_companion(redis: bool, kind: Kind, prefix: Option<&str>, name: &str) -> bool {
    redis && redis_companion(&kinds::prefix_for(kind, prefix), name).is_some()
}

/// The kinds to show: `--kind`, else every kind the store has; one kind only with a
/// `--prefix` of the user's (a prefix belongs to one kind).
fn selected_kinds<I: Inspector>(src: &I, args: &TopArgs) -> Result<Vec<Kind>, Failure> {
    let has = I::KINDS;
    let custom_prefix = args.store.prefix.is_some();
    let mut kinds: Vec<Kind> = if !args.kind.is_empty() {
        args.kind.clone()
    } else if custom_prefix {
        vec![Kind::Lock]
    } else {
        has.to_vec()
    };
    let mut seen = HashSet::new();
    kinds.retain(|k| seen.insert(kind_name(*k)));
    if let Some(k) = kinds.iter().find(|k| !has.contains(k)) {
        return Err(Failure::usage(format!(
            "{} has no such kind of lock: --kind {} is not among its locks",
            src.store(),
            kind_name(*k)
        )));
    }
    if custom_prefix && kinds.len() > 1 {
        return Err(Failure::usage(
            "--prefix is the key prefix of one kind of primitive: name that kind with --kind",
        ));
    }
    Ok(kinds)
}

/// One lock as the store showed it.
struct Row {
    kind: Kind,
    name: String,
    state: LockState,
}

impl Row {
    fn waiters(&self) -> Option<u64> {
        let (q, w) = (self.state.queued, self.state.waiting_clients);
        match (q, w) {
            (None, None) => None,
            (q, w) => Some(u64::from(q.unwrap_or(0)).max(w.unwrap_or(0))),
        }
    }

    fn info(&self) -> Option<&HolderInfo> {
        self.state.holder_info.as_ref()
    }

    /// What "holds" means for its kind: the hold count (reentrant), permits in use
    /// (semaphore), readers or the writer (read-write lock), the one holder.
    fn holds(&self) -> Option<u32> {
        let s = &self.state;
        match self.kind {
            Kind::Semaphore | Kind::Reentrant => s.hold_count,
            Kind::Rwlock if s.holder.is_none() => s.holders,
            _ => Some(u32::from(s.holder.is_some())),
        }
    }

    fn holder(&self) -> Option<String> {
        if let Some(h) = &self.state.holder {
            // Enough to tell holders apart (the token's random part starts it), never
            // enough to release their lock.
            return Some(abbreviate(h));
        }
        match (self.kind, self.state.holders) {
            (_, None | Some(0)) => None,
            (Kind::Rwlock, Some(1)) => Some("1 reader".to_owned()),
            (Kind::Rwlock, Some(n)) => Some(format!("{n} readers")),
            (_, Some(1)) => Some("1 holder".to_owned()),
            (_, Some(n)) => Some(format!("{n} holders")),
        }
    }

    fn json(&self) -> RowJson<'_> {
        let info = self.info();
        let s = &self.state;
        RowJson {
            kind: kind_name(self.kind),
            name: &self.name,
            held: kinds::is_held(s),
            holder: self.holder(),
            host: info.and_then(|i| i.host.as_deref()),
            pid: info.and_then(|i| i.pid),
            command: info.and_then(|i| i.command.as_deref()),
            since_ms: info
                .and_then(|i| i.since)
                .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                .map(millis),
            age_ms: info.and_then(HolderInfo::age).map(millis),
            remaining_ms: s.remaining.map(millis),
            last_fence: s.last_fence,
            hold_count: s.hold_count,
            holders: s.holders,
            queued: s.queued,
            waiting_clients: s.waiting_clients,
            waiters: self.waiters(),
        }
    }
}

#[derive(Serialize)]
struct RowJson<'a> {
    kind: &'static str,
    name: &'a str,
    held: bool,
    /// Abbreviated token (or "N readers" / "N holders" when the holders share it).
    holder: Option<String>,
    host: Option<&'a str>,
    pid: Option<u32>,
    command: Option<&'a str>,
    /// When the holder asked for the lock, Unix ms (its clock).
    since_ms: Option<u64>,
    /// How long ago that was (this machine's clock).
    age_ms: Option<u64>,
    remaining_ms: Option<u64>,
    last_fence: Option<u64>,
    hold_count: Option<u32>,
    holders: Option<u32>,
    queued: Option<u32>,
    waiting_clients: Option<u64>,
    /// The larger of `queued` and `waiting_clients`.
    waiters: Option<u64>,
}

/// A lock that was listed but could not be read (another client's key under the prefix,
/// a key of another kind).
#[derive(Serialize)]
struct Unreadable {
    kind: &'static str,
    name: String,
    error: String,
}

/// One refresh.
struct Snapshot {
    at: SystemTime,
    rows: Vec<Row>,
    /// The listing reached the limit: there may be more.
    truncated: bool,
    unreadable: Vec<Unreadable>,
}

async fn snapshot<I: Inspector>(
    src: &I,
    kinds: &[Kind],
    args: &TopArgs,
) -> Result<Snapshot, Failure> {
    let limit = usize::try_from(args.limit).unwrap_or(usize::MAX);
    let mut wanted = Vec::new();
    let mut truncated = false;
    for &kind in kinds {
        let room = limit - wanted.len();
        if room == 0 {
            truncated = true;
            break;
        }
        let mut names = src
            .names(kind, args.store.prefix.as_deref(), &args.pattern, room)
            .await?;
        truncated |= names.len() >= room;
        // SCAN may return a key twice.
        names.sort();
        names.dedup();
        names.truncate(room);
        wanted.extend(names.into_iter().map(|n| (kind, n)));
    }
    let at = SystemTime::now();
    let (mut rows, mut unreadable) = (Vec::new(), Vec::new());
    let mut pending = wanted.into_iter();
    let mut running = JoinSet::new();
    loop {
        while running.len() < CONCURRENCY {
            let Some((kind, name)) = pending.next() else {
                break;
            };
            let (src, prefix) = (src.clone(), args.store.prefix.clone());
            running.spawn(async move {
                let state = src.state(kind, prefix.as_deref(), &name).await;
                (kind, name, state)
            });
        }
        let Some(done) = running.join_next().await else {
            break;
        };
        match done {
            Ok((kind, name, Ok(state))) => {
                // Released between listing and inspecting: gone.
                let row = Row { kind, name, state };
                if kinds::is_held(&row.state) || row.waiters().unwrap_or(0) > 0 {
                    rows.push(row);
                }
            }
            Ok((kind, name, Err(_)))
                if src.companion(kind, args.store.prefix.as_deref(), &name) => {}
            Ok((kind, name, Err(failure))) => unreadable.push(Unreadable {
                kind: kind_name(kind),
                name,
                error: failure.message,
            }),
            Err(e) => return Err(Failure::new(exit::UNAVAILABLE, format!("inspecting: {e}"))),
        }
    }
    unreadable.sort_by(|a, b| (a.kind, &a.name).cmp(&(b.kind, &b.name)));
    Ok(Snapshot {
        at,
        rows,
        truncated,
        unreadable,
    })
}

fn sort_rows(rows: &mut [Row], by: SortBy) {
    use std::cmp::{Ordering, Reverse};
    // `None` (unknown) last in every order.
    fn some_first<T: Ord>(a: Option<T>, b: Option<T>) -> Ordering {
        match (a, b) {
            (Some(a), Some(b)) => a.cmp(&b),
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (None, None) => Ordering::Equal,
        }
    }
    rows.sort_by(|a, b| {
        let first = match by {
            SortBy::Name => Ordering::Equal,
            SortBy::Ttl => some_first(a.state.remaining, b.state.remaining),
            SortBy::Fence => some_first(
                a.state.last_fence.map(Reverse),
                b.state.last_fence.map(Reverse),
            ),
            SortBy::Waiters => some_first(a.waiters().map(Reverse), b.waiters().map(Reverse)),
            SortBy::Since => some_first(
                a.info().and_then(|i| i.since),
                b.info().and_then(|i| i.since),
            ),
        };
        first
            .then_with(|| a.name.cmp(&b.name))
            .then_with(|| (a.kind as u8).cmp(&(b.kind as u8)))
    });
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, millis)
}

#[derive(Serialize)]
struct Tick<'a> {
    t: u64,
    store: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    locks: Option<Vec<RowJson<'a>>>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    truncated: bool,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    unreadable: &'a [Unreadable],
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a str>,
}

fn json_line(store: &str, result: &Result<Snapshot, Failure>) -> String {
    let tick = match result {
        Ok(s) => Tick {
            t: unix_ms(s.at),
            store,
            locks: Some(s.rows.iter().map(Row::json).collect()),
            truncated: s.truncated,
            unreadable: &s.unreadable,
            error: None,
        },
        Err(f) => Tick {
            t: unix_ms(SystemTime::now()),
            store,
            locks: None,
            truncated: false,
            unreadable: &[],
            error: Some(&f.message),
        },
    };
    // Plain data: it always encodes.
    serde_json::to_string(&tick).unwrap_or_default()
}

/// What interrupts the wait for the next refresh.
enum Event {
    Quit,
    NextSort,
    Redraw,
    /// Ctrl-Z on the terminal: put it back, stop, and take it again when continued.
    Suspend,
}

/// Fills `tx` with q / Ctrl-C / SIGTERM / SIGHUP (quit), `s` (next order), window size
/// changes and, on the screen, Ctrl-Z.
fn listen(
    tx: &mpsc::UnboundedSender<Event>,
    on_screen: bool,
    keyboard: bool,
) -> Result<(), Failure> {
    let mut signals: Vec<(SignalKind, fn() -> Event)> = vec![
        (SignalKind::interrupt(), || Event::Quit),
        (SignalKind::terminate(), || Event::Quit),
        (SignalKind::hangup(), || Event::Quit),
        (SignalKind::window_change(), || Event::Redraw),
    ];
    if on_screen {
        signals.push((SignalKind::from_raw(Signal::SIGTSTP as i32), || {
            Event::Suspend
        }));
    }
    for (kind, event) in signals {
        let mut stream = signal(kind)
            .map_err(|e| Failure::new(exit::UNAVAILABLE, format!("signal handler: {e}")))?;
        let tx = tx.clone();
        tokio::spawn(async move {
            while stream.recv().await.is_some() {
                if tx.send(event()).is_err() {
                    break;
                }
            }
        });
    }
    if keyboard {
        let tx = tx.clone();
        // A plain thread, not the runtime's blocking pool: it stays blocked in read() when
        // top ends, and the process exits without waiting for it.
        std::thread::spawn(move || {
            let mut buf = [0u8; 64];
            let mut stdin = std::io::stdin();
            while let Ok(n @ 1..) = stdin.read(&mut buf) {
                for &b in &buf[..n] {
                    let event = match b {
                        b'q' | b'Q' => Event::Quit,
                        b's' | b'S' => Event::NextSort,
                        // Ctrl-L, as in most full-screen programs.
                        0x0c => Event::Redraw,
                        _ => continue,
                    };
                    if tx.send(event).is_err() {
                        return;
                    }
                }
            }
        });
    }
    Ok(())
}

/// The terminal while `top` draws on it: the alternate screen, no cursor, and (when stdin
/// is the terminal) keys delivered one at a time without echo. Dropping it puts all of it
/// back.
struct Screen {
    saved: Option<Termios>,
}

impl Screen {
    fn enter() -> Screen {
        let stdin = std::io::stdin();
        let saved = stdin
            .is_terminal()
            .then(|| tcgetattr(stdin.as_fd()).ok())
            .flatten();
        let screen = Screen { saved };
        screen.take();
        screen
    }

    /// Keys one at a time, the alternate screen.
    fn take(&self) {
        if let Some(saved) = &self.saved {
            let mut keys = saved.clone();
            // Ctrl-C and Ctrl-Z still signal (ISIG stays on).
            keys.local_flags
                .remove(LocalFlags::ICANON | LocalFlags::ECHO);
            keys.control_chars[SpecialCharacterIndices::VMIN as usize] = 1;
            keys.control_chars[SpecialCharacterIndices::VTIME as usize] = 0;
            let _ = tcsetattr(std::io::stdin().as_fd(), SetArg::TCSANOW, &keys);
        }
        emit("\x1b[?1049h\x1b[?25l\x1b[H\x1b[2J");
    }

    /// The terminal as it was.
    fn give_back(&self) {
        emit("\x1b[?25h\x1b[?1049l");
        if let Some(saved) = &self.saved {
            let _ = tcsetattr(std::io::stdin().as_fd(), SetArg::TCSANOW, saved);
        }
    }

    /// Ctrl-Z: the terminal back to the shell while stopped, then taken again.
    fn suspend(&self) {
        self.give_back();
        // Stops here until SIGCONT (`fg`).
        let _ = nix::sys::signal::raise(Signal::SIGSTOP);
        self.take();
    }

    fn keyboard(&self) -> bool {
        self.saved.is_some()
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        self.give_back();
    }
}

/// What stays the same from frame to frame.
struct View<'a> {
    store: String,
    kinds: &'a [Kind],
    args: &'a TopArgs,
    sort: SortBy,
}

async fn watch<I: Inspector>(src: I, args: TopArgs) -> Result<u8, Failure> {
    let kinds = selected_kinds(&src, &args)?;
    let mut view = View {
        store: fencelock::backend::redact_url(args.store.url.as_deref().unwrap_or_default()),
        kinds: &kinds,
        args: &args,
        sort: args.sort,
    };
    // The first refresh comes before the terminal is touched: a store that cannot list
    // locks (memcached has no key iteration) fails here, with its reason, as `dlock list`.
    let mut started = Instant::now();
    let mut result: Result<Snapshot, Failure> = Ok(snapshot(&src, &kinds, &args).await?);
    let (tx, mut events) = mpsc::unbounded_channel();
    let interactive = !args.json && std::io::stdout().is_terminal();
    let screen = interactive.then(Screen::enter);
    listen(
        &tx,
        screen.is_some(),
        screen.as_ref().is_some_and(Screen::keyboard),
    )?;
    let mut last_good: Option<SystemTime> = None;
    let mut refreshes = 0u64;
    loop {
        if let Ok(s) = &mut result {
            sort_rows(&mut s.rows, view.sort);
            last_good = Some(s.at);
        }
        let shown = if screen.is_some() {
            draw(&view, &result, last_good)
        } else {
            let mut line = json_line(&view.store, &result);
            line.push('\n');
            line
        };
        if !emit(&shown) {
            // stdout closed (`dlock top --json | head -1`): nobody is watching.
            return Ok(exit::SUCCESS);
        }
        refreshes += 1;
        if args.iterations.is_some_and(|n| refreshes >= n) {
            if screen.is_some() {
                // Left on the normal screen, as `top -n` does.
                drop(screen);
                emit(&plain(&draw(&view, &result, last_good)));
            }
            return Ok(exit::SUCCESS);
        }
        // Until the next refresh is due, then while it runs: keys and signals.
        let next = due(started, args.interval);
        loop {
            tokio::select! {
                () = sleep_until(next) => break,
                event = events.recv() => {
                    if react(event, &mut view, &mut result, last_good, screen.as_ref()) {
                        return Ok(exit::SUCCESS);
                    }
                }
            }
        }
        started = Instant::now();
        let refresh = snapshot(&src, &kinds, &args);
        tokio::pin!(refresh);
        result = loop {
            tokio::select! {
                r = &mut refresh => break r,
                event = events.recv() => {
                    if react(event, &mut view, &mut result, last_good, screen.as_ref()) {
                        return Ok(exit::SUCCESS);
                    }
                }
            }
        };
    }
}

/// When the refresh after one that started at `started` is due: `None` (never) for an
/// `--interval` too long for the clock (`18446744073709551615s` parses, and adding it to
/// an instant would panic).
fn due(started: Instant, interval: Duration) -> Option<Instant> {
    started.checked_add(interval)
}

/// Sleeps until `deadline`, or forever without one.
async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// Handles one event between refreshes; `true` to quit.
fn react(
    event: Option<Event>,
    view: &mut View<'_>,
    result: &mut Result<Snapshot, Failure>,
    last_good: Option<SystemTime>,
    screen: Option<&Screen>,
) -> bool {
    match event {
        None | Some(Event::Quit) => return true,
        Some(Event::NextSort) => {
            view.sort = view.sort.next();
            if let Ok(s) = result {
                sort_rows(&mut s.rows, view.sort);
            }
        }
        Some(Event::Suspend) => {
            if let Some(screen) = screen {
                screen.suspend();
            }
        }
        Some(Event::Redraw) => {}
    }
    if screen.is_some() {
        emit(&draw(view, result, last_good));
    }
    false
}

/// Writes `text` to stdout at once; `false` if stdout is gone.
fn emit(text: &str) -> bool {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .is_ok()
}

/// A frame without its escape sequences, one line per row.
fn plain(frame: &str) -> String {
    let mut out = String::with_capacity(frame.len());
    let mut chars = frame.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            // CSI: ESC [ parameters… final byte (@ to ~).
            if chars.next() == Some('[') {
                for c in chars.by_ref() {
                    if ('@'..='~').contains(&c) {
                        break;
                    }
                }
            }
        } else {
            out.push(c);
        }
    }
    let mut lines: Vec<&str> = out.lines().map(str::trim_end).collect();
    while lines.last().is_some_and(|l| l.is_empty()) {
        lines.pop();
    }
    lines.join("\n") + "\n"
}

/// `s` cut to `width` characters, the last one `…` if anything was cut.
fn fit(s: &str, width: usize) -> String {
    if s.chars().count() <= width {
        return s.to_owned();
    }
    let mut out: String = s.chars().take(width.saturating_sub(1)).collect();
    out.push('…');
    out
}

const COLUMNS: [&str; 11] = [
    "KIND", "NAME", "HOLDER", "HOST", "PID", "SINCE", "TTL", "FENCE", "HOLDS", "WAIT", "COMMAND",
];
/// Columns aligned right (numbers and durations).
const RIGHT: [bool; 11] = [
    false, false, false, false, true, true, true, true, true, true, false,
];

/// A row's cells; text from the store (another holder's metadata can hold anything) with
/// its control characters made spaces, so it cannot move the cursor or restyle the screen;
/// the name as it is typed (see [`shown`]).
fn cells(row: &Row) -> [String; 11] {
    let info = row.info();
    [
        kind_name(row.kind).to_owned(),
        fit(&shown(&row.name), NAME_WIDTH),
        or_dash(row.holder()),
        fit(&last_cell(info.and_then(|i| i.host.as_deref())), 24),
        or_dash(info.and_then(|i| i.pid)),
        or_dash(info.and_then(HolderInfo::age).map(compact)),
        or_dash(row.state.remaining.map(compact)),
        or_dash(row.state.last_fence),
        or_dash(row.holds()),
        or_dash(row.waiters()),
        last_cell(info.and_then(|i| i.command.as_deref())),
    ]
}

/// The lines above the table: store, time, counts, and what needs saying.
fn header(
    view: &View<'_>,
    result: &Result<Snapshot, Failure>,
    last_good: Option<SystemTime>,
) -> Vec<String> {
    let args = view.args;
    let mut lines = vec![format!(
        "dlock top — {} — {} — every {} — q quit, s sort",
        view.store,
        humantime::format_rfc3339_seconds(SystemTime::now()),
        humantime::format_duration(args.interval),
    )];
    let rows: &[Row] = result.as_ref().map_or(&[], |s| &s.rows);
    let mut summary = format!("{} held", rows.len());
    let counts: Vec<String> = view
        .kinds
        .iter()
        .filter_map(|&k| {
            let n = rows.iter().filter(|r| r.kind == k).count();
            (n > 0).then(|| format!("{n} {}", kind_name(k)))
        })
        .collect();
    if !counts.is_empty() {
        let _ = write!(summary, " ({})", counts.join(", "));
    }
    let waiting: u64 = rows.iter().filter_map(Row::waiters).sum();
    let _ = write!(summary, " — {waiting} waiting — sort {}", view.sort.name());
    if args.pattern != "*" {
        let _ = write!(summary, " — matching {}", last_cell(Some(&args.pattern)));
    }
    if view.kinds.len() < ALL_KINDS.len() {
        let kinds: Vec<&str> = view.kinds.iter().map(|&k| kind_name(k)).collect();
        let _ = write!(summary, " — {} only", kinds.join(", "));
    }
    lines.push(summary);
    match result {
        Ok(s) => {
            if s.truncated {
                lines.push(format!(
                    "--limit {} reached (there may be more): narrow PATTERN or --kind, or raise it",
                    args.limit
                ));
            }
            if let Some(u) = s.unreadable.first() {
                lines.push(format!(
                    "{} listed but unreadable, e.g. {} {}: {}",
                    s.unreadable.len(),
                    u.kind,
                    shown(&u.name),
                    last_cell(Some(&u.error))
                ));
            }
        }
        Err(f) => lines.push(format!(
            "error: {} (last good refresh: {})",
            last_cell(Some(&f.message)),
            last_good.map_or_else(
                || "none".to_owned(),
                |t| humantime::format_rfc3339_seconds(t).to_string()
            )
        )),
    }
    lines
}

/// One frame for the terminal: cursor home, every line cleared to its end, the rest of
/// the screen cleared; nothing wider or taller than the window.
fn draw(
    view: &View<'_>,
    result: &Result<Snapshot, Failure>,
    last_good: Option<SystemTime>,
) -> String {
    let (width, height) = terminal_size::terminal_size()
        .map_or((80, 24), |(w, h)| (usize::from(w.0), usize::from(h.0)));
    // One column short of the edge: a line that fills the last column leaves the cursor
    // pending a wrap, and clearing from there would erase that column.
    let width = width.saturating_sub(1).max(20);
    let mut lines = header(view, result, last_good);
    lines.push(String::new());
    let rows: &[Row] = result.as_ref().map_or(&[], |s| &s.rows);
    let table: Vec<[String; 11]> = rows.iter().map(cells).collect();
    let mut widths = COLUMNS.map(|c| c.chars().count());
    for row in &table {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: [&str; 11]| {
        let mut out = String::new();
        for (i, cell) in cells.into_iter().enumerate() {
            let w = widths[i];
            if i > 0 {
                out.push_str("  ");
            }
            if RIGHT[i] {
                let _ = write!(out, "{cell:>w$}");
            } else if i == COLUMNS.len() - 1 {
                out.push_str(cell);
            } else {
                let _ = write!(out, "{cell:<w$}");
            }
        }
        out
    };
    let titles = lines.len();
    lines.push(line(COLUMNS));
    // Room for the rows, keeping the last line free (writing there could scroll).
    let room = height.saturating_sub(lines.len() + 1).max(1);
    for (i, row) in table.iter().enumerate() {
        if i + 1 == room && table.len() > room {
            lines.push(format!(
                "… and {} more: a taller window, a PATTERN or --kind shows them",
                table.len() - i
            ));
            break;
        }
        lines.push(line(row.each_ref().map(String::as_str)));
    }
    if rows.is_empty() && result.is_ok() {
        lines.push("(no lock held)".to_owned());
    }
    let mut frame = String::from("\x1b[H");
    for (i, l) in lines.iter().enumerate() {
        if i > 0 {
            frame.push_str("\r\n");
        }
        let l = fit(l, width);
        if i == titles {
            // The column titles in reverse video, across the whole width.
            let pad = width.saturating_sub(l.chars().count());
            let _ = write!(frame, "\x1b[7m{l}{}\x1b[0m", " ".repeat(pad));
        } else {
            frame.push_str(&l);
        }
        frame.push_str("\x1b[K");
    }
    frame.push_str("\x1b[J");
    frame
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::hostile::cases;

    /// A row's name is shown as `list` shows it: one word that pastes back into a shell.
    #[test]
    fn names_in_rows_paste_back() {
        for (name, shown) in [
            ("my job", "$'my\\x20job'"),
            ("new\nline", "$'new\\nline'"),
            ("plain", "plain"),
        ] {
            let row = Row {
                kind: Kind::Lock,
                name: name.to_owned(),
                state: LockState::new(Some("0123456789abcdef".into()), None, None),
            };
            assert_eq!(cells(&row)[1], shown);
        }
    }

    #[test]
    fn redis_companions_of_hash_tagged_names_are_told_apart() {
        assert_eq!(
            redis_companion("dlock-rw:", "{c}:readers"),
            Some(("{c}", "readers"))
        );
        assert_eq!(
            redis_companion("{app}:", "job:waiters"),
            Some(("job", "waiters"))
        );
        assert_eq!(redis_companion("dlock:", "job:waiters"), None);
        assert_eq!(redis_companion("dlock:", "{}x:waiters"), None);
        assert_eq!(redis_companion("dlock:", "{o}x:Build-7"), None);
    }

    #[test]
    fn plain_drops_escapes_and_trailing_blanks() {
        let frame = "\x1b[H\x1b[7mTITLE  \x1b[0m\x1b[K\r\nrow\x1b[K\x1b[J";
        assert_eq!(plain(frame), "TITLE\nrow\n");
    }

    #[test]
    fn fit_cuts_with_an_ellipsis() {
        assert_eq!(fit("abcdef", 6), "abcdef");
        assert_eq!(fit("abcdefg", 6), "abcde…");
    }

    proptest! {
        #![proptest_config(cases(256))]

        /// A name listed by the store (anything) is a companion key only as
        /// `<name>:<lowercase word>`, under a hash-tagged key; never a panic.
        #[test]
        fn redis_companions_are_name_colon_word(
            prefix in prop_oneof![any::<String>(), "[a-z{}:]{0,6}"],
            name in prop_oneof![any::<String>(), "[a-z{}:A-Z]{0,12}"],
        ) {
            if let Some((base, word)) = redis_companion(&prefix, &name) {
                prop_assert_eq!(format!("{base}:{word}"), name.clone());
                prop_assert!(!word.is_empty() && word.bytes().all(|b| b.is_ascii_lowercase()));
                let key = prefix.clone() + base;
                prop_assert!(key.contains('{'), "{:?}", key);
            }
        }

        /// A cut cell is at most `width` characters, and the text itself when it fits.
        #[test]
        fn fit_never_exceeds_the_width(s in any::<String>(), width in 1..60usize) {
            let cut = fit(&s, width);
            prop_assert!(cut.chars().count() <= width);
            if s.chars().count() <= width {
                prop_assert_eq!(cut, s);
            } else {
                prop_assert!(cut.ends_with('…'));
            }
        }

        /// Any frame loses every escape sequence and ends in one newline.
        #[test]
        fn plain_removes_every_escape(
            frame in prop_oneof![any::<String>(), "(\x1b\\[[0-9;]{0,4}[@-~]|[a-z \r\n])*"],
        ) {
            let text = plain(&frame);
            prop_assert!(!text.contains('\x1b'));
            prop_assert!(text.ends_with('\n'));
        }

        /// Any `--interval` (up to `u64::MAX` seconds parses): the next refresh is due
        /// then, or never; no panic.
        #[test]
        fn any_interval_has_a_due_time_or_none(secs in any::<u64>(), nanos in 0..1_000_000_000u32) {
            let now = Instant::now();
            let interval = Duration::new(secs, nanos);
            match due(now, interval) {
                Some(next) => prop_assert_eq!(next - now, interval),
                None => prop_assert!(secs > 1 << 40),
            }
        }

        /// `s` cycles through every order, and each order's name is what `--sort` takes.
        #[test]
        fn sort_names_are_what_sort_takes(start in 0..5usize) {
            use clap::ValueEnum as _;
            let mut by = SortBy::value_variants()[start];
            let mut seen = HashSet::new();
            for _ in 0..5 {
                prop_assert_eq!(SortBy::from_str(by.name(), false), Ok(by));
                seen.insert(by.name());
                by = by.next();
            }
            prop_assert_eq!(by, SortBy::value_variants()[start]);
            prop_assert_eq!(seen.len(), 5);
            for &kind in ALL_KINDS {
                prop_assert_eq!(Kind::from_str(kind_name(kind), false), Ok(kind));
            }
        }
    }

    /// Regression: `dlock top --interval 18446744073709551615s` (which parses) panicked
    /// adding it to the clock after the first refresh.
    #[test]
    fn an_interval_past_the_clock_is_never_due() {
        assert_eq!(due(Instant::now(), Duration::MAX), None);
    }
}
