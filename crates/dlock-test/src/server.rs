//! Real `redis-server` processes on free loopback ports, killed on drop.

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::clock::{FakeClock, Interposer};

/// Environment variable naming the `redis-server` binary (default: `redis-server` on PATH).
pub const REDIS_SERVER_ENV: &str = "DLOCK_REDIS_SERVER";

/// How long a spawned server may take to answer `PING`.
const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// A `redis-server` child process listening on `127.0.0.1:<port>`, without persistence.
///
/// Dropping it kills the process (continuing it first if it was frozen) and removes its
/// working directory.
#[derive(Debug)]
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
    extra: Vec<String>,
    frozen: bool,
    /// TLS port and certificate directory, for servers from [`RedisServer::start_tls`].
    tls: Option<(u16, PathBuf)>,
    /// The clock it runs under, for servers from [`RedisServer::start_with_clock`].
    clock: Option<FakeClock>,
}

impl RedisServer {
    /// Starts a server on a free loopback port and waits until it answers `PING`.
    ///
    /// # Errors
    /// The binary is missing, or no server became ready on any of a few free ports.
    pub fn start() -> io::Result<RedisServer> {
        RedisServer::start_with(&[])
    }

    /// As [`start`](RedisServer::start), with extra `redis-server` arguments
    /// (e.g. `["--maxmemory", "1mb"]`).
    ///
    /// # Errors
    /// As [`start`](RedisServer::start).
    pub fn start_with(extra: &[&str]) -> io::Result<RedisServer> {
        RedisServer::start_inner(extra, None)
    }

    /// As [`start_with`](RedisServer::start_with), running under `clock` (through the kit's
    /// shim: Debian's `redis-server` links jemalloc, which deadlocks with libfaketime; see
    /// [`crate::clock`]). Key expiry follows the clock's wall time. Restarts keep the clock.
    ///
    /// # Errors
    /// As [`start`](RedisServer::start), or the shim could not be built (no `cc`).
    pub fn start_with_clock(clock: &FakeClock, extra: &[&str]) -> io::Result<RedisServer> {
        RedisServer::start_inner(extra, Some(clock.clone()))
    }

    fn start_inner(extra: &[&str], clock: Option<FakeClock>) -> io::Result<RedisServer> {
        let mut last_err = None;
        for _ in 0..5 {
            let port = free_port()?;
            let dir =
                std::env::temp_dir().join(format!("dlock-test-{}-{port}", std::process::id()));
            std::fs::create_dir_all(&dir)?;
            let mut server = RedisServer {
                child: None,
                port,
                dir,
                extra: extra.iter().map(|s| (*s).to_owned()).collect(),
                frozen: false,
                tls: None,
                clock: clock.clone(),
            };
            match server.spawn() {
                Ok(()) => return Ok(server),
                Err(e) => last_err = Some(e), // port taken in the meantime: try another
            }
        }
        Err(last_err.unwrap_or_else(|| io::Error::other("redis-server did not start")))
    }

