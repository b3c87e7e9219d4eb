//! `dlock torture` and `dlock demo`: run by the `dlock-torture` binary (crate
//! `dlock-torture`), which carries the test kit, the server spawners and the fault proxies
//! that the lock tool itself does not link. `dlock` finds it and replaces itself with it
//! (exec), so its output, signals and exit code are the harness's own.

use std::ffi::OsString;
use std::os::unix::process::CommandExt as _;
use std::path::PathBuf;
use std::process::Command;

use crate::exit::{self, Failure};

/// The harness binary's name.
const HARNESS: &str = "dlock-torture";

/// Set for the harness, so that its usage and help name `dlock torture` / `dlock demo`.
const VIA_DLOCK: &str = "DLOCK_TORTURE_VIA_DLOCK";

/// Where the harness is: `$DLOCK_TORTURE` if set, else beside this executable (as `cargo
/// build` and `cargo install` of both crates leave them), else on `PATH`.
fn harness() -> PathBuf {
    if let Some(path) = std::env::var_os("DLOCK_TORTURE").filter(|p| !p.is_empty()) {
        return PathBuf::from(path);
    }
    std::env::current_exe()
        .ok()
        .map(|exe| exe.with_file_name(HARNESS))
        .filter(|sibling| sibling.is_file())
        .unwrap_or_else(|| PathBuf::from(HARNESS))
}

/// Runs `dlock-torture <subcommand> <args>` in place of this process; returns only if it
/// could not be started.
pub(crate) fn exec(subcommand: &str, args: Vec<OsString>) -> Failure {
    let path = harness();
    let err = Command::new(&path)
        .arg(subcommand)
        .args(args)
        .env(VIA_DLOCK, "1")
        .exec();
    let (code, what) = if err.kind() == std::io::ErrorKind::NotFound {
        (exit::NOT_FOUND, "is not installed")
    } else {
        (exit::CANNOT_EXECUTE, "could not be started")
    };
    Failure::new(
        code,
        format!(
            "dlock {subcommand} runs the {HARNESS} binary, which {what} ({}: {err}); build it \
             with `cargo build --release -p dlock-torture` (it goes beside dlock), install it \
             with `cargo install --path crates/dlock-torture`, or point DLOCK_TORTURE at it",
            path.display()
        ),
    )
}
