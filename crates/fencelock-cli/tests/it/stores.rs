//! Every command on every store: what the store can do works, what it cannot is a usage
//! error that says why. One server per store, one test per store (they run side by side);
//! one table of cases walked by the same steps.

use super::*;

#[cfg(feature = "etcd")]
use dlock_test::server::EtcdCluster;
use dlock_test::server::{MemcachedServer, SentinelServer};

/// A store whose holds outlive their process (acquire/release/extend by token work).
struct Case {
    label: &'static str,
    url: String,
    /// Whether grants carry a fence (not RedLock).
    fenced: bool,
    /// Why `list` is refused (a word of the message), if it is.
    list_refused: Option<&'static str>,
    /// Why `top` is refused (a word of the message), if it is.
    top_refused: Option<&'static str>,
    /// Expiry on a whole-second clock (memcached, etcd's leases): remaining ttls read up
    /// to this much above the asked-for ttl.
    slack: Duration,
}

/// `--min-hold` in the cases.
const MIN_HOLD: Duration = Duration::from_secs(3);

fn json(out: &Output) -> serde_json::Value {
    assert!(out.status.success(), "{}", stderr(out));
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

fn status(url: &str, name: &str) -> serde_json::Value {
    json(&output(dlock(url).args(["status", "--json", name])))
}

/// The store answers (a fresh etcd member may still be electing its leader).
fn wait_ready(url: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = output(dlock(url).args(["status", "ready-probe"]));
        if out.status.success() {
            return;
        }
        assert!(Instant::now() < deadline, "never ready: {}", stderr(&out));
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The abbreviated holder `shown` names `token` without giving it away: a short prefix
/// of its random part and `…`, nothing of the metadata behind it.
fn assert_abbreviates(shown: &str, token: &str) {
    let random = token.split('~').next().expect("random part");
    let prefix = shown.strip_suffix('…').expect("ends with …");
    assert!(
        !prefix.is_empty() && prefix.len() <= random.len() / 2 && random.starts_with(prefix),
        "{shown:?} of {token:?}"
    );
}

/// An exit code and a word of the message.
fn assert_refused(out: &Output, code: i32, why: &str) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(code), "{err}");
    assert!(err.contains(why), "{why:?} not in {err}");
    // Besides warnings about the store's configuration (no AOF).
    let lines = err.trim_end().lines();
    assert_eq!(
        lines.filter(|l| !l.starts_with("dlock: warning: ")).count(),
        1,
        "{err}"
    );
}

fn remaining_ms(s: &serde_json::Value) -> u64 {
    s["remaining_ms"].as_u64().unwrap_or_else(|| panic!("{s}"))
}

