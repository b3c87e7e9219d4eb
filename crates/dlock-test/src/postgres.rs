//! A private PostgreSQL server on a free loopback port, killed on drop.
//!
//! The binaries come from `$DLOCK_PG_BIN`, else the newest `/usr/lib/postgresql/<N>/bin`
//! (Debian's `postgresql` package), else `pg_config --bindir`. `initdb` runs once per test
//! process into a template directory that every server copies. PostgreSQL refuses to run
//! as root; when the tests run as root (CI does), the directories are given to the
//! package's `postgres` user and every binary runs through `setpriv` as that user (it
//! execs, so the child process is the postmaster itself).

use std::io;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::clock::{FakeClock, Interposer};
use crate::server::free_port;

/// Environment variable naming PostgreSQL's bin directory.
pub const PG_BIN_ENV: &str = "DLOCK_PG_BIN";
/// The superuser `initdb` creates; its password is [`PASSWORD`] on TCP (the `password`
/// method: the server checks it against its SCRAM verifier, so a client in a debug build
/// does not spend tens of milliseconds per connection on SCRAM's key stretching), trust on
/// the unix socket.
pub const SUPERUSER: &str = "dlock";
/// The superuser's password.
pub const PASSWORD: &str = "dlock-test-pw";

const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// PostgreSQL's bin directory.
fn bin_dir() -> io::Result<PathBuf> {
    if let Some(dir) = std::env::var_os(PG_BIN_ENV) {
        return Ok(PathBuf::from(dir));
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let v = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("postgres").exists().then_some((v, bin))
        })
        .collect();
    versions.sort();
    if let Some((_, bin)) = versions.pop() {
        return Ok(bin);
    }
    let out = Command::new("pg_config")
        .arg("--bindir")
        .output()
        .map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "PostgreSQL not found (apt-get install postgresql, or set {PG_BIN_ENV}): {e}"
                ),
            )
        })?;
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

/// `PostgreSQL 15.18`, from the kit's `postgres --version`.
pub fn version() -> Option<String> {
    let out = Command::new(bin_dir().ok()?.join("postgres"))
        .arg("--version")
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    // "postgres (PostgreSQL) 15.18 (Debian 15.18-0+deb12u1)"
    let number = text.split_whitespace().nth(2)?;
    Some(format!("PostgreSQL {number}"))
}

/// Whether this process runs as root (PostgreSQL then runs as `postgres`).
fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|ids| ids.split_whitespace().nth(1))
            == Some("0")
    })
}

/// A command for PostgreSQL binary `name`, as the `postgres` user when we are root.
fn pg_command(name: &str) -> io::Result<Command> {
    pg_command_env(name, &[])
}

/// As [`pg_command`], the binary run through `env` with `env_args` when there are any
/// (so that a preloaded library is loaded by PostgreSQL alone, as its user, not by
/// `setpriv`). `env` and `setpriv` exec: the child is still the postmaster itself.
fn pg_command_env(name: &str, env_args: &[std::ffi::OsString]) -> io::Result<Command> {
    let bin = bin_dir()?.join(name);
    let mut c = if is_root() {
        let mut c = Command::new("setpriv");
        c.args([
            "--reuid=postgres",
            "--regid=postgres",
            "--init-groups",
            "--",
        ]);
        if !env_args.is_empty() {
            c.arg("env").args(env_args);
        }
        c
    } else if env_args.is_empty() {
        return Ok(Command::new(bin));
    } else {
        let mut c = Command::new("env");
        c.args(env_args);
        c
    };
    c.arg(bin);
    Ok(c)
}

/// Gives `path` (recursively) to the `postgres` user when we are root.
fn hand_over(path: &Path) -> io::Result<()> {
    if is_root() {
        let status = Command::new("chown")
            .args(["-R", "postgres:postgres"])
            .arg(path)
            .status()?;
        if !status.success() {
            return Err(io::Error::other(format!(
                "chown {}: {status}",
                path.display()
            )));
        }
    }
    Ok(())
}

