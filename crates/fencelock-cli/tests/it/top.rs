//! `dlock top`: in a real terminal (tmux) as a person uses it, as a JSON stream, and the
//! stores that cannot list.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use dlock_test::server::{MemcachedServer, RedisServer, free_port};
use fencelock::backend::Redis;
use fencelock::{HolderInfo, Lock, RwLock, Semaphore};

use super::{USAGE, dlock, output, scratch, stderr, wait_for_file};

/// A tmux server of the test's own (`-L`, no config file), killed on drop.
struct Tmux {
    socket: String,
}

impl Tmux {
    /// A detached 160×40 session running a plain `sh` with a known prompt.
    fn start(name: &str) -> Tmux {
        let tmux = Tmux {
            socket: format!(
                "dlock-top-{name}-{}-{}",
                std::process::id(),
                free_port().expect("port")
            ),
        };
        tmux.run(&[
            "new-session",
            "-d",
            "-x",
            "160",
            "-y",
            "40",
            "env PS1='top-test$ ' sh",
        ]);
        tmux
    }

    fn run(&self, args: &[&str]) -> String {
        let out = Command::new("tmux")
            .args(["-L", &self.socket, "-f", "/dev/null"])
            .args(args)
            .output()
            .expect("tmux (apt-get install tmux)");
        assert!(
            out.status.success(),
            "tmux {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Types `line` and Enter, as a person would.
    fn type_line(&self, line: &str) {
        self.run(&["send-keys", "-l", line]);
        self.run(&["send-keys", "Enter"]);
    }

    fn screen(&self) -> String {
        self.run(&["capture-pane", "-p"])
    }

    /// Waits (at most 10 s) until `ok` holds for the screen; returns that screen.
    fn wait_for(&self, what: &str, ok: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let screen = self.screen();
            if ok(&screen) {
                return screen;
            }
            assert!(
                Instant::now() < deadline,
                "the screen never showed {what}:\n{screen}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["-L", &self.socket, "kill-server"])
            .output();
    }
}

/// The table's row for lock `name`, if the screen shows one.
fn row<'a>(screen: &'a str, name: &str) -> Option<&'a str> {
    screen
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some(name))
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Runtime::new().expect("runtime")
}

fn read(path: &Path) -> String {
    wait_for_file(path, Duration::from_secs(10))
}

