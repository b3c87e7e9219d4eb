//! The command kinds (`run-supervised`, `run-supervised-zookeeper`, and their control
//! `run-unsupervised`): the workers are processes of the shipped `dlock` binary, each
//! running a shell command that behaves as the commands of a user's reproduction did — it ignores
//! SIGTERM, writes to the resource for longer than a lease, and leaves a process in the
//! background that writes again after the command itself has exited. None of its writes
//! carries a fence: only `dlock run`'s supervision can keep them inside the lock.
//!
//! The resource is a file that every write appends one line to (`O_APPEND`, one
//! `write(2)`): who wrote (the worker, the harness's id of that `dlock` process), what
//! (`start`, the command's first write, which marks the grant; `write`, the command's
//! own; `late`, its background process's), when (CLOCK_MONOTONIC, which every process of
//! the host shares), the writer's process group, the fence and the token. The writer is
//! this binary's hidden `torture-append` subcommand, started by the shell like any
//! program: a command needs nothing but a shell. The harness reads the file once the kind
//! has run; a holder's hold lasts from its `start` to the last write of anything its
//! command started, so a write after the next holder's grant is an overlap — two holders
//! at once, which no fault excuses: not even a pause of that holder's `dlock` process,
//! whose reaper process holds the same kill deadline.

use std::fs::OpenOptions;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::args::AppendArgs;
use crate::exit::{self, Failure};
use crate::model::{Kind, monotonic_ns};
use crate::worker::Step;

/// The resource file, for the command's writes.
pub(crate) const RESOURCE_ENV: &str = "DLOCK_TORTURE_RESOURCE";
/// The harness's id of the `dlock` process (the worker) the command runs under.
pub(crate) const WORKER_ENV: &str = "DLOCK_TORTURE_WORKER";
/// This binary, which the command runs to write (`torture-append`).
pub(crate) const HELPER_ENV: &str = "DLOCK_TORTURE_HELPER";
/// The control's worker script: the `dlock` binary, the lock's name, the command, and
/// how long to wait for the lock and hold it.
const DLOCK_ENV: &str = "DLOCK_TORTURE_DLOCK";
const LOCK_ENV: &str = "DLOCK_TORTURE_LOCK";
const COMMAND_ENV: &str = "DLOCK_TORTURE_COMMAND";
const WAIT_ENV: &str = "DLOCK_TORTURE_WAIT_MS";
const TTL_ENV: &str = "DLOCK_TORTURE_TTL_MS";

/// How often a command's writer appends while it runs.
const EVERY: Duration = Duration::from_millis(50);

/// What one line of the resource says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Event {
    /// The command's first write: the grant it runs under (also printed on stdout, as
    /// the worker's `Acquired` step, so that the nemesis sees the grant as it happens).
    Start,
    /// A write of the command itself (its foreground).
    Write,
    /// A write of the process the command left in the background.
    Late,
}

impl Event {
    fn word(self) -> &'static str {
        match self {
            Event::Start => "start",
            Event::Write => "write",
            Event::Late => "late",
        }
    }

    fn parse(word: &str) -> Option<Event> {
        [Event::Start, Event::Write, Event::Late]
            .into_iter()
            .find(|e| e.word() == word)
    }
}

/// The shell command each holder runs, its timing drawn from the kind's `ttl` (3 s: writes
/// for 4 s, a lease and a third; its background process writes from 4.3 s to 4.8 s, after
/// the command has exited). It ignores SIGTERM, and so does everything it starts (an
/// ignored signal stays ignored across `fork` and `exec`): only SIGKILL ends it early.
pub(crate) fn script(ttl: Duration) -> String {
    let ms = |d: Duration| d.as_millis();
    let foreground = ttl * 4 / 3;
    let late_after = foreground + ttl / 10;
    let late_for = ttl / 6;
    format!(
        "trap '' TERM\n\
         \"${HELPER_ENV}\" torture-append start || exit 1\n\
         \"${HELPER_ENV}\" torture-append late --after-ms {} --for-ms {} &\n\
         \"${HELPER_ENV}\" torture-append write --for-ms {}\n\
         exit 0\n",
        ms(late_after),
        ms(late_for),
        ms(foreground),
    )
}

/// The control's worker: the same command, under a lock taken with `dlock acquire` (a
/// lease of --ttl, never renewed) and given back with `dlock release` once the command
/// has exited — no supervisor. Its lease ends while the command still writes.
const CONTROL: &str = "\
out=$(\"$DLOCK_TORTURE_DLOCK\" acquire --prefix= --ttl \"${DLOCK_TORTURE_TTL_MS}ms\" \
--wait \"${DLOCK_TORTURE_WAIT_MS}ms\" \"$DLOCK_TORTURE_LOCK\") || exit $?
set -- $out
export DLOCK_TOKEN=\"$1\" DLOCK_FENCE=\"$2\"
sh -c \"$DLOCK_TORTURE_COMMAND\"
exec \"$DLOCK_TORTURE_DLOCK\" release --prefix= \"$DLOCK_TORTURE_LOCK\"
";

