//! `dlock elect` and `dlock leader`: real processes campaigning on real stores.

use super::*;

/// `dlock leader NAME --json` as a JSON value.
fn leader_json(url: &str, name: &str) -> serde_json::Value {
    let out = output(dlock(url).args(["leader", "--json", name]));
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_slice(&out.stdout).expect("json")
}

/// Sends `sig` to `pid`.
fn signal(sig: &str, pid: u32) {
    let status = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
}

/// Several `dlock elect` processes on one name: only the leader's command runs; each
/// SIGTERM to the leading dlock stops its command, which exits with its own status, and
/// a standby leads long before the lease (60 s) could have run out; terms increase.
#[test]
fn electors_run_one_command_at_a_time_and_standbys_take_over_after_sigterm() {
    let server = RedisServer::start().expect("redis-server");
    let url = server.url();
    let dir = scratch("elect");
    let log = dir.join("log");
    let leader_file = dir.join("leader");
    // The command logs its start (with its term), says which dlock runs it, and on
    // SIGTERM logs its end and exits 3.
    let script = format!(
        "trap 'echo \"end $$\" >> {log}; exit 3' TERM; \
         echo \"begin $$ $DLOCK_TERM $DLOCK_VALUE\" >> {log}; \
         echo $PPID > {leader}.tmp; mv {leader}.tmp {leader}; \
         while true; do sleep 0.05; done",
        log = log.display(),
        leader = leader_file.display()
    );
    let mut electors: Vec<Child> = (0..3)
        .map(|i| {
            dlock(&url)
                .args([
                    "elect",
                    "--ttl",
                    "60s",
                    "--value",
                    &format!("node-{i}"),
                    "scheduler",
                    "--",
                    "sh",
                    "-c",
                    &script,
                ])
                .spawn()
                .expect("spawn dlock elect")
        })
        .collect();
    let mut led = Vec::new();
    for _ in 0..3 {
        let pid: u32 = wait_for_file(&leader_file, Duration::from_secs(10))
            .trim()
            .parse()
            .expect("a pid");
        assert!(!led.contains(&pid), "{pid} led twice");
        led.push(pid);
        let seen = leader_json(&url, "scheduler");
        assert_eq!(seen["leader"], true);
        std::fs::remove_file(&leader_file).expect("rm leader file");
        signal("-TERM", pid);
        let idx = electors
            .iter()
            .position(|c| c.id() == pid)
            .expect("the leader is one of ours");
        let mut elector = electors.swap_remove(idx);
        let status = wait_exit(&mut elector, Duration::from_secs(10));
        assert_eq!(
            status.code(),
            Some(3),
            "dlock exits with the command's status"
        );
        if !electors.is_empty() {
            // Half the 60 s lease: only the resign's hand-over can be that quick (the bound
            // tells the mechanism apart; no speed is measured).
            wait_for_file(&leader_file, Duration::from_secs(30));
        }
    }
    let text = std::fs::read_to_string(&log).expect("log");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 6, "{text}");
    let mut terms = Vec::new();
    for pair in lines.chunks(2) {
        let begin: Vec<&str> = pair[0].split(' ').collect();
        assert_eq!(begin[0], "begin", "{text}");
        assert_eq!(
            pair[1],
            format!("end {}", begin[1]),
            "two commands at once:\n{text}"
        );
        terms.push(begin[2].parse::<u64>().expect("DLOCK_TERM"));
        assert!(begin[3].starts_with("node-"), "DLOCK_VALUE: {text}");
    }
    assert!(terms.windows(2).all(|w| w[0] < w[1]), "terms {terms:?}");
    assert_eq!(leader_json(&url, "scheduler")["leader"], false);
    let _ = std::fs::remove_dir_all(dir);
}

