//! dlock's benchmarks: one command that starts its own `redis-server` processes on
//! loopback and measures dlock beside the physical limit (the same round trips as bare
//! redis-rs commands) and beside its peers (rslock, a python-redis-lock-style `BLPOP`
//! hand-off).
//!
//! ```text
//! cargo run --release -p dlock-bench -- [--quick] [--out DIR] [--only SECTIONS]
//! ```
//!
//! It prints `BENCHMARKS.md`-ready Markdown tables (also written to `DIR/results.md`) and
//! SVG charts (`DIR/*.svg`). `DIR` defaults to `dlock-bench/` in the cargo target
//! directory. Figures are printed, never asserted: the machine is shared and noisy, so the
//! tables give ratios measured in one run, interleaved. The exit status is non-zero only
//! when something is actually broken — a benchmark failed, or a lease held under the
//! watchdog was lost.
//!
//! Sections (`--only` takes a comma-separated subset): `uncontended`, `physical` (one
//! client holding many locks at once, beside `redis-benchmark -t set -P 16`), `contended`,
//! `redlock` (RedLock over 3 and 5 servers), `watchdog`, `memory`, `memcached`, `etcd`,
//! `postgres`, `pg-stale` (PostgreSQL's 3 000 waiters at ttl 2 s on a clean waiters table
//! and on one with 5 000 places of killed clients), `zookeeper`, `primitives` (Semaphore,
//! ReentrantLock, RwLock, FairLock, MultiLock), `replicas` (`WAIT` on a master with a
//! replica), `cluster` (a 3-master Redis
//! Cluster), `election` (leader election's takeover after a resign and after a crash, on
//! every store, beside the plain lock's). The store sections also start `memcached`,
//! `etcd`, PostgreSQL, a standalone ZooKeeper (a JVM) and `redis-cli --cluster create`.
//! The last table judges the targets on the figures of this run (see `targets`).

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod cluster;
mod contended;
mod election;
mod etcd;
mod measure;
mod memcached;
mod pg_stale;
mod physical;
mod postgres;
mod primitives;
mod redlock;
mod replicas;
mod report;
mod scale;
mod stores;
mod svg;
mod targets;
mod uncontended;
mod zookeeper;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use stats_alloc::{INSTRUMENTED_SYSTEM, StatsAlloc};

/// Counts every allocation of the process, for bytes per held lock / per waiter and
/// allocations per cycle. The counting itself is in `stats_alloc` (no unsafe code here);
/// it costs a few relaxed atomic additions per allocation, for every client alike.
#[global_allocator]
static ALLOC: &StatsAlloc<std::alloc::System> = &INSTRUMENTED_SYSTEM;

/// Any failure of a benchmark: they are programs, so one boxed error type is enough.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// The benchmarks' result type.
pub(crate) type Result<T> = std::result::Result<T, BoxError>;

