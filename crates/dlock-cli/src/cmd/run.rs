//! `dlock run NAME -- COMMAND`: a command under a lock.

use std::io::ErrorKind as IoErrorKind;
use std::os::unix::process::ExitStatusExt;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use dlock::raw::RawFencing;
use dlock::{Lock, LockGuard};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::process::{Child, Command};
use tokio::signal::unix::{SignalKind, signal};

use crate::args::RunArgs;
use crate::cmd::acquire;
use crate::exit::{self, Failure};

/// The signals dlock forwards to its child.
struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> Result<Signals, Failure> {
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
    async fn recv(&mut self) -> Signal {
        tokio::select! {
            _ = self.int.recv() => Signal::SIGINT,
            _ = self.term.recv() => Signal::SIGTERM,
            _ = self.hup.recv() => Signal::SIGHUP,
        }
    }
}

pub(crate) async fn run<B: RawFencing>(backend: B, args: RunArgs) -> Result<u8, Failure> {
    if args.semaphore.is_some() {
        return Err(Failure::usage(
            "--semaphore needs the semaphore primitive, which is not implemented yet",
        ));
    }
    if args.shared {
        return Err(Failure::usage(
            "--shared needs the read-write lock, which is not implemented yet",
        ));
    }
    let lock = Lock::builder(backend, &args.name)
        .prefix(&args.store.prefix)
        .ttl(args.ttl)
        .build()?;
    // Installed before waiting, so that a signal while waiting ends the wait cleanly
    // (a cancelled acquire leaves no lock behind) instead of killing dlock mid-call.
    let mut signals = Signals::install()?;
    let acquired = tokio::select! {
        acquired = acquire(&lock, &args.wait) => acquired?,
        sig = signals.recv() => return Ok(128 + sig as u8),
    };
    let Some(guard) = acquired else {
        if !args.quiet {
            eprintln!("dlock: {:?} is held by another process", args.name);
        }
        return Ok(args.wait.conflict_exit_code);
    };

    let mut child = match spawn(&args, &guard) {
        Ok(child) => child,
        Err(failure) => {
            guard.release().await.ok();
            return Err(failure);
        }
    };
    let pid = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .map(Pid::from_raw);
    let lost = guard.lost();
    tokio::pin!(lost);
    let status = loop {
        tokio::select! {
            status = child.wait() => break Some(status),
            () = &mut lost => break None,
            sig = signals.recv() => {
                if let Some(pid) = pid {
                    let _ = kill(pid, sig);
                }
            }
        }
    };
    match status {
        Some(status) => {
            let code = status.map(status_code).map_err(|e| {
                Failure::new(exit::UNAVAILABLE, format!("waiting for the command: {e}"))
            })?;
            match guard.release().await {
                Ok(()) => Ok(code),
                Err(err) if err.is_lock_lost() => Err(Failure::new(
                    exit::LOST,
                    format!(
                        "the command finished, but {err}; its work may have overlapped another holder's"
                    ),
                )),
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
                "dlock: lock {:?} lost while the command ran; terminating it (SIGTERM, SIGKILL after {})",
                args.name,
                humantime::format_duration(args.kill_grace)
            );
            terminate(&mut child, pid, args.kill_grace).await;
            drop(guard.release().await);
            Ok(exit::LOST)
        }
    }
}

fn spawn<B: RawFencing>(args: &RunArgs, guard: &LockGuard<B>) -> Result<Child, Failure> {
    let (program, rest) = args
        .command
        .split_first()
        .ok_or_else(|| Failure::usage("no command given after --"))?;
    Command::new(program)
        .args(rest)
        .env("DLOCK_NAME", &args.name)
        .env("DLOCK_TOKEN", guard.token().as_str())
        .env("DLOCK_FENCE", guard.fencing_token().to_string())
        .stdin(Stdio::inherit())
        .spawn()
        .map_err(|e| {
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

/// SIGTERM, then SIGKILL after `grace`, and reap.
async fn terminate(child: &mut Child, pid: Option<Pid>, grace: Duration) {
    if let Some(pid) = pid {
        let _ = kill(pid, Signal::SIGTERM);
    }
    if tokio::time::timeout(grace, child.wait()).await.is_err() {
        let _ = child.start_kill();
        let _ = child.wait().await;
    }
}

/// A shell's view of an exit status: the code, or 128 + the signal that killed it.
fn status_code(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code & 0xff).unwrap_or(1),
        (None, Some(sig)) => u8::try_from(128 + sig).unwrap_or(255),
        (None, None) => 1,
    }
}