    fn spawn(&mut self) -> io::Result<()> {
        let binary = std::env::var(REDIS_SERVER_ENV).unwrap_or_else(|_| "redis-server".into());
        let port = self.port.to_string();
        let mut cmd = Command::new(&binary);
        cmd.args([
            "--port",
            &port,
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .args(["--protected-mode", "no", "--loglevel", "warning"])
        .arg("--dir")
        .arg(&self.dir)
        .args(&self.extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
        if let Some(clock) = &self.clock {
            clock.apply(&mut cmd, Interposer::Shim)?;
        }
        let mut child = cmd.spawn().map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("cannot run {binary:?} (set {REDIS_SERVER_ENV}): {e}"),
            )
        })?;
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(status) = child.try_wait()? {
                return Err(io::Error::other(format!(
                    "redis-server exited early: {status}"
                )));
            }
            // Ready, and really ours: another test's server may have won a race for the
            // same free port (ours then exits on the failed bind).
            if server_pid(self.port).is_ok_and(|pid| pid == child.id()) {
                self.child = Some(child);
                return Ok(());
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "redis-server not ready",
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Starts a server that also accepts TLS connections on [`tls_port`](Self::tls_port),
    /// with a fresh self-signed certificate made by `openssl` (clients connect with
    /// `rediss://127.0.0.1:<tls_port>/#insecure`).
    ///
    /// # Errors
    /// `openssl` or `redis-server` failed, or the server was built without TLS.
    pub fn start_tls() -> io::Result<RedisServer> {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let certs = std::env::temp_dir().join(format!("dlock-test-tls-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&certs)?;
        let (cert, key) = (certs.join("cert.pem"), certs.join("key.pem"));
        let status = Command::new("openssl")
            .args([
                "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            ])
            .args(["-subj", "/CN=127.0.0.1", "-keyout"])
            .arg(&key)
            .arg("-out")
            .arg(&cert)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()?;
        if !status.success() {
            return Err(io::Error::other(format!("openssl req failed: {status}")));
        }
        let tls_port = free_port()?;
        let (tls_port_s, cert_s, key_s) = (
            tls_port.to_string(),
            cert.to_string_lossy().into_owned(),
            key.to_string_lossy().into_owned(),
        );
        let mut server = RedisServer::start_with(&[
            "--tls-port",
            &tls_port_s,
            "--tls-cert-file",
            &cert_s,
            "--tls-key-file",
            &key_s,
            "--tls-ca-cert-file",
            &cert_s,
            "--tls-auth-clients",
            "no",
        ])?;
        server.tls = Some((tls_port, certs));
        Ok(server)
    }

    /// The TLS port, for servers from [`start_tls`](Self::start_tls).
    pub fn tls_port(&self) -> Option<u16> {
        self.tls.as_ref().map(|(port, _)| *port)
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Kills the server with SIGKILL and starts an empty one on the same port (no
    /// persistence: every key, lock and fence counter is gone).
    ///
    /// # Errors
    /// The new process did not become ready.
    pub fn restart(&mut self) -> io::Result<()> {
        self.kill();
        self.spawn()
    }

    /// Kills the server with SIGKILL (it stays down until [`restart`](RedisServer::restart)).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            if self.frozen {
                let _ = signal(child.id(), "CONT");
                self.frozen = false;
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Freezes the server with SIGSTOP: connections stay open, nothing is answered.
    ///
    /// # Errors
    /// The server is not running, or `kill` failed.
    pub fn freeze(&mut self) -> io::Result<()> {
        let pid = self
            .pid()
            .ok_or_else(|| io::Error::other("server not running"))?;
        signal(pid, "STOP")?;
        self.frozen = true;
        Ok(())
    }

    /// Continues a frozen server with SIGCONT.
    ///
    /// # Errors
    /// The server is not running, or `kill` failed.
    pub fn thaw(&mut self) -> io::Result<()> {
        let pid = self
            .pid()
            .ok_or_else(|| io::Error::other("server not running"))?;
        signal(pid, "CONT")?;
        self.frozen = false;
        Ok(())
    }

    /// A redis-rs client for the test's own inspection and fault commands.
    ///
    /// # Panics
    /// Never for a well-formed loopback URL.
    pub fn client(&self) -> redis::Client {
        #[allow(clippy::unwrap_used)]
        redis::Client::open(self.url()).unwrap()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
        if let Some((_, certs)) = &self.tls {
            let _ = std::fs::remove_dir_all(certs);
        }
    }
}

fn signal(pid: u32, sig: &str) -> io::Result<()> {
    let status = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()?;
    if status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "kill -{sig} {pid} failed: {status}"
        )))
    }
}

/// A loopback port nobody listens on right now.
///
/// # Errors
/// Binding an ephemeral port failed.
pub fn free_port() -> io::Result<u16> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    Ok(listener.local_addr()?.port())
}

/// The `process_id` a server on `port` reports in `INFO server`.
fn server_pid(port: u16) -> io::Result<u32> {
    let mut stream = TcpStream::connect((Ipv4Addr::LOCALHOST, port))?;
    stream.set_read_timeout(Some(Duration::from_millis(500)))?;
    stream.write_all(b"INFO server\r\n")?;
    // A bulk string: "$<len>\r\n<body>\r\n".
    let mut reply = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            return Err(io::Error::other("connection closed"));
        }
        reply.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&reply);
        let Some((header, body)) = text.split_once("\r\n") else {
            continue;
        };
        let len: usize = header
            .strip_prefix('$')
            .and_then(|l| l.parse().ok())
            .ok_or_else(|| io::Error::other(format!("unexpected INFO reply {header:?}")))?;
        if body.len() < len {
            continue;
        }
        return body
            .lines()
            .find_map(|l| l.strip_prefix("process_id:"))
            .and_then(|pid| pid.trim().parse().ok())
            .ok_or_else(|| io::Error::other("no process_id in INFO"));
    }
}

