//! `dlock elect`'s supervisor (the one `dlock run` uses) against a command that ignores
//! SIGTERM: when the leader's renewals fail, its command is killed before its lease can
//! end, so it never runs beside the next leader's.

use std::process::Stdio;
use std::time::Duration;

use dlock_test::proxy::Fault;

use super::supervise::{
    next_holder, proxied_redis, stubborn_writer, wait_until_gone, writes_after_grant,
};
use super::{LOST, dlock, scratch, wait_exit, wait_for_file};

/// The leader's connection blackholed, `--ttl 2s` with the default grace: the command
/// (ignoring SIGTERM, with a background child that writes too) is SIGKILLed, its whole
/// group, before the next leader (elected when the lease expires) writes.
#[test]
fn an_elected_command_that_ignores_sigterm_is_killed_before_the_next_leader_is_elected() {
    let (server, _runtime, proxy) = proxied_redis();
    let dir = scratch("elect-stubborn");
    let (log, pidfile, childfile) = (dir.join("log"), dir.join("pid"), dir.join("child"));
    let script = format!(
        "trap '' TERM; \
         ( while :; do echo A >> {log}; sleep 0.05; done ) & echo $! > {child}; {writer}",
        log = log.display(),
        child = childfile.display(),
        writer = stubborn_writer(&log, &pidfile),
    );
    let mut first = dlock(&format!("redis://{}/0", proxy.addr()))
        .args([
            "elect",
            "--ttl",
            "2s",
            "elect-stubborn",
            "--",
            "sh",
            "-c",
            &script,
        ])
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let pid = wait_for_file(&pidfile, Duration::from_secs(10));
    let child = wait_for_file(&childfile, Duration::from_secs(10));
    wait_for_file(&log, Duration::from_secs(10));
    proxy.set_fault(Fault::Blackhole);
    let mut next = next_holder(&server.url(), "elect", "elect-stubborn", &log);
    assert!(wait_exit(&mut next, Duration::from_secs(30)).success());
    assert_eq!(
        writes_after_grant(&log),
        0,
        "the first leader's command wrote while the next leader led"
    );
    assert_eq!(
        wait_exit(&mut first, Duration::from_secs(15)).code(),
        Some(LOST)
    );
    assert!(
        wait_until_gone(&pid, Duration::from_secs(5)),
        "the command outlived its lease"
    );
    assert!(
        wait_until_gone(&child, Duration::from_secs(5)),
        "the command's background child outlived its lease"
    );
    let err = super::piped_stderr(&mut first);
    assert!(err.contains("terminating the command"), "{err}");
    let _ = std::fs::remove_dir_all(dir);
}
