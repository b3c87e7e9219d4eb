//! `dlock run NAME -- COMMAND`: a command under a lock.

use std::ffi::OsString;
use std::io::{ErrorKind as IoErrorKind, IsTerminal};
use std::os::unix::process::ExitStatusExt;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use dlock::raw::{RawFencing, RawLock, RawSemaphore};
use dlock::{
    ErrorKind, FairLock, HolderInfo, Lock, LockGuard, OtherCount, PermitCounts, Permits, RwLock,
    Semaphore, SemaphorePermit,
};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::process::{Child, Command};
use tokio::signal::unix::{SignalKind, signal};
use tokio::time::Instant;

use crate::args::{Kind, RunArgs};
use crate::cmd::acquire;
use crate::cmd::kinds::{self, AnyKind};
use crate::exit::{self, Failure};

/// The signals dlock handles (forwards to its child, or cleans up on).
pub(crate) struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl Signals {
    pub(crate) fn install() -> Result<Signals, Failure> {
        let install = |kind| {
            signal(kind)
                .map_err(|e| Failure::new(exit::UNAVAILABLE, format!("cannot handle signals: {e}")))
        };
        Ok(Signals {
            int: install(SignalKind::interrupt())?,
            term: install(SignalKind::terminate())?,
            hup: install(SignalKind::hangup())?,
        })
    }

    /// The next signal received.
    pub(crate) async fn recv(&mut self) -> Signal {
        tokio::select! {
            _ = self.int.recv() => Signal::SIGINT,
            _ = self.term.recv() => Signal::SIGTERM,
            _ = self.hup.recv() => Signal::SIGHUP,
        }
    }
}

/// What `supervise` runs: the command, under which name, with which extra environment.
pub(crate) struct Job<'a> {
    /// What is held, for messages: "lock" or "leadership of".
    pub(crate) what: &'static str,
    pub(crate) name: &'a str,
    pub(crate) command: &'a [std::ffi::OsString],
    pub(crate) kill_grace: Duration,
    /// Variables beside DLOCK_NAME and DLOCK_TOKEN (DLOCK_FENCE, DLOCK_TERM, …).
    pub(crate) env: Vec<(&'static str, String)>,
}

impl<'a> Job<'a> {
    /// `dlock run`'s job: DLOCK_FENCE where the primitive has a fence.
    fn of_run(args: &'a RunArgs, fence: Option<u64>) -> Job<'a> {
        Job {
            what: "lock",
            name: &args.name,
            command: &args.command,
            kill_grace: args.kill_grace,
            env: fence
                .map(|f| vec![("DLOCK_FENCE", f.to_string())])
                .unwrap_or_default(),
        }
    }
}

/// `--min-hold`: how long after the command ended the lock is kept at least.
#[derive(Clone, Copy, Debug)]
struct MinHold {
    hold: Duration,
    /// The shortest lease the store takes (memcached's one-second clock needs 2 s).
    shortest: Duration,
    /// The store's clock-drift allowance: a lease asked for `hold` may end that much
    /// early by the client's clock (memcached's whole-second expiry up to a second), so
    /// the lease kept is longer by it.
    drift: dlock::validity::Drift,
}

impl MinHold {
    fn of<B: RawLock>(args: &RunArgs, shortest: Duration, backend: &B) -> Option<MinHold> {
        args.min_hold.map(|hold| MinHold {
            hold,
            shortest,
            drift: backend.drift(),
        })
    }

    /// The lease to leave behind: `hold` from now, whatever the store's clock does.
    fn lease(self) -> Duration {
        (self.hold + self.drift.of(self.hold))
            .max(self.shortest)
            .min(dlock::MAX_TTL)
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

async fn wait_for<X: RawLock>(
    lock: &Lock<X>,
    args: &RunArgs,
    signals: &mut Signals,
) -> Result<Waited<X>, Failure> {
    let acquired = tokio::select! {
        acquired = acquire(lock, &args.wait) => acquired?,
        sig = signals.recv() => return Ok(Waited::Exit(128 + sig as u8)),
    };
    match acquired {
        Some(guard) => Ok(Waited::Got(guard)),
        None => {
            if !args.quiet {
                eprintln!("dlock: {:?} is held by another process", args.name);
            }
            Ok(Waited::Exit(args.wait.conflict_exit_code))
        }
    }
}

/// `--semaphore N`: one permit, as `--wait` / `--no-wait` say (`None` on conflict),
/// through the semaphore's own methods (which set the count first with --set-permits).
async fn acquire_permit<B: RawSemaphore>(
    sem: &Semaphore<B>,
    args: &RunArgs,
) -> dlock::Result<Option<SemaphorePermit<B>>> {
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
) -> Result<Waited<Permits<B>>, Failure> {
    let acquired = tokio::select! {
        acquired = acquire_permit(sem, args) => acquired,
        sig = signals.recv() => return Ok(Waited::Exit(128 + sig as u8)),
    };
    match acquired {
        Ok(Some(guard)) => Ok(Waited::Got(guard)),
        Ok(None) => {
            if !args.quiet {
                eprintln!("dlock: {:?} is held by another process", args.name);
            }
            Ok(Waited::Exit(args.wait.conflict_exit_code))
        }
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
                shell_word(&args.name)
            )))
        }
        Err(err) => Err(err.into()),
    }
}