/// A `redis-sentinel` process (`redis-server --sentinel`) on a free loopback port,
/// watching one master; killed when dropped.
#[derive(Debug)]
pub struct SentinelServer {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
}

impl SentinelServer {
    /// Starts a sentinel that monitors the master on `master_port` under `name`, with
    /// `quorum` sentinels needed to agree it is down. It declares the master down after
    /// 1 s without an answer.
    ///
    /// # Errors
    /// The config could not be written or the sentinel did not become ready.
    pub fn start(master_port: u16, name: &str, quorum: u32) -> io::Result<SentinelServer> {
        let mut last_err = None;
        for _ in 0..5 {
            let port = free_port()?;
            let dir =
                std::env::temp_dir().join(format!("dlock-sentinel-{}-{port}", std::process::id()));
            std::fs::create_dir_all(&dir)?;
            let conf = dir.join("sentinel.conf");
            std::fs::write(
                &conf,
                format!(
                    "port {port}\nbind 127.0.0.1\nprotected-mode no\nlogfile \"\"\n\
                     dir {dir}\n\
                     sentinel monitor {name} 127.0.0.1 {master_port} {quorum}\n\
                     sentinel down-after-milliseconds {name} 1000\n\
                     sentinel failover-timeout {name} 4000\n\
                     sentinel parallel-syncs {name} 1\n",
                    dir = dir.display()
                ),
            )?;
            let binary = std::env::var(REDIS_SERVER_ENV).unwrap_or_else(|_| "redis-server".into());
            let mut child = Command::new(&binary)
                .arg(&conf)
                .arg("--sentinel")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()?;
            let deadline = Instant::now() + READY_TIMEOUT;
            let ready = loop {
                if child.try_wait()?.is_some() {
                    break false;
                }
                if server_pid(port).is_ok_and(|pid| pid == child.id()) {
                    break true;
                }
                if Instant::now() > deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    break false;
                }
                std::thread::sleep(Duration::from_millis(10));
            };
            if ready {
                return Ok(SentinelServer {
                    child: Some(child),
                    port,
                    dir,
                });
            }
            last_err = Some(io::Error::other("redis sentinel did not start"));
        }
        Err(last_err.unwrap_or_else(|| io::Error::other("redis sentinel did not start")))
    }

    /// `127.0.0.1:<port>`, for `redis+sentinel://` URLs.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// A redis-rs client of the sentinel itself.
    ///
    /// # Panics
    /// Never for a well-formed loopback URL.
    pub fn client(&self) -> redis::Client {
        #[allow(clippy::unwrap_used)]
        redis::Client::open(format!("redis://{}/", self.addr())).unwrap()
    }
}