#[test]
fn top_in_a_terminal_shows_holders_as_they_come_and_go_and_quits_cleanly() {
    let server = RedisServer::start().expect("redis-server");
    let url = server.url();
    let dir = scratch("top-tty");
    let tmux = Tmux::start("tty");
    let bin = env!("CARGO_BIN_EXE_dlock");
    let d = dir.display();
    tmux.type_line(&format!(
        "stty -g > {d}/before1; {bin} top --url {url} --interval 200ms; \
         echo \"exit=$?\" > {d}/status1; stty -g > {d}/after1"
    ));
    tmux.wait_for("the empty table", |s| s.contains("(no lock held)"));

    // Someone takes a lock, a permit and a read lock.
    let me = HolderInfo::current().command("tmux-test-job");
    let host = me.host.clone().expect("this host's name");
    let rt = runtime();
    let (lock, permit, read_guard, token) = rt.block_on(async {
        let redis = Redis::connect(&url).await.expect("connect");
        let lock = Lock::builder(redis.clone(), "tmux-job")
            .holder_info(me.clone())
            .build()
            .expect("lock");
        let guard = lock.lock().await.expect("lock");
        let token = guard.token().as_str().to_owned();
        let sem = Semaphore::builder(redis.clone(), "tmux-slots", 3)
            .holder_info(me.clone())
            .build()
            .expect("semaphore");
        let permit = sem.acquire().await.expect("permit");
        let rw = RwLock::builder(redis, "tmux-catalog")
            .holder_info(me)
            .build()
            .expect("rwlock");
        let read_guard = rw.read().await.expect("read");
        (guard, permit, read_guard, token)
    });
    let pid = std::process::id().to_string();
    let screen = tmux.wait_for("the three holders", |s| {
        row(s, "tmux-job")
            .is_some_and(|r| r.contains("tmux-test-job") && r.contains(&host) && r.contains(&pid))
            && row(s, "tmux-slots").is_some_and(|r| r.contains("1 holder"))
            && row(s, "tmux-catalog").is_some_and(|r| r.contains("1 reader"))
    });
    println!("dlock top, three locks held:\n{screen}");
    assert!(screen.contains("3 held"), "{screen}");
    let job = row(&screen, "tmux-job").expect("row");
    assert!(job.starts_with("lock "), "{job}");
    // The holder abbreviated, never the whole token.
    assert!(job.contains(&format!("{}…", &token[..8])), "{job}");
    assert!(!screen.contains(&token[..16]), "{screen}");
    assert!(
        row(&screen, "tmux-slots")
            .expect("row")
            .starts_with("semaphore ")
    );
    assert!(
        row(&screen, "tmux-catalog")
            .expect("row")
            .starts_with("rwlock ")
    );

    // They are released: the rows go.
    rt.block_on(async {
        lock.release().await.expect("release");
        permit.release().await.expect("release");
        read_guard.release().await.expect("release");
    });
    let screen = tmux.wait_for("no rows", |s| {
        s.contains("(no lock held)")
            && ["tmux-job", "tmux-slots", "tmux-catalog"]
                .iter()
                .all(|n| row(s, n).is_none())
    });
    assert!(screen.contains("0 held"), "{screen}");

    // q quits: the shell is back, the table gone with the alternate screen, the terminal
    // settings as they were.
    tmux.run(&["send-keys", "q"]);
    assert_eq!(read(&dir.join("status1")).trim(), "exit=0");
    assert_eq!(read(&dir.join("after1")), read(&dir.join("before1")));
    let screen = tmux.wait_for("the prompt", |s| s.trim_end().ends_with("top-test$"));
    assert!(!screen.contains("KIND"), "{screen}");

    // Ctrl-Z gives the terminal back to the shell, `fg` takes it again, Ctrl-C quits.
    tmux.type_line(&format!(
        "stty -g > {d}/before2; {bin} top --url {url} --interval 200ms"
    ));
    tmux.wait_for("the table", |s| s.contains("(no lock held)"));
    tmux.run(&["send-keys", "C-z"]);
    tmux.wait_for("the stopped job", |s| {
        s.contains("Stopped") && !s.contains("(no lock held)")
    });
    tmux.type_line(&format!(
        "stty -g > {d}/stopped2; fg; echo \"exit=$?\" > {d}/status2; stty -g > {d}/after2"
    ));
    assert_eq!(read(&dir.join("stopped2")), read(&dir.join("before2")));
    tmux.wait_for("the table again", |s| s.contains("(no lock held)"));
    tmux.run(&["send-keys", "C-c"]);
    assert_eq!(read(&dir.join("status2")).trim(), "exit=0");
    assert_eq!(read(&dir.join("after2")), read(&dir.join("before2")));

    // --iterations: the last refresh stays on the normal screen, without escapes.
    tmux.type_line(&format!("clear; {bin} top --url {url} --iterations 1"));
    let screen = tmux.wait_for("the table left behind", |s| {
        s.contains("(no lock held)") && s.trim_end().ends_with("top-test$")
    });
    assert!(screen.contains("KIND  NAME"), "{screen}");
    drop(tmux);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn top_json_streams_one_object_per_refresh_with_the_holders() {
    let server = RedisServer::start().expect("redis-server");
    let url = server.url();
    let rt = runtime();
    let (guard, permit, token) = rt.block_on(async {
        let redis = Redis::connect(&url).await.expect("connect");
        let lock = Lock::builder(redis.clone(), "json-job")
            .holder_info(HolderInfo::current().command("json-test-job"))
            .build()
            .expect("lock");
        let guard = lock.lock().await.expect("lock");
        let token = guard.token().as_str().to_owned();
        let sem = Semaphore::builder(redis, "json-slots", 2)
            .build()
            .expect("semaphore");
        (guard, sem.acquire().await.expect("permit"), token)
    });
    // Another client waits for json-job: one waiter, in the lock's queue.
    let queue = rt.block_on(async {
        let redis = Redis::connect(&url).await.expect("connect");
        Lock::new(redis, "json-job").expect("lock")
    });
    let waiting = queue.clone();
    let waiter = rt.spawn(async move { waiting.lock().await.expect("granted") });
    rt.block_on(async {
        let deadline = Instant::now() + Duration::from_secs(10);
        while queue.state().await.expect("state").queued != Some(1) {
            assert!(Instant::now() < deadline, "the waiter never queued");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });

    let out =
        output(dlock(&url).args(["top", "--json", "--iterations", "3", "--interval", "100ms"]));
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8(out.stdout).expect("utf-8");
    assert!(!text.contains('\x1b'), "no ANSI in JSON: {text:?}");
    assert!(
        !text.contains(&token[..16]),
        "the token stays secret: {text}"
    );
    let ticks: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect();
    assert_eq!(ticks.len(), 3, "{text}");
    for tick in &ticks {
        assert!(tick["t"].as_u64().is_some(), "{tick}");
        let locks = tick["locks"].as_array().expect("locks");
        assert_eq!(locks.len(), 2, "{tick}");
        let job = locks
            .iter()
            .find(|l| l["name"] == "json-job")
            .expect("the held lock");
        assert_eq!(job["kind"], "lock");
        assert_eq!(job["held"], true);
        assert_eq!(job["holder"], format!("{}…", &token[..8]));
        assert_eq!(job["command"], "json-test-job");
        assert_eq!(job["pid"], std::process::id());
        assert_eq!(job["host"].as_str(), HolderInfo::current().host.as_deref());
        // The counter: the holder's fence, or above it if attempts that found the lock
        // held took numbers (Redis mints a fence with every first attempt's SET).
        assert!(
            job["last_fence"]
                .as_u64()
                .is_some_and(|f| f >= guard.fencing_token().get()),
            "{job}"
        );
        assert!(
            job["remaining_ms"].as_u64().is_some_and(|ms| ms > 0),
            "{job}"
        );
        assert!(job["since_ms"].as_u64().is_some(), "{job}");
        assert_eq!(job["queued"], 1, "{job}");
        assert_eq!(job["waiters"], 1, "the client waiting for it: {job}");
        let slots = locks
            .iter()
            .find(|l| l["name"] == "json-slots")
            .expect("the semaphore");
        assert_eq!(slots["kind"], "semaphore");
        assert_eq!(slots["hold_count"], 1, "{slots}");
        assert_eq!(slots["holders"], 1, "{slots}");
        assert!(
            slots["waiters"].as_u64().is_none_or(|w| w == 0),
            "nobody waits for a permit: {slots}"
        );
    }

    // --sort: by name (the default), and most waiters first (a lock nobody waits for,
    // named to come first by name, comes after the one with a waiter).
    let first = rt.block_on(async {
        let redis = Redis::connect(&url).await.expect("connect");
        let lock = Lock::new(redis, "json-aaa").expect("lock");
        lock.lock().await.expect("lock")
    });
    let order = |sort: &[&str]| -> Vec<String> {
        let out = output(
            dlock(&url)
                .args(["top", "--json", "--iterations", "1"])
                .args(sort),
        );
        assert!(out.status.success(), "{}", stderr(&out));
        let tick: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        tick["locks"]
            .as_array()
            .expect("locks")
            .iter()
            .map(|l| l["name"].as_str().expect("name").to_owned())
            .collect()
    };
    assert_eq!(order(&[]), ["json-aaa", "json-job", "json-slots"]);
    assert_eq!(
        order(&["--sort", "waiters"]),
        ["json-job", "json-aaa", "json-slots"],
        "the lock with a waiter first"
    );

    // Off a terminal, JSON without asking; --kind and PATTERN filter.
    let out = output(dlock(&url).args(["top", "--iterations", "1", "--kind", "semaphore"]));
    assert!(out.status.success(), "{}", stderr(&out));
    let tick: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let names: Vec<&str> = tick["locks"]
        .as_array()
        .expect("locks")
        .iter()
        .filter_map(|l| l["name"].as_str())
        .collect();
    assert_eq!(names, ["json-slots"], "{tick}");
    let out = output(dlock(&url).args(["top", "--iterations", "1", "nothing-*"]));
    let tick: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(tick["locks"], serde_json::json!([]), "{tick}");

    // A prefix of one's own belongs to one kind.
    let out = output(dlock(&url).args([
        "top",
        "--prefix",
        "app:",
        "--kind",
        "lock,semaphore",
        "--iterations",
        "1",
    ]));
    assert_eq!(out.status.code(), Some(USAGE), "{}", stderr(&out));

    rt.block_on(async {
        first.release().await.expect("release");
        guard.release().await.expect("release");
        // The waiter gets the lock, then gives it back.
        let granted = waiter.await.expect("the waiter's task");
        granted.release().await.expect("release");
        permit.release().await.expect("release");
    });
    let out = output(dlock(&url).args(["top", "--json", "--iterations", "1"]));
    let tick: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(tick["locks"], serde_json::json!([]), "released: {tick}");
}

#[test]
fn top_refuses_memcached_which_cannot_enumerate_keys() {
    let server = MemcachedServer::start().expect("memcached");
    let out = output(dlock(&server.url()).args(["top", "--iterations", "1"]));
    assert_eq!(out.status.code(), Some(USAGE), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("no key iteration"), "{err}");
    assert!(out.stdout.is_empty(), "nothing drawn: {:?}", out.stdout);
}
