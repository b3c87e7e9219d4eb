//! `dlock run`'s supervisor against its adversaries: a command that ignores SIGTERM, one
//! that leaves children behind (in its group or detached from it), a `dlock` that is
//! paused or killed — none of them may give two holders at once.
//!
//! Each overlap check has the writers append to one file (O_APPEND: the file's order is
//! the order of the writes), the next holder's first line marking its grant.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use dlock_test::proxy::{Fault, Proxy};
use dlock_test::server::RedisServer;

use super::{
    CONFLICT, LOST, USAGE, alive, dlock, output, scratch, stderr, wait_exit, wait_for_file,
};

/// A command that ignores SIGTERM and appends `A` to `log` every 50 ms, forever.
pub(super) fn stubborn_writer(log: &Path, pidfile: &Path) -> String {
    format!(
        "trap '' TERM; echo $$ > {}; while :; do echo A >> {}; sleep 0.05; done",
        pidfile.display(),
        log.display()
    )
}

/// The next holder (`command`: `run`, or `elect` for the next leader): waits for the lock,
/// then marks its grant with `B` and writes a while.
pub(super) fn next_holder(url: &str, command: &str, name: &str, log: &Path) -> std::process::Child {
    let script = format!(
        "echo B >> {log}; sleep 0.5; echo B >> {log}",
        log = log.display()
    );
    dlock(url)
        .args([command, "--wait", "60s", name, "--", "sh", "-c", &script])
        .spawn()
        .expect("spawn the next holder")
}

/// Every `A` line written after the first `B` line: the first holder's writes while the
/// next one held the lock.
pub(super) fn writes_after_grant(log: &Path) -> usize {
    let text = std::fs::read_to_string(log).expect("log");
    let mut lines = text.lines();
    assert!(
        lines.by_ref().any(|l| l == "B"),
        "the next holder never ran:\n{text}"
    );
    lines.filter(|l| *l == "A").count()
}