/// Where the `dlock` binary is: beside this one (as `cargo build` and `cargo install` of
/// both crates leave them, and as `dlock torture` found this one), else on `PATH`.
pub(crate) fn dlock_binary() -> Result<PathBuf, String> {
    let beside = std::env::current_exe()
        .map_err(|e| format!("cannot find dlock-torture itself: {e}"))?
        .with_file_name("dlock");
    if beside.is_file() {
        return Ok(beside);
    }
    std::env::var_os("PATH")
        .and_then(|path| {
            std::env::split_paths(&path)
                .map(|dir| dir.join("dlock"))
                .find(|p| p.is_file())
        })
        .ok_or_else(|| {
            format!(
                "the dlock binary, which is neither beside dlock-torture ({}) nor on PATH \
                 (cargo build -p fencelock-cli)",
                beside.display()
            )
        })
}

/// What a command kind's worker process is: `dlock` (or, for the control, `sh`), its
/// arguments, and the environment it needs beside the store's URL.
pub(crate) struct Worker {
    pub(crate) program: PathBuf,
    pub(crate) args: Vec<String>,
    pub(crate) env: Vec<(&'static str, String)>,
}

/// The workers of one command kind's run.
pub(crate) struct Workers {
    pub(crate) dlock: PathBuf,
    pub(crate) helper: PathBuf,
    pub(crate) resource: PathBuf,
    /// The lock's name (no key prefix: `--prefix=`, as the harness's own plain locks).
    pub(crate) name: String,
    pub(crate) ttl: Duration,
}

impl Workers {
    /// Worker `id`, which may wait for the lock until `until`.
    pub(crate) fn worker(&self, kind: Kind, id: usize, until: u64) -> Worker {
        let ms = |d: Duration| d.as_millis().to_string();
        let wait = Duration::from_nanos(until.saturating_sub(monotonic_ns()))
            .max(Duration::from_millis(1));
        let script = script(self.ttl);
        let mut env = vec![
            (RESOURCE_ENV, self.resource.display().to_string()),
            (WORKER_ENV, id.to_string()),
            (HELPER_ENV, self.helper.display().to_string()),
        ];
        if kind == Kind::RunUnsupervised {
            env.extend([
                (DLOCK_ENV, self.dlock.display().to_string()),
                (LOCK_ENV, self.name.clone()),
                (COMMAND_ENV, script),
                (WAIT_ENV, ms(wait)),
                (TTL_ENV, ms(self.ttl)),
            ]);
            return Worker {
                program: PathBuf::from("sh"),
                args: vec!["-c".to_owned(), CONTROL.to_owned()],
                env,
            };
        }
        // `dlock run` with its defaults (--kill-grace 10 s) but a short ttl: the reproduction's
        // reproduction.
        let args = [
            "run",
            "--prefix=",
            "--ttl",
            &format!("{}ms", ms(self.ttl)),
            "--wait",
            &format!("{}ms", ms(wait)),
            &self.name,
            "--",
            "sh",
            "-c",
            &script,
        ]
        .map(str::to_owned)
        .to_vec();
        Worker {
            program: self.dlock.clone(),
            args,
            env,
        }
    }
}

/// Whether a command kind's worker ended as it may under the faults: the command's own
/// status (0), the lock lost (76), the store unreachable (69: a partition), the wait for
/// the lock run out at the run's end (75), or — the control's `dlock release` after its
/// lease ran out — the lock held under another token (77) or by nobody (79). Anything
/// else — a usage error, a command not found, a crash — fails the kind.
pub(crate) fn exit_ok(status: ExitStatus) -> bool {
    matches!(status.code(), Some(0 | 69 | 75 | 76 | 77 | 79))
}

/// One line of the resource.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Record {
    pub(crate) worker: usize,
    pub(crate) event: Event,
    pub(crate) t: u64,
    pub(crate) pgid: i32,
    pub(crate) fence: u64,
    pub(crate) token: String,
}

impl Record {
    fn line(&self) -> String {
        format!(
            "{} {} {} {} {} {}\n",
            self.worker,
            self.event.word(),
            self.t,
            self.pgid,
            self.fence,
            self.token
        )
    }

