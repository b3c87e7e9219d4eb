//! The orchestrator: `dlock torture` from its arguments to its exit code — the servers of
//! each kind, its worker processes and proxies, the nemesis loop, the audit, the checkers
//! and the report.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use dlock_test::clock::{FakeClock, Interposer};
use dlock_test::postgres::PostgresServer;
use dlock_test::proxy::Proxy;
#[cfg(feature = "etcd")]
use dlock_test::server::EtcdCluster;
use dlock_test::server::{MemcachedServer, RedisServer};
use fencelock::Lock;
use fencelock::backend::Memory;

use crate::args::TortureArgs;
use crate::checkers::{self, Resources};
use crate::exit::{self, Failure};
use crate::failover::{Cluster, Sentinel};
use crate::model::{
    Config, ETCD_MEMBERS, Fault, FaultWindow, Given, Kind, REDLOCK_NODES, ResourceKeys, Rng,
    ZOOKEEPER_MEMBERS, monotonic_ns,
};
use crate::nemesis::{Nemesis, Undo, pick, plan, schedule};
use crate::report::{KindReport, Report, print_summary, write};
use crate::stores::{LockServer, Store, start_server, start_zookeeper, store_err};
use crate::timelines;
use crate::worker::Step;
use crate::workers::Spawner;

/// A run's checked arguments and started servers, shared by one run ([`once`]) and a
/// soak (`soak::soak`).
pub(crate) struct Setup {
    pub(crate) config: Config,
    pub(crate) kinds: Vec<Kind>,
    pub(crate) lock_server: LockServer,
    pub(crate) resource_server: RedisServer,
    pub(crate) signals: crate::signals::Signals,
}

/// Checks `args`, finds the clocks, starts the lock server (unless `--url` names one) and
/// the resource server, and installs the signal handlers.
pub(crate) async fn setup(args: &TortureArgs) -> Result<Setup, Failure> {
    let url = args.url.as_deref().filter(|u| !u.is_empty());
    let given = url.map(Given::of);
    let all_kinds = args.kinds.trim() == "all";
    let mut kinds: Vec<Kind> = if all_kinds {
        Kind::ALL.to_vec()
    } else {
        args.kinds
            .split(',')
            .map(|k| Kind::parse(k.trim()))
            .collect::<Result<_, _>>()?
    };
    if given == Some(Given::Postgres) {
        if all_kinds {
            // The user's PostgreSQL is what this run is about.
            kinds = vec![Kind::PostgresFenced];
        } else if let Some(k) = kinds
            .iter()
            .find(|&&k| !k.owns_servers() && k != Kind::Memory)
        {
            return Err(Failure::usage(format!(
                "the {} kind needs a Redis lock server, and --url names a PostgreSQL one \
                 (on which the postgres-fenced kind runs); run it without --url, or with a \
                 redis:// one",
                k.id()
            )));
        }
    }
    if let Some(url) = url
        && given == Some(Given::Redis)
        && (url.starts_with("redis+sentinel://") || url.starts_with("redis+cluster://"))
        && kinds.iter().any(|&k| Given::Redis.runs(k))
    {
        // The nemesis and the audit reach the one server a URL names; the topologies have
        // kinds of their own.
        return Err(Failure::usage(format!(
            "--url {}: the single-Redis kinds need one server's redis:// (or rediss://, \
             unix://) URL; Sentinel and Cluster are tortured by the sentinel-fenced, \
             sentinel-wait-fenced and cluster-fenced kinds, on servers of their own",
            exit::redact(url)
        )));
    }
    let faults = Fault::parse_list(&args.faults)?;
    if args.workers < 2 {
        return Err(Failure::usage("--workers must be at least 2"));
    }
    if args.ttl < fencelock::MIN_TTL {
        return Err(Failure::usage(format!(
            "--ttl must be at least {:?}",
            fencelock::MIN_TTL
        )));
    }
    let mut not_on_given = Vec::new();
    if let Some(url) = url {
        not_on_given.extend(faults.iter().copied().filter(|f| f.needs_own_server()));
        if !not_on_given.is_empty() {
            let own = match given {
                Some(Given::Postgres) => "",
                _ => {
                    " (the redlock, sentinel, cluster, memcached-fenced, \
                     memcached-family-fenced, etcd-fenced, etcd-family-fenced, \
                     postgres-fenced and zookeeper-fenced kinds run on servers of their own)"
                }
            };
            eprintln!(
                "dlock: freeze, restart and the server clock faults need a server dlock \
                 owns; skipped for {}{own}",
                exit::redact(url)
            );
        }
        if args.faults.trim() == "all" {
            // They act on every client of a server we do not own: only when named.
            not_on_given.extend([Fault::ClientPause, Fault::ScriptFlush]);
        }
    }
    let mut config = Config {
        workers: args.workers,
        ttl: args.ttl,
        seed: args.seed,
        faults,
        faults_named: args.faults.trim() != "all",
        given,
        not_on_given,
        all_kinds,
        quick: args.quick,
        duration: args.duration,
        store_clock: None,
        client_clock: None,
    };
    // A clock fault that cannot run here fails the run where it was asked for: named in
    // --faults, or in the CI profile (--quick with the kinds named; not from $CI, which
    // every CI service sets for its users' own runs too).
    let strict = args.faults.trim() != "all" || (args.quick && !all_kinds);
    clocks(&mut config, &kinds, strict)?;
    required_faults(&config, &mut kinds)?;
    let lock_server = match url {
        Some(url) if given == Some(Given::Postgres) => LockServer::Postgres(url.to_owned()),
        Some(url) => LockServer::Given(url.to_owned()),
        None => LockServer::Own(start_server(config.store_clock.as_ref())?),
    };
    // The protected resources live apart from the lock server, which the nemesis faults.
    let resource_server = start_server(None)?;
    std::fs::create_dir_all(&args.out)
        .map_err(|e| Failure::usage(format!("cannot create {}: {e}", args.out.display())))?;
    println!(
        "dlock torture: seed {}, {} workers, ttl {}, lock server {}, resources on {}",
        config.seed,
        config.workers,
        humantime::format_duration(config.ttl),
        exit::redact(&lock_server.url()),
        resource_server.url()
    );
    // A signal ends the run cleanly: dropping the run's future kills its workers
    // (kill_on_drop, SIGKILL works on stopped ones too) and returning drops both servers
    // (a frozen one is continued first), so nothing is left behind.
    let signals = crate::signals::Signals::install()?;
    Ok(Setup {
        config,
        kinds,
        lock_server,
        resource_server,
        signals,
    })
}

