//! The soak profile, `dlock torture --soak DURATION`: the chosen kinds round after round,
//! with their faults, for as long as asked, while one client process — the *holder*, this
//! binary's hidden `soak-holder` subcommand — holds `--soak-leases` leases (10 000 by
//! default) on a redis-server of its own that the nemesis never touches.
//!
//! The holder connects one [`Redis`] client, acquires its leases (distinct names
//! `soak:<run>:<i>`, watchdog on: the engine renews them in batches), holds them until
//! the rounds are over (SIGTERM) or its deadline, then releases them all. Every few
//! seconds it prints a sample line — its RSS (`VmRSS`), its open file descriptors, how
//! many leases it holds and how many it lost — and the orchestrator samples its own at
//! the same moment. A leak shows as a slope: the summary gives the least-squares slope of
//! the holder's RSS over the second half of the run, in KiB per minute, and its fds
//! first → last. The soak fails if a lease was lost, the holder could not acquire them all,
//! did not release them all, left a key behind, or died; a growing RSS is reported, not
//! failed (the allocator makes it noisy).

use std::fmt::Write as _;
use std::path::Path;
use std::process::ExitStatus;
use std::time::Duration;

use dlock_test::server::RedisServer;
use fencelock::backend::Redis;
use fencelock::{ErrorKind, Lock, LockGuard};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};
use tokio::process::Child;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::task::JoinSet;

use crate::args::SoakHolderArgs;
use crate::exit::{self, Failure};
use crate::model::{Config, Kind, monotonic_ns};
use crate::nemesis::plan;
use crate::report::{KindReport, Report, print_summary, write};
use crate::run::{Setup, run_kinds};
use crate::stores::{LockServer, start_server};
use crate::timelines::esc;
use crate::workers::spawn;

/// The holder's leases' ttl: renewed every second by the watchdog.
const HOLDER_TTL: Duration = Duration::from_secs(3);

/// Tasks the holder acquires and releases its leases with.
const HOLDER_TASKS: usize = 32;

/// How long the holder may take to acquire its leases, or to release them.
const HOLDER_PHASE_LIMIT: Duration = Duration::from_secs(180);

/// Rows of the summary table at most (evenly spread, first and last always shown).
const TABLE_ROWS: usize = 24;

/// What the holder prints, one JSON object a line.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "kebab-case")]
enum HolderLine {
    Sample(HolderSample),
    /// Its leases acquired (or as many as it could).
    Acquired {
        t_ms: u64,
        acquired: u64,
        wanted: u64,
        errors: u64,
        first_error: Option<String>,
        took_ms: u64,
    },
    /// Its leases released.
    Released {
        t_ms: u64,
        released: u64,
        /// Releases that said the lease was no longer ours.
        lost: u64,
        errors: u64,
        first_error: Option<String>,
        took_ms: u64,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum Phase {
    /// Before connecting: the process's baseline.
    Start,
    /// Right after acquiring, before the watchdog's first renewals (its warm-up).
    Acquired,
    /// Every sampling period while holding, and once more just before releasing.
    Holding,
    /// After releasing everything.
    Released,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct HolderSample {
    t_ms: u64,
    phase: Phase,
    rss_kb: u64,
    fds: u64,
    held: u64,
    lost: u64,
}

/// A sample of the holder and, taken as its line arrived, of the orchestrator.
#[derive(Debug, Clone, Serialize)]
struct Sample {
    t_ms: u64,
    phase: Phase,
    rss_kb: u64,
    fds: u64,
    held: u64,
    lost: u64,
    orchestrator_rss_kb: u64,
    orchestrator_fds: u64,
}

/// This process's resident set (KiB) and open file descriptors.
fn proc_self() -> (u64, u64) {
    let rss = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status.lines().find_map(|l| {
                l.strip_prefix("VmRSS:")
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            })
        })
        .unwrap_or(0);
    // Less the descriptor read_dir itself holds open while listing.
    let fds = std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count() as u64)
        .unwrap_or(0)
        .saturating_sub(1);
    (rss, fds)
}

fn ms(ns: u64) -> u64 {
    ns / 1_000_000
}

fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

// ---------------------------------------------------------------------------------------
// The holder process.

/// Prints one line; false once stdout is gone (the orchestrator died).
fn emit(line: &HolderLine) -> bool {
    use std::io::Write as _;
    let Ok(text) = serde_json::to_string(line) else {
        return true;
    };
    writeln!(std::io::stdout().lock(), "{text}").is_ok()
}

type Guards = Vec<LockGuard<Redis>>;

