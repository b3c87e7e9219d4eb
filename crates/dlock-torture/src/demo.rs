//! `dlock demo`: the oversell scenario (buyers deducting one stock), run by real worker processes.
//!
//! Workers place orders: read the stock, check it, write stock − 1. Now and then a worker
//! stalls for longer than the lease *after* checking that its lock is still valid and
//! *before* writing (a GC pause, a stalled VM: its runtime thread is blocked, so nothing
//! renews its lease). Four ways:
//!
//! * no lock;
//! * the `SETNX` + `GETSET` lock of the classic blog recipe (client-clock expiry, plain `DEL` release);
//! * dlock without fencing — correct lease, but a stalled holder still writes late;
//! * dlock with fencing — the stock store rejects any access carrying a fence below the
//!   highest it has seen, so the stalled holder's late write is refused.

use std::collections::HashMap;
use std::io::Write as _;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fencelock::backend::{Memory, Postgres, Redis};
use fencelock::fenced::{PgFencedTable, RedisFenced};
use fencelock::{Lock, LockGuard};
use indicatif::{ProgressBar, ProgressStyle};

use crate::args::{DemoArgs, DemoWorkerArgs};
use crate::exit::{self, Failure};

/// Lease of both locks.
const LEASE: Duration = Duration::from_millis(500);
/// A stall longer than the lease.
const STALL: Duration = Duration::from_millis(1200);
/// Normal order processing.
const WORK: Duration = Duration::from_millis(3);

/// Deterministic "now and then": about one order in eleven stalls.
fn stalls(worker: usize, order: usize) -> bool {
    (worker * 7 + order) % 11 == 5
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Scenario {
    NoLock,
    Seed,
    Dlock,
    Fenced,
}

impl Scenario {
    const ALL: [Scenario; 4] = [
        Scenario::NoLock,
        Scenario::Seed,
        Scenario::Dlock,
        Scenario::Fenced,
    ];

    fn id(self) -> &'static str {
        match self {
            Scenario::NoLock => "no-lock",
            Scenario::Seed => "recipe",
            Scenario::Dlock => "dlock",
            Scenario::Fenced => "dlock-fenced",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Scenario::NoLock => "no lock",
            Scenario::Seed => "SETNX+GETSET recipe",
            Scenario::Dlock => "dlock, no fencing",
            Scenario::Fenced => "dlock + fenced stock",
        }
    }

    fn parse(s: &str) -> Result<Scenario, Failure> {
        Scenario::ALL
            .into_iter()
            .find(|sc| sc.id() == s)
            .ok_or_else(|| Failure::usage(format!("unknown demo scenario {s:?}")))
    }
}

/// The outcome of one order, as a worker reports it (one word a line).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Event {
    Accepted,
    SoldOut,
    /// The fenced stock refused a stale holder.
    Refused,
    /// The holder saw its lease lost before writing and gave up the order.
    Abandoned,
}

impl Event {
    fn word(self) -> &'static str {
        match self {
            Event::Accepted => "accepted",
            Event::SoldOut => "sold-out",
            Event::Refused => "refused",
            Event::Abandoned => "abandoned",
        }
    }

    fn parse(s: &str) -> Option<Event> {
        [
            Event::Accepted,
            Event::SoldOut,
            Event::Refused,
            Event::Abandoned,
        ]
        .into_iter()
        .find(|e| e.word() == s)
    }
}

fn store_err(e: redis::RedisError) -> Failure {
    Failure::new(exit::UNAVAILABLE, format!("demo store: {e}"))
}

fn pg_err(e: tokio_postgres::Error) -> Failure {
    Failure::new(exit::UNAVAILABLE, format!("demo store: {e}"))
}

/// The stock and the recipe lock's key: in this process, in Redis, or in a PostgreSQL table
/// (`<schema>.demo_stock` beside dlock's own tables, its fence in a `dlock_fence` column).
#[derive(Clone)]
enum Kv {
    Local(Arc<Mutex<HashMap<String, String>>>),
    Redis(redis::aio::MultiplexedConnection),
    Postgres(Postgres, PgFencedTable),
}

impl Kv {
    /// The PostgreSQL store on the lock's own client (its pool): creates the table.
    async fn postgres(pg: Postgres) -> Result<Kv, Failure> {
        let table = format!("{}.demo_stock", pg.schema());
        let fenced = PgFencedTable::new(&table, "key")?;
        pg.client()
            .await?
            .batch_execute(&format!(
                "CREATE TABLE IF NOT EXISTS {table} (key text PRIMARY KEY, value text NOT NULL);
                 {}",
                fenced.migration_sql()
            ))
            .await
            .map_err(pg_err)?;
        Ok(Kv::Postgres(pg, fenced))
    }

