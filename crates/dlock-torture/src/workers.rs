//! Worker processes of `dlock demo` and `dlock torture`: this same binary, run with a
//! hidden subcommand, reporting one line per event on its stdout; for the torture, the
//! [`Spawner`] that starts them and the [`Running`] record the nemesis keeps of each.

use std::process::Stdio;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Child;
use tokio::task::JoinHandle;

use crate::exit::{self, Failure};
use crate::model::Kind;
use crate::worker::Step;

/// Starts `dlock-torture <args>` and hands each line it prints to `on_line`, from a task that
/// ends at the worker's EOF. The worker is killed if the `Child` is dropped.
pub(crate) fn spawn(
    args: &[String],
    env: &[(String, std::ffi::OsString)],
    on_line: impl Fn(&str) + Send + 'static,
) -> Result<(Child, Option<JoinHandle<()>>), Failure> {
    let exe = std::env::current_exe().map_err(|e| {
        Failure::new(
            exit::CANNOT_EXECUTE,
            format!("cannot find dlock-torture itself: {e}"),
        )
    })?;
    let mut child = tokio::process::Command::new(exe)
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| Failure::new(exit::CANNOT_EXECUTE, format!("cannot start a worker: {e}")))?;
    let reader = child.stdout.take().map(|out| {
        tokio::spawn(async move {
            let mut lines = BufReader::new(out).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                on_line(line.trim());
            }
        })
    });
    Ok((child, reader))
}

pub(crate) struct Running {
    pub(crate) id: usize,
    pub(crate) slot: usize,
    pub(crate) child: Child,
    /// Reads the worker's history lines until EOF.
    pub(crate) reader: Option<tokio::task::JoinHandle<()>>,
    pub(crate) holding: bool,
    pub(crate) alive: bool,
    /// Under a fault now (paused, or its proxy faulted): not a target for another.
    pub(crate) faulted: bool,
    pub(crate) killed: bool,
}

/// Starts worker processes for one kind.
pub(crate) struct Spawner {
    pub(crate) kind: Kind,
    pub(crate) urls: Vec<String>,
    pub(crate) resource_url: String,
    pub(crate) keys_base: String,
    pub(crate) ttl_ms: u64,
    pub(crate) until: u64,
    pub(crate) tx: tokio::sync::mpsc::UnboundedSender<(usize, Step)>,
    /// Whether the workers report how far their wall clock is off the real one (a
    /// `clock` line at their start and whenever it moves): when it may be moved.
    pub(crate) report_wall_clock: bool,
    /// The workers' environment beyond ours: the fake wall clock's, when the kind's
    /// workers run under one (the `client-clock` fault).
    pub(crate) env: Vec<(String, std::ffi::OsString)>,
    /// The command kinds' workers (`dlock` processes), in place of this binary's.
    pub(crate) commands: Option<crate::command::Workers>,
}

impl Spawner {
    pub(crate) fn spawn(&self, id: usize, slot: usize) -> Result<Running, Failure> {
        if let Some(commands) = &self.commands {
            return self.spawn_command(commands, id, slot);
        }
        // The lock server's URL (with its password, if any) in the environment, not on
        // the command line.
        let mut args: Vec<String> = [
            "torture-worker",
            "--kind",
            self.kind.id(),
            "--resource-url",
            &self.resource_url,
            "--keys",
            &self.keys_base,
            "--ttl-ms",
            &self.ttl_ms.to_string(),
            "--until-ns",
            &self.until.to_string(),
        ]
        .iter()
        .map(|a| (*a).to_owned())
        .collect();
        if self.report_wall_clock {
            // Read here, under the real clock.
            args.push(format!(
                "--real-wall-minus-monotonic-ns={}",
                crate::model::wall_minus_monotonic_ns()
            ));
        }
        let tx = self.tx.clone();
        let mut env = self.env.clone();
        env.push((
            crate::args::TORTURE_WORKER_LOCK_URL.to_owned(),
            self.urls[slot].clone().into(),
        ));
        let (child, reader) = spawn(&args, &env, move |line| {
            if let Ok(step) = serde_json::from_str::<Step>(line) {
                let _ = tx.send((id, step));
            }
        })?;
        Ok(Running {
            id,
            slot,
            child,
            reader,
            holding: false,
            alive: true,
            faulted: false,
            killed: false,
        })
    }

    /// A command kind's worker: a `dlock` process (the control: a shell script calling
    /// `dlock`), in a process group of its own, the store's URL in its environment. Its
    /// stdout carries the command's grant (`Acquired`, printed by its first write); each
    /// line of its stderr (dlock's messages, the command's) becomes an `Error` step.
    fn spawn_command(
        &self,
        commands: &crate::command::Workers,
        id: usize,
        slot: usize,
    ) -> Result<Running, Failure> {
        let worker = commands.worker(self.kind, id, self.until);
        let mut child = tokio::process::Command::new(&worker.program)
            .args(&worker.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .envs(worker.env)
            .env("DLOCK_URL", &self.urls[slot])
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| {
                Failure::new(
                    exit::CANNOT_EXECUTE,
                    format!("cannot start {}: {e}", worker.program.display()),
                )
            })?;
        let tx = self.tx.clone();
        let errors = self.tx.clone();
        let out = child.stdout.take();
        let err = child.stderr.take();
        let reader = tokio::spawn(async move {
            let steps = async {
                if let Some(out) = out {
                    let mut lines = BufReader::new(out).lines();
                    while let Ok(Some(line)) = lines.next_line().await {
                        if let Ok(step) = serde_json::from_str::<Step>(line.trim()) {
                            let _ = tx.send((id, step));
                        }
                    }
                }
            };
            let messages = async {
                if let Some(err) = err {
                    let mut lines = BufReader::new(err).lines();
                    while let Ok(Some(line)) = lines.next_line().await {
                        let step = Step::Error {
                            t: crate::model::monotonic_ns(),
                            message: line.trim().to_owned(),
                        };
                        let _ = errors.send((id, step));
                    }
                }
            };
            tokio::join!(steps, messages);
        });
        Ok(Running {
            id,
            slot,
            child,
            reader: Some(reader),
            holding: false,
            alive: true,
            faulted: false,
            killed: false,
        })
    }
}