/// The `soak-holder` subcommand: one client holding `--leases` leases.
pub(crate) async fn holder(args: SoakHolderArgs) -> Result<u8, Failure> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())
        .map_err(|e| Failure::new(exit::UNAVAILABLE, format!("cannot handle signals: {e}")))?;
    let t_ms = || ms(monotonic_ns().saturating_sub(args.start_ns));
    let sample = |phase: Phase, guards: &Guards| {
        let (rss_kb, fds) = proc_self();
        let lost = guards.iter().filter(|g| g.is_lost()).count() as u64;
        emit(&HolderLine::Sample(HolderSample {
            t_ms: t_ms(),
            phase,
            rss_kb,
            fds,
            held: guards.len() as u64 - lost,
            lost,
        }))
    };
    if !sample(Phase::Start, &Vec::new()) {
        return Ok(exit::UNAVAILABLE);
    }
    let redis = Redis::builder(args.url.clone()).connect().await?;
    let began = monotonic_ns();
    let mut tasks = JoinSet::new();
    for task in 0..HOLDER_TASKS as u64 {
        let (redis, run, ttl, n) = (redis.clone(), args.run.clone(), args.ttl, args.leases);
        tasks.spawn(async move {
            let mut got = Vec::new();
            let (mut errors, mut first_error) = (0_u64, None);
            for i in (task..n).step_by(HOLDER_TASKS) {
                let attempt = async {
                    Lock::builder(redis.clone(), format!("soak:{run}:{i}"))
                        .ttl(ttl)
                        .build()?
                        .try_lock()
                        .await
                };
                match attempt.await {
                    Ok(Some(guard)) => got.push(guard),
                    Ok(None) => {
                        errors += 1;
                        first_error.get_or_insert_with(|| format!("soak:{run}:{i} was held"));
                    }
                    Err(e) => {
                        errors += 1;
                        first_error.get_or_insert_with(|| e.to_string());
                    }
                }
            }
            (got, errors, first_error)
        });
    }
    let mut guards: Guards = Vec::new();
    let (mut errors, mut first_error) = (0, None);
    while let Some(done) = tasks.join_next().await {
        match done {
            Ok((got, e, first)) => {
                guards.extend(got);
                errors += e;
                first_error = first_error.or(first);
            }
            Err(e) => {
                errors += 1;
                first_error.get_or_insert_with(|| format!("an acquiring task failed: {e}"));
            }
        }
    }
    let mut alive = emit(&HolderLine::Acquired {
        t_ms: t_ms(),
        acquired: guards.len() as u64,
        wanted: args.leases,
        errors,
        first_error,
        took_ms: ms(monotonic_ns() - began),
    }) && sample(Phase::Acquired, &guards);
    let every = ns(args.every).max(1);
    let mut next = monotonic_ns() + every;
    while alive {
        let now = monotonic_ns();
        if now >= args.until_ns {
            break;
        }
        let wake = next.min(args.until_ns);
        tokio::select! {
            () = tokio::time::sleep(Duration::from_nanos(wake.saturating_sub(now))) => {}
            _ = term.recv() => break,
        }
        let now = monotonic_ns();
        if now >= next {
            alive = sample(Phase::Holding, &guards);
            while next <= now {
                next += every;
            }
        }
    }
    // The last sample while holding, then give everything back.
    if alive {
        sample(Phase::Holding, &guards);
    }
    let began = monotonic_ns();
    let mut chunks: Vec<Guards> = (0..HOLDER_TASKS).map(|_| Vec::new()).collect();
    for (i, g) in guards.into_iter().enumerate() {
        chunks[i % HOLDER_TASKS].push(g);
    }
    let mut tasks = JoinSet::new();
    for chunk in chunks {
        tasks.spawn(async move {
            let (mut released, mut lost, mut errors, mut first_error) = (0_u64, 0_u64, 0_u64, None);
            for guard in chunk {
                match guard.release().await {
                    Ok(()) => released += 1,
                    Err(e) => {
                        if e.kind() == ErrorKind::LockLost {
                            lost += 1;
                        } else {
                            errors += 1;
                        }
                        first_error.get_or_insert_with(|| e.to_string());
                    }
                }
            }
            (released, lost, errors, first_error)
        });
    }
    let (mut released, mut lost, mut errors, mut first_error) = (0, 0, 0, None);
    while let Some(done) = tasks.join_next().await {
        match done {
            Ok((r, l, e, first)) => {
                released += r;
                lost += l;
                errors += e;
                first_error = first_error.or(first);
            }
            Err(e) => {
                errors += 1;
                first_error.get_or_insert_with(|| format!("a releasing task failed: {e}"));
            }
        }
    }
    emit(&HolderLine::Released {
        t_ms: t_ms(),
        released,
        lost,
        errors,
        first_error,
        took_ms: ms(monotonic_ns() - began),
    });
    sample(Phase::Released, &Vec::new());
    Ok(exit::SUCCESS)
}

