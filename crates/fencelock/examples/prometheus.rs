//! dlock's metrics in Prometheus: a small contended workload, measured.
//!
//! ```text
//! cargo run -p fencelock --example prometheus                       # run 2 s, print the metrics
//! cargo run -p fencelock --example prometheus -- --seconds 1          # run 1 s (CI)
//! cargo run -p fencelock --example prometheus -- --serve 127.0.0.1:9187   # curl …/metrics
//! cargo run -p fencelock --example prometheus -- --redis redis://127.0.0.1/
//! ```
//!
//! dlock records through the `metrics` facade only; the application installs the
//! exporter it wants. Here it is `metrics-exporter-prometheus` without its HTTP listener
//! (`default-features = false`): the recorder renders the exposition text, served by a
//! few lines of `std::net`. The store is the in-process memory backend unless `--redis URL`
//! names a server.
//!
//! Without `--serve` it exits by itself once the workload has run (about `--seconds`, plus
//! the half second of its longest hold), printing the exposition text on stdout, and
//! fails (exit status 1) if that text lacks any metric the workload must have recorded.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::time::Duration;

use fencelock::raw::RawSemaphore;
use fencelock::{Lock, Semaphore};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Histogram buckets for lock latencies: 1 ms to 10 s.
const BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let mut seconds = 2u64;
    let mut serve: Option<String> = None;
    let mut redis: Option<String> = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--seconds" => seconds = args.next().ok_or("--seconds N")?.parse()?,
            "--serve" => serve = Some(args.next().ok_or("--serve ADDR")?),
            "--redis" => redis = Some(args.next().ok_or("--redis URL")?),
            other => return Err(format!("unknown argument {other:?}").into()),
        }
    }

    // Histograms as true Prometheus histograms (the exporter's default is summaries).
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), BUCKETS)?
        .install_recorder()?;
    // Units and help texts (optional).
    fencelock::observe::describe_metrics();

    if let Some(addr) = serve {
        spawn_server(&addr, handle.clone())?;
        eprintln!("serving http://{addr}/metrics; Ctrl-C to stop");
        seconds = u64::MAX;
    }
    let until = tokio::time::Instant::now()
        .checked_add(Duration::from_secs(seconds))
        .unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(86_400 * 365));

    match redis {
        #[cfg(feature = "redis")]
        Some(url) => workload(fencelock::backend::Redis::connect(url).await?, until).await?,
        #[cfg(not(feature = "redis"))]
        Some(_) => return Err("built without the `redis` feature".into()),
        None => workload(fencelock::backend::Memory::new(), until).await?,
    }

    handle.run_upkeep();
    let text = handle.render();
    print!("{text}");
    // What the workload cannot have avoided recording (with at least one round run).
    let missing: Vec<&str> = [
        fencelock::observe::metric::ACQUIRE_DURATION,
        fencelock::observe::metric::WAIT_DURATION,
        fencelock::observe::metric::HOLDS,
        fencelock::observe::metric::WAITERS,
        fencelock::observe::metric::RENEWALS,
    ]
    .into_iter()
    .filter(|name| !text.lines().any(|l| l.starts_with(name)))
    .collect();
    if !missing.is_empty() {
        return Err(format!("metrics not recorded: {missing:?}").into());
    }
    Ok(())
}

/// Four workers contend for one lock and for two semaphore permits; one holds a
/// short-leased lock long enough to be renewed; one `try_lock`s a held lock.
async fn workload<B: RawSemaphore>(store: B, until: tokio::time::Instant) -> Result<(), BoxError> {
    let orders = Lock::new(store.clone(), "orders")?;
    let slots = Semaphore::new(store.clone(), "slots", 2)?;
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..4 {
        let (orders, slots) = (orders.clone(), slots.clone());
        workers.spawn(async move {
            while tokio::time::Instant::now() < until {
                let guard = orders.lock().await?;
                tokio::time::sleep(Duration::from_millis(5)).await;
                guard.release().await?;
                let permit = slots.acquire().await?;
                tokio::time::sleep(Duration::from_millis(10)).await;
                permit.release().await?;
            }
            Ok::<_, fencelock::Error>(())
        });
    }
    let renewed = Lock::builder(store, "report")
        .ttl(Duration::from_millis(300))
        .build()?;
    workers.spawn(async move {
        while tokio::time::Instant::now() < until {
            let guard = renewed.lock().await?;
            // Renewed every ~100 ms by the watchdog while held.
            tokio::time::sleep(Duration::from_millis(500)).await;
            let busy = renewed.try_lock().await?;
            assert!(busy.is_none(), "held by the guard");
            guard.release().await?;
        }
        Ok(())
    });
    while let Some(done) = workers.join_next().await {
        done??;
    }
    Ok(())
}

/// Serves the exposition text on `addr` (every path), from a thread of its own.
fn spawn_server(addr: &str, handle: PrometheusHandle) -> Result<(), BoxError> {
    let listener = TcpListener::bind(addr)?;
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            // Read the request head; its contents do not matter.
            let mut reader = BufReader::new(&stream);
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                line.clear();
            }
            handle.run_upkeep();
            let body = handle.render();
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n\
                 Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    Ok(())
}