    /// A PostgreSQL statement's rows.
    async fn pg_query(
        pg: &Postgres,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Vec<tokio_postgres::Row>, Failure> {
        let sql = sql.replace("{table}", &format!("{}.demo_stock", pg.schema()));
        pg.client()
            .await?
            .query(sql.as_str(), params)
            .await
            .map_err(pg_err)
    }

    /// The first column of the first row, if any.
    fn first(rows: &[tokio_postgres::Row]) -> Option<String> {
        rows.first().and_then(|r| r.get::<_, Option<String>>(0))
    }
}

impl Kv {
    fn local(&self) -> Option<std::sync::MutexGuard<'_, HashMap<String, String>>> {
        match self {
            Kv::Local(m) => Some(m.lock().unwrap_or_else(PoisonError::into_inner)),
            Kv::Redis(_) | Kv::Postgres(..) => None,
        }
    }

    async fn get(&self, key: &str) -> Result<Option<String>, Failure> {
        match self {
            Kv::Local(_) => Ok(self.local().and_then(|m| m.get(key).cloned())),
            Kv::Postgres(pg, _) => Ok(Kv::first(
                &Kv::pg_query(pg, "SELECT value FROM {table} WHERE key = $1", &[&key]).await?,
            )),
            Kv::Redis(c) => redis::cmd("GET")
                .arg(key)
                .query_async(&mut c.clone())
                .await
                .map_err(store_err),
        }
    }

    async fn set(&self, key: &str, value: &str) -> Result<(), Failure> {
        match self {
            Kv::Local(_) => {
                if let Some(mut m) = self.local() {
                    m.insert(key.to_owned(), value.to_owned());
                }
                Ok(())
            }
            Kv::Postgres(pg, _) => Kv::pg_query(
                pg,
                "INSERT INTO {table} (key, value) VALUES ($1, $2)
                 ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                &[&key, &value],
            )
            .await
            .map(drop),
            Kv::Redis(c) => redis::cmd("SET")
                .arg(key)
                .arg(value)
                .query_async(&mut c.clone())
                .await
                .map_err(store_err),
        }
    }

    async fn setnx(&self, key: &str, value: &str) -> Result<bool, Failure> {
        match self {
            Kv::Local(_) => Ok(self.local().is_some_and(|mut m| {
                if m.contains_key(key) {
                    false
                } else {
                    m.insert(key.to_owned(), value.to_owned());
                    true
                }
            })),
            Kv::Postgres(pg, _) => Ok(!Kv::pg_query(
                pg,
                "INSERT INTO {table} (key, value) VALUES ($1, $2)
                 ON CONFLICT (key) DO NOTHING RETURNING key",
                &[&key, &value],
            )
            .await?
            .is_empty()),
            Kv::Redis(c) => redis::cmd("SETNX")
                .arg(key)
                .arg(value)
                .query_async(&mut c.clone())
                .await
                .map_err(store_err),
        }
    }

    async fn getset(&self, key: &str, value: &str) -> Result<Option<String>, Failure> {
        match self {
            Kv::Local(_) => Ok(self
                .local()
                .and_then(|mut m| m.insert(key.to_owned(), value.to_owned()))),
            // The old value under the row lock, then the new one (a missing row stays
            // missing: the recipe's lock only GETSETs a key it has just read).
            Kv::Postgres(pg, _) => Ok(Kv::first(
                &Kv::pg_query(
                    pg,
                    "UPDATE {table} AS t SET value = $2
                     FROM (SELECT value FROM {table} WHERE key = $1 FOR UPDATE) AS old
                     WHERE t.key = $1 RETURNING old.value",
                    &[&key, &value],
                )
                .await?,
            )),
            Kv::Redis(c) => redis::cmd("GETSET")
                .arg(key)
                .arg(value)
                .query_async(&mut c.clone())
                .await
                .map_err(store_err),
        }
    }

    async fn del(&self, keys: &[&str]) -> Result<(), Failure> {
        match self {
            Kv::Local(_) => {
                if let Some(mut m) = self.local() {
                    for k in keys {
                        m.remove(*k);
                    }
                }
                Ok(())
            }
            Kv::Postgres(pg, _) => {
                Kv::pg_query(pg, "DELETE FROM {table} WHERE key = ANY($1)", &[&keys])
                    .await
                    .map(drop)
            }
            Kv::Redis(c) => redis::cmd("DEL")
                .arg(keys)
                .query_async(&mut c.clone())
                .await
                .map_err(store_err),
        }
    }