/// `word` as one shell word (quoted unless it is plain).
fn shell_word(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/' | ':' | '@'));
    if plain {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', "'\\''"))
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
    let others = match kinds::held_as_others(backend, mine, &args.store.prefix, &args.name).await {
        Ok(others) => others,
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
    let prefix = |default: &'static str| {
        if args.store.prefix == dlock::keys::DEFAULT_PREFIX {
            default.to_owned()
        } else {
            args.store.prefix.clone()
        }
    };
    let holder = run_holder(&args);
    let min_hold = MinHold::of(&args, shortest, &backend);
    // Installed before waiting, so that a signal while waiting ends the wait cleanly
    // (a cancelled acquire leaves no lock behind) instead of killing dlock mid-call.
    let mut signals = Signals::install()?;
    if let Some(permits) = args.semaphore {
        let mut builder = Semaphore::builder(backend, &args.name, permits)
            .ttl(args.ttl)
            .prefix(prefix(dlock::DEFAULT_SEMAPHORE_PREFIX))
            .on_other_count(if args.set_permits {
                OtherCount::Set
            } else {
                OtherCount::Refuse
            });
        if let Some(info) = holder {
            builder = builder.holder_info(info);
        }
        let sem = builder.build()?;
        return match wait_for_permit(&sem, &args, &mut signals).await? {
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
            .prefix(prefix(dlock::DEFAULT_RWLOCK_PREFIX));
        if let Some(info) = holder {
            builder = builder.holder_info(info);
        }
        let rw = builder.build()?;
        if args.shared {
            return match wait_for(rw.read_lock(), &args, &mut signals).await? {
                Waited::Got(guard) => {
                    let Some(guard) = alone(guard, &checker, Kind::Rwlock, &args).await else {
                        return Ok(conflict);
                    };
                    supervise_run(guard, &Job::of_run(&args, None), signals, min_hold).await
                }
                Waited::Exit(code) => Ok(code),
            };
        }
        return match wait_for(rw.write_lock(), &args, &mut signals).await? {
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
            .prefix(prefix(dlock::DEFAULT_FAIR_PREFIX));
        if let Some(info) = holder {
            builder = builder.holder_info(info);
        }
        let fair = builder.build()?;
        return match wait_for(fair.as_lock(), &args, &mut signals).await? {
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
    match wait_for(&lock, &args, &mut signals).await? {
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
        .prefix(&args.store.prefix)
        .ttl(args.ttl);
    if let Some(info) = holder {
        builder = builder.holder_info(info);
    }
    Ok(builder.build()?)
}

/// `dlock run` on a store that has only the plain lock (RedLock, memcached, etcd,
/// advisory mode); `fence` reads the guard's fence where the store mints one; `shortest`
/// is the shortest lease the store takes (for `--min-hold`).
pub(crate) async fn run_plain<B: RawLock>(
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
    // --refuse-other-kinds: there is no other kind of lock here to be held.
    let mut signals = Signals::install()?;
    let min_hold = MinHold::of(&args, shortest, &backend);
    let lock = plain_lock(backend, &args, run_holder(&args))?;
    match wait_for(&lock, &args, &mut signals).await? {
        Waited::Got(guard) => {
            let fence = fence(&guard);
            supervise_run(guard, &Job::of_run(&args, fence), signals, min_hold).await
        }
        Waited::Exit(code) => Ok(code),
    }
}

/// Runs the command while `guard` is held; see `dlock run --help`.
pub(crate) async fn supervise<X: RawLock>(
    guard: LockGuard<X>,
    job: &Job<'_>,
    signals: Signals,
) -> Result<u8, Failure> {
    supervise_run(guard, job, signals, None).await
}

/// [`supervise`], keeping the lock for `min_hold` after the command ended.
async fn supervise_run<X: RawLock>(
    guard: LockGuard<X>,
    job: &Job<'_>,
    mut signals: Signals,
    min_hold: Option<MinHold>,
) -> Result<u8, Failure> {
    // Without a terminal, the command gets a process group of its own, so that signals
    // (and termination on a lost lock) reach everything it started. On a terminal it
    // stays in the foreground group, where Ctrl-C reaches it directly.
    let interactive = std::io::stdin().is_terminal();
    let mut child = match spawn(job, guard.token(), !interactive) {
        Ok(child) => child,
        Err(failure) => {
            guard.release().await.ok();
            return Err(failure);
        }
    };
    let target = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .map(|id| Pid::from_raw(if interactive { id } else { -id }));
    let lost = guard.lost();
    tokio::pin!(lost);
    // Terminate early enough that the command is gone before the lease can run out and
    // be granted to someone else: once the remaining validity is down to the kill grace
    // (at most a third of the ttl, which renewals every third of it never let it reach).
    // (The lease, not --ttl: a store may cap it, as ZooKeeper's session timeout does.)
    let threshold = job.kill_grace.min(guard.lease() / 3);
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    let mut forwarded = 0;
    let status = loop {
        tokio::select! {
            status = child.wait() => break Some(status),
            () = &mut lost => break None,
            _ = tick.tick() => {
                if guard.remaining() <= threshold {
                    break None;
                }
            }
            sig = signals.recv() => {
                // A terminal already delivered Ctrl-C to the command itself.
                if interactive && sig == Signal::SIGINT {
                    continue;
                }
                forwarded += 1;
                // A second SIGINT/SIGTERM means "now": SIGKILL.
                let sig = if forwarded > 1 && sig != Signal::SIGHUP { Signal::SIGKILL } else { sig };
                if let Some(target) = target {
                    let _ = kill(target, sig);
                }
            }
        }
    };
    match status {
        Some(status) => {
            let code = status.map(status_code).map_err(|e| {
                Failure::new(exit::UNAVAILABLE, format!("waiting for the command: {e}"))
            })?;
            if let Some(min) = min_hold {
                return keep_for(guard, min, code).await;
            }
            match guard.release().await {
                Ok(()) => Ok(code),
                Err(err) if err.is_lock_lost() => Err(lost_after(&err)),
                Err(err) => {
                    // The lease expires by itself; the command's result stands.
                    eprintln!(
                        "dlock: warning: release failed ({err}); the lock expires within its ttl"
                    );
                    Ok(code)
                }
            }
        }
        None => {
            eprintln!(
                "dlock: {} {:?} lost while the command ran; terminating it (SIGTERM, SIGKILL after {})",
                job.what,
                job.name,
                humantime::format_duration(job.kill_grace)
            );
            terminate(&mut child, target, job.kill_grace, &mut signals).await;
            drop(guard.release().await);
            Ok(exit::LOST)
        }
    }
}

/// The lock was found lost when the command had finished.
fn lost_after(err: &dlock::Error) -> Failure {
    Failure::new(
        exit::LOST,
        format!("the command finished, but {err}; its work may have overlapped another holder's"),
    )
}

/// `--min-hold`: sets the lease to end `min.hold` from now (plus the store's drift) and
/// leaves it to expire (no release, no renewal), then ends with the command's `code`. If
/// the store cannot set it, the guard stays held (renewed) for `min.hold` and is then
/// left to expire: never a release before `min.hold` has passed.
async fn keep_for<X: RawLock>(guard: LockGuard<X>, min: MinHold, code: u8) -> Result<u8, Failure> {
    let kept_from = Instant::now();
    match guard.extend(min.lease()).await {
        Ok(()) => {
            guard.forget();
            Ok(code)
        }
        Err(err) if err.is_lock_lost() => Err(lost_after(&err)),
        Err(err) => {
            eprintln!(
                "dlock: warning: setting the lease to --min-hold failed ({err}); holding the lock \
                 (renewed) until --min-hold has passed"
            );
            tokio::select! {
                () = tokio::time::sleep_until(kept_from + min.hold) => {}
                () = guard.lost() => {}
            }
            // Left to expire within its ttl from its last renewal: later, never sooner.
            guard.forget();
            Ok(code)
        }
    }
}

fn spawn(job: &Job<'_>, token: &dlock::Token, own_group: bool) -> Result<Child, Failure> {
    let (program, rest) = job
        .command
        .split_first()
        .ok_or_else(|| Failure::usage("no command given after --"))?;
    let mut command = Command::new(program);
    if own_group {
        command.process_group(0);
    }
    command
        .args(rest)
        .env("DLOCK_NAME", job.name)
        .env("DLOCK_TOKEN", token.as_str())
        .envs(job.env.iter().map(|(k, v)| (k, v)));
    command.stdin(Stdio::inherit()).spawn().map_err(|e| {
        let code = if e.kind() == IoErrorKind::NotFound {
            exit::NOT_FOUND
        } else {
            exit::CANNOT_EXECUTE
        };
        Failure::new(
            code,
            format!("cannot run {}: {e}", program.to_string_lossy()),
        )
    })
}

/// SIGTERM, then SIGKILL after `grace` (or at once on a signal to dlock), and reap.
/// `target` is the command's process group where it has one.
async fn terminate(child: &mut Child, target: Option<Pid>, grace: Duration, signals: &mut Signals) {
    if let Some(target) = target {
        let _ = kill(target, Signal::SIGTERM);
    }
    tokio::select! {
        _ = child.wait() => return,
        () = tokio::time::sleep(grace) => {}
        _ = signals.recv() => {}
    }
    if let Some(target) = target {
        let _ = kill(target, Signal::SIGKILL);
    }
    let _ = child.start_kill();
    let _ = child.wait().await;
}

/// A shell's view of an exit status: the code, or 128 + the signal that killed it.
fn status_code(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code & 0xff).unwrap_or(1),
        (None, Some(sig)) => u8::try_from(128 + sig).unwrap_or(255),
        (None, None) => 1,
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