/// Checks that every kind that exists to be run under a fault
/// ([`Kind::required_faults`]) gets one of them: a kind named in `--kinds` without it is
/// a usage error, one that `--kinds all` brought is skipped with a note. A kind to which
/// none of the faults `--faults` names applies is skipped with a note saying so (rather
/// than run without a fault, as if it had passed under them); a run left with no kind at
/// all is a usage error.
fn required_faults(config: &Config, kinds: &mut Vec<Kind>) -> Result<(), Failure> {
    let mut failure = None;
    let named: Vec<&str> = config.faults.iter().map(|f| f.id()).collect();
    let asked = kinds.len();
    kinds.retain(|&kind| {
        let planned = plan(config, kind).0;
        let required = kind.required_faults();
        if required.iter().any(|f| planned.contains(f)) {
            return true;
        }
        if required.is_empty() {
            if config.faults_named && !config.faults.is_empty() && planned.is_empty() {
                println!(
                    "  {:<16} skipped: none of the faults named ({}) applies to it",
                    kind.id(),
                    named.join(", ")
                );
                return false;
            }
            return true;
        }
        let why = format!(
            "the {} kind is run under the {} fault, which --faults leaves out: without it \
             the run would prove nothing",
            kind.id(),
            kind.required_words()
        );
        if config.all_kinds {
            println!("  {:<16} skipped: {why}", kind.id());
        } else if failure.is_none() {
            failure = Some(Failure::usage(why));
        }
        false
    });
    if let Some(failure) = failure {
        return Err(failure);
    }
    if kinds.is_empty() && asked > 0 {
        return Err(Failure::usage(format!(
            "nothing to run: every kind of --kinds was skipped (see above) under the faults \
             named ({})",
            named.join(", ")
        )));
    }
    Ok(())
}

/// One run of every kind: the summary, `report.json` and the timelines in `out`; exit 1
/// on any unexpected result.
pub(crate) async fn once(setup: Setup, out: &Path) -> Result<u8, Failure> {
    let Setup {
        config,
        kinds,
        mut lock_server,
        resource_server,
        mut signals,
    } = setup;
    let reports = tokio::select! {
        reports = run_kinds(&config, &kinds, &mut lock_server, &resource_server, out) => reports?,
        sig = signals.recv() => {
            eprintln!("dlock: torture interrupted ({sig}); cleaning up");
            return Ok(128 + sig as u8);
        }
    };
    print_summary(&reports);
    let json = serde_json::to_string_pretty(&Report {
        seed: config.seed,
        ttl_ms: u64::try_from(config.ttl.as_millis()).unwrap_or(u64::MAX),
        workers: config.workers,
        duration_ms: u64::try_from(config.duration.as_millis()).unwrap_or(u64::MAX),
        lock_server: &exit::redact(&lock_server.url()),
        kinds: &reports,
    })
    .map_err(|e| Failure::new(exit::UNAVAILABLE, format!("report: {e}")))?;
    write(&out.join("report.json"), &json)?;
    println!(
        "\nreport: {}  timelines: {}/timeline-<kind>.svg",
        out.join("report.json").display(),
        out.display()
    );
    let failed = reports.iter().filter(|r| !r.findings.verdict_ok).count();
    if failed > 0 {
        eprintln!("dlock: torture: {failed} unexpected result(s)");
        return Ok(exit::TORTURE_FAILED);
    }
    Ok(exit::SUCCESS)
}

/// The fake clocks of the lock servers and of the workers, for the clock faults some kind
/// of this run has planned, when they can run here (libfaketime installed; for
/// redis-server, the kit's shim built with the C compiler). A clock fault that cannot run
/// is dropped from the run with a note, unless `strict` (the run asked for it: named in
/// `--faults`, or in the CI profile): then the run fails at once, saying why, rather than
/// pass without it.
fn clocks(config: &mut Config, kinds: &[Kind], strict: bool) -> Result<(), Failure> {
    let due = |config: &Config, f: fn(Fault) -> bool| -> Vec<Fault> {
        let mut due: Vec<Fault> = Vec::new();
        for &kind in kinds {
            for fault in plan(config, kind).0 {
                if f(fault) && !due.contains(&fault) {
                    due.push(fault);
                }
            }
        }
        due
    };
    let unavailable = |config: &mut Config, due: &[Fault], e: std::io::Error| {
        let names = due.iter().map(|f| f.id()).collect::<Vec<_>>().join(", ");
        if strict {
            return Err(Failure::new(
                exit::UNAVAILABLE,
                format!(
                    "torture: the clock fault(s) {names} cannot be injected here: {e}; install \
                     faketime (libfaketime) and a C compiler, or leave them out of --faults"
                ),
            ));
        }
        eprintln!("dlock: torture: the clock fault(s) {names} are skipped: {e}");
        config.faults.retain(|f| !due.contains(f));
        Ok(())
    };
    let store = due(config, Fault::moves_store_clock);
    if !store.is_empty() {
        // redis-server (a lock server of the run's own, under the single-Redis kinds)
        // runs under the kit's shim; memcached and PostgreSQL under libfaketime.
        let moved = |kind: Kind| plan(config, kind).0.iter().any(|f| f.moves_store_clock());
        let shim = kinds.iter().any(|&k| !k.owns_servers() && moved(k));
        let libfaketime = kinds.iter().any(|&k| k.owns_servers() && moved(k));
        let found = FakeClock::wall().and_then(|clock| {
            if shim {
                dlock_test::clock::shim()?;
            }
            if libfaketime {
                dlock_test::clock::libfaketime()?;
            }
            Ok(clock)
        });
        match found {
            Ok(clock) => config.store_clock = Some(clock),
            Err(e) => unavailable(config, &store, e)?,
        }
    }
    let client = due(config, |f| f == Fault::ClientClock);
    if !client.is_empty() {
        match FakeClock::wall().and_then(|clock| dlock_test::clock::libfaketime().map(|_| clock)) {
            Ok(clock) => config.client_clock = Some(clock),
            Err(e) => unavailable(config, &client, e)?,
        }
    }
    Ok(())
}