// ---------------------------------------------------------------------------------------
// The orchestrator's side.

/// One round: every kind once (the last round may stop early, at the soak's end).
#[derive(Debug, Serialize)]
struct Round {
    round: usize,
    /// The seed of its fault schedules: `--seed` in round 1, one more each round after.
    seed: u64,
    start_ms: u64,
    end_ms: u64,
    kinds: Vec<&'static str>,
    failed: Vec<&'static str>,
    /// Every kind ran (not cut short by the soak's end).
    complete: bool,
}

/// What the holder did, from its lines and its exit.
#[derive(Debug, Default, Serialize)]
struct HolderReport {
    wanted: u64,
    acquired: Option<u64>,
    acquire_errors: u64,
    acquire_ms: Option<u64>,
    released: Option<u64>,
    /// Releases that found the lease no longer ours.
    release_lost: u64,
    release_errors: u64,
    release_ms: Option<u64>,
    first_error: Option<String>,
    /// Lock keys left on its server after its release (must be 0).
    keys_left: Option<u64>,
    /// Its exit code (`None`: killed by a signal, or never ended).
    exit_code: Option<i32>,
    /// It ended on its own before the rounds were over, or not cleanly.
    died: bool,
}

#[derive(Debug, Serialize)]
struct SoakReport {
    duration_ms: u64,
    ran_ms: u64,
    leases: u64,
    holder_ttl_ms: u64,
    sample_every_ms: u64,
    rounds: Vec<Round>,
    holder: HolderReport,
    /// The most leases seen lost at once, or lost at release (must be 0).
    lost: u64,
    rss_first_kb: Option<u64>,
    rss_last_kb: Option<u64>,
    /// Least squares over the second half of the holding samples.
    rss_slope_kib_per_min: Option<f64>,
    fds_first: Option<u64>,
    fds_last: Option<u64>,
    orchestrator_rss_first_kb: Option<u64>,
    orchestrator_rss_last_kb: Option<u64>,
    orchestrator_rss_slope_kib_per_min: Option<f64>,
    verdict_ok: bool,
    verdict: String,
    samples: Vec<Sample>,
}

/// report.json of a soak.
#[derive(Serialize)]
struct SoakFile<'a> {
    #[serde(flatten)]
    base: serde_json::Map<String, serde_json::Value>,
    kinds: Vec<RoundKind<'a>>,
    soak: &'a SoakReport,
}

/// A kind's report in a round.
#[derive(Serialize)]
struct RoundKind<'a> {
    round: usize,
    #[serde(flatten)]
    report: &'a KindReport,
}

/// What the rounds left for the report.
struct Outcome {
    reports: Vec<(usize, KindReport)>,
    rounds: Vec<Round>,
    samples: Vec<Sample>,
    holder: HolderReport,
    every: Duration,
    ran_ms: u64,
}

/// Gathers the holder's lines into samples and its report.
struct Lines {
    rx: UnboundedReceiver<(HolderLine, (u64, u64))>,
    samples: Vec<Sample>,
    holder: HolderReport,
}

impl Lines {
    fn take(&mut self, line: HolderLine, (orss, ofds): (u64, u64)) {
        let h = &mut self.holder;
        match line {
            HolderLine::Sample(s) => self.samples.push(Sample {
                t_ms: s.t_ms,
                phase: s.phase,
                rss_kb: s.rss_kb,
                fds: s.fds,
                held: s.held,
                lost: s.lost,
                orchestrator_rss_kb: orss,
                orchestrator_fds: ofds,
            }),
            HolderLine::Acquired {
                acquired,
                errors,
                first_error,
                took_ms,
                ..
            } => {
                h.acquired = Some(acquired);
                h.acquire_errors = errors;
                h.acquire_ms = Some(took_ms);
                h.first_error = h.first_error.take().or(first_error);
            }
            HolderLine::Released {
                released,
                lost,
                errors,
                first_error,
                took_ms,
                ..
            } => {
                h.released = Some(released);
                h.release_lost = lost;
                h.release_errors = errors;
                h.release_ms = Some(took_ms);
                h.first_error = h.first_error.take().or(first_error);
            }
        }
    }

    fn drain(&mut self) {
        while let Ok((line, me)) = self.rx.try_recv() {
            self.take(line, me);
        }
    }

    fn last_holding(&self) -> Option<&Sample> {
        self.samples
            .iter()
            .rev()
            .find(|s| s.phase == Phase::Holding)
    }
}

fn exited(child: &mut Child) -> Option<ExitStatus> {
    child.try_wait().ok().flatten()
}