/// How long and how often each measurement runs.
#[derive(Debug, Clone)]
pub(crate) struct Profile {
    /// `--quick`: the CI profile (under two minutes).
    pub(crate) quick: bool,
    /// Repetitions of every measurement (the tables show medians).
    pub(crate) rounds: usize,
    /// Length of one uncontended run.
    pub(crate) uncontended_run: Duration,
    /// Task counts of the uncontended benchmark.
    pub(crate) concurrencies: Vec<usize>,
    /// Length of one contended run.
    pub(crate) contended_run: Duration,
    /// Waiter counts of the contended benchmark.
    pub(crate) waiters: Vec<usize>,
    /// Waiter behaviours of the contended benchmark.
    pub(crate) modes: Vec<contended::Mode>,
    /// Lease counts, lease lengths and kinds of the watchdog benchmark.
    pub(crate) lease_runs: Vec<(usize, Duration, scale::Mix)>,
    /// How long renewals are observed at least (two renewal periods at the least).
    pub(crate) watch_window: Duration,
    /// Waiters parked for the per-waiter memory figure.
    pub(crate) memory_waiters: usize,
    /// Locks held for the per-lock memory figure of the peer.
    pub(crate) memory_locks: usize,
    /// Length of one uncontended run of the other primitives.
    pub(crate) primitive_run: Duration,
    /// Task counts of the many-readers benchmark.
    pub(crate) reader_tasks: Vec<usize>,
    /// Length of one contended run of the other primitives.
    pub(crate) primitive_contended_run: Duration,
    /// Waiter counts of the other primitives' contended benchmark.
    pub(crate) primitive_waiters: Vec<usize>,
    /// Length of one uncontended run of the store sections (RedLock, replicas, Cluster,
    /// Memcached, etcd).
    pub(crate) store_run: Duration,
    /// Task counts of the store sections' uncontended runs.
    pub(crate) store_tasks: Vec<usize>,
    /// Length of one contended run of the store sections.
    pub(crate) store_contended_run: Duration,
    /// Waiter counts of the store sections' contended runs.
    pub(crate) store_waiters: Vec<usize>,
    /// Warm-up on another name before each of those contended runs.
    pub(crate) store_warm_up: Duration,
    /// Takeovers after a resign measured per store (election and plain lock each).
    pub(crate) election_rounds: usize,
    /// Takeovers after a crash measured per store (each waits about a ttl).
    pub(crate) election_crash_rounds: usize,
}

impl Profile {
    fn quick() -> Profile {
        Profile {
            quick: true,
            rounds: 3,
            uncontended_run: Duration::from_millis(500),
            concurrencies: vec![1, 16, 64],
            contended_run: Duration::from_secs(1),
            waiters: vec![8, 64],
            modes: vec![contended::Mode::StepAside],
            lease_runs: vec![
                (1_000, SHORT_TTL, scale::Mix::Locks),
                (10_000, SHORT_TTL, scale::Mix::Locks),
                (10_000, SHORT_TTL, scale::Mix::Mixed),
            ],
            watch_window: Duration::from_secs(3),
            memory_waiters: 1_000,
            memory_locks: 10_000,
            primitive_run: Duration::from_millis(300),
            reader_tasks: vec![64],
            primitive_contended_run: Duration::from_millis(400),
            primitive_waiters: vec![8, 64],
            store_run: Duration::from_millis(150),
            store_tasks: vec![1, 16],
            store_contended_run: Duration::from_millis(300),
            store_waiters: vec![8],
            store_warm_up: Duration::from_millis(100),
            election_rounds: 10,
            election_crash_rounds: 2,
        }
    }

    fn full() -> Profile {
        Profile {
            quick: false,
            rounds: 5,
            uncontended_run: Duration::from_secs(2),
            concurrencies: vec![1, 16, 64],
            contended_run: Duration::from_secs(2),
            waiters: vec![8, 64],
            modes: vec![contended::Mode::StepAside, contended::Mode::Barging],
            lease_runs: vec![
                (1_000, SHORT_TTL, scale::Mix::Locks),
                (10_000, SHORT_TTL, scale::Mix::Locks),
                (100_000, SHORT_TTL, scale::Mix::Locks),
                (100_000, fencelock::DEFAULT_TTL, scale::Mix::Locks),
                (100_000, fencelock::DEFAULT_TTL, scale::Mix::Mixed),
            ],
            watch_window: Duration::from_secs(10),
            memory_waiters: 10_000,
            memory_locks: 10_000,
            primitive_run: Duration::from_secs(1),
            reader_tasks: vec![16, 64],
            primitive_contended_run: Duration::from_secs(2),
            primitive_waiters: vec![8, 64],
            store_run: Duration::from_secs(1),
            store_tasks: vec![1, 16],
            store_contended_run: Duration::from_secs(2),
            store_waiters: vec![8, 64],
            store_warm_up: Duration::from_millis(300),
            election_rounds: 30,
            election_crash_rounds: 5,
        }
    }
}

