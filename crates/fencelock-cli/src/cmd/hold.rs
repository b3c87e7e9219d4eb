//! `dlock hold NAME`: a lock held (renewed) across a shell script's commands, until dlock
//! is signalled or its parent exits.

use std::io::Write as _;
use std::time::Duration;

use fencelock::{HolderInfo, Lock, LockGuard};
use nix::unistd::{Pid, getppid};

use crate::args::HoldArgs;
use crate::cmd::run::Signals;
use crate::cmd::{Acquired, Holders, acquire, conflict, millis, or_dash};
use crate::exit::{self, Failure};

/// How often dlock looks whether its parent is still there.
const PARENT_CHECK: Duration = Duration::from_millis(200);

/// What `dlock hold` tells about its holder: this host, dlock's own pid (the process to
/// kill to release the lock) and `--info`.
fn hold_holder(args: &HoldArgs) -> Option<HolderInfo> {
    if args.holder.no_info {
        return None;
    }
    let info = HolderInfo::current();
    Some(match &args.holder.info {
        Some(value) => info.command(value),
        None => info,
    })
}

/// How holding ended.
enum Ended {
    /// SIGTERM, SIGINT or SIGHUP.
    Signalled,
    /// The process that started dlock is gone.
    Orphaned,
}

/// `dlock hold`; `fence` reads the grant's fence where the store mints one.
pub(crate) async fn hold<B: Holders>(
    backend: B,
    args: HoldArgs,
    fence: impl Fn(&LockGuard<B>) -> Option<u64>,
) -> Result<u8, Failure> {
    // Read first: a parent that exits later makes this process an orphan (its parent
    // then is a reaper or init).
    let parent = getppid();
    let mut builder = Lock::builder(backend, &args.name)
        .prefix(args.store.lock_prefix())
        .ttl(args.ttl);
    if let Some(info) = hold_holder(&args) {
        builder = builder.holder_info(info);
    }
    let lock = builder.build()?;
    // Installed before waiting, so that a signal while waiting ends the wait cleanly (a
    // cancelled acquire leaves no lock behind).
    let mut signals = Signals::install()?;
    let acquired = tokio::select! {
        acquired = acquire(&lock, &args.wait) => acquired?,
        sig = signals.recv() => return Ok(128 + sig as u8),
    };
    let Some(guard) = acquired else {
        if !args.quiet {
            let held = lock
                .backend()
                .lock_status(args.store.lock_prefix(), &args.name)
                .await;
            eprintln!("dlock: {}", conflict(&args.name, &args.wait, held));
        }
        return Ok(args.wait.conflict_exit_code);
    };
    let fence = fence(&guard);
    let line = if args.json {
        serde_json::to_string(&Acquired {
            name: &args.name,
            key: lock.keys().lock(),
            token: guard.token().as_str(),
            fence,
            ttl_ms: millis(args.ttl),
        })
        .map_err(|e| e.to_string())
    } else {
        Ok(format!("{} {}", guard.token(), or_dash(fence)))
    };
    // Nobody reads the line (its reader is gone): give the lock back at once.
    let printed = line.and_then(|line| {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{line}")
            .and_then(|()| out.flush())
            .map_err(|e| e.to_string())
    });
    if let Err(err) = printed {
        drop(guard.release().await);
        return Err(Failure::new(
            exit::UNAVAILABLE,
            format!(
                "printing the token of {:?} failed ({err}); released it",
                args.name
            ),
        ));
    }
    let lost = guard.lost();
    tokio::pin!(lost);
    let mut parent_check = tokio::time::interval(PARENT_CHECK);
    parent_check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let ended = loop {
        tokio::select! {
            () = &mut lost => {
                eprintln!(
                    "dlock: lock {:?} lost while held (deleted, force-unlocked, or not renewed \
                     in time): another process may hold it now",
                    args.name
                );
                return Ok(exit::LOST);
            }
            _ = signals.recv() => break Ended::Signalled,
            _ = parent_check.tick() => {
                if orphaned(parent) {
                    break Ended::Orphaned;
                }
            }
        }
    };
    match guard.release().await {
        Ok(()) => Ok(exit::SUCCESS),
        Err(err) if err.is_lock_lost() => {
            eprintln!("dlock: {err}");
            Ok(exit::LOST)
        }
        Err(err) => {
            let why = match ended {
                Ended::Signalled => "signalled",
                Ended::Orphaned => "its parent exited",
            };
            eprintln!(
                "dlock: warning: releasing {:?} ({why}) failed ({err}); the lock expires \
                 within its ttl",
                args.name
            );
            Ok(exit::SUCCESS)
        }
    }
}

/// Whether the process that started dlock (`parent`) has exited.
fn orphaned(parent: Pid) -> bool {
    getppid() != parent
}
