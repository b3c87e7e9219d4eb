//! `dlock run` on ZooKeeper when its session ends under it: the `dlock` process is
//! paused past its lease (its reaper process kills the command on time) or its links to
//! the ensemble are cut. Either way it exits promptly, and as a run that lost its lock
//! (76) — never with the status of the command its reaper killed (137), as if the command
//! had merely failed, and never held up by a release it could not finish.

use std::process::{Command, Stdio};
use std::time::Duration;

use dlock_test::proxy::{Fault, Proxy};

use super::supervise::{next_holder, stubborn_writer, wait_until_gone, writes_after_grant};
use super::{LOST, dlock, scratch, wait_exit, wait_for_file};

/// How long a `dlock` whose lease is over may take to exit: a liveness bound (a release
/// it cannot finish, tried again in the background, must not hold it up).
const EXIT_WITHIN: Duration = Duration::from_secs(15);

fn signal(pid: &str, sig: &str) {
    assert!(
        Command::new("kill")
            .args([sig, pid])
            .status()
            .expect("kill")
            .success()
    );
}

/// Paused past its session (the torture kind's pause fault): the reaper kills the
/// command at the lease's end, the session expires, the next holder runs. Resumed, dlock
/// finds its command dead by SIGKILL and its session gone: it exits 76, not 137. Tried a
/// few times (bounded), every other time with `--release-on-exit`: which of the events
/// dlock sees first after its pause (the command's exit, the end of its group, the
/// lease's end) varies, and dlock must tell the same whichever it is.
#[test]
fn a_paused_dlock_on_zookeeper_exits_as_lost_not_with_its_killed_commands_status() {
    let zk = dlock_test::zookeeper::ZooKeeper::shared();
    let url = zk.url("/dlock-cli-zk-exit", "?session_timeout=3s");
    for round in 0..8 {
        let name = format!("paused-{round}");
        let dir = scratch("zk-paused");
        let (log, pidfile) = (dir.join("log"), dir.join("pid"));
        let mut run = dlock(&url);
        run.args(["run", "--ttl", "3s"]);
        if round % 2 == 1 {
            run.arg("--release-on-exit");
        }
        let mut first = run
            .args([&name, "--", "sh", "-c"])
            .arg(stubborn_writer(&log, &pidfile))
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        let pid = wait_for_file(&pidfile, Duration::from_secs(20));
        wait_for_file(&log, Duration::from_secs(10));
        let dlock_pid = first.id().to_string();
        signal(&dlock_pid, "-STOP");
        let mut next = next_holder(&url, "run", &name, &log);
        let granted = wait_exit(&mut next, Duration::from_secs(30));
        signal(&dlock_pid, "-CONT");
        assert!(granted.success(), "round {round}");
        assert_eq!(writes_after_grant(&log), 0, "round {round}");
        assert!(
            wait_until_gone(&pid, Duration::from_secs(5)),
            "round {round}: the command outlived its lease"
        );
        let status = wait_exit(&mut first, EXIT_WITHIN);
        let err = super::piped_stderr(&mut first);
        assert_eq!(status.code(), Some(LOST), "round {round}: {status}\n{err}");
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// Its links to the ensemble cut (blackhole: nothing answered, nothing refused): dlock
/// kills the command before the lease ends and exits 76 within a liveness bound, though
/// the release it sends then cannot reach the ensemble.
#[test]
fn a_dlock_on_zookeeper_cut_from_the_ensemble_exits_promptly_as_lost() {
    let zk = dlock_test::zookeeper::ZooKeeper::shared();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let proxy = rt
        .block_on(Proxy::start(
            zk.members[0].addr().parse().expect("member address"),
        ))
        .expect("proxy");
    let url = format!("zk://{}/dlock-cli-zk-exit?session_timeout=3s", proxy.addr());
    let dir = scratch("zk-cut");
    let (log, pidfile) = (dir.join("log"), dir.join("pid"));
    let mut first = dlock(&url)
        .args(["run", "--ttl", "3s", "cut", "--", "sh", "-c"])
        .arg(stubborn_writer(&log, &pidfile))
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let pid = wait_for_file(&pidfile, Duration::from_secs(20));
    wait_for_file(&log, Duration::from_secs(10));
    proxy.set_fault(Fault::Blackhole);
    // The lease (2 s, two thirds of the session) and the kill are over long before this.
    let status = wait_exit(&mut first, EXIT_WITHIN);
    let err = super::piped_stderr(&mut first);
    assert_eq!(status.code(), Some(LOST), "{status}\n{err}");
    assert!(
        wait_until_gone(&pid, Duration::from_secs(5)),
        "the command outlived its lease"
    );
    let direct = zk.url("/dlock-cli-zk-exit", "?session_timeout=3s");
    let mut next = next_holder(&direct, "run", "cut", &log);
    assert!(wait_exit(&mut next, Duration::from_secs(30)).success());
    assert_eq!(writes_after_grant(&log), 0);
    let _ = std::fs::remove_dir_all(dir);
}