/// Lease length of most watchdog runs: renewed every second, ten times as often as at
/// dlock's default ttl.
const SHORT_TTL: Duration = Duration::from_secs(3);

/// The benchmark sections, in the order they run.
const SECTIONS: [&str; 15] = [
    "uncontended",
    "physical",
    "contended",
    "redlock",
    "watchdog",
    "memory",
    "memcached",
    "etcd",
    "postgres",
    "pg-stale",
    "zookeeper",
    "primitives",
    "replicas",
    "cluster",
    "election",
];

/// Parsed command line.
struct Args {
    profile: Profile,
    out: PathBuf,
    only: Vec<String>,
}

const USAGE: &str = "usage: dlock-bench [--quick] [--out DIR] \
     [--only uncontended,physical,contended,redlock,watchdog,memory,memcached,etcd,postgres,pg-stale,zookeeper,\
     primitives,replicas,cluster,election]";

fn parse_args() -> std::result::Result<Args, String> {
    let mut quick = false;
    let mut out = None;
    let mut only: Vec<String> = SECTIONS.iter().map(|s| (*s).to_owned()).collect();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--quick" => quick = true,
            "--out" => out = Some(PathBuf::from(args.next().ok_or("--out needs a directory")?)),
            "--only" => {
                let list = args.next().ok_or("--only needs a list of sections")?;
                only = list.split(',').map(str::to_owned).collect();
                if let Some(bad) = only.iter().find(|s| !SECTIONS.contains(&s.as_str())) {
                    return Err(format!("unknown section {bad:?}"));
                }
            }
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    let out = match out {
        Some(out) => out,
        None => default_out_dir(),
    };
    Ok(Args {
        profile: if quick {
            Profile::quick()
        } else {
            Profile::full()
        },
        out,
        only,
    })
}