    /// A fenced read (`new_value` None) or write; `None` if the fence was refused.
    async fn fenced(
        &self,
        stock: &str,
        highest: &str,
        fence: u64,
        new_value: Option<i64>,
    ) -> Result<Option<String>, Failure> {
        match self {
            Kv::Local(_) => {
                let Some(mut m) = self.local() else {
                    return Ok(None);
                };
                let seen: u64 = m.get(highest).and_then(|v| v.parse().ok()).unwrap_or(0);
                if fence < seen {
                    return Ok(None);
                }
                m.insert(highest.to_owned(), fence.to_string());
                match new_value {
                    Some(v) => {
                        m.insert(stock.to_owned(), v.to_string());
                        Ok(Some("OK".to_owned()))
                    }
                    None => Ok(m.get(stock).cloned()),
                }
            }
            // The library's fenced resources (fencelock::fenced): the row keeps its own fence.
            Kv::Postgres(pg, table) => {
                let fence = fencelock::FencingToken::new(fence);
                let client = pg.client().await?;
                Ok(match new_value {
                    Some(v) => table
                        .update(&*client, "value = $1", "", &[&v.to_string()], &stock, fence)
                        .await?
                        .ok()
                        .filter(|&n| n > 0)
                        .map(|_| "OK".to_owned()),
                    None => match table.read(&*client, "value", &stock, fence).await? {
                        Ok(row) => Some(row.map(|r| r.get::<_, String>(0)).unwrap_or_default()),
                        Err(_stale) => None,
                    },
                })
            }
            Kv::Redis(c) => {
                let resource = RedisFenced::new(stock).fence_key(highest);
                let fence = fencelock::FencingToken::new(fence);
                let mut conn = c.clone();
                Ok(match new_value {
                    Some(v) => resource
                        .write(&mut conn, fence, &v.to_string())
                        .await?
                        .ok()
                        .map(|()| "OK".to_owned()),
                    None => match resource.read(&mut conn, fence).await? {
                        Ok(value) => Some(value.unwrap_or_default()),
                        Err(_stale) => None,
                    },
                })
            }
        }
    }
}

fn wall_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