/// Runs every kind in turn, writing each one's timeline to `out`.
pub(crate) async fn run_kinds(
    config: &Config,
    kinds: &[Kind],
    lock_server: &mut LockServer,
    resource_server: &RedisServer,
    out: &Path,
) -> Result<Vec<KindReport>, Failure> {
    let mut reports = Vec::new();
    for &kind in kinds {
        let (kind_faults, duration) = plan(config, kind);
        // A kind's own servers run under the store clock when its clock faults are due.
        let kind_clock = config
            .store_clock
            .clone()
            .filter(|_| kind_faults.iter().any(|f| f.moves_store_clock()));
        let faults = kind_faults
            .iter()
            .map(|f| f.id())
            .collect::<Vec<_>>()
            .join(",");
        let own = match kind {
            Kind::Redlock => format!("  ({REDLOCK_NODES} redis-servers of its own)"),
            Kind::RedlockImmediateRestart | Kind::RedlockDelayedRestart => format!(
                "  ({REDLOCK_NODES} redis-servers of its own; even workers reach nodes 0, 1, 2, odd ones 2, 3, 4; node 2 restarts {} on a grant)",
                if kind == Kind::RedlockDelayedRestart {
                    "after 2 × ttl"
                } else {
                    "at once"
                }
            ),
            Kind::SentinelFenced => {
                "  (master + replica + 3 sentinels of its own; failover before replication)"
                    .to_owned()
            }
            Kind::SentinelWaitFenced => {
                "  (master + replica + 3 sentinels of its own, min_replicas 1; failover before replication)"
                    .to_owned()
            }
            Kind::ClusterFenced => {
                "  (a 3-master cluster with a replica each; the lock slot's master fails over)"
                    .to_owned()
            }
            Kind::MemcachedFenced => format!(
                "  (a memcached of its own, ttl {})",
                humantime::format_duration(kind.ttl(config.ttl))
            ),
            Kind::MemcachedFamilyFenced => format!(
                "  (a read-write lock on a memcached of its own, ttl {})",
                humantime::format_duration(kind.ttl(config.ttl))
            ),
            Kind::PostgresFenced if config.on_given(kind) => format!(
                "  (on {}: not restarted, frozen or its clock moved, as dlock does not own it)",
                exit::redact(&lock_server.url())
            ),
            Kind::PostgresFenced => {
                "  (a PostgreSQL of its own; restarts keep its data)".to_owned()
            }
            Kind::EtcdFenced => format!(
                "  (an etcd cluster of {ETCD_MEMBERS} of its own, ttl {})",
                humantime::format_duration(kind.ttl(config.ttl))
            ),
            Kind::EtcdFamilyFenced => format!(
                "  (a read-write lock on an etcd cluster of {ETCD_MEMBERS} of its own, ttl {})",
                humantime::format_duration(kind.ttl(config.ttl))
            ),
            Kind::ZookeeperFenced => format!(
                "  (a ZooKeeper ensemble of {ZOOKEEPER_MEMBERS} of its own, ttl = session timeout {})",
                humantime::format_duration(kind.ttl(config.ttl))
            ),
            Kind::RunSupervised | Kind::RunSupervisedZookeeper | Kind::RunUnsupervised => {
                let dlock = crate::command::dlock_binary();
                let Some(dlock) = own_servers(config, kind, dlock, "the dlock command")? else {
                    continue;
                };
                let ttl = humantime::format_duration(kind.ttl(config.ttl));
                let how = match kind {
                    Kind::RunUnsupervised => {
                        format!("dlock acquire --ttl {ttl}, the command, dlock release")
                    }
                    Kind::RunSupervisedZookeeper => format!(
                        "dlock run --ttl {ttl} on a ZooKeeper ensemble of {ZOOKEEPER_MEMBERS} of its own, session timeout {ttl}: a lease of 2/3 of it"
                    ),
                    _ => format!("dlock run --ttl {ttl}"),
                };
                format!(
                    "  ({how}; {}; the command ignores SIGTERM and leaves a writer behind)",
                    dlock.display()
                )
            }
            _ => String::new(),
        };
        let line = format!(
            "  {:<16} {:>5.1} s  faults: {faults}{own}",
            kind.id(),
            duration.as_secs_f64(),
        );
        let report = match kind {
            Kind::Memory => {
                println!("{line}");
                run_memory(config, &kind_faults, duration)?
            }
            Kind::Redlock | Kind::RedlockImmediateRestart | Kind::RedlockDelayedRestart => {
                println!("{line}");
                let nodes = (0..REDLOCK_NODES)
                    .map(|_| start_server(None))
                    .collect::<Result<Vec<_>, _>>()?;
                let store = Store::quorum(nodes).await?;
                run_workers(config, kind, &kind_faults, duration, store, resource_server).await?
            }
            Kind::SentinelFenced | Kind::SentinelWaitFenced => {
                let started = blocking(Sentinel::start).await?;
                let Some(sentinel) = own_servers(config, kind, started, "its sentinels to start")?
                else {
                    continue;
                };
                println!("{line}");
                let store = Store::Sentinel(sentinel);
                run_workers(config, kind, &kind_faults, duration, store, resource_server).await?
            }
            Kind::ClusterFenced => {
                let started = blocking(Cluster::start).await?;
                let needs = "redis-cli to create its cluster";
                let Some(cluster) = own_servers(config, kind, started, needs)? else {
                    continue;
                };
                println!("{line}");
                let store = Store::Cluster(cluster);
                run_workers(config, kind, &kind_faults, duration, store, resource_server).await?
            }
            Kind::MemcachedFenced | Kind::MemcachedFamilyFenced => {
                let started = match &kind_clock {
                    Some(clock) => MemcachedServer::start_with_clock(clock, &[]),
                    None => MemcachedServer::start(),
                };
                let Some(server) = own_servers(config, kind, started, "memcached on PATH")? else {
                    continue;
                };
                println!("{line}");
                let store = Store::Memcached(server);
                run_workers(config, kind, &kind_faults, duration, store, resource_server).await?
            }
            // Named by `--kinds`, it was refused with the same reason (`Kind::parse`).
            #[cfg(not(feature = "etcd"))]
            Kind::EtcdFenced | Kind::EtcdFamilyFenced => {
                println!("  {:<16} skipped: {}", kind.id(), crate::model::NO_ETCD);
                continue;
            }
            #[cfg(feature = "etcd")]
            Kind::EtcdFenced | Kind::EtcdFamilyFenced => {
                let started = EtcdCluster::start(ETCD_MEMBERS);
                let Some(cluster) = own_servers(config, kind, started, "etcd on PATH")? else {
                    continue;
                };
                println!("{line}");
                let store = Store::etcd(cluster).await?;
                run_workers(config, kind, &kind_faults, duration, store, resource_server).await?
            }
            Kind::ZookeeperFenced | Kind::RunSupervisedZookeeper => {
                let started = start_zookeeper(kind_clock.clone()).await;
                let needs = "ZooKeeper installed (java on PATH and Debian's zookeeper \
                             package, or $DLOCK_ZOOKEEPER_JAR)";
                let Some(ensemble) = own_servers(config, kind, started, needs)? else {
                    continue;
                };
                println!("{line}");
                let store = Store::ZooKeeper {
                    ensemble,
                    session_timeout: kind.ttl(config.ttl),
                };
                run_workers(config, kind, &kind_faults, duration, store, resource_server).await?
            }
            // On the PostgreSQL `--url` names.
            Kind::PostgresFenced if config.on_given(kind) => {
                println!("{line}");
                let store = Store::postgres(None, Some(&lock_server.url())).await?;
                run_workers(config, kind, &kind_faults, duration, store, resource_server).await?
            }
            Kind::PostgresFenced => {
                let started = match &kind_clock {
                    Some(clock) => PostgresServer::start_with_clock(clock),
                    None => PostgresServer::start(),
                };
                let Some(server) = own_servers(config, kind, started, "PostgreSQL installed")?
                else {
                    continue;
                };
                println!("{line}");
                let store = Store::postgres(Some(server), None).await?;
                run_workers(config, kind, &kind_faults, duration, store, resource_server).await?
            }
            _ => {
                if let LockServer::Postgres(_) = lock_server {
                    return Err(Failure::usage(format!(
                        "the {} kind needs a Redis lock server, and --url names a PostgreSQL one",
                        kind.id()
                    )));
                }
                println!("{line}");
                let store = Store::redis(lock_server).await?;
                run_workers(config, kind, &kind_faults, duration, store, resource_server).await?
            }
        };
        let svg = timelines::timeline(&report, config.workers);
        write(&out.join(format!("timeline-{}.svg", kind.id())), &svg)?;
        reports.push(report);
    }
    Ok(reports)
}