/// acquire → status (holder and metadata) → extend → list → release by another process
/// → status free; force-unlock; `run --min-hold`.
fn round_trip(case: &Case) {
    let (url, label) = (case.url.as_str(), case.label);
    wait_ready(url);
    let name = format!("matrix-{label}");

    // --min-hold first, so its wait overlaps the rest: a job that exits at once keeps
    // the lock D after it ended, and the same job started again right after is skipped.
    let quick = format!("quick-{label}");
    let launched = Instant::now();
    let out = output(dlock(url).args([
        "run",
        "--no-wait",
        "--min-hold",
        "3s",
        &quick,
        "--",
        "sh",
        "-c",
        "exit 7",
    ]));
    assert_eq!(out.status.code(), Some(7), "{label}: {}", stderr(&out));
    let min_hold_done = Instant::now();
    let out = output(dlock(url).args(["run", "--no-wait", &quick, "--", "true"]));
    assert_eq!(
        out.status.code(),
        Some(CONFLICT),
        "{label}: {}",
        stderr(&out)
    );
    let s = status(url, &quick);
    assert_eq!(s["held"], true, "{label}: {s}");
    // Set to D (plus the store's drift allowance) when the job ended, which was after
    // `launched`: at least D - (now - launched) is left, and not the 30 s ttl.
    let left = remaining_ms(&s);
    assert!(
        left + millis(launched.elapsed() + case.slack) >= millis(MIN_HOLD),
        "{label}: kept at least --min-hold after the job: {s}"
    );
    assert!(
        left <= millis(MIN_HOLD + Duration::from_millis(1100) + case.slack),
        "{label}: set to --min-hold (plus drift), not the ttl: {s}"
    );
    // The program's name only: its arguments may carry secrets.
    assert_eq!(s["holder_info"]["command"], "sh", "{label}: {s}");

    // acquire: `TOKEN FENCE` (`TOKEN -` without fences), or JSON.
    let out = output(dlock(url).args([
        "acquire",
        "--json",
        "--ttl",
        "20s",
        "--info",
        "matrix job",
        &name,
    ]));
    let acquired = json(&out);
    let token = acquired["token"].as_str().expect("token").to_owned();
    if case.fenced {
        assert!(
            acquired["fence"].as_u64().is_some_and(|f| f > 0),
            "{acquired}"
        );
    } else {
        assert!(acquired["fence"].is_null(), "{acquired}");
    }
    let other = format!("other-{label}");
    let out = output(dlock(url).args(["acquire", "--ttl", "20s", &other]));
    assert!(out.status.success(), "{label}: {}", stderr(&out));
    let plain = String::from_utf8_lossy(&out.stdout).into_owned();
    let words: Vec<&str> = plain.split_whitespace().collect();
    assert_eq!(words.len(), 2, "{label}: `TOKEN FENCE`: {plain}");
    let other_token = words[0].to_owned();
    assert_eq!(words[1] == "-", !case.fenced, "{label}: {plain}");
    let out = output(dlock(url).args(["acquire", "--no-wait", &name]));
    assert_eq!(
        out.status.code(),
        Some(CONFLICT),
        "{label}: {}",
        stderr(&out)
    );

    // status: the holder (abbreviated) and who it said it is.
    let s = status(url, &name);
    assert_eq!(s["held"], true, "{label}: {s}");
    assert_abbreviates(s["holder"].as_str().expect("holder"), &token);
    let info = &s["holder_info"];
    assert_eq!(
        info["pid"],
        std::process::id(),
        "{label}: the caller's pid: {s}"
    );
    assert_eq!(info["command"], "matrix job", "{label}: {s}");
    assert!(info["host"].as_str().is_some_and(|h| !h.is_empty()), "{s}");
    assert!(
        info["since"].as_str().is_some_and(|t| t.ends_with('Z')),
        "{s}"
    );
    let remaining = remaining_ms(&s);
    assert!(
        remaining > 0 && remaining <= 20_000 + millis(case.slack),
        "{label}: {s}"
    );
    let out = output(dlock(url).args(["status", &name]));
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    for needle in ["command:         matrix job", "pid:", "since:", "host:"] {
        assert!(text.contains(needle), "{label}: {needle:?} in\n{text}");
    }
    assert!(!text.contains(&token), "{label}: the token leaked: {text}");

    // extend, from another process, to a shorter lease: the lease is that long now.
    let out = output(dlock(url).args(["extend", &name, "--token", &token, "--ttl", "9s"]));
    assert!(out.status.success(), "{label}: {}", stderr(&out));
    let s = status(url, &name);
    assert!(
        remaining_ms(&s) <= 9_000 + millis(case.slack),
        "{label}: extended to 9s: {s}"
    );
    let out = output(dlock(url).args(["extend", &name, "--token", &other_token, "--ttl", "9s"]));
    assert_eq!(out.status.code(), Some(77), "{label}: another's token");

    // list: one row per held lock, the holder's metadata in it.
    let out = output(dlock(url).args(["list", "--json", "*-*"]));
    if let Some(why) = case.list_refused {
        assert_refused(&out, USAGE, why);
    } else {
        let rows = json(&out);
        let row = rows
            .as_array()
            .expect("rows")
            .iter()
            .find(|r| r["name"] == name.as_str())
            .unwrap_or_else(|| panic!("{label}: {name} not in {rows}"));
        assert_eq!(row["holder_info"]["command"], "matrix job", "{row}");
        assert_abbreviates(row["holder"].as_str().expect("holder"), &token);
        let out = output(dlock(url).args(["list", "*-*"]));
        assert!(out.status.success(), "{}", stderr(&out));
        let table = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            table.starts_with("NAME ")
                && table.lines().next().is_some_and(|h| h.ends_with("COMMAND")),
            "{table}"
        );
        let line = table
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name.as_str()))
            .unwrap_or_else(|| panic!("{label}: {name} not in\n{table}"));
        assert!(line.ends_with("matrix job"), "{line}");
        assert_eq!(
            line.split_whitespace().nth(5),
            Some(std::process::id().to_string().as_str()),
            "{label}: PID column: {line}"
        );
        assert!(
            !table.contains(&token),
            "{label}: the token leaked: {table}"
        );
    }

    // top: one JSON refresh with both held locks and who holds them.
    top_shows_the_holders(case, &acquired, &other_token);

    // release by token from another process (DLOCK_TOKEN); a second release is refused.
    let out = output(
        dlock(url)
            .env("DLOCK_TOKEN", &token)
            .args(["release", &name]),
    );
    assert!(out.status.success(), "{label}: {}", stderr(&out));
    let s = status(url, &name);
    assert_eq!(s["held"], false, "{label}: {s}");
    assert!(s["holder_info"].is_null(), "{s}");
    let out = output(dlock(url).args(["release", &name, "--token", &token]));
    assert_eq!(out.status.code(), Some(79), "{label}: released twice");

    // force-unlock: the other holder's lock is gone; a free lock is exit 79.
    let out = output(dlock(url).args(["force-unlock", "--yes", &other]));
    assert!(out.status.success(), "{label}: {}", stderr(&out));
    assert!(stderr(&out).contains("force-unlocked"), "{}", stderr(&out));
    assert_eq!(status(url, &other)["held"], false, "{label}");
    let out = output(dlock(url).args(["force-unlock", "--yes", &other]));
    assert_eq!(out.status.code(), Some(79), "{label}: {}", stderr(&out));
    assert!(stderr(&out).contains("is not held"), "{}", stderr(&out));
    let out = output(dlock(url).args(["release", &other, "--token", &other_token]));
    assert_eq!(out.status.code(), Some(79), "{label}: force-unlocked");

    // The quick job's lock expires D (plus drift) after it ended, by itself.
    let deadline = min_hold_done + MIN_HOLD + 2 * case.slack + Duration::from_secs(4);
    while status(url, &quick)["held"] == true {
        assert!(
            Instant::now() < deadline,
            "{label}: still held long after --min-hold"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = output(dlock(url).args(["run", "--no-wait", &quick, "--", "true"]));
    assert!(out.status.success(), "{label}: {}", stderr(&out));
}

/// `dlock top --json --iterations 1` while `matrix-<label>` (acquired: `acquired`, with
/// `--info "matrix job"`) and `other-<label>` (`other_token`) are held: one refresh, one
/// line, a row per lock with its holder (abbreviated) and metadata; or, where the store
/// cannot list, the usage code and why, nothing drawn.
fn top_shows_the_holders(case: &Case, acquired: &serde_json::Value, other_token: &str) {
    let (url, label) = (case.url.as_str(), case.label);
    let pattern = format!("*-{label}");
    let out = output(dlock(url).args(["top", "--json", "--iterations", "1", &pattern]));
    if let Some(why) = case.top_refused {
        assert_refused(&out, USAGE, why);
        assert!(out.stdout.is_empty(), "{label}: nothing drawn: {out:?}");
        return;
    }
    assert!(out.status.success(), "{label}: {}", stderr(&out));
    let text = String::from_utf8(out.stdout).expect("utf-8");
    assert_eq!(
        text.lines().count(),
        1,
        "{label}: one refresh, one line: {text}"
    );
    let token = acquired["token"].as_str().expect("token");
    assert!(!text.contains(token), "{label}: the token leaked: {text}");
    let tick: serde_json::Value = serde_json::from_str(&text).expect("json");
    let locks = tick["locks"].as_array().unwrap_or_else(|| panic!("{tick}"));
    let row = |name: &str| {
        locks
            .iter()
            .find(|l| l["name"] == name && l["kind"] == "lock")
            .unwrap_or_else(|| panic!("{label}: {name} not in {tick}"))
    };
    let job = row(&format!("matrix-{label}"));
    assert_eq!(job["held"], true, "{label}: {job}");
    assert_abbreviates(job["holder"].as_str().expect("holder"), token);
    assert_eq!(job["command"], "matrix job", "{label}: {job}");
    assert_eq!(job["pid"], std::process::id(), "{label}: {job}");
    assert!(job["host"].as_str().is_some_and(|h| !h.is_empty()), "{job}");
    assert!(job["since_ms"].as_u64().is_some(), "{label}: {job}");
    // The counter: the holder's fence, or above it where an attempt that found the lock
    // held took a number (Redis mints a fence with every first attempt's SET).
    assert!(
        job["last_fence"].as_u64() >= acquired["fence"].as_u64(),
        "{label}: {job}"
    );
    // Extended to 9 s just before.
    assert!(
        job["remaining_ms"]
            .as_u64()
            .is_some_and(|ms| ms > 0 && ms <= 9_000 + millis(case.slack)),
        "{label}: {job}"
    );
    let other = row(&format!("other-{label}"));
    assert_eq!(other["held"], true, "{label}: {other}");
    assert_abbreviates(other["holder"].as_str().expect("holder"), other_token);
    assert!(
        locks.iter().all(|l| l["held"] == true),
        "{label}: only held locks: {tick}"
    );
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).expect("ms")
}

