//! A process that left the command's process group (`setsid`) but kept the hold
//! descriptor is part of the command (it keeps the lock while the command ends normally):
//! when the lock is lost, it is killed with the group, before the lease can end.

use std::process::Stdio;
use std::time::Duration;

use dlock_test::proxy::Fault;

use super::supervise::{
    next_holder, proxied_redis, stubborn_writer, wait_until_gone, writes_after_grant,
};
use super::{LOST, dlock, scratch, wait_exit, wait_for_file};

#[test]
fn a_holder_of_the_descriptor_outside_the_group_is_killed_before_the_next_holder_is_granted() {
    let (server, _runtime, proxy) = proxied_redis();
    let dir = scratch("detached-holder");
    let (log, pidfile, childfile) = (dir.join("log"), dir.join("pid"), dir.join("child"));
    let detached = format!(
        "trap \"\" TERM HUP; echo $$ > {child}; while :; do echo A >> {log}; sleep 0.05; done",
        log = log.display(),
        child = childfile.display(),
    );
    let script = format!(
        "trap '' TERM; setsid sh -c '{detached}' & {writer}",
        writer = stubborn_writer(&log, &pidfile),
    );
    let mut first = dlock(&format!("redis://{}/0", proxy.addr()))
        .args([
            "run",
            "--ttl",
            "2s",
            "detached-holder",
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
    let mut next = next_holder(&server.url(), "run", "detached-holder", &log);
    let granted = wait_exit(&mut next, Duration::from_secs(30));
    let after = writes_after_grant(&log);
    // (Not left running, whatever the outcome.)
    let _ = std::process::Command::new("kill")
        .args(["-KILL", child.trim()])
        .status();
    assert!(granted.success());
    assert_eq!(
        after, 0,
        "the detached holder of the descriptor wrote while the next holder held the lock"
    );
    assert_eq!(
        wait_exit(&mut first, Duration::from_secs(15)).code(),
        Some(LOST)
    );
    assert!(
        wait_until_gone(&pid, Duration::from_secs(5)),
        "the command outlived its lease"
    );
    let _ = std::fs::remove_dir_all(dir);
}