/// Each of `faults` once, in order.
fn distinct(faults: impl Iterator<Item = Fault>) -> Vec<Fault> {
    let mut seen = Vec::new();
    for f in faults {
        if !seen.contains(&f) {
            seen.push(f);
        }
    }
    seen
}

/// The next fault of `plan` to inject at `now`, taken out of it with how often it could
/// not be injected before: of those whose time has come, the first that has not taken
/// effect yet in this run (`windows`), else the first. So a fault whose turn slipped
/// (the nemesis starts none while another's window is open) goes before a repeat.
fn next_due(
    plan: &mut Vec<(u64, Fault, usize)>,
    now: u64,
    windows: &[FaultWindow],
) -> Option<(Fault, usize)> {
    let fresh = |f: Fault| !windows.iter().any(|w| f.took_effect_as(w.fault));
    let due = |i: &usize| plan[*i].0 <= now;
    let mut order: Vec<usize> = (0..plan.len()).collect();
    order.sort_by_key(|&i| plan[i].0);
    let i = order
        .iter()
        .copied()
        .filter(due)
        .find(|&i| fresh(plan[i].1))
        .or_else(|| order.iter().copied().find(due))?;
    let (_, fault, tries) = plan.remove(i);
    Some((fault, tries))
}

/// A fault that could not be injected now (no worker to aim it at, a replica not in
/// sync, a server that did not answer) is tried again half a ttl later while the run
/// lasts: one that never takes effect fails the kind (see the verdict), so it must not be
/// dropped quietly. Said on stderr the first time, and when the run ends first.
fn again(
    plan: &mut Vec<(u64, Fault, usize)>,
    fault: Fault,
    tries: usize,
    now: u64,
    ttl_ns: u64,
    until: u64,
    why: &str,
) {
    let at = now + ttl_ns / 2;
    if at < until {
        if tries == 0 {
            eprintln!(
                "dlock: torture: fault {} could not be injected now{why}; trying again",
                fault.id()
            );
        }
        plan.push((at, fault, tries + 1));
    } else {
        eprintln!(
            "dlock: torture: fault {} could not be injected{why} before the run's end",
            fault.id()
        );
    }
}

/// A kind's own servers as they started: `Some` to run on; `None` when `--kinds all`
/// skips a kind whose servers are not installed here (said on stdout: a user's `dlock
/// torture` need not have every store); otherwise a failure naming what the kind `needs`.
fn own_servers<T>(
    config: &Config,
    kind: Kind,
    started: Result<T, impl std::fmt::Display>,
    needs: &str,
) -> Result<Option<T>, Failure> {
    match started {
        Ok(servers) => Ok(Some(servers)),
        Err(e) if config.all_kinds => {
            println!("  {:<16} skipped: {e}", kind.id());
            Ok(None)
        }
        Err(e) => Err(Failure::new(
            exit::UNAVAILABLE,
            format!("the {} kind needs {needs}: {e}", kind.id()),
        )),
    }
}

/// Runs a blocking start-up (the kit's topologies wait for their servers) off the runtime.
async fn blocking<T: Send + 'static>(start: fn() -> T) -> Result<T, Failure> {
    tokio::task::spawn_blocking(start)
        .await
        .map_err(|e| Failure::new(exit::UNAVAILABLE, format!("starting servers: {e}")))
}