pub(super) fn wait_until_gone(pid: &str, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while alive(pid) {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

/// A private Redis behind a proxy (to cut the holder's connection), and the runtime the
/// proxy runs on: keep all three alive for the test.
pub(super) fn proxied_redis() -> (RedisServer, tokio::runtime::Runtime, Proxy) {
    let server = RedisServer::start().expect("redis-server");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let proxy = rt
        .block_on(Proxy::start(
            format!("127.0.0.1:{}", server.port())
                .parse()
                .expect("addr"),
        ))
        .expect("proxy");
    (server, rt, proxy)
}

/// The reproduction: `--ttl 2s` with the default 10 s grace, the holder's
/// connection cut. The command ignores SIGTERM, so only a SIGKILL before the lease ends
/// keeps it from writing while the next holder (granted when the key expires) runs.
#[test]
fn a_command_that_ignores_sigterm_is_killed_before_the_next_holder_is_granted() {
    let (server, _runtime, proxy) = proxied_redis();
    let dir = scratch("stubborn");
    let (log, pidfile) = (dir.join("log"), dir.join("pid"));
    let mut first = dlock(&format!("redis://{}/0", proxy.addr()))
        .args(["run", "--ttl", "2s", "stubborn", "--", "sh", "-c"])
        .arg(stubborn_writer(&log, &pidfile))
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let pid = wait_for_file(&pidfile, Duration::from_secs(10));
    wait_for_file(&log, Duration::from_secs(10));
    proxy.set_fault(Fault::Blackhole);
    let mut next = next_holder(&server.url(), "run", "stubborn", &log);
    assert!(wait_exit(&mut next, Duration::from_secs(30)).success());
    assert_eq!(
        writes_after_grant(&log),
        0,
        "the first command wrote while the next holder held the lock"
    );
    assert_eq!(
        wait_exit(&mut first, Duration::from_secs(15)).code(),
        Some(LOST)
    );
    // (Killed, it may still be a zombie for a moment: its parent, dlock, was stopped.)
    assert!(
        wait_until_gone(&pid, Duration::from_secs(5)),
        "the command outlived its lease"
    );
    let err = super::piped_stderr(&mut first);
    assert!(err.contains("terminating the command"), "{err}");
    let _ = std::fs::remove_dir_all(dir);
}

/// A paused `dlock` cannot kill anything: its reaper process must, at the same deadline.
#[test]
fn a_paused_dlock_does_not_let_its_command_outlive_the_lease() {
    let server = RedisServer::start().expect("redis-server");
    let dir = scratch("paused");
    let (log, pidfile) = (dir.join("log"), dir.join("pid"));
    let mut first = dlock(&server.url())
        .args(["run", "--ttl", "2s", "paused", "--", "sh", "-c"])
        .arg(stubborn_writer(&log, &pidfile))
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let pid = wait_for_file(&pidfile, Duration::from_secs(10));
    wait_for_file(&log, Duration::from_secs(10));
    let dlock_pid = first.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-STOP", &dlock_pid])
            .status()
            .expect("kill")
            .success()
    );
    let mut next = next_holder(&server.url(), "run", "paused", &log);
    let granted = wait_exit(&mut next, Duration::from_secs(30));
    assert!(
        Command::new("kill")
            .args(["-CONT", &dlock_pid])
            .status()
            .expect("kill")
            .success()
    );
    assert!(granted.success());
    assert_eq!(
        writes_after_grant(&log),
        0,
        "the command of a paused dlock wrote while the next holder held the lock"
    );
    // (Killed, it may still be a zombie for a moment: its parent, dlock, was stopped.)
    assert!(
        wait_until_gone(&pid, Duration::from_secs(5)),
        "the command outlived its lease"
    );
    assert_eq!(
        wait_exit(&mut first, Duration::from_secs(15)).code(),
        Some(LOST)
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// A `dlock` killed outright takes its command's group with it (its reaper's stdin
/// closes), instead of leaving it to run without the lock.
#[test]
fn a_killed_dlock_takes_its_command_with_it() {
    let server = RedisServer::start().expect("redis-server");
    let dir = scratch("killed");
    let (log, pidfile) = (dir.join("log"), dir.join("pid"));
    let mut first = dlock(&server.url())
        .args(["run", "killed", "--", "sh", "-c"])
        .arg(stubborn_writer(&log, &pidfile))
        .spawn()
        .expect("spawn");
    let pid = wait_for_file(&pidfile, Duration::from_secs(10));
    first.kill().expect("SIGKILL dlock");
    let _ = first.wait();
    assert!(
        wait_until_gone(&pid, Duration::from_secs(5)),
        "the command of a killed dlock kept running"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// flock(1)'s rule: a background child (in the group, or detached into a session of its
/// own but holding the inherited descriptor) keeps the lock until it exits; the lock is
/// then released. `--release-on-exit` releases with the direct child.
#[test]
fn the_lock_is_held_until_the_commands_children_have_exited() {
    let server = RedisServer::start().expect("redis-server");
    let url = server.url();
    let dir = scratch("children");
    let late = dir.join("late");
    let cases = [
        (
            "in the group",
            format!("(sleep 2; echo late >> {}) & exit 0", late.display()),
        ),
        (
            "detached with the descriptor",
            format!(
                "setsid sh -c 'sleep 2; echo late >> {}' & exit 0",
                late.display()
            ),
        ),
    ];
    for (what, script) in cases {
        let _ = std::fs::remove_file(&late);
        let mut first = dlock(&url)
            .args(["run", "children", "--", "sh", "-c", &script])
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        std::thread::sleep(Duration::from_millis(700));
        assert!(!late.exists(), "{what}: the child already wrote");
        let out = output(dlock(&url).args(["run", "--no-wait", "children", "--", "true"]));
        assert_eq!(
            out.status.code(),
            Some(CONFLICT),
            "{what}: the lock was released while the command's child still ran: {}",
            stderr(&out)
        );
        assert!(
            wait_exit(&mut first, Duration::from_secs(15)).success(),
            "{what}"
        );
        assert_eq!(wait_for_file(&late, Duration::from_secs(1)).trim(), "late");
        let err = super::piped_stderr(&mut first);
        assert!(err.contains("holding the lock"), "{what}: {err}");
        let out = output(dlock(&url).args(["run", "--no-wait", "children", "--", "true"]));
        assert!(
            out.status.success(),
            "{what}: not released after the child: {}",
            stderr(&out)
        );
    }

    let _ = std::fs::remove_file(&late);
    let script = format!("(sleep 2; echo late >> {}) & exit 0", late.display());
    // (Not `output()`: it would wait for the child, which inherits the pipes.)
    let first = dlock(&url)
        .args([
            "run",
            "--release-on-exit",
            "children",
            "--",
            "sh",
            "-c",
            &script,
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("run");
    assert!(first.success());
    let out = output(dlock(&url).args(["run", "--no-wait", "children", "--", "true"]));
    assert!(
        out.status.success(),
        "--release-on-exit kept the lock: {}",
        stderr(&out)
    );
    assert!(!late.exists(), "the child should still be running");
    assert_eq!(wait_for_file(&late, Duration::from_secs(5)).trim(), "late");
    let _ = std::fs::remove_dir_all(dir);
}

/// A grace that cannot fit inside the ttl is refused before anything is locked, naming
/// the bound; `dlock elect` the same.
#[test]
fn a_kill_grace_longer_than_the_ttl_allows_is_refused_with_the_bound() {
    let server = RedisServer::start().expect("redis-server");
    for command in ["run", "elect"] {
        let out = output(dlock(&server.url()).args([
            command,
            "--ttl",
            "3s",
            "--kill-grace",
            "10s",
            "graceful",
            "--",
            "true",
        ]));
        assert_eq!(
            out.status.code(),
            Some(USAGE),
            "{command}: {}",
            stderr(&out)
        );
        assert!(
            stderr(&out).contains("at most ttl/3 - 100ms = 900ms"),
            "{}",
            stderr(&out)
        );
    }
    let out = output(dlock(&server.url()).args(["status", "--json", "graceful"]));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(json["held"], false, "nothing was locked");
    let out = output(dlock(&server.url()).args([
        "run",
        "--ttl",
        "3s",
        "--kill-grace",
        "900ms",
        "graceful",
        "--",
        "true",
    ]));
    assert!(out.status.success(), "{}", stderr(&out));
}