/// `dlock torture --soak`: after `torture` has set up (servers, config, output directory).
#[allow(clippy::too_many_arguments)]
pub(crate) async fn soak(
    soak: Duration,
    leases: u64,
    setup: Setup,
    out: &Path,
) -> Result<u8, Failure> {
    let Setup {
        config,
        kinds,
        mut lock_server,
        resource_server,
        mut signals,
    } = setup;
    let (kinds, lock_server, resource_server, signals) = (
        kinds.as_slice(),
        &mut lock_server,
        &resource_server,
        &mut signals,
    );
    let base_seed = config.seed;
    let (ttl_ms, workers, duration_ms) = (
        u64::try_from(config.ttl.as_millis()).unwrap_or(u64::MAX),
        config.workers,
        u64::try_from(config.duration.as_millis()).unwrap_or(u64::MAX),
    );
    let outcome = tokio::select! {
        outcome = rounds(soak, leases, config, kinds, lock_server, resource_server, out) => outcome?,
        sig = signals.recv() => {
            eprintln!("dlock: torture interrupted ({sig}); cleaning up");
            return Ok(128 + sig as u8);
        }
    };
    let failed_kinds = outcome
        .reports
        .iter()
        .filter(|(_, r)| !r.findings.verdict_ok)
        .count();
    let report = soak_report(
        soak,
        leases,
        outcome.every,
        outcome.ran_ms,
        outcome.rounds,
        outcome.samples,
        outcome.holder,
    );
    print_soak(&report);
    // The run's fields as `dlock torture` writes them, then every round's kinds (each
    // with its round) and the soak's figures.
    let base = serde_json::to_value(Report {
        seed: base_seed,
        ttl_ms,
        workers,
        duration_ms,
        lock_server: &exit::redact(&lock_server.url()),
        kinds: &[],
    })
    .map_err(|e| Failure::new(exit::UNAVAILABLE, format!("report: {e}")))?;
    let mut base = match base {
        serde_json::Value::Object(map) => map,
        _ => serde_json::Map::new(),
    };
    base.remove("kinds");
    let json = SoakFile {
        base,
        kinds: outcome
            .reports
            .iter()
            .map(|(round, report)| RoundKind {
                round: *round,
                report,
            })
            .collect(),
        soak: &report,
    };
    let text = serde_json::to_string_pretty(&json)
        .map_err(|e| Failure::new(exit::UNAVAILABLE, format!("report: {e}")))?;
    write(&out.join("report.json"), &text)?;
    write(&out.join("soak.svg"), &chart(&report))?;
    println!(
        "\nreport: {}  soak chart: {}  timelines: {}/round-<n>/timeline-<kind>.svg",
        out.join("report.json").display(),
        out.join("soak.svg").display(),
        out.display()
    );
    if failed_kinds > 0 || !report.verdict_ok {
        if failed_kinds > 0 {
            eprintln!("dlock: torture: {failed_kinds} unexpected result(s)");
        }
        if !report.verdict_ok {
            eprintln!("dlock: torture: soak: {}", report.verdict);
        }
        return Ok(exit::TORTURE_FAILED);
    }
    Ok(exit::SUCCESS)
}