/// Exit codes: the command's status (and leadership resigned), 75 when another leads
/// and --no-wait, 76 when leadership is lost while the command runs, 64 on RedLock.
#[test]
fn elect_exit_codes_environment_and_leader_output() {
    let server = RedisServer::start().expect("redis-server");
    let url = server.url();
    let dir = scratch("elect-codes");
    let env_file = dir.join("env");

    let script = format!(
        "echo \"$DLOCK_NAME $DLOCK_TERM $DLOCK_VALUE\" > {}; exit 7",
        env_file.display()
    );
    let out = output(dlock(&url).args([
        "elect", "--value", "alpha", "codes", "--", "sh", "-c", &script,
    ]));
    assert_eq!(out.status.code(), Some(7), "{}", stderr(&out));
    let env = std::fs::read_to_string(&env_file).expect("env");
    let fields: Vec<&str> = env.split_whitespace().collect();
    assert_eq!(fields[0], "codes");
    let term: u64 = fields[1].parse().expect("term");
    assert_eq!(fields[2], "alpha");
    assert_eq!(
        leader_json(&url, "codes")["leader"],
        false,
        "resigned when the command exited"
    );
    let out = output(dlock(&url).args(["leader", "codes"]));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "no leader");

    // A leader that stays up; another candidate with --no-wait gets the conflict code.
    let ready = dir.join("ready");
    let hold = format!("echo up > {}; sleep 30", ready.display());
    let mut leader = dlock(&url)
        .args([
            "elect",
            "--ttl",
            "2s",
            "--kill-grace",
            "500ms",
            "--value",
            "beta",
            "codes",
            "--",
            "sh",
            "-c",
            &hold,
        ])
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    wait_for_file(&ready, Duration::from_secs(10));
    let seen = leader_json(&url, "codes");
    assert_eq!(seen["value"], "beta");
    assert!(seen["term"].as_u64().expect("term") > term);
    let out = output(dlock(&url).args(["leader", "codes"]));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("term {}: beta", seen["term"])
    );
    let out = output(dlock(&url).args(["elect", "--no-wait", "codes", "--", "true"]));
    assert_eq!(out.status.code(), Some(CONFLICT), "{}", stderr(&out));
    assert!(stderr(&out).contains("another candidate leads"));

    // Leadership deleted behind its back: the command is terminated, dlock exits 76.
    let out = output(dlock(&url).args([
        "force-unlock",
        "--yes",
        "--prefix",
        "dlock-election:",
        "codes",
    ]));
    assert!(out.status.success(), "{}", stderr(&out));
    let status = wait_exit(&mut leader, Duration::from_secs(10));
    assert_eq!(status.code(), Some(LOST));
    let err = piped_stderr(&mut leader);
    assert!(err.contains("leadership of \"codes\" lost"), "{err}");

    // RedLock (here three "masters" on one server, enough to connect) has no term.
    let node = format!("127.0.0.1:{}", server.port());
    let out = output(
        dlock(&format!("redlock://{node},{node},{node}")).args(["elect", "x", "--", "true"]),
    );
    assert_eq!(out.status.code(), Some(USAGE), "{}", stderr(&out));
    let out = output(dlock(&url).args(["elect", "--value", &"v".repeat(5000), "x", "--", "true"]));
    assert_eq!(out.status.code(), Some(USAGE), "{}", stderr(&out));
    let _ = std::fs::remove_dir_all(dir);
}

