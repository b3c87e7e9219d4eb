//! `dlock run NAME -- COMMAND`: a command under a lock.

use std::ffi::OsString;
use std::time::Duration;

use fencelock::raw::{RawFencing, RawLock, RawSemaphore};
use fencelock::{
    ErrorKind, FairLock, HolderInfo, Lock, LockGuard, OtherCount, PermitCounts, Permits, RwLock,
    Semaphore, SemaphorePermit,
};

pub(crate) use super::supervise::{Job, Signals, supervise};
use super::supervise::{MinHold, check_kill_grace, supervise_run};
use crate::args::{Kind, RunArgs};
use crate::cmd::kinds::{self, AnyKind};
use crate::cmd::{Holders, Status, acquire, conflict, shown, status_of};
use crate::exit::Failure;

impl<'a> Job<'a> {
    /// `dlock run`'s job: DLOCK_FENCE where the primitive has a fence.
    fn of_run(args: &'a RunArgs, fence: Option<u64>) -> Job<'a> {
        Job {
            what: "lock",
            name: &args.name,
            command: &args.command,
            kill_grace: args.kill_grace,
            release_on_exit: args.release_on_exit,
            env: fence
                .map(|f| vec![("DLOCK_FENCE", f.to_string())])
                .unwrap_or_default(),
        }
    }
}

/// What `dlock run` tells about its holder: this host, dlock's pid (it forwards signals
/// to the command) and the command's program name, or `--info`.
fn run_holder(args: &RunArgs) -> Option<HolderInfo> {
    if args.holder.no_info {
        return None;
    }
    let command = args
        .holder
        .info
        .clone()
        .unwrap_or_else(|| program_name(&args.command));
    Some(HolderInfo::current().command(command))
}

/// The command's program name (its last path component): what other clients see of the
/// holder by default. Not its arguments, which may carry secrets (a database URL with a
/// password, `-pSECRET`) that the lock key would show to everyone who can read it;
/// `--info` says more where that is safe.
fn program_name(command: &[OsString]) -> String {
    command
        .first()
        .map(|program| {
            let program = program.to_string_lossy();
            program.rsplit('/').next().unwrap_or_default().to_owned()
        })
        .unwrap_or_default()
}

/// How waiting for the lock (or permit) ended.
enum Waited<X: RawLock> {
    Got(LockGuard<X>),
    /// Exit with this code (conflict, or a signal while waiting).
    Exit(u8),
}

/// Waits for `lock` as `--wait` / `--no-wait` say; on a conflict, says who holds it
/// (`held`: its status) unless `--quiet`.
async fn wait_for<X: RawLock>(
    lock: &Lock<X>,
    args: &RunArgs,
    signals: &mut Signals,
    held: impl Future<Output = Result<Status, Failure>>,
) -> Result<Waited<X>, Failure> {
    let acquired = tokio::select! {
        acquired = acquire(lock, &args.wait) => acquired?,
        sig = signals.recv() => return Ok(Waited::Exit(128 + sig as u8)),
    };
    match acquired {
        Some(guard) => Ok(Waited::Got(guard)),
        None => held_by_another(args, held).await,
    }
}

/// A conflict: who holds the lock (unless `--quiet`), and the conflict code.
async fn held_by_another<X: RawLock>(
    args: &RunArgs,
    held: impl Future<Output = Result<Status, Failure>>,
) -> Result<Waited<X>, Failure> {
    if !args.quiet {
        eprintln!("dlock: {}", conflict(&args.name, &args.wait, held.await));
    }
    Ok(Waited::Exit(args.wait.conflict_exit_code))
}

/// `--semaphore N`: one permit, as `--wait` / `--no-wait` say (`None` on conflict),
/// through the semaphore's own methods (which set the count first with --set-permits).
async fn acquire_permit<B: RawSemaphore>(
    sem: &Semaphore<B>,
    args: &RunArgs,
) -> fencelock::Result<Option<SemaphorePermit<B>>> {
    if args.wait.no_wait {
        sem.try_acquire().await
    } else if let Some(d) = args.wait.wait {
        sem.try_acquire_for(d).await
    } else {
        sem.acquire().await.map(Some)
    }
}

/// [`wait_for`] a permit of `sem`; another stored permit count than `--semaphore N` is a
/// usage error that names it and how to change it.
async fn wait_for_permit<B: RawSemaphore>(
    sem: &Semaphore<B>,
    args: &RunArgs,
    signals: &mut Signals,
    held: impl Future<Output = Result<Status, Failure>>,
) -> Result<Waited<Permits<B>>, Failure> {
    let acquired = tokio::select! {
        acquired = acquire_permit(sem, args) => acquired,
        sig = signals.recv() => return Ok(Waited::Exit(128 + sig as u8)),
    };
    match acquired {
        Ok(Some(guard)) => Ok(Waited::Got(guard)),
        Ok(None) => held_by_another(args, held).await,
        Err(err) if err.kind() == ErrorKind::PermitsMismatch => {
            let counts = std::error::Error::source(&err)
                .and_then(|s| s.downcast_ref::<PermitCounts>())
                .copied();
            let Some(PermitCounts {
                stored, requested, ..
            }) = counts
            else {
                return Err(err.into());
            };
            let permits = if stored == 1 { "permit" } else { "permits" };
            Err(Failure::usage(format!(
                "semaphore {:?} has {stored} {permits} stored, not --semaphore {requested}: run \
                 with --semaphore {stored}, or change the count for every run with `dlock \
                 set-permits {} {requested}` (or --set-permits)",
                args.name,
                shown(&args.name)
            )))
        }
        Err(err) => Err(err.into()),
    }
}

/// Once `guard` is held as `mine`: whether `NAME` is also held as another kind (a separate
/// lock that does not exclude this one). A warning on stderr, or with
/// `--refuse-other-kinds` the lock given back and `None` (exit with the conflict code).
async fn alone<X: RawLock, B: AnyKind>(
    guard: LockGuard<X>,
    backend: &B,
    mine: Kind,
    args: &RunArgs,
) -> Option<LockGuard<X>> {
    if args.store.prefix.is_some() && !B::KINDS_TOLD_APART_UNDER_ONE_PREFIX {
        if !args.quiet {
            eprintln!(
                "dlock: note: whether {:?} is also held as another kind of lock was not \
                 checked: under --prefix every kind of it has the same key, where this \
                 store's other kinds cannot tell this run's own hold from another's",
                args.name
            );
        }
        return Some(guard);
    }
    let others = match kinds::held_as_others(
        backend,
        mine,
        args.store.prefix.as_deref(),
        &args.name,
        guard.token().as_str(),
    )
    .await
    {
        Ok((others, unchecked)) => {
            if !unchecked.is_empty() && !args.quiet {
                let kinds: Vec<&str> = unchecked.iter().map(|k| k.described()).collect();
                eprintln!(
                    "dlock: note: whether {:?} is also held as {} was not checked: under \
                     --prefix every kind of it has the same key, and this run's own value \
                     there hides that kind's holders from the check",
                    args.name,
                    kinds.join(", ")
                );
            }
            others
        }
        Err(failure) => {
            eprintln!(
                "dlock: warning: could not check whether {:?} is held as another kind of \
                 lock: {}",
                args.name, failure.message
            );
            return Some(guard);
        }
    };
    if others.is_empty() {
        return Some(guard);
    }
    let held: Vec<&str> = others.iter().map(|k| k.described()).collect();
    let held = held.join(", ");
    if args.refuse_other_kinds {
        drop(guard.release().await);
        if !args.quiet {
            eprintln!(
                "dlock: {:?} is also held as {held} (not this lock, but the same name): not \
                 running the command (--refuse-other-kinds)",
                args.name
            );
        }
        return None;
    }
    let (locks, exclude) = if others.len() == 1 {
        ("a separate lock", "does")
    } else {
        ("separate locks", "do")
    };
    eprintln!(
        "dlock: warning: {:?} is also held as {held}: {locks} of the same name, which \
         {exclude} not exclude this one (--refuse-other-kinds refuses to run then)",
        args.name
    );
    Some(guard)
}

/// `dlock run` on a store with every kind of primitive; `shortest` is the shortest lease
/// it takes (for `--min-hold`).
pub(crate) async fn run<B: RawFencing + AnyKind>(
    backend: B,
    args: RunArgs,
    shortest: Duration,
) -> Result<u8, Failure> {
    let conflict = args.wait.conflict_exit_code;
    let checker = backend.clone();
    // Each kind has its own default prefix, so that names of different kinds never
    // collide; an explicit --prefix is used as given.
    let prefix = |default: &'static str| args.store.prefix_or(default).to_owned();
    check_kill_grace(args.kill_grace, args.ttl)?;
    let holder = run_holder(&args);
    let min_hold = MinHold::of(args.min_hold, shortest, &backend);
    // Installed before waiting, so that a signal while waiting ends the wait cleanly
    // (a cancelled acquire leaves no lock behind) instead of killing dlock mid-call.
    let mut signals = Signals::install()?;
    if let Some(permits) = args.semaphore {
        let mut builder = Semaphore::builder(backend, &args.name, permits)
            .ttl(args.ttl)
            .prefix(prefix(fencelock::DEFAULT_SEMAPHORE_PREFIX))
            .on_other_count(if args.set_permits {
                OtherCount::Set
            } else {
                OtherCount::Refuse
            });
        if let Some(info) = holder {
            builder = builder.holder_info(info);
        }
        let sem = builder.build()?;
        let held = status_of(
            checker.clone(),
            Kind::Semaphore,
            args.store.prefix.as_deref(),
            &args.name,
        );
        return match wait_for_permit(&sem, &args, &mut signals, held).await? {
            Waited::Got(guard) => {
                let Some(guard) = alone(guard, &checker, Kind::Semaphore, &args).await else {
                    return Ok(conflict);
                };
                supervise_run(guard, &Job::of_run(&args, None), signals, min_hold).await
            }
            Waited::Exit(code) => Ok(code),
        };
    }
    if args.shared || args.exclusive {
        let mut builder = RwLock::builder(backend, &args.name)
            .ttl(args.ttl)
            .prefix(prefix(fencelock::DEFAULT_RWLOCK_PREFIX));
        if let Some(info) = holder {
            builder = builder.holder_info(info);
        }
        let rw = builder.build()?;
        let held = status_of(
            checker.clone(),
            Kind::Rwlock,
            args.store.prefix.as_deref(),
            &args.name,
        );
        if args.shared {
            return match wait_for(rw.read_lock(), &args, &mut signals, held).await? {
                Waited::Got(guard) => {
                    let Some(guard) = alone(guard, &checker, Kind::Rwlock, &args).await else {
                        return Ok(conflict);
                    };
                    supervise_run(guard, &Job::of_run(&args, None), signals, min_hold).await
                }
                Waited::Exit(code) => Ok(code),
            };
        }
        return match wait_for(rw.write_lock(), &args, &mut signals, held).await? {
            Waited::Got(guard) => {
                let Some(guard) = alone(guard, &checker, Kind::Rwlock, &args).await else {
                    return Ok(conflict);
                };
                let fence = guard.fencing_token().get();
                supervise_run(guard, &Job::of_run(&args, Some(fence)), signals, min_hold).await
            }
            Waited::Exit(code) => Ok(code),
        };
    }
    if args.fair {
        let mut builder = FairLock::builder(backend, &args.name)
            .ttl(args.ttl)
            .prefix(prefix(fencelock::DEFAULT_FAIR_PREFIX));
        if let Some(info) = holder {
            builder = builder.holder_info(info);
        }
        let fair = builder.build()?;
        let held = status_of(
            checker.clone(),
            Kind::Fair,
            args.store.prefix.as_deref(),
            &args.name,
        );
        return match wait_for(fair.as_lock(), &args, &mut signals, held).await? {
            Waited::Got(guard) => {
                let Some(guard) = alone(guard, &checker, Kind::Fair, &args).await else {
                    return Ok(conflict);
                };
                let fence = guard.fencing_token().get();
                supervise_run(guard, &Job::of_run(&args, Some(fence)), signals, min_hold).await
            }
            Waited::Exit(code) => Ok(code),
        };
    }
    let lock = plain_lock(backend, &args, holder)?;
    let held = status_of(
        checker.clone(),
        Kind::Lock,
        args.store.prefix.as_deref(),
        &args.name,
    );
    match wait_for(&lock, &args, &mut signals, held).await? {
        Waited::Got(guard) => {
            let Some(guard) = alone(guard, &checker, Kind::Lock, &args).await else {
                return Ok(conflict);
            };
            let fence = guard.fencing_token().get();
            supervise_run(guard, &Job::of_run(&args, Some(fence)), signals, min_hold).await
        }
        Waited::Exit(code) => Ok(code),
    }
}

/// The plain lock `dlock run` takes.
fn plain_lock<B: RawLock>(
    backend: B,
    args: &RunArgs,
    holder: Option<HolderInfo>,
) -> Result<Lock<B>, Failure> {
    let mut builder = Lock::builder(backend, &args.name)
        .prefix(args.store.lock_prefix())
        .ttl(args.ttl);
    if let Some(info) = holder {
        builder = builder.holder_info(info);
    }
    Ok(builder.build()?)
}

/// `dlock run` on a store that has only the plain lock (RedLock, advisory mode); `fence` reads the guard's fence where the store mints one; `shortest`
/// is the shortest lease the store takes (for `--min-hold`).
pub(crate) async fn run_plain<B: Holders>(
    backend: B,
    args: RunArgs,
    fence: impl Fn(&LockGuard<B>) -> Option<u64>,
    shortest: Duration,
) -> Result<u8, Failure> {
    if args.semaphore.is_some() || args.shared || args.exclusive || args.fair {
        return Err(Failure::usage(
            "this store supports the plain lock only (no --semaphore, --shared, --exclusive, --fair)",
        ));
    }
    check_kill_grace(args.kill_grace, args.ttl)?;
    // --refuse-other-kinds: there is no other kind of lock here to be held.
    let mut signals = Signals::install()?;
    let min_hold = MinHold::of(args.min_hold, shortest, &backend);
    let lock = plain_lock(backend, &args, run_holder(&args))?;
    let held = lock
        .backend()
        .lock_status(args.store.lock_prefix(), &args.name);
    match wait_for(&lock, &args, &mut signals, held).await? {
        Waited::Got(guard) => {
            let fence = fence(&guard);
            supervise_run(guard, &Job::of_run(&args, fence), signals, min_hold).await
        }
        Waited::Exit(code) => Ok(code),
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::ffi::OsStringExt as _;

    use proptest::prelude::*;

    use super::*;
    use crate::hostile::cases;

    proptest! {
        #![proptest_config(cases(256))]

        /// What `dlock run` tells of any command (any bytes, not UTF-8 included): its
        /// program's last path component, never an argument.
        #[test]
        fn the_holder_shows_the_program_name_only(
            program in prop::collection::vec(any::<u8>(), 0..40),
            args in prop::collection::vec("[ -~]{0,10}", 0..3),
        ) {
            let mut command = vec![OsString::from_vec(program.clone())];
            command.extend(args.iter().map(OsString::from));
            let name = program_name(&command);
            let lossy = String::from_utf8_lossy(&program);
            prop_assert!(!name.contains('/'), "{:?}", name);
            prop_assert!(lossy.ends_with(&name), "{:?} of {:?}", name, lossy);
            prop_assert_eq!(program_name(&[]), "");
        }
    }
}