/// The holder, the rounds, and the holder's end.
async fn rounds(
    soak: Duration,
    leases: u64,
    mut config: Config,
    kinds: &[Kind],
    lock_server: &mut LockServer,
    resource_server: &RedisServer,
    out: &Path,
) -> Result<Outcome, Failure> {
    // The holder's server: never faulted, its own.
    let holder_server = start_server(None)?;
    let run = fencelock::Token::random()?.as_str()[..8].to_owned();
    let start = monotonic_ns();
    let end = start + ns(soak);
    // A bound on the holder's life should this process vanish without killing it: the
    // soak's end, plus the longest kind, plus room for starting and settling.
    let longest = kinds
        .iter()
        .map(|&k| plan(&config, k).1)
        .max()
        .unwrap_or_default();
    let until = end + ns(longest) + ns(Duration::from_secs(600));
    let every = (soak / 60).clamp(Duration::from_secs(1), Duration::from_secs(10));
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let args: Vec<String> = vec![
        "soak-holder".into(),
        "--url".into(),
        holder_server.url(),
        "--leases".into(),
        leases.to_string(),
        "--ttl".into(),
        humantime::format_duration(HOLDER_TTL).to_string(),
        "--run".into(),
        run.clone(),
        "--start-ns".into(),
        start.to_string(),
        "--until-ns".into(),
        until.to_string(),
        "--every".into(),
        humantime::format_duration(every).to_string(),
    ];
    let (mut child, reader) = spawn(&args, &[], move |line| {
        if let Ok(parsed) = serde_json::from_str::<HolderLine>(line) {
            // This process's figures at the moment the holder took its own.
            let _ = tx.send((parsed, proc_self()));
        }
    })?;
    let mut lines = Lines {
        rx,
        samples: Vec::new(),
        holder: HolderReport {
            wanted: leases,
            ..HolderReport::default()
        },
    };
    println!(
        "soak: {} round after round for {}; one client holds {leases} leases (ttl {}, \
         watchdog on) on {} (never faulted), sampled every {}",
        kinds.iter().map(|k| k.id()).collect::<Vec<_>>().join(","),
        humantime::format_duration(soak),
        humantime::format_duration(HOLDER_TTL),
        holder_server.url(),
        humantime::format_duration(every),
    );
    // The rounds start once the leases are held.
    let limit = monotonic_ns() + ns(HOLDER_PHASE_LIMIT);
    while lines.holder.acquired.is_none() {
        match tokio::time::timeout(Duration::from_millis(200), lines.rx.recv()).await {
            Ok(Some((line, me))) => lines.take(line, me),
            Ok(None) => break, // its stdout closed: it ended
            Err(_) => {}
        }
        if monotonic_ns() > limit || exited(&mut child).is_some() {
            break;
        }
    }
    lines.drain();
    let Some(acquired) = lines.holder.acquired else {
        let _ = child.start_kill();
        let status = child.wait().await.ok();
        return Err(Failure::new(
            exit::UNAVAILABLE,
            format!(
                "soak: the lease holder did not acquire its leases ({}){}",
                status.map_or_else(|| "did not end".to_owned(), |s| s.to_string()),
                lines
                    .holder
                    .first_error
                    .as_deref()
                    .map(|e| format!(": {e}"))
                    .unwrap_or_default()
            ),
        ));
    };
    println!(
        "soak: the client holds {acquired} of {leases} leases (acquired in {} ms)",
        lines.holder.acquire_ms.unwrap_or(0)
    );
    let mut reports: Vec<(usize, KindReport)> = Vec::new();
    let mut rounds = Vec::new();
    let mut holder_died = false;
    let first_seed = config.seed;
    for round in 1.. {
        if monotonic_ns() >= end {
            break;
        }
        config.seed = first_seed.wrapping_add(round as u64 - 1);
        let dir = out.join(format!("round-{round}"));
        std::fs::create_dir_all(&dir)
            .map_err(|e| Failure::usage(format!("cannot create {}: {e}", dir.display())))?;
        let left = Duration::from_nanos(end.saturating_sub(monotonic_ns()));
        println!(
            "\nsoak round {round} (seed {}), {} left",
            config.seed,
            humantime::format_duration(Duration::from_secs(left.as_secs()))
        );
        let mut r = Round {
            round,
            seed: config.seed,
            start_ms: ms(monotonic_ns() - start),
            end_ms: 0,
            kinds: Vec::new(),
            failed: Vec::new(),
            complete: true,
        };
        let mut round_reports = Vec::new();
        for &kind in kinds {
            if monotonic_ns() >= end {
                r.complete = false;
                break;
            }
            if let Some(status) = exited(&mut child) {
                eprintln!("dlock: soak: the lease holder ended early ({status}); stopping");
                holder_died = true;
                r.complete = false;
                break;
            }
            let got = run_kinds(
                &config,
                std::slice::from_ref(&kind),
                lock_server,
                resource_server,
                &dir,
            )
            .await?;
            for report in got {
                r.kinds.push(report.findings.kind.id());
                if !report.findings.verdict_ok {
                    r.failed.push(report.findings.kind.id());
                }
                round_reports.push(report);
            }
        }
        r.end_ms = ms(monotonic_ns() - start);
        if r.kinds.is_empty() {
            break;
        }
        if !round_reports.is_empty() {
            print_summary(&round_reports);
        }
        reports.extend(round_reports.into_iter().map(|report| (round, report)));
        lines.drain();
        if let Some(s) = lines.last_holding() {
            println!(
                "soak: after round {round} ({:.0} s): the client holds {}, lost {}, RSS {:.1} MiB, \
                 {} fds",
                s.t_ms as f64 / 1e3,
                s.held,
                s.lost,
                s.rss_kb as f64 / 1024.0,
                s.fds
            );
        }
        rounds.push(r);
        if holder_died {
            break;
        }
    }
    let ran_ms = ms(monotonic_ns() - start);
    // The rounds are over: the holder releases everything and ends.
    if !holder_died {
        if let Some(status) = exited(&mut child) {
            holder_died = true;
            eprintln!("dlock: soak: the lease holder ended before the rounds were over ({status})");
        } else if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
        }
    }
    let status = match tokio::time::timeout(HOLDER_PHASE_LIMIT, child.wait()).await {
        Ok(Ok(status)) => Some(status),
        _ => {
            eprintln!("dlock: soak: the lease holder did not end; killing it");
            let _ = child.start_kill();
            let _ = child.wait().await;
            None
        }
    };
    if let Some(reader) = reader {
        let _ = tokio::time::timeout(Duration::from_secs(5), reader).await;
    }
    lines.drain();
    lines.holder.exit_code = status.and_then(|s| s.code());
    lines.holder.died =
        holder_died || !status.is_some_and(|s| s.success()) || lines.holder.released.is_none();
    lines.holder.keys_left = keys_left(&holder_server, &run).await;
    Ok(Outcome {
        reports,
        rounds,
        samples: lines.samples,
        holder: lines.holder,
        every,
        ran_ms,
    })
}