/// `dlock leader --watch --json` prints nobody, then every leader and proclaimed value
/// as it changes, one line each (each leader's resignation as a vacancy after its term),
/// until SIGTERM.
#[test]
fn leader_watch_prints_every_change() {
    let server = RedisServer::start().expect("redis-server");
    let url = server.url();
    let mut watch = dlock(&url)
        .args(["leader", "--watch", "--json", "watched"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn watch");
    let mut lines = BufReader::new(watch.stdout.take().expect("stdout")).lines();
    let mut next = || -> serde_json::Value {
        let line = lines.next().expect("a line").expect("read");
        serde_json::from_str(&line).expect("json line")
    };
    assert_eq!(next()["leader"], false);
    let mut terms = Vec::new();
    for value in ["first", "second", "third"] {
        let out =
            output(dlock(&url).args(["elect", "--value", value, "watched", "--", "sleep", "0.3"]));
        assert!(out.status.success(), "{}", stderr(&out));
        let seen = next();
        assert_eq!(seen["value"], value);
        let term = seen["term"].as_u64().expect("term");
        terms.push(term);
        let gone = next();
        assert_eq!(
            (&gone["leader"], &gone["last_term"]),
            (&false.into(), &term.into())
        );
    }
    assert!(terms.windows(2).all(|w| w[0] < w[1]), "{terms:?}");
    signal("-TERM", watch.id());
    let status = wait_exit(&mut watch, Duration::from_secs(10));
    assert_eq!(status.code(), Some(128 + 15));
}

/// `dlock elect` and `dlock leader` on every other store that has elections.
#[test]
fn elect_and_leader_on_memcached_etcd_postgres_and_zookeeper() {
    let mc = dlock_test::server::MemcachedServer::start().expect("memcached");
    #[cfg(feature = "etcd")]
    let etcd = dlock_test::server::EtcdCluster::start(1).expect("etcd");
    let pg = dlock_test::postgres::PostgresServer::start().expect("postgres");
    let zk = dlock_test::zookeeper::ZooKeeper::standalone().expect("zookeeper");
    let urls = [
        mc.url(),
        #[cfg(feature = "etcd")]
        etcd.url(),
        pg.url(),
        zk.url("/elect", "?session_timeout=2s"),
    ];
    let dir = scratch("elect-stores");
    for (i, url) in urls.iter().enumerate() {
        let term_file = dir.join(format!("term-{i}"));
        let go = dir.join(format!("go-{i}"));
        let script = format!(
            "echo $DLOCK_TERM > {}; while [ ! -e {} ]; do sleep 0.05; done",
            term_file.display(),
            go.display()
        );
        let mut elector = dlock(url)
            .args([
                "elect", "--ttl", "3s", "--value", "on-store", "job", "--", "sh", "-c", &script,
            ])
            .spawn()
            .expect("spawn");
        let term: u64 = wait_for_file(&term_file, Duration::from_secs(20))
            .trim()
            .parse()
            .expect("term");
        let seen = leader_json(url, "job");
        assert_eq!(seen["leader"], true, "{url}");
        assert_eq!(seen["value"], "on-store", "{url}");
        assert_eq!(seen["term"].as_u64(), Some(term), "{url}");
        let out = output(dlock(url).args(["elect", "--no-wait", "job", "--", "true"]));
        assert_eq!(out.status.code(), Some(CONFLICT), "{url}: {}", stderr(&out));
        std::fs::write(&go, "go").expect("go");
        assert!(wait_exit(&mut elector, Duration::from_secs(20)).success());
        assert_eq!(leader_json(url, "job")["leader"], false, "{url}");
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// A leader whose `dlock elect` process is SIGKILLed (no resign, no renewal) is replaced
/// by a standby within its lease plus a margin, with a higher term.
#[test]
fn a_sigkilled_leader_is_replaced_within_its_lease() {
    let server = RedisServer::start().expect("redis-server");
    let url = server.url();
    let dir = scratch("elect-kill");
    let log = dir.join("log");
    // Each command logs its term and its dlock's pid, then runs until killed.
    let script = format!(
        "echo \"$PPID $DLOCK_TERM $$\" >> {}; exec sleep 60",
        log.display()
    );
    let spawn = || {
        dlock(&url)
            .args(["elect", "--ttl", "2s", "crashy", "--", "sh", "-c", &script])
            .spawn()
            .expect("spawn dlock elect")
    };
    let mut electors = vec![spawn(), spawn()];
    let first = wait_for_file(&log, Duration::from_secs(10));
    let fields: Vec<&str> = first.split_whitespace().collect();
    let (pid, term): (u32, u64) = (
        fields[0].parse().expect("pid"),
        fields[1].parse().expect("term"),
    );
    let orphan = fields[2].to_owned();
    signal("-KILL", pid);
    let killed = Instant::now();
    let idx = electors.iter().position(|c| c.id() == pid).expect("ours");
    let mut dead = electors.swap_remove(idx);
    let _ = dead.wait();
    // Its command (orphaned, as with `dlock run`) must not outlive the test.
    let _ = Command::new("kill").args([orphan.as_str()]).status();
    let deadline = Instant::now() + Duration::from_secs(20);
    let second = loop {
        let text = std::fs::read_to_string(&log).expect("log");
        if let Some(line) = text.lines().nth(1) {
            break line.to_owned();
        }
        assert!(Instant::now() < deadline, "no standby took over: {text}");
        std::thread::sleep(Duration::from_millis(20));
    };
    let took = killed.elapsed();
    assert!(
        took <= Duration::from_secs(2) + Duration::from_secs(2),
        "replaced only after {took:?} (lease 2 s)"
    );
    let next: u64 = second
        .split_whitespace()
        .nth(1)
        .expect("term")
        .parse()
        .expect("term");
    assert!(next > term);
    for mut e in electors {
        signal("-TERM", e.id());
        let _ = wait_exit(&mut e, Duration::from_secs(10));
    }
    let _ = std::fs::remove_dir_all(dir);
}
