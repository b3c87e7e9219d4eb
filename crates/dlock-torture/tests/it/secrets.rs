//! Secrets in lock server URLs: never printed by `dlock torture` (stdout, stderr, every
//! file it writes) whatever the scheme, never in `--help` from the environment, and never
//! on a worker process's command line (which any user of the machine can read).

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use dlock_test::server::{RedisServer, free_port};

use super::{dlock, harness, output, scratch, stderr};

const SECRET: &str = "s3cr3t-in-url-7f3a";

/// Everything the run printed and every file it left in `dir`, in one string.
fn everything(out: &Output, dir: &Path) -> String {
    let mut text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    for entry in std::fs::read_dir(dir).expect("out dir").flatten() {
        if let Ok(body) = std::fs::read(entry.path()) {
            text.push_str(&String::from_utf8_lossy(&body));
        }
    }
    text
}

/// `dlock torture` against `url` (as `--url`, then as `DLOCK_URL`): the secret appears
/// nowhere, and the URL was shown, redacted (`***`), so the run got as far as naming it.
/// Returns the outputs.
fn torture_hides_the_secret(url: &str, kinds: &str, codes: &[i32]) -> Vec<Output> {
    assert!(url.contains(SECRET), "{url}");
    let mut outs = Vec::new();
    for via_flag in [true, false] {
        let dir = scratch("torture-url-secret");
        let mut cmd = harness();
        cmd.env_remove("CI").env("RUST_LOG", "trace").arg("torture");
        if via_flag {
            cmd.env_remove("DLOCK_URL").args(["--url", url]);
        } else {
            cmd.env("DLOCK_URL", url);
        }
        let out = output(cmd.args([
            "--kinds",
            kinds,
            "--faults",
            "pause,kill",
            "--duration",
            "3s",
            "--workers",
            "2",
            "--out",
            dir.to_str().expect("utf-8 path"),
        ]));
        let text = everything(&out, &dir);
        let what = format!(
            "{url} (via {})",
            if via_flag { "--url" } else { "DLOCK_URL" }
        );
        assert!(
            !text.contains(SECRET),
            "{what}: the secret was printed: {text}"
        );
        assert!(
            text.contains("***"),
            "{what}: the URL is shown redacted: {text}"
        );
        assert!(!text.contains("panicked"), "{what}: {text}");
        assert!(
            out.status.code().is_some_and(|c| codes.contains(&c)),
            "{what}: exit {:?}, expected one of {codes:?}: {text}",
            out.status
        );
        let _ = std::fs::remove_dir_all(dir);
        outs.push(out);
    }
    outs
}

/// A loopback port where nothing listens.
fn closed() -> u16 {
    free_port().expect("port")
}

#[test]
fn torture_never_prints_a_rediss_sentinel_or_cluster_password() {
    let p = closed();
    for url in [
        format!("rediss://alice:{SECRET}@127.0.0.1:{p}/"),
        format!("rediss://alice:{SECRET}@127.0.0.1:{p}/#insecure"),
    ] {
        torture_hides_the_secret(&url, "dlock-fenced", &[69]);
    }
    // The single-Redis kinds need one server: a usage error that names the URL redacted.
    for url in [
        format!("redis+sentinel://alice:{SECRET}@127.0.0.1:{p}/mymaster"),
        format!("redis+cluster://alice:{SECRET}@127.0.0.1:{p},127.0.0.1:{p}/"),
    ] {
        let outs = torture_hides_the_secret(&url, "dlock-fenced", &[64]);
        assert!(
            stderr(&outs[0]).contains("Sentinel and Cluster"),
            "{}",
            stderr(&outs[0])
        );
    }
}

/// A PostgreSQL URL: a real server refusing the password, closed ports, the password as a
/// parameter; and a run on a server that takes it (report.json and the timeline too).
#[test]
fn torture_never_prints_a_postgres_password() {
    let pg = dlock_test::postgres::PostgresServer::start().expect("postgres");
    let outs = torture_hides_the_secret(&pg.url_as("dlock", SECRET), "postgres-fenced", &[69]);
    let err = stderr(&outs[0]);
    assert!(err.contains("password authentication failed"), "{err}");
    let p = closed();
    for url in [
        format!("postgres://app:{SECRET}@127.0.0.1:{p}/db"),
        format!("postgresql://app:{SECRET}@127.0.0.1:{p}/db?sslmode=disable"),
        format!("postgres://127.0.0.1:{p}/db?user=app&password={SECRET}"),
    ] {
        torture_hides_the_secret(&url, "postgres-fenced", &[69]);
    }
    // The server takes this one: the run goes through, and says nothing of it.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        pg.admin()
            .await
            .batch_execute(&format!(
                "CREATE ROLE torturer LOGIN SUPERUSER PASSWORD '{SECRET}'"
            ))
            .await
            .expect("create role");
    });
    let outs = torture_hides_the_secret(&pg.url_as("torturer", SECRET), "postgres-fenced", &[0]);
    assert!(
        String::from_utf8_lossy(&outs[0].stdout).contains("postgres-fenced"),
        "{}",
        String::from_utf8_lossy(&outs[0].stdout)
    );
}

