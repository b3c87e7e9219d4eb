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

/// Where `cargo build` and `cargo install` put the harness: beside this executable (in the
/// same profile directory of whatever target directory cargo used, or in cargo's bin
/// directory), as found through the running executable's own path.
fn beside_dlock() -> Option<PathBuf> {
    std::env::current_exe()
        .ok()
        .map(|exe| exe.with_file_name(HARNESS))
}

/// Where the harness is: `$DLOCK_TORTURE` if set, else beside this executable, else on
/// `PATH` (the bare name); and whether it is the last (nothing given, nothing beside).
fn harness() -> (PathBuf, bool) {
    if let Some(path) = std::env::var_os("DLOCK_TORTURE").filter(|p| !p.is_empty()) {
        return (PathBuf::from(path), false);
    }
    match beside_dlock().filter(|sibling| sibling.is_file()) {
        Some(sibling) => (sibling, false),
        None => (PathBuf::from(HARNESS), true),
    }
}

/// Runs `dlock-torture <subcommand> <args>` in place of this process; returns only if it
/// could not be started.
pub(crate) fn exec(subcommand: &str, args: Vec<OsString>) -> Failure {
    let (path, on_path) = harness();
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
    let looked = if on_path {
        let beside = beside_dlock().map_or_else(|| "?".to_owned(), |p| p.display().to_string());
        format!("neither beside dlock, as {beside}, nor on PATH: {err}")
    } else {
        format!("{}: {err}", path.display())
    };
    Failure::new(
        code,
        format!(
            "dlock {subcommand} runs the {HARNESS} binary, which {what} ({looked}); build both \
             with `cargo build --release` in dlock's source tree (it goes beside dlock, in any \
             target directory), install it beside dlock with `cargo install --path \
             crates/dlock-torture`, or point DLOCK_TORTURE at it"
        ),
    )
}