/// The blog recipe's SETNX + GETSET lock, as it is written there (a control: broken by design).
async fn seed_lock(kv: &Kv, key: &str) -> Result<(), Failure> {
    loop {
        let expires = (wall_ms() + LEASE.as_millis() + 1).to_string();
        if kv.setnx(key, &expires).await? {
            return Ok(());
        }
        let current = kv.get(key).await?;
        if let Some(at) = current.as_deref().and_then(|v| v.parse::<u128>().ok())
            && at < wall_ms()
            && kv.getset(key, &expires).await? == current
        {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// dlock on either store.
enum AnyLock {
    Memory(Lock<Memory>),
    Redis(Lock<Redis>),
    Postgres(Lock<Postgres>),
}

enum AnyGuard {
    Memory(LockGuard<Memory>),
    Redis(LockGuard<Redis>),
    Postgres(LockGuard<Postgres>),
}

impl AnyLock {
    async fn lock(&self) -> Result<AnyGuard, Failure> {
        Ok(match self {
            AnyLock::Memory(l) => AnyGuard::Memory(l.lock().await?),
            AnyLock::Redis(l) => AnyGuard::Redis(l.lock().await?),
            AnyLock::Postgres(l) => AnyGuard::Postgres(l.lock().await?),
        })
    }
}

impl AnyGuard {
    fn fence(&self) -> u64 {
        match self {
            AnyGuard::Memory(g) => g.fencing_token().get(),
            AnyGuard::Redis(g) => g.fencing_token().get(),
            AnyGuard::Postgres(g) => g.fencing_token().get(),
        }
    }

    fn is_lost(&self) -> bool {
        match self {
            AnyGuard::Memory(g) => g.is_lost(),
            AnyGuard::Redis(g) => g.is_lost(),
            AnyGuard::Postgres(g) => g.is_lost(),
        }
    }

    async fn release(self) {
        // A stalled holder's release reports LockLost; the demo counts the damage instead.
        let _ = match self {
            AnyGuard::Memory(g) => g.release().await,
            AnyGuard::Redis(g) => g.release().await,
            AnyGuard::Postgres(g) => g.release().await,
        };
    }
}

struct Keys {
    stock: String,
    highest: String,
    seed: String,
    lock: String,
}

impl Keys {
    fn new(run_id: &str, scenario: Scenario) -> Keys {
        let base = format!("dlock-demo:{run_id}:{}", scenario.id());
        Keys {
            stock: format!("{base}:stock"),
            highest: format!("{base}:highest-fence"),
            seed: format!("{base}:seed-lock"),
            lock: format!("demo:{run_id}:{}", scenario.id()),
        }
    }
}

/// One worker's orders; `report` is told each outcome.
async fn place_orders(
    kv: &Kv,
    lock: Option<&AnyLock>,
    scenario: Scenario,
    keys: &Keys,
    worker: usize,
    orders: usize,
    report: &(dyn Fn(Event) + Sync),
) -> Result<(), Failure> {
    for order in 0..orders {
        let guard = match (scenario, lock) {
            (Scenario::Seed, _) => {
                seed_lock(kv, &keys.seed).await?;
                None
            }
            (Scenario::Dlock | Scenario::Fenced, Some(lock)) => Some(lock.lock().await?),
            _ => None,
        };
        let fence = guard
            .as_ref()
            .map(AnyGuard::fence)
            .filter(|_| scenario == Scenario::Fenced);
        let stock = match fence {
            Some(f) => kv.fenced(&keys.stock, &keys.highest, f, None).await?,
            None => kv.get(&keys.stock).await?,
        };
        let event = match stock.and_then(|s| s.parse::<i64>().ok()) {
            None => Event::Refused,
            Some(stock) if stock <= 0 => Event::SoldOut,
            Some(stock) => {
                tokio::time::sleep(WORK).await;
                if guard.as_ref().is_some_and(AnyGuard::is_lost) {
                    Event::Abandoned
                } else {
                    if stalls(worker, order) {
                        // Block the runtime thread: nothing renews the lease meanwhile.
                        std::thread::sleep(STALL);
                    }
                    let written = match fence {
                        Some(f) => kv
                            .fenced(&keys.stock, &keys.highest, f, Some(stock - 1))
                            .await?
                            .is_some(),
                        None => {
                            kv.set(&keys.stock, &(stock - 1).to_string()).await?;
                            true
                        }
                    };
                    if written {
                        Event::Accepted
                    } else {
                        Event::Refused
                    }
                }
            }
        };
        report(event);
        if scenario == Scenario::Seed {
            kv.del(&[&keys.seed]).await?;
        }
        if let Some(guard) = guard {
            guard.release().await;
        }
    }
    Ok(())
}

/// `dlock demo-worker`: one worker process, on a current-thread runtime (so that a stall
/// stops its lease renewal too, as a real process pause would).
pub(crate) async fn worker(args: DemoWorkerArgs) -> Result<u8, Failure> {
    let scenario = Scenario::parse(&args.scenario)?;
    let keys = Keys::new(&args.run_id, scenario);
    let locking = matches!(scenario, Scenario::Dlock | Scenario::Fenced);
    let (kv, lock) = if is_postgres(&args.url) {
        let pg = Postgres::connect(&args.url).await?;
        let lock = locking
            .then(|| Lock::builder(pg.clone(), &keys.lock).ttl(LEASE).build())
            .transpose()?
            .map(AnyLock::Postgres);
        (Kv::postgres(pg).await?, lock)
    } else {
        let lock = if locking {
            let redis = Redis::connect(args.url.clone()).await?;
            Some(AnyLock::Redis(
                Lock::builder(redis, &keys.lock).ttl(LEASE).build()?,
            ))
        } else {
            None
        };
        (redis_kv(&args.url).await?, lock)
    };
    let report = |e: Event| {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{}", e.word());
        let _ = out.flush();
    };
    place_orders(
        &kv,
        lock.as_ref(),
        scenario,
        &keys,
        args.worker,
        args.orders,
        &report,
    )
    .await?;
    Ok(exit::SUCCESS)
}

#[derive(Default, Debug)]
struct Tally {
    accepted: u64,
    refused: u64,
    abandoned: u64,
    sold_out: u64,
}

impl Tally {
    fn add(&mut self, e: Event) {
        match e {
            Event::Accepted => self.accepted += 1,
            Event::Refused => self.refused += 1,
            Event::Abandoned => self.abandoned += 1,
            Event::SoldOut => self.sold_out += 1,
        }
    }
}

enum Mode {
    /// Worker processes against this URL.
    Processes(String),
    /// Worker threads against one in-process store.
    Threads(Memory),
}

pub(crate) async fn demo(args: DemoArgs) -> Result<u8, Failure> {
    if args.workers == 0 || args.orders == 0 || args.stock < 0 {
        return Err(Failure::usage(
            "--workers and --orders must be positive, --stock not negative",
        ));
    }
    let mut private = None;
    let (mode, kv, described) = match args.url.as_deref().filter(|u| !u.is_empty()) {
        Some(url) if url.starts_with("memory://") => (
            Mode::Threads(Memory::new()),
            Kv::Local(Arc::default()),
            "the in-process memory backend (worker threads)".to_owned(),
        ),
        Some(url) if is_postgres(url) => {
            let pg = Postgres::connect(url).await?;
            let described = format!(
                "PostgreSQL at {} (worker processes; the stock in table {}.demo_stock)",
                exit::redact(url),
                pg.schema()
            );
            (Mode::Processes(url.to_owned()), Kv::postgres(pg).await?, described)
        }
        Some(url) if is_redis(url) => {
            Redis::connect(url).await?;
            let kv = redis_kv(url).await?;
            let described = format!("Redis at {} (worker processes)", exit::redact(url));
            (Mode::Processes(url.to_owned()), kv, described)
        }
        Some(url) => {
            return Err(Failure::usage(format!(
                "dlock demo keeps its stock in Redis or PostgreSQL: --url {} is neither \
                 (redis://, rediss://, redis+unix://, redis+sentinel://, redis+cluster://, \
                 postgres://, memory://)",
                exit::redact(url)
            )));
        }
        // A private server, killed when the demo ends (by the test kit's spawner).
        None => match dlock_test::server::RedisServer::start() {
            Ok(server) => {
                let url = server.url();
                private = Some(server);
                let kv = redis_kv(&url).await?;
                (
                    Mode::Processes(url.clone()),
                    kv,
                    format!("a private redis-server at {url} (worker processes)"),
                )
            }
            Err(_) => (
                Mode::Threads(Memory::new()),
                Kv::Local(Arc::default()),
                "the in-process memory backend with worker threads (no --url, and no redis-server on PATH)"
                    .to_owned(),
            ),
        },
    };
    println!(
        "Oversell demo: {} workers × {} orders, stock {}, lease {}; a few orders stall {} \
         between checking the lock and writing.\nStore: {described}\n",
        args.workers,
        args.orders,
        args.stock,
        humantime::format_duration(LEASE),
        humantime::format_duration(STALL),
    );
    let run_id = fencelock::Token::random()?.as_str()[..8].to_owned();
    let mut rows = Vec::new();
    for scenario in Scenario::ALL {
        let keys = Keys::new(&run_id, scenario);
        kv.set(&keys.stock, &args.stock.to_string()).await?;
        let bar = progress(&args, scenario);
        let started = Instant::now();
        let tally = match &mode {
            Mode::Processes(url) => run_processes(url, scenario, &run_id, &args, &bar).await?,
            Mode::Threads(store) => run_threads(store, &kv, scenario, &keys, &args, &bar)?,
        };
        let elapsed = started.elapsed();
        bar.finish_and_clear();
        let final_stock: i64 = kv
            .get(&keys.stock)
            .await?
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        kv.del(&[&keys.stock, &keys.highest, &keys.seed]).await?;
        rows.push((scenario, tally, final_stock, elapsed));
    }
    println!(
        "{:<24} {:>8} {:>8} {:>11} {:>8} {:>12} {:>8}",
        "scenario", "orders", "refused", "final stock", "oversold", "lost updates", "time"
    );
    for (scenario, t, final_stock, elapsed) in &rows {
        let sold = u64::try_from(args.stock - final_stock).unwrap_or(0);
        let oversold = t
            .accepted
            .saturating_sub(u64::try_from(args.stock).unwrap_or(0));
        let lost = t.accepted.saturating_sub(sold);
        println!(
            "{:<24} {:>8} {:>8} {:>11} {:>8} {:>12} {:>7.2}s",
            scenario.label(),
            t.accepted,
            t.refused + t.abandoned,
            final_stock,
            oversold,
            lost,
            elapsed.as_secs_f64()
        );
    }
    println!(
        "\norders = orders accepted; refused = stale holders turned away (by the fenced stock, \
         or by their own lost-lease check);\noversold = orders beyond the stock; lost updates = \
         accepted orders the final stock does not reflect.\nWithout fencing, no lease lock can \
         stop a holder that stalls past its lease between its check and its write."
    );
    drop(private);
    Ok(exit::SUCCESS)
}

fn is_redis(url: &str) -> bool {
    url.split_once("://").is_some_and(|(scheme, _)| {
        matches!(
            scheme,
            "redis" | "rediss" | "redis+unix" | "unix" | "redis+sentinel" | "redis+cluster"
        )
    })
}

fn is_postgres(url: &str) -> bool {
    url.starts_with("postgres://") || url.starts_with("postgresql://")
}

async fn redis_kv(url: &str) -> Result<Kv, Failure> {
    let conn = redis::Client::open(url)
        .map_err(|e| Failure::usage(format!("bad URL: {e}")))?
        .get_multiplexed_async_connection()
        .await
        .map_err(store_err)?;
    Ok(Kv::Redis(conn))
}

fn progress(args: &DemoArgs, scenario: Scenario) -> ProgressBar {
    let total = (args.workers * args.orders) as u64;
    if args.plain {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    if let Ok(style) = ProgressStyle::with_template("{msg:<24} [{bar:30}] {pos}/{len} orders") {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(scenario.label());
    bar
}

async fn run_processes(
    url: &str,
    scenario: Scenario,
    run_id: &str,
    args: &DemoArgs,
    bar: &ProgressBar,
) -> Result<Tally, Failure> {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut children = Vec::new();
    for worker in 0..args.workers {
        let tx = tx.clone();
        // The URL (with its password, if any) in the environment, not on the command line.
        let args: Vec<String> = [
            "demo-worker",
            "--scenario",
            scenario.id(),
            "--run-id",
            run_id,
            "--worker",
            &worker.to_string(),
            "--orders",
            &args.orders.to_string(),
        ]
        .iter()
        .map(|a| (*a).to_owned())
        .collect();
        let env = [(crate::args::DEMO_WORKER_URL.to_owned(), url.into())];
        let (child, _reader) = crate::workers::spawn(&args, &env, move |line| {
            if let Some(e) = Event::parse(line) {
                let _ = tx.send(e);
            }
        })?;
        children.push(child);
    }
    drop(tx);
    let mut tally = Tally::default();
    while let Some(e) = rx.recv().await {
        tally.add(e);
        bar.inc(1);
    }
    for mut child in children {
        let status = child
            .wait()
            .await
            .map_err(|e| Failure::new(exit::UNAVAILABLE, format!("worker: {e}")))?;
        if !status.success() {
            return Err(Failure::new(
                exit::UNAVAILABLE,
                format!("a demo worker failed: {status}"),
            ));
        }
    }
    Ok(tally)
}

/// Worker threads, each with its own current-thread runtime and its own client of the
/// shared in-process store (so one worker's stall stops only its own renewals).
fn run_threads(
    store: &Memory,
    kv: &Kv,
    scenario: Scenario,
    keys: &Keys,
    args: &DemoArgs,
    bar: &ProgressBar,
) -> Result<Tally, Failure> {
    let tally = Arc::new(Mutex::new(Tally::default()));
    let outcome: Result<(), Failure> = std::thread::scope(|scope| {
        let mut handles = Vec::new();
        for worker in 0..args.workers {
            let (store, kv, tally, bar) =
                (store.client(), kv.clone(), Arc::clone(&tally), bar.clone());
            handles.push(scope.spawn(move || -> Result<(), Failure> {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| Failure::new(exit::UNAVAILABLE, format!("runtime: {e}")))?;
                rt.block_on(async {
                    let lock = match scenario {
                        Scenario::Dlock | Scenario::Fenced => Some(AnyLock::Memory(
                            Lock::builder(store, &keys.lock).ttl(LEASE).build()?,
                        )),
                        _ => None,
                    };
                    let report = |e: Event| {
                        tally.lock().unwrap_or_else(PoisonError::into_inner).add(e);
                        bar.inc(1);
                    };
                    place_orders(
                        &kv,
                        lock.as_ref(),
                        scenario,
                        keys,
                        worker,
                        args.orders,
                        &report,
                    )
                    .await
                })
            }));
        }
        for h in handles {
            h.join()
                .map_err(|_| Failure::new(exit::UNAVAILABLE, "a demo worker thread panicked"))??;
        }
        Ok(())
    });
    outcome?;
    let tally = std::mem::take(&mut *tally.lock().unwrap_or_else(PoisonError::into_inner));
    Ok(tally)
}