/// `--help` of the harness and of `dlock torture` / `dlock demo`, with secrets in the
/// environment that their flags read (clap prints an env value beside its flag unless
/// told not to): the help is printed, the secrets are not.
#[test]
fn help_never_prints_secrets_from_the_environment() {
    let url = format!("redis://alice:{SECRET}@127.0.0.1:1/");
    let runs: Vec<(&str, Command, &[&str])> = vec![
        ("dlock-torture", harness(), &["--help"][..]),
        ("dlock-torture", harness(), &["torture", "--help"]),
        ("dlock-torture", harness(), &["torture", "-h"]),
        ("dlock-torture", harness(), &["demo", "--help"]),
        ("dlock-torture", harness(), &["help", "torture"]),
        ("dlock-torture", harness(), &["torture-worker", "--help"]),
        ("dlock-torture", harness(), &["demo-worker", "--help"]),
        ("dlock", dlock(), &["torture", "--help"]),
        ("dlock", dlock(), &["demo", "--help"]),
    ];
    for (program, mut cmd, args) in runs {
        let out = output(
            cmd.env("DLOCK_URL", &url)
                .env("DLOCK_TORTURE_WORKER_LOCK_URL", &url)
                .env("DLOCK_DEMO_WORKER_URL", &url)
                .env("RUST_LOG", "trace")
                .args(args),
        );
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(out.status.code(), Some(0), "{program} {args:?}: {text}");
        assert!(
            text.contains("Usage"),
            "{program} {args:?}: no help: {text}"
        );
        assert!(!text.contains(SECRET), "{program} {args:?}: {text}");
    }
}

/// The command lines of this user's processes now (pid, arguments joined by spaces).
fn command_lines() -> Vec<(u32, String)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let raw = std::fs::read(e.path().join("cmdline")).ok()?;
            Some((pid, String::from_utf8_lossy(&raw).replace('\0', " ")))
        })
        .collect()
}

/// The password of [`workers_get_the_password_in_their_environment_not_on_their_command_line`],
/// which no other test puts on a command line (the others here pass theirs as `--url`).
const ARGV_SECRET: &str = "argv-s3cr3t-91c2";

/// Watches every process's command line while `cmd` runs: none may show
/// [`ARGV_SECRET`], and workers (`worker_arg` on their command line) must be seen, with
/// it in their environment (`env_var`) instead. Returns `cmd`'s output.
fn watch_workers(mut cmd: Command, worker_arg: &str, env_var: &str) -> Output {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the harness");
    let (mut workers, mut with_env) = (0, 0);
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut checked = std::collections::HashSet::new();
    while child.try_wait().expect("try_wait").is_none() {
        for (pid, line) in command_lines() {
            assert!(
                !line.contains(ARGV_SECRET),
                "process {pid} shows the secret on its command line: {line}"
            );
            if line.contains(worker_arg) && checked.insert(pid) {
                workers += 1;
                let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
                let environ = String::from_utf8_lossy(&environ);
                if environ.contains(&format!("{env_var}=")) && environ.contains(ARGV_SECRET) {
                    with_env += 1;
                }
            }
        }
        assert!(Instant::now() < deadline, "the run did not end");
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("output");
    assert!(workers > 0, "no worker process seen: {}", stderr(&out));
    assert!(with_env > 0, "no worker had the URL in its environment");
    out
}

#[test]
fn workers_get_the_password_in_their_environment_not_on_their_command_line() {
    let server = RedisServer::start().expect("redis-server");
    let mut admin = server.client().get_connection().expect("admin connection");
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg(ARGV_SECRET)
        .query(&mut admin)
        .expect("CONFIG SET requirepass");
    let url = format!("redis://:{ARGV_SECRET}@127.0.0.1:{}/", server.port());
    let dir = scratch("torture-argv-secret");
    // The URL in the harness's environment, so that its own command line is clean too.
    let mut torture = harness();
    torture.env("DLOCK_URL", &url).args([
        "torture",
        "--kinds",
        "dlock-fenced",
        "--faults",
        "pause,kill",
        "--duration",
        "4s",
        "--workers",
        "2",
        "--out",
        dir.to_str().expect("utf-8 path"),
    ]);
    let out = watch_workers(torture, "torture-worker", "DLOCK_TORTURE_WORKER_LOCK_URL");
    assert!(out.status.success(), "{}", stderr(&out));
    let mut demo = harness();
    demo.env("DLOCK_URL", &url).args(["demo", "--plain"]);
    let out = watch_workers(demo, "demo-worker", "DLOCK_DEMO_WORKER_URL");
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!String::from_utf8_lossy(&out.stdout).contains(ARGV_SECRET));
    let _ = std::fs::remove_dir_all(dir);
}