/// Lock keys of the holder left on its server.
async fn keys_left(server: &RedisServer, run: &str) -> Option<u64> {
    let mut conn = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .ok()?;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("dlock:soak:{run}:*"))
        .query_async(&mut conn)
        .await
        .ok()?;
    Some(keys.len() as u64)
}

/// Least squares slope of `points` (minutes, KiB), in KiB per minute.
fn slope(points: &[(f64, f64)]) -> Option<f64> {
    if points.len() < 2 {
        return None;
    }
    let n = points.len() as f64;
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    if sxx <= 0.0 {
        return None;
    }
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    Some(sxy / sxx)
}

/// Slope of `value` over the second half (in time) of the holding samples.
fn second_half_slope(holding: &[&Sample], value: impl Fn(&Sample) -> u64) -> Option<f64> {
    let (first, last) = (holding.first()?, holding.last()?);
    let mid = first.t_ms + (last.t_ms - first.t_ms) / 2;
    let points: Vec<(f64, f64)> = holding
        .iter()
        .filter(|s| s.t_ms >= mid)
        .map(|s| (s.t_ms as f64 / 60_000.0, value(s) as f64))
        .collect();
    slope(&points)
}

fn soak_report(
    soak: Duration,
    leases: u64,
    every: Duration,
    ran_ms: u64,
    rounds: Vec<Round>,
    samples: Vec<Sample>,
    holder: HolderReport,
) -> SoakReport {
    let holding: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.phase == Phase::Holding)
        .collect();
    let lost = samples
        .iter()
        .map(|s| s.lost)
        .max()
        .unwrap_or(0)
        .max(holder.release_lost);
    let mut problems = Vec::new();
    if lost > 0 {
        problems.push(format!("{lost} lease(s) lost"));
    }
    match holder.acquired {
        Some(n) if n == leases => {}
        Some(n) => problems.push(format!(
            "the client acquired {n} of {leases} leases ({} errors{})",
            holder.acquire_errors,
            holder
                .first_error
                .as_deref()
                .map(|e| format!(", first: {e}"))
                .unwrap_or_default()
        )),
        None => problems.push("the client never reported its leases".to_owned()),
    }
    if let Some(short) = holding.iter().find(|s| s.held + s.lost < leases) {
        problems.push(format!(
            "the client held only {} at {} ms",
            short.held, short.t_ms
        ));
    }
    if holder.died {
        problems.push(format!(
            "the client died or did not end cleanly (exit {})",
            holder
                .exit_code
                .map_or_else(|| "by signal".to_owned(), |c| c.to_string())
        ));
    }
    match holder.released {
        Some(n) if n == holder.acquired.unwrap_or(0) => {}
        Some(n) => problems.push(format!(
            "the client released {n} of {} leases ({} lost, {} errors)",
            holder.acquired.unwrap_or(0),
            holder.release_lost,
            holder.release_errors
        )),
        None => problems.push("the client never released its leases".to_owned()),
    }
    match holder.keys_left {
        Some(0) => {}
        Some(n) => problems.push(format!("{n} lock key(s) left after the release")),
        None => problems.push("the client's server could not be checked for keys".to_owned()),
    }
    if holding.len() < 2 {
        problems.push(format!("only {} sample(s) while holding", holding.len()));
    }
    let verdict_ok = problems.is_empty();
    let verdict = if verdict_ok {
        format!(
            "ok: {leases} leases held by one client throughout, 0 lost, all released, no key left"
        )
    } else {
        format!("FAILED: {}", problems.join("; "))
    };
    SoakReport {
        duration_ms: u64::try_from(soak.as_millis()).unwrap_or(u64::MAX),
        ran_ms,
        leases,
        holder_ttl_ms: u64::try_from(HOLDER_TTL.as_millis()).unwrap_or(u64::MAX),
        sample_every_ms: u64::try_from(every.as_millis()).unwrap_or(u64::MAX),
        rounds,
        lost,
        rss_first_kb: holding.first().map(|s| s.rss_kb),
        rss_last_kb: holding.last().map(|s| s.rss_kb),
        rss_slope_kib_per_min: second_half_slope(&holding, |s| s.rss_kb),
        fds_first: holding.first().map(|s| s.fds),
        fds_last: holding.last().map(|s| s.fds),
        orchestrator_rss_first_kb: holding.first().map(|s| s.orchestrator_rss_kb),
        orchestrator_rss_last_kb: holding.last().map(|s| s.orchestrator_rss_kb),
        orchestrator_rss_slope_kib_per_min: second_half_slope(&holding, |s| s.orchestrator_rss_kb),
        holder,
        verdict_ok,
        verdict,
        samples,
    }
}