    fn parse(line: &str) -> Option<Record> {
        let mut words = line.splitn(6, ' ');
        Some(Record {
            worker: words.next()?.parse().ok()?,
            event: Event::parse(words.next()?)?,
            t: words.next()?.parse().ok()?,
            pgid: words.next()?.parse().ok()?,
            fence: words.next()?.parse().ok()?,
            token: words.next().unwrap_or_default().to_owned(),
        })
    }

    /// The record as a step of its worker's history.
    pub(crate) fn step(&self) -> Step {
        match self.event {
            Event::Start => Step::Acquired {
                t: self.t,
                token: self.token.clone(),
                fence: self.fence,
            },
            Event::Write | Event::Late => Step::Appended {
                t: self.t,
                late: self.event == Event::Late,
            },
        }
    }
}

/// Every well-formed line of the resource at `path` (none if it was never written).
pub(crate) fn read(path: &Path) -> Vec<Record> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(Record::parse)
        .collect()
}

/// SIGKILLs every process group that wrote to the resource and may still be there (once
/// the run is over and every command should have ended by itself): nothing of a run
/// outlives it.
pub(crate) fn kill_groups(records: &[Record]) {
    // Never the harness's own group (every command kind's worker has a group of its own,
    // but a record is only a line in a file).
    let ours = nix::unistd::getpgrp().as_raw();
    let mut groups: Vec<i32> = records
        .iter()
        .map(|r| r.pgid)
        .filter(|&g| g > 1 && g != ours)
        .collect();
    groups.sort_unstable();
    groups.dedup();
    for group in groups {
        let _ = kill(Pid::from_raw(-group), Signal::SIGKILL);
    }
}

/// `dlock-torture torture-append`: what a command runs to write to the resource (see the
/// module docs). The file, the worker and the grant come from the environment the
/// command inherited (`DLOCK_FENCE`, `DLOCK_TOKEN` from `dlock run` or the control).
pub(crate) fn append(args: &AppendArgs) -> Result<u8, Failure> {
    let var = |name: &str| {
        std::env::var(name).map_err(|_| Failure::usage(format!("torture-append needs ${name}")))
    };
    let path = var(RESOURCE_ENV)?;
    let worker: usize = var(WORKER_ENV)?
        .parse()
        .map_err(|_| Failure::usage(format!("${WORKER_ENV} is no worker id")))?;
    let fence = std::env::var("DLOCK_FENCE")
        .ok()
        .and_then(|f| f.parse().ok())
        .unwrap_or(0);
    let token = std::env::var("DLOCK_TOKEN")
        .unwrap_or_default()
        .replace(char::is_whitespace, "_");
    std::thread::sleep(Duration::from_millis(args.after_ms));
    let mut file = OpenOptions::new()
        .append(true)
        .create(true)
        .open(&path)
        .map_err(|e| Failure::new(exit::UNAVAILABLE, format!("opening {path}: {e}")))?;
    let until = monotonic_ns() + args.for_ms * 1_000_000;
    loop {
        let record = Record {
            worker,
            event: args.event,
            t: monotonic_ns(),
            pgid: nix::unistd::getpgrp().as_raw(),
            fence,
            token: token.clone(),
        };
        // One write(2) of a short line to a file opened O_APPEND: whole, never mixed
        // with another writer's.
        file.write_all(record.line().as_bytes())
            .map_err(|e| Failure::new(exit::UNAVAILABLE, format!("writing {path}: {e}")))?;
        if args.event == Event::Start
            && let Ok(line) = serde_json::to_string(&record.step())
        {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{line}");
            let _ = out.flush();
        }
        if monotonic_ns() + u64::try_from(EVERY.as_nanos()).unwrap_or(0) > until {
            return Ok(exit::SUCCESS);
        }
        std::thread::sleep(EVERY);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_reads_back_as_written_and_a_torn_line_is_skipped() {
        let record = Record {
            worker: 7,
            event: Event::Late,
            t: 123_456_789,
            pgid: 4242,
            fence: 9,
            token: "abc~def".to_owned(),
        };
        let line = record.line();
        assert_eq!(Record::parse(line.trim_end()), Some(record.clone()));
        assert_eq!(
            record.step(),
            Step::Appended {
                t: 123_456_789,
                late: true
            }
        );
        assert_eq!(Record::parse("7 late 12"), None);
        assert_eq!(Record::parse("7 sideways 1 2 3 x"), None);
    }

    #[test]
    fn the_command_outlasts_its_lease_and_its_background_writer_outlasts_it() {
        let text = script(Duration::from_secs(3));
        assert!(text.starts_with("trap '' TERM\n"), "{text}");
        assert!(text.contains("write --for-ms 4000\n"), "{text}");
        assert!(
            text.contains("late --after-ms 4300 --for-ms 500 &\n"),
            "{text}"
        );
    }
}
