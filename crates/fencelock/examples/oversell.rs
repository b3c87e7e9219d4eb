//! The oversell scenario: concurrent buyers deduct stock; how many orders oversell?
//!
//! Each buyer places orders: read the stock, check it is positive, take a moment to
//! process the order (now and then a slow one: a GC pause, a slow payment call), write
//! stock − 1. Run three ways:
//!
//! * no lock;
//! * the `SETNX` + `GETSET` lock of the classic blog recipe (expiry decided by the client's clock, released by
//!   plain `DEL`);
//! * dlock (atomic `SET NX PX`, owner-checked release, watchdog renewal).
//!
//! ```text
//! cargo run --release --example oversell                          # in-process store
//! DLOCK_URL=redis://127.0.0.1:6379/ cargo run --release --example oversell
//! ```

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fencelock::backend::{Memory, Redis};
use fencelock::{Lock, LockGuard};
use tokio::time::{Instant, sleep};

const BUYERS: usize = 16;
const ORDERS_PER_BUYER: usize = 5;
const STOCK: i64 = 40;
/// The lease / lock timeout of both locks.
const LEASE: Duration = Duration::from_millis(300);
/// A slow order takes longer than the lease.
const SLOW_ORDER: Duration = Duration::from_millis(450);
const ORDER: Duration = Duration::from_millis(2);

/// Deterministic "now and then": a few orders are slow in every run.
fn is_slow(buyer: usize, order: usize) -> bool {
    (buyer * 5 + order) % 17 == 3
}

/// Where the stock and the recipe lock's key live: this process, or Redis.
#[derive(Clone)]
enum Kv {
    Local(Arc<std::sync::Mutex<HashMap<String, String>>>),
    Redis(redis::aio::MultiplexedConnection),
}

impl Kv {
    async fn get(&self, key: &str) -> Option<String> {
        match self {
            Kv::Local(m) => m.lock().ok()?.get(key).cloned(),
            Kv::Redis(c) => redis::cmd("GET")
                .arg(key)
                .query_async(&mut c.clone())
                .await
                .ok()?,
        }
    }

    async fn set(&self, key: &str, value: &str) {
        match self {
            Kv::Local(m) => {
                if let Ok(mut m) = m.lock() {
                    m.insert(key.to_owned(), value.to_owned());
                }
            }
            Kv::Redis(c) => {
                let _: Result<(), _> = redis::cmd("SET")
                    .arg(key)
                    .arg(value)
                    .query_async(&mut c.clone())
                    .await;
            }
        }
    }

    async fn setnx(&self, key: &str, value: &str) -> bool {
        match self {
            Kv::Local(m) => m.lock().is_ok_and(|mut m| {
                if m.contains_key(key) {
                    false
                } else {
                    m.insert(key.to_owned(), value.to_owned());
                    true
                }
            }),
            Kv::Redis(c) => redis::cmd("SETNX")
                .arg(key)
                .arg(value)
                .query_async(&mut c.clone())
                .await
                .unwrap_or(false),
        }
    }

    async fn getset(&self, key: &str, value: &str) -> Option<String> {
        match self {
            Kv::Local(m) => m.lock().ok()?.insert(key.to_owned(), value.to_owned()),
            Kv::Redis(c) => redis::cmd("GETSET")
                .arg(key)
                .arg(value)
                .query_async(&mut c.clone())
                .await
                .ok()?,
        }
    }

    async fn del(&self, key: &str) {
        match self {
            Kv::Local(m) => {
                if let Ok(mut m) = m.lock() {
                    m.remove(key);
                }
            }
            Kv::Redis(c) => {
                let _: Result<i64, _> =
                    redis::cmd("DEL").arg(key).query_async(&mut c.clone()).await;
            }
        }
    }
}

fn wall_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