/// `dlock run`'s holder metadata while its command runs: dlock's pid, the program's name.
/// Returns the holder's `status`; the run ends when the test is done with it.
fn run_shows_its_holder(url: &str, name: &str) -> serde_json::Value {
    let dir = scratch("holder");
    let stop = dir.join("stop");
    let started = dir.join("started");
    let script = "touch started; while [ ! -e stop ]; do sleep 0.05; done";
    let mut run = dlock(url)
        .current_dir(&dir)
        .args(["run", "--ttl", "5s", name, "--", "sh", "-c", script])
        .spawn()
        .expect("spawn dlock run");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !started.exists() {
        assert!(Instant::now() < deadline, "the command never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    let s = status(url, name);
    assert_eq!(s["held"], true, "{s}");
    std::fs::write(&stop, "").expect("stop");
    assert!(wait_exit(&mut run, Duration::from_secs(20)).success());
    assert_eq!(
        status(url, name)["held"],
        false,
        "released after the command"
    );
    let _ = std::fs::remove_dir_all(dir);
    let info = &s["holder_info"];
    if !info.is_null() {
        assert_eq!(info["pid"], run.id(), "dlock run's own pid: {s}");
        // Not the script (arguments may carry secrets): the program's name.
        assert_eq!(info["command"], "sh", "{s}");
    }
    s
}

#[test]
fn redis_single_every_command() {
    let server = RedisServer::start().expect("redis-server");
    let case = Case {
        label: "redis",
        url: server.url(),
        fenced: true,
        list_refused: None,
        top_refused: None,
        slack: Duration::ZERO,
    };
    round_trip(&case);
    let s = run_shows_its_holder(&case.url, "running");
    assert!(!s["holder_info"].is_null(), "{s}");
    // However long the command ran, the lock is kept --min-hold after it ended (set to
    // that, not left at the 30 s ttl), then expires by itself.
    let launched = Instant::now();
    let out =
        output(dlock(&case.url).args(["run", "--min-hold", "2s", "longer", "--", "sleep", "0.3"]));
    let ended = Instant::now();
    assert!(out.status.success(), "{}", stderr(&out));
    let s = status(&case.url, "longer");
    assert_eq!(s["held"], true, "kept after the command: {s}");
    let left = remaining_ms(&s);
    assert!(
        left + millis(launched.elapsed()) >= 2_000 && left <= 2_100,
        "set to --min-hold (and its drift allowance) when the command ended: {s}"
    );
    let deadline = ended + Duration::from_secs(6);
    while status(&case.url, "longer")["held"] == true {
        assert!(
            Instant::now() < deadline,
            "still held long after --min-hold"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // --no-info: a plain random token, no metadata.
    let out = output(dlock(&case.url).args(["acquire", "--no-info", "anonymous"]));
    let token = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .expect("token")
        .to_owned();
    assert!(
        token.len() == 32 && token.bytes().all(|b| b.is_ascii_hexdigit()),
        "{token}"
    );
    let s = status(&case.url, "anonymous");
    assert!(s["holder_info"].is_null(), "{s}");
    let out = output(dlock(&case.url).args(["status", "anonymous"]));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(text.contains("host:            -"), "{text}");
    // A foreign client's short token at the key: never shown whole.
    let mut admin = server.client().get_connection().expect("admin");
    let _: () = redis::cmd("SET")
        .arg("dlock:foreign")
        .arg("abc")
        .arg("PX")
        .arg(20_000)
        .query(&mut admin)
        .expect("SET");
    let s = status(&case.url, "foreign");
    assert_eq!(s["holder"], "a…", "{s}");
    // --min-hold is capped at the longest lease, with the usage code.
    let out = output(dlock(&case.url).args(["run", "--min-hold", "25h", "x", "--", "true"]));
    assert_refused(&out, USAGE, "at most");
}

#[test]
fn redis_sentinel_and_cluster_every_command() {
    let master = RedisServer::start().expect("redis-server");
    let sentinel = SentinelServer::start(master.port(), "mymaster", 1).expect("sentinel");
    round_trip(&Case {
        label: "sentinel",
        url: format!("redis+sentinel://{}/mymaster", sentinel.addr()),
        fenced: true,
        list_refused: None,
        top_refused: None,
        slack: Duration::ZERO,
    });
    let cluster = dlock_test::cluster::RedisCluster::start(3, 0).expect("cluster");
    round_trip(&Case {
        label: "cluster",
        url: cluster.url(),
        fenced: true,
        list_refused: None,
        top_refused: None,
        slack: Duration::ZERO,
    });
}

/// RedLock: the token without a fence; status, list and force-unlock ask every node and
/// show the majority's view.
#[test]
fn redlock_every_command() {
    let servers: Vec<RedisServer> = (0..3)
        .map(|_| RedisServer::start().expect("redis-server"))
        .collect();
    let hosts: Vec<String> = servers
        .iter()
        .map(|s| format!("127.0.0.1:{}", s.port()))
        .collect();
    let url = format!("redlock://{}", hosts.join(","));
    round_trip(&Case {
        label: "redlock",
        url: url.clone(),
        fenced: false,
        list_refused: None,
        top_refused: Some("several independent stores"),
        slack: Duration::ZERO,
    });
    let out = output(dlock(&url).args(["acquire", "--ttl", "20s", "split"]));
    assert!(out.status.success(), "{}", stderr(&out));
    let s = status(&url, "split");
    assert_eq!(s["quorum"]["needed"], 2, "{s}");
    let nodes = s["quorum"]["nodes"].as_array().expect("nodes");
    assert_eq!(nodes.len(), 3, "{s}");
    assert!(nodes.iter().all(|n| n["held"] == true), "{s}");
    // One node loses the key: a majority still holds it. Two: nobody does.
    let del = |server: &RedisServer| {
        let mut admin = server.client().get_connection().expect("admin");
        let _: i64 = redis::cmd("DEL")
            .arg("dlock:split")
            .query(&mut admin)
            .expect("DEL");
    };
    del(&servers[0]);
    let s = status(&url, "split");
    assert_eq!(s["held"], true, "{s}");
    assert_eq!(s["quorum"]["nodes"][0]["held"], false, "{s}");
    del(&servers[1]);
    let s = status(&url, "split");
    assert_eq!(s["held"], false, "{s}");
    let out = output(dlock(&url).args(["list", "--json", "split"]));
    assert_eq!(
        json(&out),
        serde_json::json!([]),
        "a minority's lock is not listed"
    );
    let out = output(dlock(&url).args(["status", "--kind", "fair", "split"]));
    assert_refused(&out, USAGE, "plain lock only");
    let out = output(dlock(&url).args(["run", "--fair", "split", "--", "true"]));
    assert_refused(&out, USAGE, "plain lock only");
}

#[test]
fn memcached_every_command_but_list() {
    let server = MemcachedServer::start().expect("memcached");
    round_trip(&Case {
        label: "memcached",
        url: server.url(),
        fenced: true,
        list_refused: Some("no key iteration"),
        top_refused: Some("no key iteration"),
        slack: Duration::from_secs(1),
    });
    let out = output(dlock(&server.url()).args(["list"]));
    assert_refused(&out, USAGE, "memcached has no key iteration");
}

#[cfg(feature = "etcd")]
#[test]
fn etcd_every_command() {
    let cluster = EtcdCluster::start(1).expect("etcd");
    round_trip(&Case {
        label: "etcd",
        url: cluster.url(),
        fenced: true,
        list_refused: None,
        top_refused: None,
        slack: Duration::from_secs(1),
    });
    let s = run_shows_its_holder(&cluster.url(), "running");
    assert!(!s["holder_info"].is_null(), "{s}");
    // top watches every kind etcd has.
    let out =
        output(dlock(&cluster.url()).args(["top", "--iterations", "1", "--kind", "semaphore"]));
    assert!(out.status.success(), "{}", stderr(&out));
}

/// PostgreSQL in lease mode does everything; in advisory mode a hold is its session's:
/// acquire, release, extend and --min-hold refused (why: the session), list refused (only
/// hashes are stored), run, status and force-unlock work.
#[test]
fn postgres_lease_and_advisory_mode_every_command() {
    let pg = dlock_test::postgres::PostgresServer::start().expect("postgres");
    round_trip(&Case {
        label: "postgres",
        url: pg.url(),
        fenced: true,
        list_refused: None,
        top_refused: None,
        slack: Duration::ZERO,
    });
    let advisory = format!("{}?mode=advisory", pg.url());
    for args in [
        &["acquire", "x"][..],
        &["release", "x", "--token", "t"],
        &["extend", "x", "--token", "t", "--ttl", "5s"],
        &["run", "--min-hold", "5s", "x", "--", "true"],
    ] {
        let out = output(dlock(&advisory).args(args));
        assert_refused(&out, USAGE, "session");
    }
    let out = output(dlock(&advisory).args(["list"]));
    assert_refused(&out, USAGE, "hash");
    let out = output(dlock(&advisory).args(["top", "--json", "--iterations", "1"]));
    assert_refused(&out, USAGE, "hash");
    assert!(out.stdout.is_empty(), "nothing drawn: {out:?}");
    // The holder is its session (shown whole: no secret); no metadata is stored.
    let s = run_shows_its_holder(&advisory, "in-a-session");
    assert!(
        s["holder"].as_str().is_some_and(|h| h.starts_with("pid ")),
        "{s}"
    );
    assert!(s["holder_info"].is_null(), "{s}");
    // force-unlock ends the holding session: the run loses its lock.
    let mut holder = dlock(&advisory)
        .args(["run", "--ttl", "1s", "terminated", "--", "sleep", "20"])
        .spawn()
        .expect("spawn");
    let deadline = Instant::now() + Duration::from_secs(20);
    while status(&advisory, "terminated")["held"] != true {
        assert!(Instant::now() < deadline, "never held");
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = output(dlock(&advisory).args(["force-unlock", "--yes", "terminated"]));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        wait_exit(&mut holder, Duration::from_secs(20)).code(),
        Some(LOST)
    );
}

/// ZooKeeper (one test: the server is slow to start): holds are the session's, so
/// acquire, release, extend and --min-hold are refused saying so; run (with its holder's
/// metadata in its node), status, list and force-unlock work.
#[test]
fn zookeeper_every_command() {
    let zk = dlock_test::zookeeper::ZooKeeper::shared();
    let url = zk.url("/dlock-cli-stores", "?session_timeout=2s");
    for args in [
        &["acquire", "x"][..],
        &["release", "x", "--token", "t"],
        &["extend", "x", "--token", "t", "--ttl", "5s"],
        &["run", "--min-hold", "5s", "x", "--", "true"],
    ] {
        let out = output(dlock(&url).args(args));
        assert_refused(&out, USAGE, "session");
    }
    let s = run_shows_its_holder(&url, "running");
    assert!(!s["holder_info"].is_null(), "{s}");
    assert!(s["last_fence"].as_u64().is_some_and(|f| f > 0), "{s}");
    let mut holder = dlock(&url)
        .args(["run", "--ttl", "3s", "listed", "--", "sleep", "20"])
        .spawn()
        .expect("spawn");
    let deadline = Instant::now() + Duration::from_secs(20);
    let rows = loop {
        let rows = json(&output(dlock(&url).args(["list", "--json"])));
        if !rows.as_array().expect("rows").is_empty() {
            break rows;
        }
        assert!(Instant::now() < deadline, "never listed");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(rows[0]["name"], "listed", "{rows}");
    assert_eq!(rows[0]["holder_info"]["command"], "sleep", "{rows}");
    assert_eq!(rows[0]["holder_info"]["pid"], holder.id(), "{rows}");
    // top: the held lock with its holder; a session's hold has no stored ttl.
    let out = output(dlock(&url).args(["top", "--json", "--iterations", "1"]));
    assert!(out.status.success(), "{}", stderr(&out));
    let tick: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one refresh");
    let locks = tick["locks"].as_array().unwrap_or_else(|| panic!("{tick}"));
    assert_eq!(locks.len(), 1, "{tick}");
    let row = &locks[0];
    assert_eq!(
        (&row["kind"], &row["name"], &row["held"]),
        (&"lock".into(), &"listed".into(), &true.into()),
        "{row}"
    );
    assert_eq!(row["holder"], rows[0]["holder"], "{row}");
    assert!(
        row["holder"].as_str().is_some_and(|h| h.ends_with('…')),
        "abbreviated: {row}"
    );
    assert_eq!(row["command"], "sleep", "{row}");
    assert_eq!(row["pid"], holder.id(), "{row}");
    assert!(row["last_fence"].as_u64().is_some_and(|f| f > 0), "{row}");
    assert!(row["remaining_ms"].is_null(), "{row}");
    let out = output(dlock(&url).args(["force-unlock", "--yes", "listed"]));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        wait_exit(&mut holder, Duration::from_secs(20)).code(),
        Some(LOST)
    );
}

/// memory:// would exclude no other process: refused by every command, saying so.
#[test]
fn memory_is_refused_by_every_command() {
    for args in [
        &["run", "x", "--", "true"][..],
        &["acquire", "x"],
        &["release", "x", "--token", "t"],
        &["extend", "x", "--token", "t", "--ttl", "5s"],
        &["status", "x"],
        &["list"],
        &["force-unlock", "--yes", "x"],
        &["top", "--iterations", "1"],
    ] {
        let out = output(dlock("memory://").args(args));
        assert_refused(&out, USAGE, "in-process");
    }
}
