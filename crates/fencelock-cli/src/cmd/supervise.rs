//! The supervisor of `dlock run` and `dlock elect`: runs the command while the lease is
//! held, and keeps the two promises the lock makes to everyone else —
//!
//! * **Nothing of the command runs past the lease.** The command's whole process group
//!   gets SIGTERM early enough that the kill grace fits inside the remaining validity,
//!   and SIGKILL at the latest a margin before the validity ends, by the lease's own
//!   (monotonic) clock; every process holding the hold descriptor (below) gets the
//!   SIGKILL too, in the group or not. A separate reaper process ([`super::reaper`]) holds the same
//!   deadline, so a paused or killed `dlock` does not let the command outlive the lease.
//! * **The lock is held until the whole command is gone** (flock(1)'s rule): until the
//!   direct child has exited, every process of its process group has exited, and every
//!   process that inherited the hold descriptor (`DLOCK_HOLD_FD`) has exited or closed
//!   it — a background child the command left behind keeps the lock (renewed).
//!   `--release-on-exit` releases when the direct child exits instead.

use std::ffi::OsString;
use std::io::{ErrorKind as IoErrorKind, IsTerminal, Read};
use std::os::fd::AsRawFd;
use std::os::unix::process::ExitStatusExt;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use fencelock::LockGuard;
use fencelock::raw::RawLock;
use nix::errno::Errno;
use nix::sys::signal::{SigSet, SigmaskHow, Signal, kill, pthread_sigmask, raise};
use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid, waitpid};
use nix::unistd::{Pid, getpgrp, tcgetpgrp, tcsetpgrp};
use tokio::process::{Child, Command};
use tokio::signal::unix::{SignalKind, signal};
use tokio::time::Instant;

use super::reaper::{Reaper, kill_holders, monotonic_ns};
use crate::exit::{self, Failure};

/// The kill grace when `--kill-grace` is not given: 10 s, or less where the lease needs it.
pub(crate) const DEFAULT_KILL_GRACE: Duration = Duration::from_secs(10);

/// How long before the lease's validity ends the command's group is SIGKILLed at the
/// latest: 100 ms (a sixth of the lease for leases under 600 ms). It covers the
/// supervisor's and the reaper's timer slack and the kill itself.
pub(crate) fn kill_margin(lease: Duration) -> Duration {
    (lease / 6).min(Duration::from_millis(100))
}

/// The longest kill grace a lease allows: SIGTERM is sent when the remaining validity is
/// down to grace + margin, which must stay below what renewals every third of the lease
/// keep it above (two thirds), with room for a slow renewal: a third of the lease, less
/// the margin.
pub(crate) fn max_kill_grace(lease: Duration) -> Duration {
    (lease / 3).saturating_sub(kill_margin(lease))
}

/// Refuses an explicit `--kill-grace` that the `--ttl` cannot fit before the command is
/// started (the default adapts itself).
pub(crate) fn check_kill_grace(grace: Option<Duration>, ttl: Duration) -> Result<(), Failure> {
    match grace {
        Some(grace) if grace > max_kill_grace(ttl) => Err(Failure::usage(format!(
            "--kill-grace {} does not fit in --ttl {}: the command must be gone (SIGKILL) \
             before the lease can end, so the grace is at most ttl/3 - {} = {}",
            humantime::format_duration(grace),
            humantime::format_duration(ttl),
            humantime::format_duration(kill_margin(ttl)),
            humantime::format_duration(max_kill_grace(ttl)),
        ))),
        _ => Ok(()),
    }
}

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
    pub(crate) command: &'a [OsString],
    /// `--kill-grace`, if given (else [`DEFAULT_KILL_GRACE`], capped by the lease).
    pub(crate) kill_grace: Option<Duration>,
    /// `--release-on-exit`: release when the direct child exits, not its whole group.
    pub(crate) release_on_exit: bool,
    /// Variables beside DLOCK_NAME and DLOCK_TOKEN (DLOCK_FENCE, DLOCK_TERM, …).
    pub(crate) env: Vec<(&'static str, String)>,
}