/// `<target dir>/dlock-bench`, found from this executable's path
/// (`<target>/release/dlock-bench`).
fn default_out_dir() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.parent()?.join("dlock-bench")))
        .unwrap_or_else(|| PathBuf::from("target/dlock-bench"))
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(args) => args,
        Err(msg) => {
            if !msg.is_empty() {
                eprintln!("dlock-bench: {msg}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(if msg.is_empty() { 0 } else { 64 });
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(err) => {
            eprintln!("dlock-bench: cannot start the tokio runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(&args)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("dlock-bench: FAILED: a lease held under the watchdog was lost (see above)");
            ExitCode::FAILURE
        }
        Err(err) => {
            eprintln!("dlock-bench: FAILED: {err}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the selected sections; `Ok(false)` if a lease was lost.
async fn run(args: &Args) -> Result<bool> {
    let started = Instant::now();
    let profile = &args.profile;
    std::fs::create_dir_all(&args.out)
        .map_err(|e| format!("cannot create {}: {e}", args.out.display()))?;
    let wants = |s: &str| args.only.iter().any(|o| o == s);

    let mut steps = 0u64;
    if wants("uncontended") {
        steps += (profile.rounds * profile.concurrencies.len() * uncontended::CLIENTS.len()) as u64;
    }
    if wants("physical") {
        steps += physical::steps(profile);
    }
    if wants("contended") {
        steps += (profile.rounds
            * profile.modes.len()
            * profile.waiters.len()
            * contended::CLIENTS.len()) as u64;
    }
    if wants("redlock") {
        steps += stores::steps::<redlock::Clients>(profile);
    }
    if wants("watchdog") {
        steps += profile.lease_runs.len() as u64;
    }
    if wants("memory") {
        steps += 4;
    }
    if wants("memcached") {
        steps += stores::steps::<memcached::Clients>(profile);
    }
    if wants("etcd") {
        steps += stores::steps::<etcd::Clients>(profile);
    }
    if wants("postgres") {
        steps += stores::steps::<postgres::Clients>(profile);
    }
    if wants("pg-stale") {
        steps += pg_stale::steps(profile);
    }
    if wants("zookeeper") {
        steps += stores::steps::<zookeeper::Clients>(profile);
    }
    if wants("primitives") {
        steps += primitives::steps(profile);
    }
    if wants("replicas") {
        steps += stores::steps::<replicas::Clients>(profile);
    }
    if wants("cluster") {
        steps += stores::steps::<cluster::Clients>(profile);
    }
    if wants("election") {
        steps += election::steps(profile);
    }
    let bar = ProgressBar::new(steps);
    bar.set_style(
        ProgressStyle::with_template("{elapsed:>4} [{bar:30}] {pos}/{len} {msg}")
            .map_err(|e| format!("progress template: {e}"))?
            .progress_chars("=> "),
    );

    let mut md = report::header(profile)?;
    let mut all_kept = true;
    let mut targets = targets::Targets::default();

    if wants("uncontended") {
        let section = uncontended::bench(profile, &bar).await?;
        section.targets(&mut targets);
        md.push_str(&section.markdown());
        write(&args.out, "uncontended-cdf.svg", &section.cdf_svg())?;
    }
    if wants("physical") {
        let section = physical::bench(profile, &bar).await?;
        md.push_str(&section.markdown());
    }
    if wants("contended") {
        let section = contended::bench(profile, &bar).await?;
        section.targets(&mut targets);
        md.push_str(&section.markdown());
        write(&args.out, "handoff-histogram.svg", &section.histogram_svg())?;
    }
    if wants("redlock") {
        let section = stores::bench::<redlock::Clients>(profile, &bar).await?;
        section.targets(&mut targets);
        md.push_str(&section.markdown());
    }
    if wants("watchdog") {
        let section = scale::watchdog(profile, &bar).await?;
        all_kept &= section.all_kept();
        section.targets(&mut targets);
        md.push_str(&section.markdown());
    }
    if wants("memory") {
        let section = scale::memory(profile, &bar).await?;
        section.targets(&mut targets);
        md.push_str(&section.markdown());
    }
    if wants("memcached") {
        let section = stores::bench::<memcached::Clients>(profile, &bar).await?;
        md.push_str(&section.markdown());
    }
    if wants("etcd") {
        let section = stores::bench::<etcd::Clients>(profile, &bar).await?;
        section.targets(&mut targets);
        md.push_str(&section.markdown());
    }
    if wants("postgres") {
        let section = stores::bench::<postgres::Clients>(profile, &bar).await?;
        md.push_str(&section.markdown());
    }
    if wants("pg-stale") {
        let section = pg_stale::bench(profile, &bar).await?;
        md.push_str(&section.markdown());
    }
    if wants("zookeeper") {
        let section = stores::bench::<zookeeper::Clients>(profile, &bar).await?;
        md.push_str(&section.markdown());
    }
    if wants("primitives") {
        let section = primitives::bench(profile, &bar).await?;
        section.targets(&mut targets);
        md.push_str(&section.markdown());
        write(
            &args.out,
            "primitives-handoff-histogram.svg",
            &section.histogram_svg(),
        )?;
    }
    if wants("replicas") {
        let section = stores::bench::<replicas::Clients>(profile, &bar).await?;
        md.push_str(&section.markdown());
    }
    if wants("cluster") {
        let section = stores::bench::<cluster::Clients>(profile, &bar).await?;
        md.push_str(&section.markdown());
    }
    if wants("election") {
        let section = election::bench(profile, &bar).await?;
        md.push_str(&section.markdown());
    }
    bar.finish_and_clear();
    md.push_str(&targets.markdown(profile.quick));

    md.push_str(&format!(
        "\nTotal time: {:.0} s.\n",
        started.elapsed().as_secs_f64()
    ));
    write(&args.out, "results.md", &md)?;
    println!("{md}");
    println!(
        "(tables in {0}/results.md, charts in {0}/*.svg)",
        args.out.display()
    );
    Ok(all_kept)
}

fn write(dir: &std::path::Path, name: &str, text: &str) -> Result<()> {
    let path = dir.join(name);
    std::fs::write(&path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    Ok(())
}
