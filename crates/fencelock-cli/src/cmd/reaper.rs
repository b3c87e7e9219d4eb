//! The reaper: a small process of its own (this binary, started as `dlock
//! __dlock-reaper`) that SIGKILLs the command's process group at a deadline on
//! CLOCK_MONOTONIC unless `dlock run` keeps moving the deadline on.
//!
//! Why a process: `dlock run` kills the command before its lease can end, but a `dlock`
//! that is paused (SIGSTOP, a debugger, a swapped-out process) or killed cannot kill
//! anything, while the command goes on running and the lease runs out. The reaper is the
//! backstop: `dlock run` tells it, after every renewal, the moment by which the group must
//! be gone (the lease's validity end less a margin, on the monotonic clock that every
//! process of the host shares), and it kills the group then if `dlock run` has not moved
//! the deadline since. If `dlock run` dies, the reaper's stdin closes and it kills the
//! group at once. It sits in a process group of its own, so that neither the terminal's
//! signals nor those sent to the command's group reach it.
//!
//! The protocol on its stdin, one line each: `G <pid>` the target (a negative pid: a
//! process group), `H <inode>` the hold descriptor's pipe (every process that holds it
//! open is killed with the target: a process that left the command's group but kept the
//! descriptor), `D <ns>` the deadline (CLOCK_MONOTONIC nanoseconds), `X` disarm and exit.
//! End of input without `X`: kill now.
//!
//! The command is started through a gate (this binary again, as `dlock __dlock-gate FD
//! COMMAND…`) that waits on a pipe until the reaper knows the command's pid, then execs
//! the command in place (same pid, same process group): so no instant exists in which
//! the command runs and a `dlock` killed then would leave it unsupervised.

use std::io::{BufRead, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::{Signal, kill};
use nix::time::{ClockId, clock_gettime};
use nix::unistd::Pid;

use crate::exit::{self, Failure};

/// The argument that starts this binary as the reaper.
pub(crate) const ARG: &str = "__dlock-reaper";
/// The argument that starts this binary as the gate in front of the command.
pub(crate) const GATE_ARG: &str = "__dlock-gate";

/// The gate's main (`dlock __dlock-gate FD PROGRAM ARGS…`): reads the descriptor FD to
/// its end (`dlock run` closes it once the reaper knows this pid; then its first byte
/// says go), closes it and execs the command. Without the go byte, `dlock run` died: the
/// command is not run. Returns only on failure, with the shell's codes (127 not found,
/// 126 not executable).
pub(crate) fn gate_main(mut args: impl Iterator<Item = std::ffi::OsString>) -> u8 {
    use std::io::Read as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    use std::os::unix::process::CommandExt as _;
    let fd = args
        .next()
        .and_then(|fd| fd.to_str().and_then(|fd| fd.parse::<i32>().ok()));
    let (Some(fd), Some(program)) = (fd, args.next()) else {
        return exit::USAGE;
    };
    // The descriptor is reopened by path (no unsafe code takes a raw number here), the
    // number itself closed, so the command inherits nothing of the gate. Opened without
    // blocking (a pipe whose writer is gone would block the open), then blocking again.
    let path = format!("/proc/self/fd/{fd}");
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::fcntl::OFlag::O_NONBLOCK.bits())
        .open(&path);
    let _ = nix::unistd::close(fd);
    let Ok(gate) = opened else {
        return exit::USAGE;
    };
    let _ = nix::fcntl::fcntl(
        &gate,
        nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::empty()),
    );
    let mut go = [0_u8; 1];
    let mut gate = gate;
    let opened = matches!(gate.read(&mut go), Ok(1)) && go[0] == b'g';
    drop(gate);
    if !opened {
        return 1;
    }
    // dlock blocks SIGTTOU for itself (`supervise::write_from_the_background`); the
    // command starts without that block, which a spawned process inherits.
    let mut ttou = nix::sys::signal::SigSet::empty();
    ttou.add(Signal::SIGTTOU);
    let _ = ttou.thread_unblock();
    let err = Command::new(&program).args(args).exec();
    eprintln!("dlock: cannot run {}: {err}", program.to_string_lossy());
    if err.kind() == std::io::ErrorKind::NotFound {
        exit::NOT_FOUND
    } else {
        exit::CANNOT_EXECUTE
    }
}

/// Nanoseconds on CLOCK_MONOTONIC (the clock `Instant` reads, shared by every process).
pub(crate) fn monotonic_ns() -> i64 {
    clock_gettime(ClockId::CLOCK_MONOTONIC)
        .map(|t| {
            t.tv_sec()
                .saturating_mul(1_000_000_000)
                .saturating_add(t.tv_nsec())
        })
        .unwrap_or(0)
}

/// `dlock run`'s end of the reaper.
pub(crate) struct Reaper {
    child: Child,
    stdin: Option<ChildStdin>,
    /// The last deadline sent (to send only changes).
    sent: i64,
}