/// One kind's run with worker processes: against `store`, which it owns for the run (a
/// kind's own servers die with it), the resources on `resources`.
pub(crate) async fn run_workers(
    config: &Config,
    kind: Kind,
    faults: &[Fault],
    duration: Duration,
    store: Store<'_>,
    resources: &RedisServer,
) -> Result<KindReport, Failure> {
    let run_id = fencelock::Token::random()?.as_str()[..8].to_owned();
    let keys = ResourceKeys::parse(&format!("torture:{run_id}:{}", kind.id()));
    let ttl = kind.ttl(config.ttl);
    let mut res = resources
        .client()
        .get_multiplexed_async_connection()
        .await
        .map_err(store_err)?;
    let _: () = redis::pipe()
        .set(&keys.counter, 0)
        .set(&keys.fenced, 0)
        .del(&keys.highest)
        .del(&keys.log)
        .query_async(&mut res)
        .await
        .map_err(store_err)?;
    // Each worker slot reaches each lock server through its own proxy.
    let mut proxies = Vec::new();
    let mut urls = Vec::new();
    let targets = store.upstreams();
    // No proxy can stand in for a server given by a unix socket, several hosts or TLS:
    // the faults on a worker's links cannot be injected there.
    let mut faults = faults.to_vec();
    let network = [Fault::Delay, Fault::Blackhole, Fault::Close];
    if targets.is_empty() && faults.iter().any(|f| network.contains(f)) {
        faults.retain(|f| !network.contains(f));
        eprintln!(
            "dlock: torture: {}: the workers reach the server without a proxy (a unix \
             socket, several hosts or TLS): delay, blackhole and close skipped",
            kind.id()
        );
    }
    let faults = faults.as_slice();
    for _ in 0..config.workers {
        let mut links = Vec::with_capacity(targets.len());
        for &addr in &targets {
            links.push(
                Proxy::start(addr)
                    .await
                    .map_err(|e| Failure::new(exit::UNAVAILABLE, format!("proxy: {e}")))?,
            );
        }
        urls.push(store.worker_url(&links));
        proxies.push(links);
    }
    let start = monotonic_ns();
    let until = start + u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(usize, Step)>();
    // Workers of a kind whose wall clock jumps run under the fake clock (libfaketime: the
    // worker is a plain glibc program).
    let client_clock = config
        .client_clock
        .clone()
        .filter(|_| faults.contains(&Fault::ClientClock));
    let worker_env = match &client_clock {
        Some(clock) => clock
            .env(Interposer::Libfaketime)
            .map_err(|e| Failure::new(exit::UNAVAILABLE, format!("the client clock: {e}")))?,
        None => Vec::new(),
    };
    // The command kinds' resource: a file the commands append to (see `command`).
    let commands = if kind.runs_commands() {
        let dlock = crate::command::dlock_binary().map_err(|e| {
            Failure::new(
                exit::UNAVAILABLE,
                format!("the {} kind needs {e}", kind.id()),
            )
        })?;
        let helper = std::env::current_exe().map_err(|e| {
            Failure::new(
                exit::CANNOT_EXECUTE,
                format!("cannot find dlock-torture itself: {e}"),
            )
        })?;
        Some(crate::command::Workers {
            dlock,
            helper,
            resource: std::env::temp_dir()
                .join(format!("dlock-torture-{run_id}-{}.writes", kind.id())),
            name: keys.lock.clone(),
            ttl,
        })
    } else {
        None
    };
    let resource_file = commands.as_ref().map(|c| c.resource.clone());
    let spawner = Spawner {
        kind,
        urls,
        resource_url: resources.url(),
        keys_base: keys.base.clone(),
        ttl_ms: u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
        until,
        tx,
        // They say how far their wall clock is off, so that the report shows the jump
        // reached them.
        report_wall_clock: client_clock.is_some(),
        env: worker_env,
        commands,
    };
    let running = (0..config.workers)
        .map(|i| spawner.spawn(i, i))
        .collect::<Result<Vec<_>, _>>()?;
    let mut n = Nemesis {
        store,
        proxies,
        spawner,
        running,
        windows: Vec::new(),
        undo: Vec::new(),
        kills: Vec::new(),
        resume: None,
        ttl,
        node_rng: Rng(config.seed ^ 0x6e6f_6465 ^ (kind as u64).wrapping_mul(0x9e37_79b9)),
        node_restarts: 0,
        store_clock: config
            .store_clock
            .clone()
            .filter(|_| faults.iter().any(|f| f.moves_store_clock())),
        client_clock,
        client_jumps: 0,
    };
    // (when, the fault, how many times it could not be injected so far)
    let mut plan: Vec<(u64, Fault, usize)> = schedule(config, kind, faults, duration)
        .into_iter()
        .map(|(at, f)| (start + u64::try_from(at.as_nanos()).unwrap_or(0), f, 0))
        .collect();
    let scheduled = distinct(plan.iter().map(|p| p.1));
    let mut history: Vec<(usize, Step)> = Vec::new();
    let mut rng = Rng(config.seed.wrapping_add(7));
    let ttl_ns = n.ttl_ns();
    // Pause waits for the next worker to report a read (so it lands between a holder's
    // read and its write) and kill for the next acquire (a holder is what they are meant
    // to hit); either falls back to any worker at a deadline.
    let mut armed: Option<(Fault, u64, usize)> = None;
    let mut partition_due = kind.holds_long().then(|| start + 3_000_000_000);
    let mut started = std::collections::HashSet::new();
    let mut worker_failures = 0;
    let hard_stop = until + 3 * ttl_ns + 5_000_000_000;
    loop {
        let now = monotonic_ns();
        // A fault due while another is under way waits for it (woken by its end).
        let free = armed.is_none() && n.undo.is_empty() && n.resume.is_none() && now < until;
        let next_fault = plan.iter().map(|p| p.0).min().filter(|_| free);
        let next_undo = n
            .undo
            .iter()
            .map(|(t, _, _)| *t)
            .chain(n.resume.map(|r| r.0))
            .min();
        let wake = [
            next_fault,
            next_undo,
            armed.map(|a| a.1),
            Some(now + 50_000_000),
        ]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(now);
        tokio::select! {
            got = rx.recv() => {
                let Some((id, step)) = got else { break };
                // get-del's bug sits between its release's GET and DEL, the others' between
                // a holder's read and its write.
                // A kill, a failover's second step and the RedLock bridge's restart hit
                // a holder just granted.
                let trigger = match (&step, kind) {
                    // A command kind's faults land at a grant (its command's first write),
                    // so that they meet the command's whole run.
                    (Step::Acquired { .. }, k) if k.runs_commands() => armed
                        .map(|(f, _, _)| f)
                        .filter(|f| matches!(f, Fault::Pause | Fault::Blackhole)),
                    (Step::Acquired { .. }, _) => {
                        Some(armed.map_or(Fault::Kill, |(f, _, _)| f)).filter(|f| {
                            matches!(f, Fault::Kill | Fault::Failover | Fault::Restart)
                        })
                    }
                    (Step::Releasing { .. }, Kind::GetDel) => Some(Fault::Pause),
                    (Step::Read { .. }, k) if k != Kind::GetDel => Some(Fault::Pause),
                    _ => None,
                };
                if partition_due.is_some() {
                    started.insert(id);
                }
                if let Some(r) = n.running.iter_mut().find(|r| r.id == id) {
                    match step {
                        Step::Acquired { .. } => r.holding = true,
                        Step::Releasing { .. } => r.holding = false,
                        _ => {}
                    }
                }
                let resume_now = matches!(step, Step::Acquired { .. })
                    && matches!(n.resume, Some((_, Undo::Continue(paused, _), _)) if paused != id);
                history.push((id, step));
                if resume_now {
                    n.resume(monotonic_ns(), true);
                }
                if let Some((fault, _, tries)) = armed
                    && trigger == Some(fault)
                {
                    armed = None;
                    let victim = n.running.iter().position(|r| r.id == id && r.alive);
                    if !n.inject(fault, victim).await? {
                        again(&mut plan, fault, tries, monotonic_ns(), ttl_ns, until, "");
                    }
                }
            }
            () = tokio::time::sleep(Duration::from_nanos(wake.saturating_sub(now))) => {}
        }
        let now = monotonic_ns();
        // The RedLock restart kinds cut the halves apart once every first worker has
        // connected to all five nodes (or after a few seconds).
        if let Some(due) = partition_due
            && (started.len() >= config.workers || now >= due)
        {
            partition_due = None;
            n.partition();
        }
        n.heal(now, false);
        n.resume(now, false);
        if let Some((fault, deadline, tries)) = armed
            && deadline <= now
        {
            armed = None;
            let victim = pick(&n.running, &mut rng);
            if !n.inject(fault, victim).await? {
                again(&mut plan, fault, tries, monotonic_ns(), ttl_ns, until, "");
            }
        }
        if now < until
            && armed.is_none()
            && n.undo.is_empty()
            && n.resume.is_none()
            && let Some((fault, tries)) = next_due(&mut plan, now, &n.windows)
        {
            if matches!(fault, Fault::Pause | Fault::Kill)
                || (fault == Fault::Restart && kind.holds_long())
                || (fault == Fault::Blackhole && kind.runs_commands())
            {
                // A command kind's grants come a hold (a lease and a half) apart.
                let wait = if kind.runs_commands() { 3 } else { 2 };
                armed = Some((fault, now + wait * ttl_ns, tries));
            } else if fault == Fault::Failover {
                // Freeze the replica now; the master dies at the next grant.
                if n.prepare_failover() {
                    armed = Some((fault, now + 2 * ttl_ns, tries));
                } else {
                    let why = " (the replica not in sync)";
                    again(&mut plan, fault, tries, now, ttl_ns, until, why);
                }
            } else {
                let victim = pick(&n.running, &mut rng);
                if !n.inject(fault, victim).await? {
                    again(&mut plan, fault, tries, monotonic_ns(), ttl_ns, until, "");
                }
            }
        }
        let mut ended = Vec::new();
        for r in n.running.iter_mut().filter(|r| r.alive) {
            if let Ok(Some(status)) = r.child.try_wait() {
                r.alive = false;
                r.holding = false;
                if !kind.runs_commands() && !status.success() {
                    eprintln!(
                        "dlock: torture: {}: worker {} ended with {status}",
                        kind.id(),
                        r.id
                    );
                    worker_failures += 1;
                } else if kind.runs_commands() && !crate::command::exit_ok(status) {
                    eprintln!(
                        "dlock: torture: {}: worker {} (a dlock process) ended with {status}",
                        kind.id(),
                        r.id
                    );
                    worker_failures += 1;
                }
                ended.push(r.slot);
            }
        }
        // A command kind's worker is one `dlock` process, one grant at most: the next one
        // in its slot (through the same links) asks for the lock while the run lasts.
        if kind.runs_commands() {
            for slot in ended {
                if monotonic_ns() < until {
                    let next = n.running.iter().map(|r| r.id).max().unwrap_or(0) + 1;
                    let replacement = n.spawner.spawn(next, slot)?;
                    n.running.push(replacement);
                }
            }
        }
        let now = monotonic_ns();
        let finished = n.running.iter().all(|r| !r.alive)
            && n.undo.is_empty()
            && n.resume.is_none()
            && now >= until;
        if finished || now > hard_stop {
            n.resume(now, true);
            n.heal(now, true);
            for r in n.running.iter_mut().filter(|r| r.alive) {
                eprintln!(
                    "dlock: torture: {}: worker {} still ran past the run's hard stop: killed",
                    kind.id(),
                    r.id
                );
                let _ = r.child.start_kill();
                let _ = r.child.wait().await;
                r.alive = false;
                worker_failures += 1; // still running past the hard stop
            }
            // Every line a worker printed, up to its EOF, belongs in the history.
            for r in &mut n.running {
                if let Some(reader) = r.reader.take() {
                    let _ = tokio::time::timeout(Duration::from_secs(5), reader).await;
                }
            }
            while let Ok((id, step)) = rx.try_recv() {
                history.push((id, step));
            }
            break;
        }
    }
    let end = monotonic_ns();
    // Orphans: after ttl + ε (plus a waiter's grace, for the kinds that queue, and a tick
    // of memcached's clock) every hold and waiter's place must have expired by itself.
    // EXISTS, not GET: a reentrant lock is a hash, readers and waiters live in sorted sets.
    let lock_keys = kind.lock_keys(&keys);
    let live_keys = lock_keys
        .as_ref()
        .map_or_else(|| vec![keys.lock.clone()], |k| kind.live_keys(k));
    let settle = ttl + kind.waiter_grace(ttl).unwrap_or_default() + kind.expiry_slack();
    tokio::time::sleep(settle + Duration::from_millis(1500)).await;
    if let Some(file) = &resource_file {
        // Every command has ended by now (each writes for less than two ttls), unless
        // something is wrong: nothing of the run outlives it. Then the commands' writes
        // are the history, with the grants their first writes mark (what the workers
        // printed of them is the same).
        crate::command::kill_groups(&crate::command::read(file));
        let records = crate::command::read(file);
        let _ = std::fs::remove_file(file);
        history.retain(|(_, step)| !matches!(step, Step::Acquired { .. }));
        history.extend(records.iter().map(|r| (r.worker, r.step())));
        history.sort_by_key(|(_, step)| checkers::step_time(step));
    }
    let orphans = n.store.count_present(&live_keys).await;
    let (counter, fenced, log): (Option<i64>, Option<i64>, Vec<u64>) = redis::pipe()
        .get(&keys.counter)
        .get(&keys.fenced)
        .lrange(&keys.log, 0, -1)
        .query_async(&mut res)
        .await
        .map_err(store_err)?;
    let resources_state = Resources {
        counter: counter.unwrap_or(0),
        fenced: fenced.unwrap_or(0),
        fence_log: log,
        orphans,
        worker_failures,
    };
    // Clean up what the run left (the lock's keys too, if a control orphaned them).
    let lasting = lock_keys
        .as_ref()
        .map(|k| kind.lasting_keys(k))
        .unwrap_or_default();
    n.store.remove(&[live_keys, lasting].concat()).await;
    let _: Result<(), _> = redis::cmd("DEL")
        .arg(&keys.counter)
        .arg(&keys.fenced)
        .arg(&keys.highest)
        .arg(&keys.log)
        .query_async(&mut res)
        .await;
    let (findings, holds) = checkers::check(&checkers::Input {
        kind,
        history: &history,
        kills: &n.kills,
        windows: &n.windows,
        scheduled: &scheduled,
        faults_named: config.faults_named,
        resources: &resources_state,
        ttl_ns,
        reacquire_slack_ns: u64::try_from(kind.reacquire_slack(ttl).as_nanos()).unwrap_or(u64::MAX),
        until,
        end,
    });
    Ok(KindReport {
        findings,
        fault_windows: n.windows,
        kills: n.kills,
        holds: holds.writes,
        read_holds: holds.reads,
    })
}