/// `--min-hold`: how long after the command ended the lock is kept at least.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MinHold {
    hold: Duration,
    /// The shortest lease the store takes (memcached's one-second clock needs 2 s).
    shortest: Duration,
    /// The store's clock-drift allowance: a lease asked for `hold` may end that much
    /// early by the client's clock (memcached's whole-second expiry up to a second), so
    /// the lease kept is longer by it.
    drift: fencelock::validity::Drift,
}

impl MinHold {
    pub(crate) fn of<B: RawLock>(
        min_hold: Option<Duration>,
        shortest: Duration,
        backend: &B,
    ) -> Option<MinHold> {
        min_hold.map(|hold| MinHold {
            hold,
            shortest,
            drift: backend.drift(),
        })
    }

    /// The lease to leave behind: `hold` from now, whatever the store's clock does.
    fn lease(self) -> Duration {
        (self.hold + self.drift.of(self.hold))
            .max(self.shortest)
            .min(fencelock::MAX_TTL)
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

/// Why the command is being terminated.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Ending {
    /// The store says the lock is gone: someone else may hold it already. SIGKILL now.
    Lost,
    /// Renewals keep failing: SIGTERM, SIGKILL at `kill_at`.
    Expiring { kill_at: Instant },
}

/// [`supervise`], keeping the lock for `min_hold` after the command ended.
pub(crate) async fn supervise_run<X: RawLock>(
    guard: LockGuard<X>,
    job: &Job<'_>,
    mut signals: Signals,
    min_hold: Option<MinHold>,
) -> Result<u8, Failure> {
    let lease = guard.lease();
    let margin = kill_margin(lease);
    let grace = match job.kill_grace {
        None => DEFAULT_KILL_GRACE.min(max_kill_grace(lease)),
        Some(asked) if asked > max_kill_grace(lease) => {
            // Checked against --ttl before; a store may still grant a shorter lease
            // (ZooKeeper's session timeout caps it).
            let capped = max_kill_grace(lease);
            eprintln!(
                "dlock: warning: the store granted a {} lease; --kill-grace capped to {}",
                humantime::format_duration(lease),
                humantime::format_duration(capped)
            );
            capped
        }
        Some(asked) => asked,
    };
    // The command gets a process group of its own, so that signals (and termination on a
    // lost lock) reach everything it started, and the lock is held until the whole group
    // is gone. When dlock runs in the foreground of the terminal on its stdin and stdout,
    // that group gets the terminal's foreground while the command runs (as a shell gives
    // it to a job): Ctrl-C and Ctrl-Z reach the command's group directly. With stdout
    // elsewhere (`dlock run … | less`: a pager of dlock's group reads the terminal), the
    // group gets it only once the command reads the terminal (see `follow_stop`).
    let mut terminal = Terminal::ours();
    let eager = std::io::stdout().is_terminal();
    // Orphans of the command become our children, so that we can reap them (a group is
    // not empty while a zombie of it is left) instead of relying on PID 1 to.
    let _ = nix::sys::prctl::set_child_subreaper(true);
    let mut reaper = match Reaper::start() {
        Ok(reaper) => reaper,
        Err(failure) => {
            guard.release().await.ok();
            return Err(failure);
        }
    };
    let (hold_fd, hold_closed) = match hold_descriptor(job.release_on_exit) {
        Ok(hold) => hold,
        Err(failure) => {
            reaper.disarm();
            guard.release().await.ok();
            return Err(failure);
        }
    };
    // The hold pipe, to kill with the group whoever holds it open outside the group.
    let hold_inode = hold_fd
        .as_ref()
        .and_then(|fd| nix::sys::stat::fstat(fd).ok())
        .map_or(0, |st| st.st_ino);
    let (mut child, mut gate) = match spawn(job, guard.token(), hold_fd) {
        Ok(spawned) => spawned,
        Err(failure) => {
            reaper.disarm();
            guard.release().await.ok();
            return Err(failure);
        }
    };
    let pid = child.id().and_then(|id| i32::try_from(id).ok());
    let target = pid.map(|id| Pid::from_raw(-id));
    if let Some(target) = target {
        reaper.target(target);
        reaper.holders(hold_inode);
    }
    if let (Some(terminal), Some(pgid), true) = (&mut terminal, pid, eager) {
        terminal.give(Pid::from_raw(pgid));
    }
    // Only now that the reaper can kill it does the command run.
    gate.open();
    let lost = guard.lost();
    tokio::pin!(lost);
    let mut hold_closed = hold_closed;
    let mut hold_open = hold_closed.is_some();
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut forwarded = 0;
    let mut status: Option<ExitStatus> = None;
    let mut ending: Option<Ending> = None;
    let mut told_waiting = false;
    // When the command exited: the note on waiting for the rest of its group is printed
    // only if they are still running a moment later (the hold descriptor's end is seen a
    // little after the exit of a command that left nothing behind).
    let mut exited_at: Option<Instant> = None;
    loop {
        if let Some(st) = status {
            reap_group(pid);
            let group_gone = pid.is_none_or(group_empty);
            // Terminated: only what can still be signalled is waited for.
            let rest_gone = job.release_on_exit || (group_gone && (!hold_open || ending.is_some()));
            if rest_gone {
                break;
            }
            let exited = *exited_at.get_or_insert_with(Instant::now);
            if !told_waiting
                && ending.is_none()
                && !guard.is_lost()
                && exited.elapsed() >= Duration::from_millis(200)
            {
                told_waiting = true;
                eprintln!(
                    "dlock: the command exited ({}); holding the {} {:?} until the processes \
                     it started have exited too (--release-on-exit does not wait)",
                    describe(st),
                    job.what,
                    job.name
                );
            }
        }
        tokio::select! {
            st = child.wait(), if status.is_none() => {
                status = Some(st.map_err(|e| {
                    Failure::new(exit::UNAVAILABLE, format!("waiting for the command: {e}"))
                })?);
                // What is left of the group runs in the background, as a shell's job's
                // leftovers do.
                if let Some(terminal) = &mut terminal {
                    terminal.take_back();
                }
                continue;
            }
            _ = async { hold_closed.as_mut().expect("guarded").await }, if hold_open => {
                hold_open = false;
                hold_closed = None;
                continue;
            }
            () = &mut lost, if ending != Some(Ending::Lost) => {
                if ending.is_none() {
                    eprintln!(
                        "dlock: {} {:?} lost while the command ran; killing it (SIGKILL: \
                         another holder may have it already)",
                        job.what, job.name
                    );
                }
                ending = Some(Ending::Lost);
                kill_all(target, hold_inode);
            }
            _ = tick.tick() => {}
            sig = signals.recv() => {
                // (Ctrl-C on a terminal reaches the command's group, in the foreground,
                // not dlock: this one was sent to dlock.)
                forwarded += 1;
                // A second SIGINT/SIGTERM (or any while terminating) means "now": SIGKILL.
                let sig = if (forwarded > 1 || ending.is_some()) && sig != Signal::SIGHUP {
                    Signal::SIGKILL
                } else {
                    sig
                };
                signal_target(target, sig);
            }
        }
        // The deadlines, by the lease's clock: re-read every tick, as renewals move them.
        if let (Some(terminal), Some(pgid), None) = (&mut terminal, pid, status) {
            terminal.follow_stop(Pid::from_raw(pgid));
        }
        let now = Instant::now();
        let remaining = guard.remaining();
        let validity_end = now + remaining;
        if status.is_some() {
            reap_group(pid);
        }
        match ending {
            None if remaining <= grace + margin => {
                let kill_at = (now + grace).min(validity_end.checked_sub(margin).unwrap_or(now));
                eprintln!(
                    "dlock: {} {:?}: the lease is running out (renewals failing or late), {} of \
                     validity left; terminating the command (SIGTERM, SIGKILL after {})",
                    job.what,
                    job.name,
                    humantime::format_duration(round_ms(remaining)),
                    humantime::format_duration(round_ms(kill_at - now)),
                );
                ending = Some(Ending::Expiring { kill_at });
                signal_target(target, Signal::SIGTERM);
            }
            Some(Ending::Expiring { kill_at }) if now >= kill_at => {
                kill_all(target, hold_inode);
            }
            _ => {}
        }
        // The reaper's deadline: the same SIGKILL moment, should this process stop.
        let kill_at = match ending {
            Some(Ending::Expiring { kill_at }) => kill_at.min(validity_end),
            Some(Ending::Lost) => now,
            None => validity_end.checked_sub(margin).unwrap_or(now),
        };
        reaper
            .deadline(monotonic_ns().saturating_add(nanos(kill_at.saturating_duration_since(now))));
    }
    let status = status.expect("the loop ends after the command's exit");
    // The lease ran out before this process saw the command's whole group end: it was
    // stopped (its reaper killed the group at the lease's end), or the group's end and
    // the lease's came together. Lost, as when the loss is seen first: the command's
    // status (137 for the reaper's SIGKILL) is not the run's.
    if ending.is_none() && guard.is_lost() {
        eprintln!(
            "dlock: {} {:?} lost while the command ran (its lease ran out; the command \
             ended with {})",
            job.what,
            job.name,
            describe(status)
        );
        ending = Some(Ending::Lost);
    }
    if ending.is_some() {
        reaper.disarm();
        drop(guard.release().await);
        return Ok(exit::LOST);
    }
    // Done: nothing is left to kill (or, with --release-on-exit, left to run on purpose).
    reaper.disarm();
    let code = status_code(status);
    if let Some(min) = min_hold {
        return keep_for(guard, min, code).await;
    }
    match guard.release().await {
        Ok(()) => Ok(code),
        Err(err) if err.is_lock_lost() => Err(lost_after(&err)),
        Err(err) => {
            // The lease expires by itself; the command's result stands.
            eprintln!("dlock: warning: release failed ({err}); the lock expires within its ttl");
            Ok(code)
        }
    }
}

fn round_ms(d: Duration) -> Duration {
    Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn nanos(d: Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

/// SIGKILLs the command's group and every process that holds its hold descriptor.
fn kill_all(target: Option<Pid>, hold_inode: u64) {
    signal_target(target, Signal::SIGKILL);
    kill_holders(hold_inode);
}

fn signal_target(target: Option<Pid>, sig: Signal) {
    if let Some(target) = target {
        let _ = kill(target, sig);
    }
}

/// Whether no process of group `pgid` is left (zombies not yet reaped count).
fn group_empty(pgid: i32) -> bool {
    kill(Pid::from_raw(-pgid), None) == Err(Errno::ESRCH)
}

/// Reaps the exited processes of the command's group that became our children (orphans,
/// through the subreaper attribute). Only after the direct child was reaped by tokio,
/// which would otherwise lose its status to us.
fn reap_group(pid: Option<i32>) {
    let Some(pgid) = pid else {
        return;
    };
    for _ in 0..64 {
        match waitpid(Pid::from_raw(-pgid), Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) | Err(_) => return,
            Ok(_) => {}
        }
    }
}

/// The hold descriptor: the write end of a pipe that the command inherits (number in
/// `DLOCK_HOLD_FD`); the future resolves when every process holding it has exited or
/// closed it. `None` with `--release-on-exit`.
#[allow(clippy::type_complexity)]
fn hold_descriptor(
    release_on_exit: bool,
) -> Result<
    (
        Option<std::os::fd::OwnedFd>,
        Option<std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>>,
    ),
    Failure,
> {
    if release_on_exit {
        return Ok((None, None));
    }
    let failed = |e: std::io::Error| {
        Failure::new(
            exit::UNAVAILABLE,
            format!("cannot create the hold descriptor: {e}"),
        )
    };
    // Both ends close on exec; only a duplicate of the write end, made for the spawn,
    // is inherited (dup does not copy close-on-exec).
    let (mut reader, writer) = std::io::pipe().map_err(failed)?;
    let inherited = nix::unistd::dup(&writer).map_err(|e| failed(e.into()))?;
    drop(writer);
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    // A thread, not a blocking task: the runtime would wait for it at exit when a
    // process that left the group keeps the descriptor open past a termination.
    std::thread::spawn(move || {
        let mut buf = [0_u8; 64];
        loop {
            match reader.read(&mut buf) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.kind() == IoErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        let _ = tx.send(());
    });
    Ok((
        Some(inherited),
        Some(Box::pin(async move {
            let _ = rx.await;
        })),
    ))
}

/// The exit status in words, for the note on waiting for the rest of the group.
fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("status {code}"),
        (None, Some(sig)) => format!("signal {sig}"),
        _ => "unknown status".to_owned(),
    }
}

/// The lock was found lost when the command had finished.
pub(crate) fn lost_after(err: &fencelock::Error) -> Failure {
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

/// Starts the command behind the gate ([`super::reaper::gate_main`]): it runs once
/// [`Gate::open`] is called, after the reaper knows its pid.
fn spawn(
    job: &Job<'_>,
    token: &fencelock::Token,
    hold_fd: Option<std::os::fd::OwnedFd>,
) -> Result<(Child, Gate), Failure> {
    if job.command.is_empty() {
        return Err(Failure::usage("no command given after --"));
    }
    let exe = std::env::current_exe().map_err(|e| {
        Failure::new(
            exit::UNAVAILABLE,
            format!("cannot find dlock's own binary: {e}"),
        )
    })?;
    let failed = |e: std::io::Error| {
        Failure::new(
            exit::UNAVAILABLE,
            format!("cannot create the command's gate: {e}"),
        )
    };
    let (reader, writer) = std::io::pipe().map_err(failed)?;
    let inherited = nix::unistd::dup(&reader).map_err(|e| failed(e.into()))?;
    drop(reader);
    let mut command = Command::new(exe);
    command.process_group(0);
    command
        .arg(super::reaper::GATE_ARG)
        .arg(inherited.as_raw_fd().to_string())
        .args(job.command)
        .env("DLOCK_NAME", job.name)
        .env("DLOCK_TOKEN", token.as_str())
        .envs(job.env.iter().map(|(k, v)| (k, v)));
    if let Some(fd) = &hold_fd {
        command.env("DLOCK_HOLD_FD", fd.as_raw_fd().to_string());
    }
    let spawned = command.stdin(Stdio::inherit()).spawn();
    // Ours close now: the hold pipe reports its end when the command's copies are all
    // closed, and the gate's reader lives in the gate only.
    drop(hold_fd);
    drop(inherited);
    let child = spawned.map_err(|e| {
        Failure::new(
            exit::CANNOT_EXECUTE,
            format!("cannot start the command: {e}"),
        )
    })?;
    Ok((child, Gate(Some(writer))))
}

/// The write end of the gate: the command runs when it is opened, never if it is dropped
/// (or dlock dies) first.
struct Gate(Option<std::io::PipeWriter>);

impl Gate {
    fn open(&mut self) {
        if let Some(mut writer) = self.0.take() {
            use std::io::Write as _;
            let _ = writer.write_all(b"g");
        }
    }
}

/// dlock's controlling terminal, on its stdin. When dlock's process group is in its
/// foreground, the command's group is given the foreground while the command runs (from
/// the start if stdout is the terminal too, else once the command reads the terminal), as
/// a shell gives it to a job, so that the terminal's signals (Ctrl-C, Ctrl-Z, Ctrl-\)
/// reach the command's group; it is taken back when the command exits (and on every way
/// out of the supervisor). A stop of the command (Ctrl-Z, or reading the terminal from the
/// background) stops dlock too, as a shell's job stops as a whole.
struct Terminal {
    /// dlock's own process group.
    ours: Pid,
    /// The command's group, while it has the foreground.
    given: Option<Pid>,
}

impl Terminal {
    /// `Some` if stdin is dlock's controlling terminal.
    fn ours() -> Option<Terminal> {
        let stdin = std::io::stdin();
        if !stdin.is_terminal() || tcgetpgrp(&stdin).is_err() {
            return None;
        }
        Some(Terminal {
            ours: getpgrp(),
            given: None,
        })
    }

    fn foreground_is_ours(&self) -> bool {
        tcgetpgrp(std::io::stdin()).ok() == Some(self.ours)
    }

    /// Gives the foreground to `group` if dlock's group has it (not when dlock runs in the
    /// background).
    fn give(&mut self, group: Pid) {
        if self.foreground_is_ours() && set_foreground(group) {
            self.given = Some(group);
        }
    }

    /// Takes the foreground back for dlock's group, if the command's group still has it.
    fn take_back(&mut self) {
        if let Some(group) = self.given.take()
            && tcgetpgrp(std::io::stdin()).ok() == Some(group)
        {
            set_foreground(self.ours);
        }
    }

    /// If the command was stopped: for reading (or setting) the terminal that dlock's
    /// group has in the foreground, gives it the foreground and continues it. Otherwise
    /// (Ctrl-Z, or the terminal read while dlock runs in the background) does what a
    /// shell's job does: takes the terminal back and stops dlock with the same signal (the
    /// shell that started it sees its job stopped); once continued (`fg`, `bg`), gives the
    /// foreground to the command's group if dlock has it, and continues the group. While dlock is stopped it renews nothing, and the reaper kills the group
    /// before the lease can end, as for any paused dlock.
    fn follow_stop(&mut self, group: Pid) {
        let flags = WaitPidFlag::WSTOPPED | WaitPidFlag::WNOHANG;
        let Ok(WaitStatus::Stopped(_, sig)) = waitid(Id::Pid(group), flags) else {
            return;
        };
        let tty_stop = matches!(sig, Signal::SIGTTIN | Signal::SIGTTOU);
        if tty_stop && self.given.is_none() && self.foreground_is_ours() {
            // The command wants the terminal that dlock's group has: it gets it.
            self.give(group);
            let _ = kill(Pid::from_raw(-group.as_raw()), Signal::SIGCONT);
            return;
        }
        self.take_back();
        let sig = match sig {
            Signal::SIGTTIN | Signal::SIGTTOU => sig,
            _ => Signal::SIGTSTP,
        };
        // (Discarded by the kernel if dlock's group is orphaned: no shell to continue it.)
        let _ = raise(sig);
        self.give(group);
        let _ = kill(Pid::from_raw(-group.as_raw()), Signal::SIGCONT);
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        self.take_back();
    }
}

/// Blocks SIGTTOU in the calling thread, and so in every thread it starts afterwards (the
/// runtime's): called first thing by `dlock run` and `dlock elect`, whose messages (the
/// lock lost, the lease running out) are written while the command's group has the
/// terminal's foreground, so that a terminal set to stop background writers (`stty
/// tostop`) does not stop dlock then. The command does not inherit it: the gate in front
/// of it unblocks SIGTTOU before it execs the command.
pub(crate) fn write_from_the_background() {
    let mut ttou = SigSet::empty();
    ttou.add(Signal::SIGTTOU);
    let _ = ttou.thread_block();
}

/// Makes `group` the foreground group of the terminal on stdin. SIGTTOU is blocked in
/// this thread meanwhile, as shells do: a background group (dlock's, taking the terminal
/// back) would otherwise be stopped by it.
fn set_foreground(group: Pid) -> bool {
    let mut ttou = SigSet::empty();
    ttou.add(Signal::SIGTTOU);
    let mut before = SigSet::empty();
    let blocked = pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&ttou), Some(&mut before)).is_ok();
    let done = tcsetpgrp(std::io::stdin(), group).is_ok();
    if blocked {
        let _ = pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&before), None);
    }
    done
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
    use proptest::prelude::*;

    use super::*;
    use crate::hostile::cases;

    proptest! {
        #![proptest_config(cases(256))]

        /// For every lease: SIGTERM at grace + margin of remaining validity is below what
        /// renewals every third of the lease keep it above, and SIGKILL lands before the
        /// validity ends.
        #[test]
        fn the_kill_fits_inside_the_lease(ms in 100_u64..86_400_000) {
            let lease = Duration::from_millis(ms);
            let (grace, margin) = (max_kill_grace(lease), kill_margin(lease));
            prop_assert!(margin > Duration::ZERO);
            prop_assert!(grace + margin <= lease / 3);
            prop_assert!(check_kill_grace(Some(grace), lease).is_ok());
            prop_assert!(check_kill_grace(Some(grace + Duration::from_millis(1)), lease).is_err());
            prop_assert!(check_kill_grace(None, lease).is_ok());
        }
    }

    /// The case: a 3 s ttl with the 10 s default grace.
    #[test]
    fn a_grace_longer_than_the_lease_allows_is_refused_with_the_bound() {
        let err = check_kill_grace(Some(Duration::from_secs(10)), Duration::from_secs(3))
            .expect_err("refused");
        assert_eq!(err.code, exit::USAGE);
        assert!(
            err.message.contains("at most ttl/3 - 100ms = 900ms"),
            "{}",
            err.message
        );
    }
}
