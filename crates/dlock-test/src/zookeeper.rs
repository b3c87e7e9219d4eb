//! A private ZooKeeper on loopback: one standalone server or an ensemble of N, from
//! Debian's `zookeeper` package (`/usr/share/java/zookeeper.jar`, run with the machine's
//! Java), each member on free loopback ports with its own data directory, killed on drop.
//!
//! Set `$DLOCK_ZOOKEEPER_JAR` to use another `zookeeper.jar` (its manifest must name its
//! dependencies, as Debian's does).
//!
//! The servers tick every 100 ms, so sessions may be as short as 200 ms (tests use one to
//! two seconds), accept TTL nodes (`extendedTypesEnabled`), look for empty container
//! nodes every second (`znode.container.checkIntervalMs`), and answer the four-letter
//! words (`srvr` tells a member's role).

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::clock::{FakeClock, Interposer};
use crate::server::free_port;

/// How long a member may take to start (a JVM on a loaded machine is slow).
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// Debian's jar; its manifest's class path names every dependency.
const DEBIAN_JAR: &str = "/usr/share/java/zookeeper.jar";

/// One ZooKeeper server of an ensemble (or a standalone server).
#[derive(Debug)]
pub struct ZkMember {
    child: Option<Child>,
    /// The JVM's process id.
    java: Option<u32>,
    /// Whether the shell removes the data directory when the JVM ends (a shared server,
    /// never dropped).
    remove_on_exit: bool,
    id: usize,
    client_port: u16,
    dir: PathBuf,
    frozen: bool,
    /// The clock the JVM runs under, for members from [`ZooKeeper::start_with_clock`].
    clock: Option<FakeClock>,
}

impl ZkMember {
    fn spawn(&mut self) -> io::Result<()> {
        let jar = std::env::var("DLOCK_ZOOKEEPER_JAR").unwrap_or_else(|_| DEBIAN_JAR.into());
        if !std::path::Path::new(&jar).exists() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("{jar} not found (apt-get install zookeeper)"),
            ));
        }
        let log = std::fs::File::create(self.dir.join("server.log"))?;
        // Under a clock, `env` (which execs) preloads the library into the JVM alone.
        let launcher: Vec<std::ffi::OsString> = match &self.clock {
            Some(clock) => {
                let mut args = vec!["env".into()];
                args.extend(clock.env_command_args(Interposer::Libfaketime)?);
                args.push("java".into());
                args
            }
            None => vec!["java".into()],
        };
        // The JVM runs under a small shell that kills it when our end of its stdin closes:
        // when this process exits in any way, even without dropping the member (a server
        // shared by a whole test binary lives in a static).
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(
                "\"$@\" </dev/null & echo $!; read _; kill -9 $! 2>/dev/null; \
                 [ -n \"$DLOCK_ZK_REMOVE\" ] && wait && rm -rf \"$DLOCK_ZK_REMOVE\"",
            )
            .env(
                "DLOCK_ZK_REMOVE",
                if self.remove_on_exit {
                    self.dir.as_os_str()
                } else {
                    std::ffi::OsStr::new("")
                },
            )
            .arg("sh")
            .args(&launcher)
            .args([
                "-Xms32m",
                "-Xmx256m",
                "-XX:+UseSerialGC",
                "-XX:TieredStopAtLevel=1",
            ])
            .arg("-Dzookeeper.admin.enableServer=false")
            .arg("-Dznode.container.checkIntervalMs=1000")
            .arg("-Dzookeeper.jmx.log4j.disable=true")
            .arg("-cp")
            .arg(&jar)
            .arg("org.apache.zookeeper.server.quorum.QuorumPeerMain")
            .arg(self.dir.join("zoo.cfg"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .map_err(|e| io::Error::new(e.kind(), format!("cannot run sh: {e}")))?;
        let mut line = String::new();
        if let Some(out) = child.stdout.take() {
            io::BufRead::read_line(&mut io::BufReader::new(out), &mut line)?;
        }
        let Ok(pid) = line.trim().parse::<u32>() else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(io::Error::other("cannot start java"));
        };
        self.java = Some(pid);
        self.child = Some(child);
        self.frozen = false;
        Ok(())
    }

    /// `127.0.0.1:<client port>`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }

    /// The member's number in the ensemble (its `myid`).
    pub fn id(&self) -> usize {
        self.id
    }

    /// Whether the process runs.
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// What the member answers to a four-letter word (`ruok`, `srvr`, `mntr`, `wchc`…).
    ///
    /// # Errors
    /// It did not answer.
    pub fn four_letters(&self, word: &str) -> io::Result<String> {
        let mut conn = TcpStream::connect((Ipv4Addr::LOCALHOST, self.client_port))?;
        conn.set_read_timeout(Some(Duration::from_secs(2)))?;
        conn.write_all(word.as_bytes())?;
        let mut out = String::new();
        conn.read_to_string(&mut out)?;
        Ok(out)
    }

    /// The member's role: `leader`, `follower` or `standalone` (`None` while it serves no
    /// clients: starting, electing, killed).
    pub fn mode(&self) -> Option<String> {
        let srvr = self.four_letters("srvr").ok()?;
        srvr.lines()
            .find_map(|l| l.strip_prefix("Mode: "))
            .map(|m| m.trim().to_owned())
    }

    /// Kills the member with SIGKILL (its data stays; [`restart`](Self::restart) rejoins).
    pub fn kill(&mut self) {
        let java = self.java.take();
        if let Some(pid) = java {
            if self.frozen {
                let _ = signal(pid, "CONT");
            }
            let _ = signal(pid, "KILL");
        }
        if let Some(mut child) = self.child.take() {
            // Closing its stdin ends the shell.
            drop(child.stdin.take());
            let _ = child.wait();
        }
        if let (Some(pid), Some(_)) = (java, &self.clock) {
            crate::clock::forget_process(pid);
        }
        self.frozen = false;
    }

    /// Starts a killed member again from its data directory.
    ///
    /// # Errors
    /// It could not be started.
    pub fn restart(&mut self) -> io::Result<()> {
        self.kill();
        self.spawn()
    }

    /// Freezes the member with SIGSTOP: connections stay open, nothing is answered.
    ///
    /// # Errors
    /// Not running, or `kill` failed.
    pub fn freeze(&mut self) -> io::Result<()> {
        let pid = self.java.ok_or_else(not_running)?;
        signal(pid, "STOP")?;
        self.frozen = true;
        Ok(())
    }

    /// Continues a frozen member.
    ///
    /// # Errors
    /// Not running, or `kill` failed.
    pub fn thaw(&mut self) -> io::Result<()> {
        let pid = self.java.ok_or_else(not_running)?;
        signal(pid, "CONT")?;
        self.frozen = false;
        Ok(())
    }
}

