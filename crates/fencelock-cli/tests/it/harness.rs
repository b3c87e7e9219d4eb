//! Where `dlock demo` and `dlock torture` find their harness binary (`dlock-torture`):
//! beside the running `dlock`, whatever directory that is (any `CARGO_TARGET_DIR`, cargo's
//! bin directory), else on `PATH`; and the error that says how to get it when it is in
//! neither place. Each test runs a copy of the real `dlock` binary from a directory of its
//! own, with `DLOCK_TORTURE` unset and a `PATH` that holds no harness.

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use super::{scratch, stderr};

/// A stand-in harness: records its arguments and `DLOCK_TORTURE_VIA_DLOCK`, exits 3.
const FAKE_HARNESS: &str = "#!/bin/sh\nprintf '%s|' \"$@\" > \"$0.args\"\n\
                            echo \"$DLOCK_TORTURE_VIA_DLOCK\" > \"$0.env\"\nexit 3\n";

/// Writes an executable file.
fn write_executable(path: &Path, text: &str) {
    std::fs::write(path, text).expect("write the fake harness");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
}

/// A copy of the `dlock` under test in `dir` (a directory of its own, as `cargo install`
/// or another `CARGO_TARGET_DIR` would leave it).
fn copy_of_dlock(dir: &Path) -> PathBuf {
    std::fs::create_dir_all(dir).expect("bin dir");
    let copy = dir.join("dlock");
    std::fs::copy(env!("CARGO_BIN_EXE_dlock"), &copy).expect("copy dlock");
    copy
}

/// Runs `dlock args…` with `DLOCK_TORTURE` unset and `PATH` set to `path` only. A freshly
/// written executable can be busy for a moment (another test's fork may still hold its
/// write descriptor): retried a few times.
fn run(dlock: &Path, path: &Path, args: &[&str]) -> Output {
    let mut last = None;
    for _ in 0..40 {
        let out = Command::new(dlock)
            .args(args)
            .env_remove("DLOCK_TORTURE")
            .env("PATH", path)
            .stdin(Stdio::null())
            .output();
        match out {
            Ok(out) => return out,
            Err(e) if e.raw_os_error() == Some(26) => last = Some(e), // ETXTBSY
            Err(e) => panic!("run {}: {e}", dlock.display()),
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("run {}: {last:?}", dlock.display());
}

/// The harness beside a copied `dlock` runs, with the subcommand and every argument, its
/// exit code dlock's own; nothing on PATH is needed.
#[test]
fn demo_and_torture_run_the_harness_beside_dlock_wherever_it_is() {
    let dir = scratch("harness-beside");
    let bin = dir.join("some-target-dir").join("release");
    let dlock = copy_of_dlock(&bin);
    let fake = bin.join("dlock-torture");
    write_executable(&fake, FAKE_HARNESS);
    let empty = dir.join("empty-path");
    std::fs::create_dir_all(&empty).expect("empty dir");

    let out = run(&dlock, &empty, &["demo", "--plain"]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let args = std::fs::read_to_string(bin.join("dlock-torture.args")).expect("args");
    assert_eq!(args, "demo|--plain|");
    let env = std::fs::read_to_string(bin.join("dlock-torture.env")).expect("env");
    assert_eq!(env.trim(), "1");

    let out = run(&dlock, &empty, &["torture", "--quick", "--kinds", "memory"]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let args = std::fs::read_to_string(bin.join("dlock-torture.args")).expect("args");
    assert_eq!(args, "torture|--quick|--kinds|memory|");
    let _ = std::fs::remove_dir_all(dir);
}

/// Nothing beside dlock: the harness on PATH runs.
#[test]
fn without_one_beside_dlock_the_harness_on_path_runs() {
    let dir = scratch("harness-path");
    let dlock = copy_of_dlock(&dir.join("bin"));
    let on_path = dir.join("on-path");
    std::fs::create_dir_all(&on_path).expect("path dir");
    write_executable(&on_path.join("dlock-torture"), FAKE_HARNESS);

    let out = run(&dlock, &on_path, &["demo"]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let args = std::fs::read_to_string(on_path.join("dlock-torture.args")).expect("args");
    assert_eq!(args, "demo|");
    let _ = std::fs::remove_dir_all(dir);
}

/// No harness anywhere: one line (exit 127) that names where dlock looked (beside itself,
/// by its full path, and PATH) and how to build or install it.
#[test]
fn a_missing_harness_names_where_dlock_looked_and_how_to_install_it() {
    let dir = scratch("harness-missing");
    let bin = dir.join("bin");
    let dlock = copy_of_dlock(&bin);
    let empty = dir.join("empty-path");
    std::fs::create_dir_all(&empty).expect("empty dir");

    let out = run(&dlock, &empty, &["demo"]);
    assert_eq!(out.status.code(), Some(127), "{}", stderr(&out));
    let err = stderr(&out);
    let beside = format!("beside dlock, as {}", bin.join("dlock-torture").display());
    for wanted in [
        "dlock demo runs the dlock-torture binary, which is not installed",
        beside.as_str(),
        "nor on PATH",
        "cargo build --release",
        "cargo install --path crates/dlock-torture",
        "DLOCK_TORTURE",
    ] {
        assert!(err.contains(wanted), "{wanted:?} not in: {err}");
    }
    assert_eq!(err.lines().count(), 1, "{err}");
    let _ = std::fs::remove_dir_all(dir);
}

/// A dlock built without the `etcd` feature (the default) refuses `etcd://` with a usage
/// error that says how to get it; built with it, the same URL goes to the etcd client
/// (nothing listens on port 1: some other error, not that one).
#[test]
fn etcd_urls_work_only_in_a_dlock_built_with_the_etcd_feature() {
    let out = super::output(super::dlock("etcd://127.0.0.1:1").args(["status", "some-job"]));
    let err = stderr(&out);
    if cfg!(feature = "etcd") {
        assert!(!err.contains("without etcd support"), "{err}");
    } else {
        assert_eq!(out.status.code(), Some(super::USAGE), "{err}");
        assert!(
            err.contains("built without etcd support")
                && err.contains("--features etcd")
                && err.contains("protoc"),
            "{err}"
        );
    }
}