/// The blog recipe's lock as it is written there: SETNX a client-clock expiry; if held and the
/// stored expiry has passed, GETSET a new one and take the lock if the old value was the
/// expired one; release by plain DEL. (A test control only: it is broken by design.)
async fn seed_lock(kv: &Kv, key: &str) {
    loop {
        let expires = (wall_ms() + LEASE.as_millis() + 1).to_string();
        if kv.setnx(key, &expires).await {
            return;
        }
        let current = kv.get(key).await;
        if let Some(cur) = current.as_deref().and_then(|v| v.parse::<u128>().ok())
            && cur < wall_ms()
        {
            let old = kv.getset(key, &expires).await;
            if old == current {
                return;
            }
        }
        sleep(Duration::from_millis(5)).await;
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Scenario {
    NoLock,
    SeedLock,
    Dlock,
}

impl Scenario {
    fn label(self) -> &'static str {
        match self {
            Scenario::NoLock => "no lock",
            Scenario::SeedLock => "SETNX+GETSET recipe",
            Scenario::Dlock => "dlock",
        }
    }
}

struct Outcome {
    accepted: u64,
    final_stock: i64,
    elapsed: Duration,
}

enum Backend {
    Memory(Memory),
    Redis(String),
}

/// dlock on either store.
enum AnyLock {
    Memory(Lock<Memory>),
    Redis(Lock<Redis>),
}

enum AnyGuard {
    Memory(LockGuard<Memory>),
    Redis(LockGuard<Redis>),
}

impl AnyLock {
    async fn new(backend: &Backend, name: &str) -> fencelock::Result<AnyLock> {
        Ok(match backend {
            Backend::Memory(m) => {
                AnyLock::Memory(Lock::builder(m.clone(), name).ttl(LEASE).build()?)
            }
            Backend::Redis(url) => {
                // One client per buyer, as separate machines would have.
                AnyLock::Redis(
                    Lock::builder(Redis::connect(url.clone()).await?, name)
                        .ttl(LEASE)
                        .build()?,
                )
            }
        })
    }

    async fn lock(&self) -> fencelock::Result<AnyGuard> {
        Ok(match self {
            AnyLock::Memory(l) => AnyGuard::Memory(l.lock().await?),
            AnyLock::Redis(l) => AnyGuard::Redis(l.lock().await?),
        })
    }
}

impl AnyGuard {
    async fn release(self) -> fencelock::Result<()> {
        match self {
            AnyGuard::Memory(g) => g.release().await,
            AnyGuard::Redis(g) => g.release().await,
        }
    }
}

async fn run(
    scenario: Scenario,
    backend: &Backend,
    kv: &Kv,
    run_id: &str,
) -> fencelock::Result<Outcome> {
    let stock_key = format!("dlock-oversell:{run_id}:{}:stock", scenario as u8);
    let seed_key = format!("dlock-oversell:{run_id}:seed-lock");
    let lock_name = format!("oversell:{run_id}");
    kv.set(&stock_key, &STOCK.to_string()).await;
    let accepted = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut buyers = Vec::new();
    for b in 0..BUYERS {
        let kv = kv.clone();
        let (stock_key, seed_key) = (stock_key.clone(), seed_key.clone());
        let accepted = Arc::clone(&accepted);
        let lock = match scenario {
            Scenario::Dlock => Some(AnyLock::new(backend, &lock_name).await?),
            _ => None,
        };
        buyers.push(tokio::spawn(async move {
            for o in 0..ORDERS_PER_BUYER {
                let mut guard = None;
                match &lock {
                    Some(lock) => guard = Some(lock.lock().await?),
                    None if scenario == Scenario::SeedLock => seed_lock(&kv, &seed_key).await,
                    None => {}
                }
                let stock: i64 = kv
                    .get(&stock_key)
                    .await
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(0);
                if stock > 0 {
                    sleep(if is_slow(b, o) { SLOW_ORDER } else { ORDER }).await;
                    kv.set(&stock_key, &(stock - 1).to_string()).await;
                    accepted.fetch_add(1, Ordering::SeqCst);
                }
                if scenario == Scenario::SeedLock {
                    kv.del(&seed_key).await;
                }
                if let Some(guard) = guard {
                    guard.release().await?;
                }
            }
            Ok::<(), fencelock::Error>(())
        }));
    }
    for buyer in buyers {
        buyer.await.map_err(|e| {
            fencelock::Error::new(fencelock::ErrorKind::Backend, format!("buyer task: {e}"))
        })??;
    }
    let elapsed = started.elapsed();
    let final_stock = kv
        .get(&stock_key)
        .await
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    kv.del(&stock_key).await;
    kv.del(&seed_key).await;
    Ok(Outcome {
        accepted: accepted.load(Ordering::SeqCst),
        final_stock,
        elapsed,
    })
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    match real_main().await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("oversell: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn real_main() -> fencelock::Result<()> {
    let (backend, kv, where_) = match std::env::var("DLOCK_URL") {
        Ok(url) if !url.is_empty() => {
            // Checks the URL and the server before anything else.
            drop(Redis::connect(url.clone()).await?);
            let conn = redis::Client::open(url.as_str())
                .map_err(|e| {
                    fencelock::Error::new(fencelock::ErrorKind::InvalidArgument, e.to_string())
                })?
                .get_multiplexed_async_connection()
                .await
                .map_err(|e| {
                    fencelock::Error::new(fencelock::ErrorKind::Unavailable, e.to_string())
                })?;
            (
                Backend::Redis(url.clone()),
                Kv::Redis(conn),
                format!("Redis at {url}"),
            )
        }
        _ => (
            Backend::Memory(Memory::new()),
            Kv::Local(Arc::default()),
            "the in-process memory backend (set DLOCK_URL=redis://… to use Redis)".to_owned(),
        ),
    };
    let run_id = fencelock::Token::random()?.as_str()[..8].to_owned();
    println!(
        "Oversell: {BUYERS} buyers × {ORDERS_PER_BUYER} orders, stock {STOCK}, lease {LEASE:?}, \
         some orders take {SLOW_ORDER:?}; store: {where_}\n"
    );
    println!(
        "{:<24} {:>8} {:>12} {:>9} {:>13} {:>10}",
        "scenario", "accepted", "final stock", "oversold", "lost updates", "wall time"
    );
    let mut dlock_clean = true;
    for scenario in [Scenario::NoLock, Scenario::SeedLock, Scenario::Dlock] {
        let out = run(scenario, &backend, &kv, &run_id).await?;
        let sold_from_stock = (STOCK - out.final_stock).max(0) as u64;
        let oversold = out.accepted.saturating_sub(STOCK as u64);
        let lost_updates = out.accepted.saturating_sub(sold_from_stock);
        if scenario == Scenario::Dlock {
            dlock_clean = oversold == 0 && lost_updates == 0;
        }
        println!(
            "{:<24} {:>8} {:>12} {:>9} {:>13} {:>9.2}s",
            scenario.label(),
            out.accepted,
            out.final_stock,
            oversold,
            lost_updates,
            out.elapsed.as_secs_f64()
        );
    }
    // The fence counter is meant to outlive locks; this demo's own is no longer needed.
    let keys = fencelock::keys::LockKeys::new(
        fencelock::keys::DEFAULT_PREFIX,
        &format!("oversell:{run_id}"),
    )?;
    kv.del(keys.fence()).await;
    println!(
        "\noversold = orders accepted beyond the stock; lost updates = accepted orders the \
         stock count does not reflect."
    );
    if !dlock_clean {
        return Err(fencelock::Error::new(
            fencelock::ErrorKind::LockLost,
            "dlock run oversold: a lease was lost (see the crate docs on pauses and fencing)",
        ));
    }
    Ok(())
}
