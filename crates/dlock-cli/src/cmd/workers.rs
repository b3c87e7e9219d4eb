//! Worker processes of `dlock demo` and `dlock torture`: this same binary, run with a
//! hidden subcommand, reporting one line per event on its stdout.

use std::process::Stdio;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Child;
use tokio::task::JoinHandle;

use crate::exit::{self, Failure};

/// Starts `dlock <args>` and hands each line it prints to `on_line`, from a task that
/// ends at the worker's EOF. The worker is killed if the `Child` is dropped.
pub(crate) fn spawn(
    args: &[String],
    on_line: impl Fn(&str) + Send + 'static,
) -> Result<(Child, Option<JoinHandle<()>>), Failure> {
    let exe = std::env::current_exe().map_err(|e| {
        Failure::new(
            exit::CANNOT_EXECUTE,
            format!("cannot find dlock itself: {e}"),
        )
    })?;
    let mut child = tokio::process::Command::new(exe)
        .args(args)
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