/// The initialised data directory every server copies: made once per machine and
/// PostgreSQL version (`initdb` into a private directory, then renamed into place, so
/// concurrent test processes never see half of one), reused by later runs.
fn template() -> io::Result<&'static Path> {
    static TEMPLATE: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let made = TEMPLATE.get_or_init(|| {
        let bin = bin_dir().map_err(|e| e.to_string())?;
        let version = bin
            .parent()
            .and_then(|p| p.file_name())
            .map_or_else(|| "pg".to_owned(), |v| v.to_string_lossy().into_owned());
        // "-pw": password authentication on TCP.
        let dir = std::env::temp_dir().join(format!("dlock-pg-template-{version}-pw"));
        if dir.join("PG_VERSION").exists() {
            return Ok(dir);
        }
        let fresh = std::env::temp_dir().join(format!(
            "dlock-pg-template-{version}.{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&fresh);
        std::fs::create_dir_all(&fresh).map_err(|e| e.to_string())?;
        hand_over(&fresh).map_err(|e| e.to_string())?;
        let pwfile = std::env::temp_dir().join(format!("dlock-pg-pw.{}", std::process::id()));
        std::fs::write(&pwfile, PASSWORD).map_err(|e| e.to_string())?;
        hand_over(&pwfile).map_err(|e| e.to_string())?;
        let out = pg_command("initdb")
            .map_err(|e| e.to_string())?
            .args([
                "-U",
                SUPERUSER,
                "--auth-local=trust",
                "--auth-host=password",
                "--no-sync",
                "--locale=C",
                "-E",
                "UTF8",
            ])
            .arg(format!("--pwfile={}", pwfile.display()))
            .arg("-D")
            .arg(&fresh)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run initdb: {e}"))?;
        let _ = std::fs::remove_file(&pwfile);
        if !out.status.success() {
            let _ = std::fs::remove_dir_all(&fresh);
            return Err(format!(
                "initdb failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        if std::fs::rename(&fresh, &dir).is_err() {
            // Another process put its template there first.
            let _ = std::fs::remove_dir_all(&fresh);
        }
        if dir.join("PG_VERSION").exists() {
            Ok(dir)
        } else {
            Err(format!("no PostgreSQL template at {}", dir.display()))
        }
    });
    made.as_deref().map_err(|e| io::Error::other(e.clone()))
}

/// A `postgres` server listening on `127.0.0.1:<port>` (and a unix socket in its data
/// directory). Dropping it kills the postmaster and its children and removes the data.
#[derive(Debug)]
pub struct PostgresServer {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
    frozen: bool,
    /// Whether it serves TLS (with a self-signed certificate for 127.0.0.1).
    tls: bool,
    /// The clock it runs under, for servers from [`PostgresServer::start_with_clock`].
    clock: Option<FakeClock>,
}

impl PostgresServer {
    /// Starts a server on a free loopback port and waits until it accepts connections.
    ///
    /// # Errors
    /// PostgreSQL is missing, `initdb` failed, or no server became ready on a few ports.
    pub fn start() -> io::Result<PostgresServer> {
        PostgresServer::start_inner(false, None)
    }

    /// As [`start`](PostgresServer::start), the server (postmaster and every backend)
    /// running under `clock` (libfaketime): `clock_timestamp()`, `now()` and so dlock's
    /// lease expiry follow its wall time. Restarts keep the clock.
    ///
    /// # Errors
    /// As [`start`](PostgresServer::start), or libfaketime is not installed.
    pub fn start_with_clock(clock: &FakeClock) -> io::Result<PostgresServer> {
        PostgresServer::start_inner(false, Some(clock.clone()))
    }

    /// As [`start`](PostgresServer::start), also serving TLS with a self-signed
    /// certificate for `127.0.0.1` (see [`certificate`](PostgresServer::certificate)).
    ///
    /// # Errors
    /// As [`start`](PostgresServer::start), or `openssl` failed.
    pub fn start_tls() -> io::Result<PostgresServer> {
        PostgresServer::start_inner(true, None)
    }

    fn start_inner(tls: bool, clock: Option<FakeClock>) -> io::Result<PostgresServer> {
        let template = template()?;
        let mut last_err = None;
        for _ in 0..5 {
            let port = free_port()?;
            let dir = std::env::temp_dir().join(format!("dlock-pg-{}-{port}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            let status = Command::new("cp")
                .arg("-a")
                .arg(template)
                .arg(&dir)
                .status()?;
            if !status.success() {
                return Err(io::Error::other(format!(
                    "cp -a {}: {status}",
                    template.display()
                )));
            }
            let mut server = PostgresServer {
                child: None,
                port,
                dir,
                frozen: false,
                tls,
                clock: clock.clone(),
            };
            if tls {
                server.make_certificate()?;
            }
            match server.spawn() {
                Ok(()) => return Ok(server),
                Err(e) => last_err = Some(e),
            }
        }
        Err(last_err.unwrap_or_else(|| io::Error::other("postgres did not start")))
    }

    /// The CA certificate (PEM) that signed a TLS server's certificate: what a client
    /// passes as `sslrootcert`.
    pub fn certificate(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    /// A private CA, and a certificate for 127.0.0.1 it signed, in the data directory; the
    /// key readable by the server's user only (PostgreSQL refuses it otherwise).
    fn make_certificate(&self) -> io::Result<()> {
        let d = |name: &str| self.dir.join(name);
        std::fs::write(
            d("server.ext"),
            "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n",
        )?;
        let openssl = |args: &[&std::ffi::OsStr]| -> io::Result<()> {
            let status = Command::new("openssl")
                .args(args)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()?;
            if status.success() {
                Ok(())
            } else {
                Err(io::Error::other(format!(
                    "openssl {args:?} failed: {status}"
                )))
            }
        };
        let s = |text: &'static str| std::ffi::OsStr::new(text);
        let (ca_key, ca_crt, key, csr, crt, ext) = (
            d("ca.key"),
            d("ca.crt"),
            d("server.key"),
            d("server.csr"),
            d("server.crt"),
            d("server.ext"),
        );
        openssl(&[
            s("req"),
            s("-x509"),
            s("-newkey"),
            s("rsa:2048"),
            s("-nodes"),
            s("-days"),
            s("1"),
            s("-subj"),
            s("/CN=dlock test CA"),
            s("-keyout"),
            ca_key.as_os_str(),
            s("-out"),
            ca_crt.as_os_str(),
        ])?;
        openssl(&[
            s("req"),
            s("-newkey"),
            s("rsa:2048"),
            s("-nodes"),
            s("-subj"),
            s("/CN=127.0.0.1"),
            s("-keyout"),
            key.as_os_str(),
            s("-out"),
            csr.as_os_str(),
        ])?;
        openssl(&[
            s("x509"),
            s("-req"),
            s("-in"),
            csr.as_os_str(),
            s("-CA"),
            ca_crt.as_os_str(),
            s("-CAkey"),
            ca_key.as_os_str(),
            s("-CAcreateserial"),
            s("-days"),
            s("1"),
            s("-extfile"),
            ext.as_os_str(),
            s("-out"),
            crt.as_os_str(),
        ])?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600))?;
        hand_over(&self.dir)
    }

    fn spawn(&mut self) -> io::Result<()> {
        use std::os::unix::process::CommandExt;
        let port = self.port.to_string();
        let tls: &[&str] = if self.tls {
            &[
                "-c",
                "ssl=on",
                "-c",
                "ssl_cert_file=server.crt",
                "-c",
                "ssl_key_file=server.key",
            ]
        } else {
            &[]
        };
        let env_args = match &self.clock {
            Some(clock) => clock.env_command_args(Interposer::Libfaketime)?,
            None => Vec::new(),
        };
        let mut child = pg_command_env("postgres", &env_args)?
            .arg("-D")
            .arg(&self.dir)
            .args(["-p", &port, "-k"])
            .arg(&self.dir)
            .args([
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                "fsync=off",
                "-c",
                "shared_buffers=16MB",
                "-c",
                "max_connections=1000",
            ])
            .args(tls)
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| io::Error::new(e.kind(), format!("cannot run postgres: {e}")))?;
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(status) = child.try_wait()? {
                return Err(io::Error::other(format!("postgres exited early: {status}")));
            }
            let ready = Command::new(bin_dir()?.join("pg_isready"))
                .args(["-q", "-h", "127.0.0.1", "-p", &port, "-U", SUPERUSER])
                .status()
                .is_ok_and(|s| s.success());
            if ready {
                self.child = Some(child);
                return Ok(());
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "postgres not ready",
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Signals the server: the postmaster and every process it forked (each backend runs
    /// in a session of its own, so a process group would miss them). Children first, so
    /// that none is forked behind a stopped postmaster's back.
    /// The postmaster's and every backend's process ids, while it runs.
    pub fn pids(&self) -> Vec<u32> {
        let Some(child) = &self.child else {
            return Vec::new();
        };
        let mut pids = children_of(child.id());
        pids.push(child.id());
        pids
    }

    fn signal(&self, signal: &str) {
        let Some(child) = &self.child else { return };
        let postmaster = child.id();
        let mut pids: Vec<String> = children_of(postmaster)
            .into_iter()
            .map(|p| p.to_string())
            .collect();
        pids.push(postmaster.to_string());
        let _ = Command::new("kill")
            .arg(signal)
            .arg("--")
            .args(&pids)
            .stderr(Stdio::null()) // a backend may have exited meanwhile
            .status();
    }

    fn stop(&mut self) {
        if self.frozen {
            self.signal("-CONT");
            self.frozen = false;
        }
        self.signal("-KILL");
        if let Some(mut child) = self.child.take() {
            let _ = child.wait();
            if self.clock.is_some() {
                crate::clock::forget_process(child.id());
            }
        }
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The postmaster's process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// A URL for the `postgres` database as the superuser.
    pub fn url(&self) -> String {
        self.url_as(SUPERUSER, PASSWORD)
    }

    /// A URL for the `postgres` database as `user` with `password`.
    pub fn url_as(&self, user: &str, password: &str) -> String {
        format!(
            "postgres://{user}:{password}@127.0.0.1:{}/postgres",
            self.port
        )
    }

    /// The same server through its unix socket (libpq's `host=` parameter).
    pub fn socket_url(&self) -> String {
        format!(
            "postgres://{SUPERUSER}@/postgres?host={}&port={}",
            self.dir.display(),
            self.port
        )
    }

    /// Kills the server (SIGKILL, every backend with it) and starts it again on the same
    /// data directory and port: committed data survives, as after a crash.
    ///
    /// # Errors
    /// It did not come back.
    pub fn restart(&mut self) -> io::Result<()> {
        self.stop();
        // The postmaster's shared memory and pid file outlive a SIGKILL for a moment.
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            match self.spawn() {
                Ok(()) => return Ok(()),
                Err(e) if Instant::now() > deadline => return Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(200)),
            }
        }
    }

    /// Stops the whole server (SIGSTOP to the postmaster and every backend): connections
    /// stay open but nothing answers.
    pub fn freeze(&mut self) {
        self.signal("-STOP");
        self.frozen = true;
    }

    /// Continues a frozen server.
    pub fn thaw(&mut self) {
        self.signal("-CONT");
        self.frozen = false;
    }

    /// An admin connection (superuser), driven on the current runtime.
    ///
    /// # Panics
    /// If the server does not answer.
    pub async fn admin(&self) -> tokio_postgres::Client {
        self.try_admin().await.expect("admin connection")
    }

    /// An admin connection (superuser), driven on the current runtime.
    ///
    /// # Errors
    /// The server does not answer.
    pub async fn try_admin(&self) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
        let (client, connection) =
            tokio_postgres::connect(&self.url(), tokio_postgres::NoTls).await?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(client)
    }
}

/// The processes whose parent is `pid` (from `/proc/<pid>/stat`: the field after the
/// parenthesised command name is the state, then the parent's pid).
fn children_of(pid: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let child: u32 = e.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
            let after_name = &stat[stat.rfind(')')? + 1..];
            let parent: u32 = after_name.split_whitespace().nth(1)?.parse().ok()?;
            (parent == pid).then_some(child)
        })
        .collect()
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