/// The memory backend: worker threads in this process, each with its own client of one
/// store and its own current-thread runtime; "pause" blocks a holder's thread (its
/// watchdog with it) between its read and its write.
pub(crate) fn run_memory(
    config: &Config,
    faults: &[Fault],
    duration: Duration,
) -> Result<KindReport, Failure> {
    let store = Memory::new();
    let history: Arc<Mutex<Vec<(usize, Step)>>> = Arc::default();
    let resource: Arc<Mutex<(i64, u64, Vec<u64>)>> = Arc::default(); // value, highest, log
    let holding: Arc<Vec<AtomicBool>> = Arc::new(
        (0..config.workers)
            .map(|_| AtomicBool::new(false))
            .collect(),
    );
    let stall: Arc<Vec<AtomicBool>> = Arc::new(
        (0..config.workers)
            .map(|_| AtomicBool::new(false))
            .collect(),
    );
    let start = monotonic_ns();
    let until = start + u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX);
    let ttl = config.ttl;
    let record = |history: &Mutex<Vec<(usize, Step)>>, w: usize, step: Step| {
        history
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((w, step));
    };
    let stalls: Arc<Mutex<Vec<FaultWindow>>> = Arc::default();
    let mut scheduled = Vec::new();
    std::thread::scope(|scope| -> Result<(), Failure> {
        let mut handles = Vec::new();
        for w in 0..config.workers {
            let (client, history, resource, holding, stall, stalls) = (
                store.client(),
                Arc::clone(&history),
                Arc::clone(&resource),
                Arc::clone(&holding),
                Arc::clone(&stall),
                Arc::clone(&stalls),
            );
            handles.push(scope.spawn(move || -> Result<(), Failure> {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| Failure::new(exit::UNAVAILABLE, format!("runtime: {e}")))?;
                rt.block_on(async {
                    let lock = Lock::builder(client, "torture-memory").ttl(ttl).build()?;
                    while monotonic_ns() < until {
                        let left = Duration::from_nanos(until.saturating_sub(monotonic_ns()));
                        let Some(guard) = lock.try_lock_for(left).await? else {
                            continue;
                        };
                        let fence = guard.fencing_token().get();
                        record(
                            &history,
                            w,
                            Step::Acquired {
                                t: monotonic_ns(),
                                token: guard.token().to_string(),
                                fence,
                            },
                        );
                        holding[w].store(true, Ordering::SeqCst);
                        let read = {
                            let mut r = resource.lock().unwrap_or_else(PoisonError::into_inner);
                            (fence >= r.1).then(|| {
                                r.1 = fence;
                                r.0
                            })
                        };
                        tokio::time::sleep(Duration::from_millis(1)).await;
                        if stall[w].swap(false, Ordering::SeqCst) {
                            let t = monotonic_ns();
                            std::thread::sleep(ttl * 5 / 2);
                            stalls.lock().unwrap_or_else(PoisonError::into_inner).push(
                                FaultWindow {
                                    fault: Fault::Pause,
                                    start: t,
                                    end: monotonic_ns(),
                                    worker: Some(w),
                                    nodes: Vec::new(),
                                },
                            );
                        }
                        let ok = read.is_some_and(|v| {
                            let mut r = resource.lock().unwrap_or_else(PoisonError::into_inner);
                            if fence >= r.1 {
                                r.1 = fence;
                                r.0 = v + 1;
                                r.2.push(fence);
                                true
                            } else {
                                false
                            }
                        });
                        record(
                            &history,
                            w,
                            Step::Fenced {
                                t: monotonic_ns(),
                                ok,
                                value: read.unwrap_or(0) + 1,
                            },
                        );
                        holding[w].store(false, Ordering::SeqCst);
                        record(&history, w, Step::Releasing { t: monotonic_ns() });
                        let released = guard.release().await;
                        record(
                            &history,
                            w,
                            Step::Released {
                                t: monotonic_ns(),
                                ok: Some(released.is_ok()),
                            },
                        );
                    }
                    Ok::<(), Failure>(())
                })
            }));
        }
        // The nemesis: stall a holder now and then.
        let mut rng = Rng(config.seed ^ 0x6d65_6d6f);
        let plan = schedule(config, Kind::Memory, faults, duration);
        scheduled = distinct(plan.iter().map(|p| p.1));
        for (at, _) in plan {
            let due = start + u64::try_from(at.as_nanos()).unwrap_or(0);
            std::thread::sleep(Duration::from_nanos(due.saturating_sub(monotonic_ns())));
            let holders: Vec<usize> = (0..config.workers)
                .filter(|&w| holding[w].load(Ordering::SeqCst))
                .collect();
            let w = if holders.is_empty() {
                rng.below(config.workers)
            } else {
                holders[rng.below(holders.len())]
            };
            // The worker records the window when it actually stalls (at its next hold).
            stall[w].store(true, Ordering::SeqCst);
        }
        for h in handles {
            h.join().map_err(|_| {
                Failure::new(exit::UNAVAILABLE, "a torture worker thread panicked")
            })??;
        }
        Ok(())
    })?;
    let history = std::mem::take(&mut *history.lock().unwrap_or_else(PoisonError::into_inner));
    let windows = std::mem::take(&mut *stalls.lock().unwrap_or_else(PoisonError::into_inner));
    let (value, _, log) =
        std::mem::take(&mut *resource.lock().unwrap_or_else(PoisonError::into_inner));
    let resources = Resources {
        counter: 0,
        fenced: value,
        fence_log: log,
        orphans: 0,
        worker_failures: 0,
    };
    let (findings, holds) = checkers::check(&checkers::Input {
        kind: Kind::Memory,
        history: &history,
        kills: &[],
        windows: &windows,
        scheduled: &scheduled,
        faults_named: config.faults_named,
        resources: &resources,
        ttl_ns: u64::try_from(ttl.as_nanos()).unwrap_or(u64::MAX),
        reacquire_slack_ns: 0,
        until,
        end: monotonic_ns(),
    });
    Ok(KindReport {
        findings,
        fault_windows: windows,
        kills: Vec::new(),
        holds: holds.writes,
        read_holds: holds.reads,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(fault: Fault) -> FaultWindow {
        FaultWindow {
            fault,
            start: 1,
            end: 2,
            worker: None,
            nodes: Vec::new(),
        }
    }

    fn config(faults: &[Fault], all_kinds: bool) -> Config {
        Config {
            workers: 4,
            ttl: Duration::from_secs(1),
            seed: 1,
            faults: faults.to_vec(),
            faults_named: true,
            given: None,
            not_on_given: Vec::new(),
            all_kinds,
            quick: true,
            duration: Duration::from_secs(20),
            store_clock: None,
            client_clock: None,
        }
    }

    #[test]
    fn a_kind_none_of_the_named_faults_applies_to_is_skipped_and_a_control_takes_either_of_its_faults()
     {
        let clocks = [
            Fault::ClockJump,
            Fault::ClockBack,
            Fault::ClockFast,
            Fault::ClientClock,
        ];
        // The CI's clock run: each kind keeps the faults that apply to it; setnx-getset is
        // run under the workers' clock jump (one of the faults it exists for).
        let mut kinds = vec![
            Kind::MemcachedFenced,
            Kind::EtcdFenced,
            Kind::ZookeeperFenced,
            Kind::SetnxGetset,
        ];
        let all = kinds.clone();
        required_faults(&config(&clocks, false), &mut kinds).expect("runs");
        assert_eq!(kinds, all);
        // dlock (whose server is shared) takes no clock fault: skipped, not run faultless.
        let mut kinds = vec![Kind::Dlock, Kind::MemcachedFenced];
        required_faults(&config(&clocks, false), &mut kinds).expect("runs");
        assert_eq!(kinds, vec![Kind::MemcachedFenced]);
        // Nothing left: a usage error.
        let mut kinds = vec![Kind::Dlock];
        let e = required_faults(&config(&clocks, false), &mut kinds).expect_err("nothing");
        assert_eq!(e.code, exit::USAGE, "{}", e.message);
        assert!(e.message.contains("nothing to run"), "{}", e.message);
        // setnx-getset under a fault that breaks it not: a usage error naming both.
        let mut kinds = vec![Kind::SetnxGetset];
        let e = required_faults(&config(&[Fault::Kill], false), &mut kinds).expect_err("usage");
        assert!(
            e.message.contains("the pause or client-clock fault"),
            "{}",
            e.message
        );
        // A kind that exists for a fault none of the named ones is: that, not "nothing to
        // run".
        let mut kinds = vec![Kind::RedlockImmediateRestart];
        let e = required_faults(&config(&[Fault::Pause], false), &mut kinds).expect_err("usage");
        assert!(e.message.contains("the restart fault"), "{}", e.message);
    }

    #[test]
    fn a_due_fault_that_has_not_taken_effect_goes_before_a_repeat() {
        let mut plan = vec![
            (10, Fault::Pause, 0),
            (20, Fault::Kill, 0),
            (30, Fault::Freeze, 0),
        ];
        // Nothing is due before its time.
        assert_eq!(next_due(&mut plan, 5, &[]), None);
        // Pause took effect already: of the two due, kill goes first.
        let paused = [window(Fault::Pause)];
        assert_eq!(next_due(&mut plan, 25, &paused), Some((Fault::Kill, 0)));
        assert_eq!(next_due(&mut plan, 25, &paused), Some((Fault::Pause, 0)));
        assert_eq!(next_due(&mut plan, 25, &paused), None);
        // A restart took effect as a crash: it is no longer fresh.
        let mut plan = vec![(10, Fault::Restart, 0), (20, Fault::Pause, 0)];
        let crashed = [window(Fault::CrashRestart)];
        assert_eq!(next_due(&mut plan, 25, &crashed), Some((Fault::Pause, 0)));
    }

    #[test]
    fn a_fault_that_could_not_be_injected_is_tried_again_while_the_run_lasts() {
        let mut plan = Vec::new();
        again(&mut plan, Fault::Failover, 0, 100, 1_000, 10_000, "");
        assert_eq!(plan, vec![(600, Fault::Failover, 1)]);
        // Not past the run's end.
        again(&mut plan, Fault::Pause, 3, 9_800, 1_000, 10_000, "");
        assert_eq!(plan.len(), 1);
    }
}