fn not_running() -> io::Error {
    io::Error::other("zookeeper member not running")
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

impl Drop for ZkMember {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A ZooKeeper standalone server (`n == 1`) or ensemble of `n` members on loopback.
#[derive(Debug)]
pub struct ZooKeeper {
    /// The members (public so tests can kill, freeze and restart them).
    pub members: Vec<ZkMember>,
}

impl ZooKeeper {
    /// One standalone server shared by every caller in this process (started at the first
    /// call; it ends with the process). Tests that share it keep apart by chroot.
    ///
    /// # Panics
    /// If it cannot be started (the tests cannot run without it).
    pub fn shared() -> &'static ZooKeeper {
        static SHARED: std::sync::OnceLock<ZooKeeper> = std::sync::OnceLock::new();
        SHARED.get_or_init(|| {
            ZooKeeper::start_with(1, true, None)
                .expect("start zookeeper (apt-get install zookeeper)")
        })
    }

    /// A standalone server.
    ///
    /// # Errors
    /// It could not be started (no `java`, no `zookeeper.jar`, no free port).
    pub fn standalone() -> io::Result<ZooKeeper> {
        Self::start(1)
    }

    /// Starts `n` members (1: standalone) and waits until every one serves clients (an
    /// ensemble: has elected a leader). A member that exits early (a port taken between
    /// the kit's choice and the JVM's bind) makes the kit try again on fresh ports, up to
    /// three times.
    ///
    /// # Errors
    /// ZooKeeper could not be started.
    pub fn start(n: usize) -> io::Result<ZooKeeper> {
        Self::start_with(n, false, None)
    }

    /// As [`start`](ZooKeeper::start), every member's JVM running under `clock`
    /// (libfaketime), restarts included. `System.currentTimeMillis` follows the clock;
    /// `System.nanoTime`, by which ZooKeeper times sessions, only under a
    /// [`ClockScope::WallAndMonotonic`](crate::clock::ClockScope) clock.
    ///
    /// # Errors
    /// As [`start`](ZooKeeper::start), or libfaketime is not installed.
    pub fn start_with_clock(n: usize, clock: &FakeClock) -> io::Result<ZooKeeper> {
        Self::start_with(n, false, Some(clock))
    }

    fn start_with(
        n: usize,
        remove_on_exit: bool,
        clock: Option<&FakeClock>,
    ) -> io::Result<ZooKeeper> {
        let mut last = None;
        for _ in 0..3 {
            match Self::start_once(n, remove_on_exit, clock) {
                Ok(zk) => return Ok(zk),
                Err(err) if err.kind() == io::ErrorKind::NotFound => return Err(err),
                Err(err) => last = Some(err),
            }
        }
        Err(last.unwrap_or_else(|| io::Error::other("zookeeper not started")))
    }

    fn start_once(
        n: usize,
        remove_on_exit: bool,
        clock: Option<&FakeClock>,
    ) -> io::Result<ZooKeeper> {
        let n = n.max(1);
        let mut ports = Vec::with_capacity(n);
        for _ in 0..n {
            ports.push((free_port()?, free_port()?, free_port()?));
        }
        let mut servers = String::new();
        if n > 1 {
            for (i, (_, quorum, election)) in ports.iter().enumerate() {
                servers.push_str(&format!("server.{}=127.0.0.1:{quorum}:{election}\n", i + 1));
            }
        }
        let mut members = Vec::with_capacity(n);
        for (i, (client_port, _, _)) in ports.iter().enumerate() {
            let dir =
                std::env::temp_dir().join(format!("dlock-zk-{}-{client_port}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(dir.join("data"))?;
            let config = format!(
                "tickTime=100\ninitLimit=100\nsyncLimit=20\ndataDir={data}\n\
                 clientPort={client_port}\nclientPortAddress=127.0.0.1\n\
                 minSessionTimeout=200\nmaxSessionTimeout=60000\n\
                 admin.enableServer=false\n4lw.commands.whitelist=*\n\
                 extendedTypesEnabled=true\nmaxClientCnxns=0\n{servers}",
                data = dir.join("data").display()
            );
            std::fs::write(dir.join("zoo.cfg"), config)?;
            if n > 1 {
                std::fs::write(dir.join("data").join("myid"), format!("{}\n", i + 1))?;
            }
            members.push(ZkMember {
                child: None,
                java: None,
                remove_on_exit,
                id: i + 1,
                client_port: *client_port,
                dir,
                frozen: false,
                clock: clock.cloned(),
            });
        }
        for m in &mut members {
            m.spawn()?;
        }
        let zk = ZooKeeper { members };
        zk.wait_serving(READY_TIMEOUT)?;
        Ok(zk)
    }

    /// Waits until every running member serves clients.
    ///
    /// # Errors
    /// A member exited, or the deadline passed.
    pub fn wait_serving(&self, within: Duration) -> io::Result<()> {
        let deadline = Instant::now() + within;
        for m in self.members.iter().filter(|m| m.is_running()) {
            while m.mode().is_none() {
                if Instant::now() > deadline {
                    let log = std::fs::read_to_string(m.dir.join("server.log")).unwrap_or_default();
                    let tail: String = log.lines().rev().take(5).collect::<Vec<_>>().join(" | ");
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("zookeeper member {} not serving: {tail}", m.id),
                    ));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Ok(())
    }

    /// The index in [`members`](Self::members) of the member that leads now (the
    /// standalone server, for one).
    pub fn leader(&self) -> Option<usize> {
        self.members
            .iter()
            .position(|m| matches!(m.mode().as_deref(), Some("leader" | "standalone")))
    }

    /// `host:port,…` of every member.
    pub fn hosts(&self) -> String {
        let hosts: Vec<String> = self.members.iter().map(ZkMember::addr).collect();
        hosts.join(",")
    }

    /// A `zk://` URL with every member and `chroot` (`""` for none), and `query` appended
    /// as is (e.g. `"?session_timeout=2s"`).
    pub fn url(&self, chroot: &str, query: &str) -> String {
        format!("zk://{}{chroot}{query}", self.hosts())
    }
}
