//! The real `dlock` binary against a real redis-server from the test kit.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use dlock_test::server::{RedisServer, free_port};

mod contact;
mod elect;
mod elect_supervise;
mod family;
mod first_contact;
mod harness;
mod hazards;
mod hostile;
mod kinds;
mod kinds_prefix;
mod leader_text;
mod messages;
mod stores;
mod supervise;
mod supervise_holders;
mod terminal;
mod top;
mod zk_exit;

const LOST: i32 = 76;
const CONFLICT: i32 = 75;
const USAGE: i32 = 64;
const UNAVAILABLE: i32 = 69;

fn dlock(url: &str) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_dlock"));
    cmd.env("DLOCK_URL", url).stdin(Stdio::null());
    cmd
}

fn output(cmd: &mut Command) -> Output {
    cmd.output().expect("run dlock")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn scratch(name: &str) -> PathBuf {
    // A counter, not a free port: a port is free again once released, and a second
    // directory of the same name then held the first one's files (a marker from an
    // earlier run read as this run's).
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir =
        std::env::temp_dir().join(format!("dlock-cli-test-{}-{name}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

fn wait_for_file(path: &Path, within: Duration) -> String {
    let deadline = Instant::now() + within;
    loop {
        if let Ok(s) = std::fs::read_to_string(path)
            && !s.is_empty()
        {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn wait_exit(child: &mut Child, within: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("dlock did not exit within {within:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// What an exited child wrote to its piped stderr, its lines joined.
fn piped_stderr(child: &mut Child) -> String {
    child
        .stderr
        .take()
        .map(|e| {
            BufReader::new(e)
                .lines()
                .map(|line| line.expect("stderr"))
                .collect()
        })
        .unwrap_or_default()
}

fn alive(pid: &str) -> bool {
    Command::new("kill")
        .args(["-0", pid.trim()])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Starts `n` copies of `dlock <args>` at once, waits for all, and returns the text the
/// runs appended to `log`.
fn run_concurrently(url: &str, n: usize, args: &[&str], log: &Path) -> String {
    let mut runs: Vec<Child> = (0..n)
        .map(|_| dlock(url).args(args).spawn().expect("spawn dlock run"))
        .collect();
    for run in &mut runs {
        assert!(wait_exit(run, Duration::from_secs(30)).success());
    }
    std::fs::read_to_string(log).expect("log")
}

#[test]
fn concurrent_runs_on_one_name_never_overlap() {
    let server = RedisServer::start().expect("redis-server");
    let dir = scratch("overlap");
    let log = dir.join("log");
    let script = format!(
        "echo \"begin $$\" >> {0}; sleep 0.05; echo \"end $$\" >> {0}",
        log.display()
    );
    let text = run_concurrently(
        &server.url(),
        6,
        &[
            "run",
            "--ttl",
            "2s",
            "shared-resource",
            "--",
            "sh",
            "-c",
            &script,
        ],
        &log,
    );
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 12, "{text}");
    for pair in lines.chunks(2) {
        let begin = pair[0].strip_prefix("begin ").expect("begin first");
        let end = pair[1].strip_prefix("end ").expect("then its end");
        assert_eq!(begin, end, "interleaved critical sections:\n{text}");
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn the_child_sees_its_lock_and_its_status_is_passed_through() {
    let server = RedisServer::start().expect("redis-server");
    let out = output(dlock(&server.url()).args([
        "run",
        "env-check",
        "--",
        "sh",
        "-c",
        // The token: 32 random hex digits, then the holder's metadata after a `~`.
        "r=${DLOCK_TOKEN%%\"~\"*}; echo \"$DLOCK_NAME $DLOCK_FENCE ${#r} ${DLOCK_TOKEN#\"$r\"}\"; exit 7",
    ]));
    assert_eq!(out.status.code(), Some(7), "{}", stderr(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.starts_with("env-check 1 32 ~p="), "{stdout}");
    let out = output(dlock(&server.url()).args(["run", "killed", "--", "sh", "-c", "kill -9 $$"]));
    assert_eq!(out.status.code(), Some(128 + 9));
    let out = output(dlock(&server.url()).args(["run", "missing", "--", "/no/such/program"]));
    assert_eq!(out.status.code(), Some(127));
}

#[test]
fn no_wait_and_bounded_wait_return_the_conflict_code_while_held() {
    let server = RedisServer::start().expect("redis-server");
    let out = output(dlock(&server.url()).args(["acquire", "--ttl", "30s", "busy"]));
    assert!(out.status.success(), "{}", stderr(&out));
    let out = output(dlock(&server.url()).args(["run", "--no-wait", "busy", "--", "true"]));
    assert_eq!(out.status.code(), Some(CONFLICT));
    assert!(stderr(&out).contains("held"), "{}", stderr(&out));
    let out = output(dlock(&server.url()).args([
        "run",
        "-n",
        "--conflict-exit-code",
        "9",
        "busy",
        "--",
        "true",
    ]));
    assert_eq!(out.status.code(), Some(9));
    let out = output(dlock(&server.url()).args(["run", "--wait", "300ms", "busy", "--", "true"]));
    assert_eq!(out.status.code(), Some(CONFLICT));
    let out = output(dlock(&server.url()).args(["acquire", "--no-wait", "busy"]));
    assert_eq!(out.status.code(), Some(CONFLICT));
}

#[test]
fn a_lost_lock_terminates_the_child_and_exits_with_the_lost_code() {
    let server = RedisServer::start().expect("redis-server");
    let dir = scratch("lost");
    let pidfile = dir.join("pid");
    let grandchild = dir.join("grandchild");
    // The command starts a process of its own: it must not outlive the lock either.
    let script = format!(
        "sleep 30 & echo $! > {}; echo $$ > {}; wait",
        grandchild.display(),
        pidfile.display()
    );
    let mut run = dlock(&server.url())
        .args(["run", "--ttl", "600ms", "doomed", "--", "sh", "-c", &script])
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let pid = wait_for_file(&pidfile, Duration::from_secs(10));
    assert!(alive(&pid));
    let out = output(dlock(&server.url()).args(["force-unlock", "--yes", "doomed"]));
    assert!(out.status.success(), "{}", stderr(&out));
    let status = wait_exit(&mut run, Duration::from_secs(10));
    assert_eq!(status.code(), Some(LOST));
    assert!(!alive(&pid), "the child outlived its lock");
    let grandchild = wait_for_file(&grandchild, Duration::from_secs(1));
    let deadline = Instant::now() + Duration::from_secs(2);
    while alive(&grandchild) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        !alive(&grandchild),
        "the command's own child outlived the lock"
    );
    let err = piped_stderr(&mut run);
    assert!(err.contains("lost"), "{err}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn signals_are_forwarded_and_the_lock_released_after_the_child_exits() {
    let server = RedisServer::start().expect("redis-server");
    let dir = scratch("signals");
    let (ready, got) = (dir.join("ready"), dir.join("got"));
    let script = format!(
        "trap 'echo term > {}; exit 3' TERM; echo up > {}; while true; do sleep 0.05; done",
        got.display(),
        ready.display()
    );
    let mut run = dlock(&server.url())
        .args(["run", "signalled", "--", "sh", "-c", &script])
        .spawn()
        .expect("spawn");
    wait_for_file(&ready, Duration::from_secs(10));
    let status = Command::new("kill")
        .args(["-TERM", &run.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    let status = wait_exit(&mut run, Duration::from_secs(10));
    assert_eq!(
        status.code(),
        Some(3),
        "dlock exits with the child's status"
    );
    assert_eq!(wait_for_file(&got, Duration::from_secs(1)).trim(), "term");
    let out = output(dlock(&server.url()).args(["status", "--json", "signalled"]));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(json["held"], false, "released after the child exited");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn acquire_status_list_extend_release_round_trip() {
    let server = RedisServer::start().expect("redis-server");
    let url = server.url();
    let out = output(dlock(&url).args(["acquire", "--json", "--ttl", "20s", "job-a"]));
    assert!(out.status.success(), "{}", stderr(&out));
    let acquired: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let token = acquired["token"].as_str().expect("token").to_owned();
    assert_eq!(acquired["fence"], 1);
    assert_eq!(acquired["key"], "dlock:job-a");

    let out = output(dlock(&url).args(["acquire", "job-b"]));
    let plain = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut words = plain.split_whitespace();
    let token_b = words.next().expect("token").to_owned();
    assert_eq!(words.next(), Some("1"), "plain output is `TOKEN FENCE`");

    let out = output(dlock(&url).args(["status", "--json", "job-a"]));
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(status["held"], true);
    assert_eq!(status["last_fence"], 1);
    let shown = status["holder"].as_str().expect("holder");
    assert!(shown.len() < token.len() && token.starts_with(shown.trim_end_matches('…')));
    assert!(
        status["remaining_ms"]
            .as_u64()
            .is_some_and(|ms| ms > 0 && ms <= 20_000)
    );

    let out = output(dlock(&url).args(["list", "--json", "job-*"]));
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let names: Vec<&str> = list
        .as_array()
        .expect("array")
        .iter()
        .filter_map(|l| l["name"].as_str())
        .collect();
    assert_eq!(names, ["job-a", "job-b"]);

    let out = output(dlock(&url).args(["extend", "job-a", "--token", &token, "--ttl", "1m"]));
    assert!(out.status.success(), "{}", stderr(&out));
    let out = output(dlock(&url).args(["extend", "job-a", "--token", &token_b, "--ttl", "1m"]));
    assert_eq!(out.status.code(), Some(77), "someone else's token");
    let out = output(dlock(&url).args(["release", "job-a", "--token", &token]));
    assert!(out.status.success(), "{}", stderr(&out));
    let out = output(dlock(&url).args(["release", "job-a", "--token", &token]));
    assert_eq!(
        out.status.code(),
        Some(79),
        "released twice: nobody holds it"
    );
    let out = output(
        dlock(&url)
            .env("DLOCK_TOKEN", &token_b)
            .args(["release", "job-b"]),
    );
    assert!(
        out.status.success(),
        "token from the environment: {}",
        stderr(&out)
    );
}

#[test]
fn force_unlock_refuses_without_yes_when_it_cannot_ask() {
    let server = RedisServer::start().expect("redis-server");
    let out = output(dlock(&server.url()).args(["acquire", "kept"]));
    assert!(out.status.success());
    let out = output(dlock(&server.url()).args(["force-unlock", "kept"]));
    assert_eq!(out.status.code(), Some(USAGE));
    let out = output(dlock(&server.url()).args(["status", "--json", "kept"]));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(json["held"], true);
}

#[test]
fn bad_input_gives_one_line_and_the_right_code() {
    let dead = format!("redis://127.0.0.1:{}/", free_port().expect("port"));
    let cases: [(&[&str], &str, i32); 8] = [
        (&["run", "x", "--", "true"], "not-a-url", USAGE),
        (
            &["run", "x", "--", "true"],
            "zookeeper://127.0.0.1:2181",
            USAGE,
        ),
        (&["run", "x", "--", "true"], "memory://", USAGE),
        (&["run", "x", "--", "true"], "", USAGE),
        (&["run", "x", "--", "true"], &dead, UNAVAILABLE),
        (&["run", "--ttl", "5", "x", "--", "true"], &dead, USAGE),
        (&["run", "--wait", "soon", "x", "--", "true"], &dead, USAGE),
        (&["run", "x"], &dead, USAGE),
    ];
    for (args, url, code) in cases {
        let out = output(dlock(url).args(args));
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(code), "{args:?} {url}: {err}");
        assert_eq!(
            err.trim_end().lines().count(),
            1,
            "{args:?} {url}: not one line: {err}"
        );
        assert!(err.starts_with("dlock: "), "{err}");
    }
}

#[test]
fn help_and_completions() {
    let out = output(Command::new(env!("CARGO_BIN_EXE_dlock")).arg("--help"));
    let help = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success());
    for needle in ["Exit codes:", "75", "76", "69", "64", "dlock run --no-wait"] {
        assert!(help.contains(needle), "--help lacks {needle:?}");
    }
    let out = output(Command::new(env!("CARGO_BIN_EXE_dlock")).args(["completions", "bash"]));
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("force-unlock"));
}

#[test]
fn semaphore_runs_let_at_most_n_commands_at_once() {
    let server = RedisServer::start().expect("redis-server");
    let dir = scratch("semaphore");
    let log = dir.join("log");
    let script = format!(
        "echo \"begin ${{DLOCK_FENCE:-none}}\" >> {0}; sleep 0.3; echo end >> {0}",
        log.display()
    );
    let text = run_concurrently(
        &server.url(),
        5,
        &[
            "run",
            "--semaphore",
            "2",
            "slots",
            "--",
            "sh",
            "-c",
            &script,
        ],
        &log,
    );
    let mut inside = 0;
    let mut most = 0;
    for line in text.lines() {
        if line.starts_with("begin") {
            assert_eq!(line, "begin none", "permits carry no fence");
            inside += 1;
            most = most.max(inside);
        } else {
            inside -= 1;
        }
    }
    assert_eq!(text.lines().count(), 10, "{text}");
    assert_eq!(
        most, 2,
        "at most 2 commands at once, and 2 did run together:\n{text}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn shared_runs_share_and_exclusive_runs_are_alone() {
    let server = RedisServer::start().expect("redis-server");
    let dir = scratch("rwlock");
    let log = dir.join("log");
    let reader = format!(
        "echo \"r-begin\" >> {0}; sleep 0.4; echo r-end >> {0}",
        log.display()
    );
    let writer = format!(
        "echo \"w-begin $DLOCK_FENCE\" >> {0}; sleep 0.1; echo w-end >> {0}",
        log.display()
    );
    let url = server.url();
    let mut runs: Vec<Child> = Vec::new();
    for i in 0..6 {
        let (mode, script) = if i % 3 == 2 {
            ("--exclusive", &writer)
        } else {
            ("--shared", &reader)
        };
        runs.push(
            dlock(&url)
                .args(["run", mode, "catalog", "--", "sh", "-c", script])
                .spawn()
                .expect("spawn dlock run"),
        );
    }
    for run in &mut runs {
        assert!(wait_exit(run, Duration::from_secs(30)).success());
    }
    let text = std::fs::read_to_string(&log).expect("log");
    let (mut readers, mut writers, mut most_readers) = (0, 0, 0);
    for line in text.lines() {
        match line.split(' ').next() {
            Some("r-begin") => {
                assert_eq!(writers, 0, "a reader beside a writer:\n{text}");
                readers += 1;
                most_readers = most_readers.max(readers);
            }
            Some("r-end") => readers -= 1,
            Some("w-begin") => {
                assert_eq!((readers, writers), (0, 0), "a writer not alone:\n{text}");
                assert!(
                    line.split(' ')
                        .nth(1)
                        .is_some_and(|f| f.parse::<u64>().is_ok()),
                    "writers get a fence: {line}"
                );
                writers += 1;
            }
            _ => writers -= 1,
        }
    }
    assert_eq!(text.lines().count(), 12, "{text}");
    assert!(most_readers > 1, "readers never shared:\n{text}");
    let out = output(dlock(&url).args(["status", "--kind", "rwlock", "--json", "catalog"]));
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(status["held"], false, "{status}");
    assert_eq!(status["holders"], 0, "{status}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn fair_runs_are_alone_and_status_shows_every_kind() {
    let server = RedisServer::start().expect("redis-server");
    let dir = scratch("fair");
    let log = dir.join("log");
    let script = format!(
        "echo \"begin $$ $DLOCK_FENCE\" >> {0}; sleep 0.05; echo \"end $$\" >> {0}",
        log.display()
    );
    let text = run_concurrently(
        &server.url(),
        4,
        &["run", "--fair", "queue", "--", "sh", "-c", &script],
        &log,
    );
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 8, "{text}");
    for pair in lines.chunks(2) {
        let begin: Vec<&str> = pair[0].split(' ').collect();
        assert_eq!(begin.len(), 3, "{text}");
        assert_eq!(pair[1], format!("end {}", begin[1]), "interleaved:\n{text}");
    }
    // A running --semaphore holder shows up in `status --kind semaphore`.
    let url = server.url();
    let mut holder = dlock(&url)
        .args(["run", "--semaphore", "3", "slots", "--", "sleep", "3"])
        .spawn()
        .expect("spawn");
    let mut seen = serde_json::Value::Null;
    for _ in 0..50 {
        let out = output(dlock(&url).args(["status", "--kind", "semaphore", "--json", "slots"]));
        seen = serde_json::from_slice(&out.stdout).expect("json");
        if seen["held"] == true {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(seen["hold_count"], 1, "{seen}");
    assert_eq!(seen["holders"], 1, "{seen}");
    let out = output(dlock(&url).args(["force-unlock", "--kind", "semaphore", "--yes", "slots"]));
    assert!(out.status.success(), "{}", stderr(&out));
    let out = output(dlock(&url).args(["status", "--kind", "semaphore", "--json", "slots"]));
    let after: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(after["held"], false, "{after}");
    let _ = holder.kill();
    let _ = holder.wait();
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn redlock_and_cluster_urls_run_commands_under_the_lock() {
    let servers: Vec<RedisServer> = (0..3)
        .map(|_| RedisServer::start().expect("redis-server"))
        .collect();
    let url = format!(
        "redlock://{}",
        servers
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port()))
            .collect::<Vec<_>>()
            .join(",")
    );
    let dir = scratch("redlock");
    let log = dir.join("log");
    let script = format!(
        "echo \"begin $$ ${{DLOCK_FENCE:-none}}\" >> {0}; sleep 0.05; echo \"end $$\" >> {0}",
        log.display()
    );
    let text = run_concurrently(&url, 4, &["run", "jobs", "--", "sh", "-c", &script], &log);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 8, "{text}");
    for pair in lines.chunks(2) {
        let begin: Vec<&str> = pair[0].split(' ').collect();
        assert_eq!(
            begin.get(2),
            Some(&"none"),
            "a quorum lock has no fence: {text}"
        );
        assert_eq!(pair[1], format!("end {}", begin[1]), "interleaved:\n{text}");
    }
    // Inspection asks every node: free on all of them after the runs.
    let out = output(dlock(&url).args(["status", "--json", "jobs"]));
    assert!(out.status.success(), "{}", stderr(&out));
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(status["held"], false, "{status}");
    assert_eq!(status["quorum"]["nodes"].as_array().map(Vec::len), Some(3));
    let out = output(dlock(&url).args(["run", "--fair", "jobs", "--", "true"]));
    assert_eq!(out.status.code(), Some(64), "{}", stderr(&out));

    let cluster = dlock_test::cluster::RedisCluster::start(3, 0).expect("cluster");
    let out = output(dlock(&cluster.url()).args([
        "run",
        "--no-wait",
        "on-a-cluster",
        "--",
        "sh",
        "-c",
        "test -n \"$DLOCK_FENCE\"",
    ]));
    assert!(out.status.success(), "{}", stderr(&out));
    let out = output(dlock(&cluster.url()).args(["status", "--json", "on-a-cluster"]));
    assert!(out.status.success(), "{}", stderr(&out));
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(status["held"], false);
    assert_eq!(status["last_fence"], 1, "{status}");

    let mc = dlock_test::server::MemcachedServer::start().expect("memcached");
    let out = output(dlock(&mc.url()).args([
        "run",
        "--ttl",
        "3s",
        "on-memcached",
        "--",
        "sh",
        "-c",
        "test \"$DLOCK_FENCE\" = 1",
    ]));
    assert!(out.status.success(), "{}", stderr(&out));
    // memcache:// has every kind: a semaphore nobody holds is shown as free.
    let out = output(dlock(&mc.url()).args(["status", "--json", "--kind", "semaphore", "x"]));
    assert!(out.status.success(), "{}", stderr(&out));
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(status["held"], false, "{status}");

    // etcd:// runs in a dlock built with etcd support (the `etcd` feature).
    #[cfg(feature = "etcd")]
    {
        let etcd = dlock_test::server::EtcdCluster::start(1).expect("etcd");
        let url = etcd.url();
        let mut ok = false;
        for _ in 0..50 {
            let out = output(dlock(&url).args([
                "run",
                "--ttl",
                "3s",
                "on-etcd",
                "--",
                "sh",
                "-c",
                "test -n \"$DLOCK_FENCE\"",
            ]));
            if out.status.success() {
                ok = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(200)); // the member is still electing
        }
        assert!(ok, "dlock run on etcd://");
        let mut holder = dlock(&url)
            .args(["run", "--ttl", "3s", "held-on-etcd", "--", "sleep", "3"])
            .spawn()
            .expect("spawn");
        let mut listed = String::new();
        for _ in 0..50 {
            let out = output(dlock(&url).args(["list"]));
            listed = String::from_utf8_lossy(&out.stdout).into_owned();
            if listed.contains("held-on-etcd") {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        assert!(listed.contains("held-on-etcd"), "{listed}");
        let out = output(dlock(&url).args(["status", "--json", "held-on-etcd"]));
        let status: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        assert_eq!(status["held"], true, "{status}");
        let out = output(dlock(&url).args(["force-unlock", "--yes", "held-on-etcd"]));
        assert!(out.status.success(), "{}", stderr(&out));
        // The holder learns its lock is gone and terminates its command: exit 76.
        assert_eq!(
            wait_exit(&mut holder, Duration::from_secs(20)).code(),
            Some(76)
        );
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn postgres_urls_run_list_inspect_and_force_unlock() {
    let pg = dlock_test::postgres::PostgresServer::start().expect("postgres");
    let url = pg.url();
    let out = output(dlock(&url).args([
        "run",
        "--ttl",
        "3s",
        "on-postgres",
        "--",
        "sh",
        "-c",
        "test \"$DLOCK_FENCE\" = 1",
    ]));
    assert!(out.status.success(), "{}", stderr(&out));
    // The unix-socket form of the URL reaches the same store: the fence goes on.
    let out = output(dlock(&pg.socket_url()).args(["status", "--json", "on-postgres"]));
    assert!(out.status.success(), "{}", stderr(&out));
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(status["held"], false, "{status}");
    assert_eq!(status["last_fence"], 1, "{status}");
    let mut holder = dlock(&url)
        .args([
            "run",
            "--ttl",
            "3s",
            "held-on-postgres",
            "--",
            "sleep",
            "20",
        ])
        .spawn()
        .expect("spawn");
    let mut listed = String::new();
    for _ in 0..100 {
        let out = output(dlock(&url).args(["list"]));
        listed = String::from_utf8_lossy(&out.stdout).into_owned();
        if listed.contains("held-on-postgres") {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(listed.contains("held-on-postgres"), "{listed}");
    let out = output(dlock(&url).args(["status", "--json", "held-on-postgres"]));
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(status["held"], true, "{status}");
    let out = output(dlock(&url).args(["force-unlock", "--yes", "held-on-postgres"]));
    assert!(out.status.success(), "{}", stderr(&out));
    // The holder learns its lock is gone and terminates its command: exit 76.
    assert_eq!(
        wait_exit(&mut holder, Duration::from_secs(20)).code(),
        Some(76)
    );
    // The family too: two of two permits taken by two runs at once, a third refused.
    let mut runs: Vec<Child> = (0..2)
        .map(|_| {
            dlock(&url)
                .args(["run", "--semaphore", "2", "pool", "--", "sleep", "3"])
                .spawn()
                .expect("spawn")
        })
        .collect();
    let mut in_use = serde_json::Value::Null;
    for _ in 0..100 {
        let out = output(dlock(&url).args(["status", "--json", "--kind", "semaphore", "pool"]));
        assert!(out.status.success(), "{}", stderr(&out));
        in_use = serde_json::from_slice(&out.stdout).expect("json");
        if in_use["holders"] == 2 {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(in_use["holders"], 2, "{in_use}");
    let out =
        output(dlock(&url).args(["run", "--semaphore", "2", "--no-wait", "pool", "--", "true"]));
    assert!(
        !out.status.success(),
        "a third permit of two: {}",
        stderr(&out)
    );
    for run in &mut runs {
        assert!(wait_exit(run, Duration::from_secs(20)).success());
    }
    let out = output(dlock(&url).args(["run", "--fair", "in-line", "--", "true"]));
    assert!(out.status.success(), "{}", stderr(&out));
    // Advisory-lock mode: a session lock, no fence.
    let advisory = format!("{url}?mode=advisory");
    let out = output(dlock(&advisory).args([
        "run",
        "in-a-session",
        "--",
        "sh",
        "-c",
        "test -z \"$DLOCK_FENCE\"",
    ]));
    assert!(out.status.success(), "{}", stderr(&out));
    let out = output(dlock(&advisory).args(["run", "--semaphore", "2", "x", "--", "true"]));
    assert_eq!(out.status.code(), Some(64), "{}", stderr(&out));
    // A wrong password: refused, and not printed.
    let out = output(dlock(&pg.url_as("dlock", "wrong-pw")).args(["status", "x"]));
    assert!(!out.status.success());
    assert!(!stderr(&out).contains("wrong-pw"), "{}", stderr(&out));
}

#[test]
fn zookeeper_urls_run_list_inspect_and_force_unlock() {
    // The server stores.rs uses too (one start for the binary), in a chroot of its own.
    let zk = dlock_test::zookeeper::ZooKeeper::shared();
    // A chroot as users' URLs have them; a session of 2 s (the lease of each hold).
    let url = zk.url("/dlock-cli", "?session_timeout=2s");
    let fence_of_a_run = || {
        let out = output(dlock(&url).args([
            "run",
            "--ttl",
            "3s",
            "on-zookeeper",
            "--",
            "sh",
            "-c",
            "echo \"$DLOCK_FENCE\"",
        ]));
        assert!(out.status.success(), "{}", stderr(&out));
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse::<u64>()
            .unwrap_or_else(|e| panic!("DLOCK_FENCE {:?}: {e}", out.stdout))
    };
    // The fence is the lock node's creation zxid: a new node, a higher one.
    let (first, second) = (fence_of_a_run(), fence_of_a_run());
    assert!(first > 0 && second > first, "{first} then {second}");
    let out = output(dlock(&url).args(["status", "--json", "on-zookeeper"]));
    assert!(out.status.success(), "{}", stderr(&out));
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(status["held"], false, "{status}");
    let mut holder = dlock(&url)
        .args([
            "run",
            "--ttl",
            "3s",
            "held-on-zookeeper",
            "--",
            "sleep",
            "20",
        ])
        .spawn()
        .expect("spawn");
    let mut listed = Vec::new();
    for _ in 0..100 {
        let out = output(dlock(&url).args(["list", "--json"]));
        assert!(out.status.success(), "{}", stderr(&out));
        let rows: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        listed = rows
            .as_array()
            .expect("rows")
            .iter()
            .filter_map(|r| r["name"].as_str().map(str::to_owned))
            .collect();
        if !listed.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    // The lock the runs above released is not listed: its directory has no node left.
    assert_eq!(listed, ["held-on-zookeeper"]);
    let out = output(dlock(&url).args(["status", "--json", "held-on-zookeeper"]));
    assert!(out.status.success(), "{}", stderr(&out));
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(status["held"], true, "{status}");
    assert!(
        status["holder"].as_str().is_some_and(|t| !t.is_empty()),
        "{status}"
    );
    assert!(
        status["last_fence"].as_u64().is_some_and(|f| f > second),
        "the holder's node is newer than the runs before: {status}"
    );
    let out = output(dlock(&url).args(["force-unlock", "--yes", "held-on-zookeeper"]));
    assert!(out.status.success(), "{}", stderr(&out));
    // The holder's next renewal finds its node gone: it terminates its command, exit 76.
    assert_eq!(
        wait_exit(&mut holder, Duration::from_secs(20)).code(),
        Some(LOST)
    );
    let out = output(dlock(&url).args(["status", "--json", "held-on-zookeeper"]));
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(status["held"], false, "{status}");
    // A hold that outlives its command cannot live in a session that ends with it.
    let out = output(dlock(&url).args(["acquire", "--ttl", "30s", "for-later"]));
    assert_eq!(out.status.code(), Some(USAGE), "{}", stderr(&out));
    assert!(stderr(&out).contains("session"), "{}", stderr(&out));
    // The family too: two of two permits taken by two runs at once, a third refused.
    let mut runs: Vec<Child> = (0..2)
        .map(|_| {
            dlock(&url)
                .args(["run", "--semaphore", "2", "pool", "--", "sleep", "3"])
                .spawn()
                .expect("spawn")
        })
        .collect();
    let mut in_use = serde_json::Value::Null;
    for _ in 0..100 {
        let out = output(dlock(&url).args(["status", "--json", "--kind", "semaphore", "pool"]));
        assert!(out.status.success(), "{}", stderr(&out));
        in_use = serde_json::from_slice(&out.stdout).expect("json");
        if in_use["holders"] == 2 {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(in_use["holders"], 2, "{in_use}");
    let out =
        output(dlock(&url).args(["run", "--semaphore", "2", "--no-wait", "pool", "--", "true"]));
    assert!(
        !out.status.success(),
        "a third permit of two: {}",
        stderr(&out)
    );
    for run in &mut runs {
        assert!(wait_exit(run, Duration::from_secs(20)).success());
    }
    let out = output(dlock(&url).args(["run", "--fair", "in-line", "--", "true"]));
    assert!(out.status.success(), "{}", stderr(&out));
}

/// `dlock torture` and `dlock demo` run the harness binary in place of dlock, with every
/// argument as given (flags and `--help` included), its exit code their own; a missing
/// harness is a clear error (127), not a panic.
#[test]
fn torture_and_demo_run_the_harness_with_their_arguments() {
    let dir = scratch("harness");
    let fake = dir.join("fake-harness");
    std::fs::write(
        &fake,
        "#!/bin/sh\nprintf '%s|' \"$@\" > \"$0.args\"\necho \"$DLOCK_TORTURE_VIA_DLOCK\" > \"$0.env\"\nexit 3\n",
    )
    .expect("write the fake harness");
    let made_executable = Command::new("chmod")
        .args(["+x", fake.to_str().expect("utf-8 path")])
        .status()
        .expect("chmod");
    assert!(made_executable.success());
    let run = |args: &[&str]| {
        output(
            Command::new(env!("CARGO_BIN_EXE_dlock"))
                .env("DLOCK_TORTURE", &fake)
                .args(args),
        )
    };
    let out = run(&["torture", "--quick", "--seed", "5", "--help"]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let args = std::fs::read_to_string(dir.join("fake-harness.args")).expect("args");
    assert_eq!(args, "torture|--quick|--seed|5|--help|");
    let env = std::fs::read_to_string(dir.join("fake-harness.env")).expect("env");
    assert_eq!(env.trim(), "1");
    let out = run(&["demo", "--plain"]);
    assert_eq!(out.status.code(), Some(3));
    let args = std::fs::read_to_string(dir.join("fake-harness.args")).expect("args");
    assert_eq!(args, "demo|--plain|");
    // No harness: a one-line error naming it and how to build it.
    let out = output(
        Command::new(env!("CARGO_BIN_EXE_dlock"))
            .env("DLOCK_TORTURE", dir.join("missing"))
            .args(["torture", "--quick"]),
    );
    assert_eq!(out.status.code(), Some(127), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("dlock-torture") && err.contains("cargo build") && err.lines().count() == 1,
        "{err}"
    );
    let _ = std::fs::remove_dir_all(dir);
}
