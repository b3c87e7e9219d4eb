//! A profiling target: one client's uncontended lock cycles and nothing else, for `perf`.
//!
//! ```text
//! cargo build --release -p dlock-bench --example cycles
//! perf record -F 2000 -g target/release/examples/cycles redis://127.0.0.1:6379 16 10 [rslock]
//! ```
//!
//! Arguments: the server's URL, the number of tasks (each locking and releasing a name of
//! its own, all on one client), the seconds to run, and `rslock` to run the peer instead.
//! Prints the cycles per second.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use fencelock::Lock;
use fencelock::backend::Redis;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: cycles URL TASKS SECONDS [rslock]";
    let url = args.next().ok_or(usage)?;
    let tasks: usize = args.next().ok_or(usage)?.parse()?;
    let secs: u64 = args.next().ok_or(usage)?.parse()?;
    let peer = args.next().as_deref() == Some("rslock");
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let client = Redis::connect(&url).await?;
    let manager = rslock::LockManager::new(vec![url.clone()]);
    let mut handles = Vec::new();
    for t in 0..tasks {
        let (stop, count) = (Arc::clone(&stop), Arc::clone(&count));
        let name = format!("profile:{t}");
        if peer {
            let manager = manager.clone();
            handles.push(tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let lock = manager
                        .lock(name.as_bytes(), Duration::from_secs(30))
                        .await
                        .map_err(|e| format!("rslock: {e}"))?;
                    manager.unlock(&lock).await;
                    count.fetch_add(1, Ordering::Relaxed);
                }
                Ok::<_, BoxError>(())
            }));
        } else {
            let lock = Lock::new(client.clone(), name)?;
            handles.push(tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    lock.lock().await?.release().await?;
                    count.fetch_add(1, Ordering::Relaxed);
                }
                Ok::<_, BoxError>(())
            }));
        }
    }
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(secs)).await;
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        h.await??;
    }
    let cycles = count.load(Ordering::Relaxed) as f64;
    println!("{:.0} cycles/s", cycles / started.elapsed().as_secs_f64());
    Ok(())
}