impl Reaper {
    /// Starts the reaper (before the command, so that a command never runs without it).
    pub(crate) fn start() -> Result<Reaper, Failure> {
        let exe = std::env::current_exe().map_err(|e| {
            Failure::new(
                exit::UNAVAILABLE,
                format!("cannot find dlock's own binary: {e}"),
            )
        })?;
        let mut command = Command::new(exe);
        use std::os::unix::process::CommandExt as _;
        command
            .arg(ARG)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .process_group(0);
        let mut child = command.spawn().map_err(|e| {
            Failure::new(
                exit::UNAVAILABLE,
                format!("cannot start the process that kills the command on time: {e}"),
            )
        })?;
        let stdin = child.stdin.take();
        Ok(Reaper {
            child,
            stdin,
            sent: i64::MIN,
        })
    }

    fn send(&mut self, line: &str) {
        if let Some(stdin) = &mut self.stdin {
            // A reaper that died cannot be helped: `dlock run`'s own deadline still holds.
            let _ = stdin
                .write_all(line.as_bytes())
                .and_then(|()| stdin.flush());
        }
    }

    /// Whom to kill: a process group (negative) or a process.
    pub(crate) fn target(&mut self, target: Pid) {
        self.send(&format!("G {}\n", target.as_raw()));
    }

    /// Kill with the target every process that holds the pipe `inode` open.
    pub(crate) fn holders(&mut self, inode: u64) {
        self.send(&format!("H {inode}\n"));
    }

    /// Kill the target at `deadline` (CLOCK_MONOTONIC ns) unless moved before.
    /// Floored to the millisecond (earlier, never later), so that the same deadline,
    /// re-read every tick through two clocks, is sent once per change, not once per tick.
    pub(crate) fn deadline(&mut self, deadline: i64) {
        let deadline = deadline - deadline.rem_euclid(1_000_000);
        if deadline != self.sent {
            self.sent = deadline;
            self.send(&format!("D {deadline}\n"));
        }
    }

    /// Stop without killing (the command's group is gone, or left to run on purpose).
    pub(crate) fn disarm(mut self) {
        self.send("X\n");
        self.stdin = None;
        let _ = self.child.wait();
    }
}

/// The reaper's main: reads the protocol on stdin, kills on the deadline or at the end of
/// input, exits.
pub(crate) fn main() -> u8 {
    let target = Arc::new(AtomicI32::new(0));
    let hold = Arc::new(AtomicU64::new(0));
    let deadline = Arc::new(AtomicI64::new(i64::MAX));
    let orphaned = Arc::new(AtomicBool::new(false));
    {
        let (target, hold, deadline, orphaned) = (
            target.clone(),
            hold.clone(),
            deadline.clone(),
            orphaned.clone(),
        );
        std::thread::spawn(move || {
            let stdin = std::io::stdin();
            for line in stdin.lock().lines() {
                let Ok(line) = line else { break };
                let mut parts = line.splitn(2, ' ');
                match (parts.next(), parts.next()) {
                    (Some("G"), Some(pid)) => {
                        if let Ok(pid) = pid.parse() {
                            target.store(pid, Ordering::SeqCst);
                        }
                    }
                    (Some("H"), Some(inode)) => {
                        if let Ok(inode) = inode.parse() {
                            hold.store(inode, Ordering::SeqCst);
                        }
                    }
                    (Some("D"), Some(ns)) => {
                        if let Ok(ns) = ns.parse() {
                            deadline.store(ns, Ordering::SeqCst);
                        }
                    }
                    (Some("X"), None) => std::process::exit(0),
                    _ => {}
                }
            }
            orphaned.store(true, Ordering::SeqCst);
        });
    }
    loop {
        let now = monotonic_ns();
        let due = deadline.load(Ordering::SeqCst);
        if orphaned.load(Ordering::SeqCst) || now >= due {
            break;
        }
        let wait = u64::try_from(due.saturating_sub(now)).unwrap_or(0);
        std::thread::sleep(Duration::from_nanos(wait).min(Duration::from_millis(5)));
    }
    let pid = target.load(Ordering::SeqCst);
    if pid == 0 || pid == -1 {
        return 0;
    }
    let inode = hold.load(Ordering::SeqCst);
    // Until nothing is left to signal (zombies still count: bounded at two seconds).
    for _ in 0..200 {
        kill_holders(inode);
        match kill(Pid::from_raw(pid), Signal::SIGKILL) {
            Err(Errno::ESRCH) => break,
            _ => std::thread::sleep(Duration::from_millis(10)),
        }
    }
    kill_holders(inode);
    0
}

/// SIGKILLs every process that has the pipe `inode` open, as far as /proc shows (the
/// processes of this user), but this one and its parent (`dlock run`, which holds the
/// pipe's read end, and is the reaper's parent); nothing for inode 0. The hold
/// descriptor's holders outside the command's process group (`setsid`) are part of the
/// command too.
pub(crate) fn kill_holders(inode: u64) {
    if inode == 0 {
        return;
    }
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return;
    };
    let link = std::ffi::OsString::from(format!("pipe:[{inode}]"));
    let me = std::process::id();
    let parent = u32::try_from(nix::unistd::getppid().as_raw()).unwrap_or(0);
    for entry in procs.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == me || pid == parent {
            continue;
        }
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else {
            continue;
        };
        let holds = fds
            .flatten()
            .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|l| l.as_os_str() == link));
        if holds && let Ok(pid) = i32::try_from(pid) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
}