impl Drop for SentinelServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A private `memcached` on a free loopback port (64 MB, no UDP, no evictions: `-M`, the
/// configuration dlock asks for); killed when dropped.
/// [`start_evicting`](MemcachedServer::start_evicting) starts one with memcached's default
/// (evictions on).
#[derive(Debug)]
pub struct MemcachedServer {
    child: Option<Child>,
    port: u16,
    extra: Vec<String>,
    clock: Option<FakeClock>,
}

impl MemcachedServer {
    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Starts `memcached` (from `PATH`).
    ///
    /// # Errors
    /// It could not be started or did not answer within 10 s.
    pub fn start() -> io::Result<MemcachedServer> {
        MemcachedServer::start_with(&[])
    }

    /// Starts `memcached` with extra arguments (e.g. `["-m", "1"]`).
    ///
    /// # Errors
    /// As [`start`](MemcachedServer::start).
    pub fn start_with(extra: &[&str]) -> io::Result<MemcachedServer> {
        MemcachedServer::start_inner(&with_no_evictions(extra), None)
    }

    /// As [`start_with`](MemcachedServer::start_with), with memcached's default eviction
    /// (no `-M`): a full cache evicts items, held locks and fence counters among them
    /// (e.g. `["-m", "1"]`).
    ///
    /// # Errors
    /// As [`start`](MemcachedServer::start).
    pub fn start_evicting(extra: &[&str]) -> io::Result<MemcachedServer> {
        MemcachedServer::start_inner(extra, None)
    }

    /// As [`start_with`](MemcachedServer::start_with), running under `clock`
    /// (libfaketime). memcached's own clock ticks once a second from `CLOCK_MONOTONIC`, so
    /// only a [`ClockScope::WallAndMonotonic`](crate::clock::ClockScope) clock moves key
    /// expiry. Restarts keep the clock.
    ///
    /// # Errors
    /// As [`start`](MemcachedServer::start), or libfaketime is not installed.
    pub fn start_with_clock(clock: &FakeClock, extra: &[&str]) -> io::Result<MemcachedServer> {
        MemcachedServer::start_inner(&with_no_evictions(extra), Some(clock.clone()))
    }

    fn start_inner(extra: &[&str], clock: Option<FakeClock>) -> io::Result<MemcachedServer> {
        let mut last_err = None;
        for _ in 0..5 {
            let mut server = MemcachedServer {
                child: None,
                port: free_port()?,
                extra: extra.iter().map(|s| (*s).to_owned()).collect(),
                clock: clock.clone(),
            };
            match server.spawn() {
                Ok(()) => return Ok(server),
                Err(e) => last_err = Some(e),
            }
        }
        Err(last_err.unwrap_or_else(|| io::Error::other("memcached did not start")))
    }

    fn spawn(&mut self) -> io::Result<()> {
        let port = self.port.to_string();
        let mut cmd = Command::new("memcached");
        cmd.args([
            "-p",
            &port,
            "-l",
            "127.0.0.1",
            "-U",
            "0",
            "-m",
            "64",
            "-u",
            "root",
        ])
        .args(&self.extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
        if let Some(clock) = &self.clock {
            clock.apply(&mut cmd, Interposer::Libfaketime)?;
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| io::Error::new(e.kind(), format!("cannot run memcached: {e}")))?;
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(status) = child.try_wait()? {
                return Err(io::Error::other(format!(
                    "memcached exited early: {status}"
                )));
            }
            if self.command("mn\r\n").is_ok_and(|r| r.starts_with("MN")) {
                self.child = Some(child);
                return Ok(());
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "memcached not ready",
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `memcache://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("memcache://127.0.0.1:{}", self.port)
    }

    /// Sends one raw text command and returns what the server answered first.
    ///
    /// # Errors
    /// The server did not answer.
    pub fn command(&self, command: &str) -> io::Result<String> {
        let mut conn = TcpStream::connect((Ipv4Addr::LOCALHOST, self.port))?;
        conn.set_read_timeout(Some(Duration::from_secs(2)))?;
        conn.write_all(command.as_bytes())?;
        let mut buf = [0u8; 4096];
        let n = conn.read(&mut buf)?;
        Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
    }

    /// Kills it (SIGKILL) and starts an empty one on the same port.
    ///
    /// # Errors
    /// The new process did not become ready.
    pub fn restart(&mut self) -> io::Result<()> {
        self.kill();
        self.spawn()
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
            if self.clock.is_some() {
                crate::clock::forget_process(child.id());
            }
        }
    }
}

/// `extra` with memcached's `-M` (no evictions) first.
fn with_no_evictions<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["-M"];
    args.extend_from_slice(extra);
    args
}

impl Drop for MemcachedServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// One etcd member (or a whole single-member cluster) on free loopback ports; killed
/// when dropped, its data directory removed.
#[derive(Debug)]
pub struct EtcdMember {
    child: Option<Child>,
    name: String,
    client_port: u16,
    peer_port: u16,
    dir: PathBuf,
    cluster: String,
    state: &'static str,
    clock: Option<FakeClock>,
}

impl EtcdMember {
    fn spawn(&mut self) -> io::Result<()> {
        let client = format!("http://127.0.0.1:{}", self.client_port);
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let mut cmd = Command::new("etcd");
        cmd.arg("--name")
            .arg(&self.name)
            .arg("--data-dir")
            .arg(&self.dir)
            .args([
                "--listen-client-urls",
                &client,
                "--advertise-client-urls",
                &client,
            ])
            .args([
                "--listen-peer-urls",
                &peer,
                "--initial-advertise-peer-urls",
                &peer,
            ])
            .args(["--initial-cluster", &self.cluster])
            .args(["--initial-cluster-state", self.state])
            .args(["--initial-cluster-token", "dlock-test"])
            .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
            .args(["--log-level", "error"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if let Some(clock) = &self.clock {
            clock.apply(&mut cmd, Interposer::Libfaketime)?;
        }
        let child = cmd
            .spawn()
            .map_err(|e| io::Error::new(e.kind(), format!("cannot run etcd: {e}")))?;
        self.child = Some(child);
        Ok(())
    }

    /// `127.0.0.1:<client port>`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }

    /// Its client port on 127.0.0.1.
    pub fn client_port(&self) -> u16 {
        self.client_port
    }

    /// Whether the process runs.
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Kills the member with SIGKILL (its data stays; [`restart`](Self::restart) rejoins).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
            if self.clock.is_some() {
                crate::clock::forget_process(child.id());
            }
        }
    }

    /// Starts a killed member again from its data directory.
    ///
    /// # Errors
    /// It could not be started.
    pub fn restart(&mut self) -> io::Result<()> {
        self.kill();
        self.state = "existing";
        self.spawn()
    }
}

impl Drop for EtcdMember {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// An etcd cluster of N members on loopback.
#[derive(Debug)]
pub struct EtcdCluster {
    /// The members (public so tests can kill and restart them).
    pub members: Vec<EtcdMember>,
}

impl EtcdCluster {
    /// Starts `n` members and waits until every client port accepts connections (the
    /// caller waits for a leader with its first request).
    ///
    /// A member that exits before it listens (another process took one of its free
    /// ports between the kit's choice and etcd's bind, which happens when many tests
    /// start servers at once) makes the kit try again on fresh ports, up to three times.
    ///
    /// # Errors
    /// etcd could not be started.
    pub fn start(n: usize) -> io::Result<EtcdCluster> {
        Self::start_inner(n, None)
    }

    /// As [`start`](EtcdCluster::start), every member running under `clock` (libfaketime),
    /// restarts included. It changes nothing in etcd: Go reads the clocks through the
    /// vDSO, not libc, so leases keep their ttl whatever the clock does (see
    /// [`crate::clock`]); it is here to show that.
    ///
    /// # Errors
    /// As [`start`](EtcdCluster::start), or libfaketime is not installed.
    pub fn start_with_clock(n: usize, clock: &FakeClock) -> io::Result<EtcdCluster> {
        Self::start_inner(n, Some(clock))
    }

    fn start_inner(n: usize, clock: Option<&FakeClock>) -> io::Result<EtcdCluster> {
        let mut last = None;
        for _ in 0..3 {
            match Self::start_once(n, clock) {
                Ok(cluster) => return Ok(cluster),
                Err(err) if err.kind() == io::ErrorKind::NotFound => return Err(err),
                Err(err) => last = Some(err),
            }
        }
        Err(last.unwrap_or_else(|| io::Error::other("etcd not started")))
    }

    fn start_once(n: usize, clock: Option<&FakeClock>) -> io::Result<EtcdCluster> {
        let mut members = Vec::with_capacity(n);
        let mut cluster = Vec::with_capacity(n);
        for i in 0..n {
            let (client_port, peer_port) = (free_port()?, free_port()?);
            let name = format!("m{i}");
            cluster.push(format!("{name}=http://127.0.0.1:{peer_port}"));
            let dir = std::env::temp_dir()
                .join(format!("dlock-etcd-{}-{client_port}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            members.push(EtcdMember {
                child: None,
                name,
                client_port,
                peer_port,
                dir,
                cluster: String::new(),
                state: "new",
                clock: clock.cloned(),
            });
        }
        let cluster = cluster.join(",");
        for m in &mut members {
            m.cluster.clone_from(&cluster);
            m.spawn()?;
        }
        // etcd (a Go binary writing its WAL) starts slower than the other servers on a
        // loaded machine: three times the usual deadline.
        let deadline = Instant::now() + 3 * READY_TIMEOUT;
        for m in &mut members {
            while TcpStream::connect(("127.0.0.1", m.client_port)).is_err() {
                if let Some(child) = m.child.as_mut()
                    && let Some(status) = child.try_wait()?
                {
                    m.child = None;
                    return Err(io::Error::other(format!(
                        "etcd member {} exited early: {status}",
                        m.name
                    )));
                }
                if Instant::now() > deadline {
                    return Err(io::Error::new(io::ErrorKind::TimedOut, "etcd not ready"));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Ok(EtcdCluster { members })
    }

    /// `etcd://` URL with every member as an endpoint.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self.members.iter().map(EtcdMember::addr).collect();
        format!("etcd://{}", hosts.join(","))
    }
}