fn mib(kb: u64) -> String {
    format!("{:.1} MiB", kb as f64 / 1024.0)
}

fn opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

fn print_soak(r: &SoakReport) {
    println!(
        "\nsoak: {} asked, ran {:.0} s: {} round(s) ({} complete), {} kind runs; \
         one client holding {} leases, sampled every {} s",
        humantime::format_duration(Duration::from_millis(r.duration_ms)),
        r.ran_ms as f64 / 1e3,
        r.rounds.len(),
        r.rounds.iter().filter(|x| x.complete).count(),
        r.rounds.iter().map(|x| x.kinds.len()).sum::<usize>(),
        r.leases,
        r.sample_every_ms as f64 / 1e3
    );
    for round in &r.rounds {
        println!(
            "  round {:>3}  seed {:<6} {:>7.0} s → {:>7.0} s  {} kind(s){}  {}",
            round.round,
            round.seed,
            round.start_ms as f64 / 1e3,
            round.end_ms as f64 / 1e3,
            round.kinds.len(),
            if round.complete { "" } else { " (cut short)" },
            if round.failed.is_empty() {
                "all as expected".to_owned()
            } else {
                format!("FAILED: {}", round.failed.join(","))
            }
        );
    }
    println!(
        "\n{:>9} {:>8} {:>12} {:>10} {:>7} {:>5} {:>18} {:>17}",
        "time",
        "phase",
        "client RSS",
        "client fds",
        "held",
        "lost",
        "dlock-torture RSS",
        "dlock-torture fds"
    );
    let holding = r
        .samples
        .iter()
        .filter(|s| s.phase == Phase::Holding)
        .count();
    let step = holding.div_ceil(TABLE_ROWS).max(1);
    let mut i = 0;
    for s in &r.samples {
        if s.phase == Phase::Holding {
            i += 1;
            // The first and the last while holding, and every step-th between.
            if i != 1 && i != holding && (i - 1) % step != 0 {
                continue;
            }
        }
        println!(
            "{:>7.1} s {:>8} {:>12} {:>10} {:>7} {:>5} {:>18} {:>17}",
            s.t_ms as f64 / 1e3,
            match s.phase {
                Phase::Start => "start",
                Phase::Acquired => "acquired",
                Phase::Holding => "holding",
                Phase::Released => "released",
            },
            mib(s.rss_kb),
            s.fds,
            s.held,
            s.lost,
            mib(s.orchestrator_rss_kb),
            s.orchestrator_fds
        );
    }
    let slope_text =
        |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:+.1} KiB/min"));
    println!(
        "\nclient RSS {} → {} (slope over the second half {}), fds {} → {}; lost {}; \
         acquired {} in {} ms, released {} in {} ms ({} lost, {} errors); lock keys left {}",
        r.rss_first_kb.map_or_else(|| "-".to_owned(), mib),
        r.rss_last_kb.map_or_else(|| "-".to_owned(), mib),
        slope_text(r.rss_slope_kib_per_min),
        opt(r.fds_first),
        opt(r.fds_last),
        r.lost,
        opt(r.holder.acquired),
        opt(r.holder.acquire_ms),
        opt(r.holder.released),
        opt(r.holder.release_ms),
        r.holder.release_lost,
        r.holder.release_errors,
        opt(r.holder.keys_left)
    );
    println!(
        "dlock-torture RSS {} → {} (slope over the second half {}; it keeps every round's \
         history for the report)",
        r.orchestrator_rss_first_kb
            .map_or_else(|| "-".to_owned(), mib),
        r.orchestrator_rss_last_kb
            .map_or_else(|| "-".to_owned(), mib),
        slope_text(r.orchestrator_rss_slope_kib_per_min)
    );
    println!("soak: {}", r.verdict);
}

// ---------------------------------------------------------------------------------------
// soak.svg

const WIDTH: f64 = 1100.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 20.0;
const PANEL: f64 = 200.0;

/// One panel: lines of `series` (label, color, values) over the samples' times.
fn panel(
    s: &mut String,
    top: f64,
    title: &str,
    unit: &str,
    times: &[u64],
    series: &[(&str, &str, Vec<f64>)],
) {
    let t_max = times.iter().copied().max().unwrap_or(0).max(1) as f64;
    let y_max = series
        .iter()
        .flat_map(|(_, _, v)| v.iter().copied())
        .fold(0.0_f64, f64::max)
        .max(1.0)
        * 1.1;
    let x = |t: u64| LEFT + t as f64 / t_max * (WIDTH - LEFT - RIGHT);
    let y = |v: f64| top + PANEL - v / y_max * PANEL;
    let _ = write!(
        s,
        r#"<text x="8" y="{:.1}" font-weight="bold">{}</text>"#,
        top - 8.0,
        esc(title)
    );
    let _ = write!(
        s,
        r##"<rect x="{LEFT}" y="{top:.1}" width="{:.1}" height="{PANEL}" fill="none" stroke="#ccc"/>"##,
        WIDTH - LEFT - RIGHT
    );
    for i in 0..=4 {
        let v = y_max * f64::from(i) / 4.0;
        let _ = write!(
            s,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="end" fill="#555">{v:.0} {unit}</text><line x1="{LEFT}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#eee"/>"##,
            LEFT - 4.0,
            y(v) + 4.0,
            y(v),
            WIDTH - RIGHT,
            y(v)
        );
    }
    let mut legend_x = LEFT + 8.0;
    for (label, color, values) in series {
        let points: Vec<String> = times
            .iter()
            .zip(values)
            .map(|(&t, &v)| format!("{:.1},{:.1}", x(t), y(v)))
            .collect();
        let _ = write!(
            s,
            r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="1.5"/>"#,
            points.join(" ")
        );
        let _ = write!(
            s,
            r#"<text x="{legend_x:.1}" y="{:.1}" fill="{color}">━ {}</text>"#,
            top + 14.0,
            esc(label)
        );
        legend_x += 9.0 * label.len() as f64 + 30.0;
    }
}

/// The holder's and the orchestrator's RSS, and the holder's fds, over the run.
fn chart(r: &SoakReport) -> String {
    let holding: Vec<&Sample> = r
        .samples
        .iter()
        .filter(|s| s.phase == Phase::Holding)
        .collect();
    let times: Vec<u64> = holding.iter().map(|s| s.t_ms).collect();
    let height = 60.0 + 2.0 * (PANEL + 50.0) + 30.0;
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" font-family="sans-serif" font-size="11">"#
    );
    let _ = write!(s, r##"<rect width="100%" height="100%" fill="#fff"/>"##);
    let _ = write!(
        s,
        r#"<text x="8" y="18" font-size="14" font-weight="bold">soak: {}</text>"#,
        esc(&r.verdict)
    );
    let _ = write!(
        s,
        r#"<text x="8" y="36">{} leases on one client · lost {} · client RSS {} → {} (second half {}) · fds {} → {} · {} round(s)</text>"#,
        r.leases,
        r.lost,
        r.rss_first_kb.map_or_else(|| "-".to_owned(), mib),
        r.rss_last_kb.map_or_else(|| "-".to_owned(), mib),
        r.rss_slope_kib_per_min
            .map_or_else(|| "-".to_owned(), |v| format!("{v:+.1} KiB/min")),
        opt(r.fds_first),
        opt(r.fds_last),
        r.rounds.len()
    );
    let mb = |f: fn(&Sample) -> u64| -> Vec<f64> {
        holding.iter().map(|s| f(s) as f64 / 1024.0).collect()
    };
    panel(
        &mut s,
        80.0,
        "resident set (MiB)",
        "MiB",
        &times,
        &[
            ("client holding the leases", "#2a9d8f", mb(|s| s.rss_kb)),
            (
                "dlock-torture (orchestrator)",
                "#e76f51",
                mb(|s| s.orchestrator_rss_kb),
            ),
        ],
    );
    panel(
        &mut s,
        80.0 + PANEL + 50.0,
        "open file descriptors",
        "",
        &times,
        &[
            (
                "client holding the leases",
                "#2a9d8f",
                holding.iter().map(|s| s.fds as f64).collect(),
            ),
            (
                "dlock-torture (orchestrator)",
                "#e76f51",
                holding.iter().map(|s| s.orchestrator_fds as f64).collect(),
            ),
        ],
    );
    let t_max = times.last().copied().unwrap_or(0);
    let _ = write!(
        s,
        r#"<text x="8" y="{:.1}">time →  {:.0} s</text></svg>"#,
        height - 10.0,
        t_max as f64 / 1e3
    );
    s
}
