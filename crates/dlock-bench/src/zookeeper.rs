//! Section 6.4, ZooKeeper: dlock's `Lock<ZooKeeper>` on a private standalone ZooKeeper,
//! beside
//!
//! * **limit**: the same znode operations, bare, with zookeeper-client on one session:
//!   create an ephemeral sequential node `/<dir>/<token>-` (the container directory first
//!   when the server has removed it), list the directory, delete the node (three round
//!   trips);
//! * dlock's `Lock<Etcd>` (the other consensus store) and `Lock<Redis>` on a private etcd
//!   member and a private `redis-server`, measured in the same run, interleaved.
//!
//! Contended, the limit is the same recipe by hand, a session per waiter: create, list,
//! watch the node just before ours (`exists` watch), and when it is deleted, hold at once
//! if it was the only one in front, else list again — what dlock's waiters do, without
//! its engine, watchdog and grant bookkeeping.

use std::time::{Duration, Instant};

use dlock_test::server::{EtcdCluster, RedisServer};
use dlock_test::zookeeper::ZooKeeper as ZkServer;
use fencelock::backend::zookeeper::escape;
use fencelock::backend::{Etcd, Redis, ZooKeeper};
use zookeeper_client as zk;

use crate::Result;
use crate::contended::{self, BoxWaiter, LockWaiter, Waiter};
use crate::measure::{self, Latencies};
use crate::report::fmt_dur;
use crate::stores::{self, BoxCycle, Cycle, CycleFuture, HandoffRow, LockCycle, Row, Setup};

/// Uncontended rows, in run order within a round.
const ROWS: [&str; 4] = ["limit", "dlock", "etcd", "redis"];

/// Contended rows, in run order within a round.
const HANDOFF_ROWS: [&str; 4] = ["limit", "dlock", "etcd", "redis"];

/// Every client's chroot: dlock creates it; the bare clients then work under it too.
const CHROOT: &str = "/bench";

/// The session timeout every client asks for (dlock's default): the lease of a hold is
/// `min(ttl, session timeout)`.
const SESSION_TIMEOUT: Duration = fencelock::backend::zookeeper::DEFAULT_SESSION_TIMEOUT;

/// A bare zookeeper-client session under [`CHROOT`] on `hosts`.
async fn bare_session(hosts: &str) -> Result<zk::Client> {
    let client = zk::Client::connector()
        .with_session_timeout(SESSION_TIMEOUT)
        .with_connection_timeout(Duration::from_secs(2))
        .connect(hosts)
        .await?;
    client
        .chroot(CHROOT)
        .map_err(|_| format!("bad chroot {CHROOT:?}").into())
}

/// A lock node's sequence, from its name `<token>-<sequence>`.
fn sequence(name: &str) -> Option<i64> {
    name.rsplit_once('-')?.1.parse().ok()
}

/// Creates the ephemeral sequential node `<prefix><sequence>` holding `token`, and its
/// directory `dir` first if the server removed it (an empty container goes within a
/// second on the kit's servers); returns the node's path and sequence.
async fn create_node(
    client: &zk::Client,
    dir: &str,
    prefix: &str,
    token: &str,
) -> Result<(String, i64)> {
    let acls = zk::Acls::anyone_all();
    let node_options = zk::CreateMode::EphemeralSequential.with_acls(acls);
    let dir_options = zk::CreateMode::Container.with_acls(acls);
    for _ in 0..3 {
        match client.create(prefix, token.as_bytes(), &node_options).await {
            Ok((_, seq)) => return Ok((format!("{prefix}{seq}"), seq.into_i64())),
            Err(zk::Error::NoNode) => match client.create(dir, &[], &dir_options).await {
                Ok(_) | Err(zk::Error::NodeExists) => {}
                Err(e) => return Err(e.into()),
            },
            Err(e) => return Err(e.into()),
        }
    }
    Err(format!("zookeeper limit: the directory {dir} kept vanishing").into())
}

/// The bare uncontended limit: create our node, list the directory (ours must be the
/// lowest), delete the node.
struct ZkLimit {
    client: zk::Client,
    dir: String,
    prefix: String,
    token: String,
}

impl ZkLimit {
    fn boxed(client: zk::Client, name: &str, token: String) -> BoxCycle {
        let dir = format!("/{}", escape(name));
        let prefix = format!("{dir}/{}-", escape(&token));
        Box::new(ZkLimit {
            client,
            dir,
            prefix,
            token,
        })
    }
}

impl Cycle for ZkLimit {
    fn cycle(&mut self) -> CycleFuture<'_> {
        Box::pin(async move {
            let start = Instant::now();
            let (node, seq) =
                create_node(&self.client, &self.dir, &self.prefix, &self.token).await?;
            let children = self.client.list_children(&self.dir).await?;
            if children.iter().filter_map(|c| sequence(c)).min() != Some(seq) {
                return Err(
                    format!("zookeeper limit: the private lock {} was taken", self.dir).into(),
                );
            }
            let acquired = start.elapsed();
            self.client.delete(&node, None).await?;
            Ok(acquired)
        })
    }
}

/// A waiter of the bare contended limit: the recipe by hand on a session of its own.
struct BareWaiter {
    client: zk::Client,
    token: String,
}

impl Waiter for BareWaiter {
    /// Our node's path.
    type Held = String;

    /// Waits for the lock `name`.
    ///
    /// Cancelled (a run ends while it waits), it leaves its node in the queue until its
    /// session closes with the waiter: every warm-up and measured run has a name of its
    /// own, so no later run queues behind it.
    async fn acquire(&mut self, name: &str) -> Result<String> {
        let dir = format!("/{}", escape(name));
        let prefix = format!("{dir}/{}-", escape(&self.token));
        let (node, seq) = create_node(&self.client, &dir, &prefix, &self.token).await?;
        loop {
            let children = self.client.list_children(&dir).await?;
            let mut ahead: Vec<(i64, &str)> = children
                .iter()
                .filter_map(|c| sequence(c).map(|s| (s, c.as_str())))
                .filter(|(s, _)| *s < seq)
                .collect();
            ahead.sort_unstable();
            let Some((_, before)) = ahead.last() else {
                return Ok(node);
            };
            let only = ahead.len() == 1;
            let (stat, watcher) = self
                .client
                .check_and_watch_stat(&format!("{dir}/{before}"))
                .await?;
            if stat.is_none() {
                continue;
            }
            let event = watcher.changed().await;
            // The only node in front is gone: no node made later sorts before ours.
            if only && event.event_type == zk::EventType::NodeDeleted {
                return Ok(node);
            }
        }
    }

    /// Deletes our node `node`.
    async fn release(&mut self, node: String, _name: &str) -> Result<()> {
        Ok(self.client.delete(&node, None).await?)
    }
}

/// The round trip of a bare `exists` of an absent node, one at a time (the first tenth
/// discarded).
async fn zk_round_trip(client: &zk::Client, samples: usize) -> Result<Latencies> {
    let mut lat = Latencies::new();
    for i in 0..samples + samples / 10 {
        let start = Instant::now();
        client.check_stat("/bench-rtt").await?;
        if i >= samples / 10 {
            lat.record(start.elapsed());
        }
    }
    Ok(lat)
}

/// The PID of the kit's JVM serving on `addr` (`127.0.0.1:port`): it runs under a shell,
/// so it is no child of ours; its `zoo.cfg` lies in `dlock-zk-<our pid>-<port>`. The
/// shell's arguments name the same file, so the program (`argv[0]`) must be `java`.
fn jvm_pid(addr: &str) -> Option<u32> {
    let port = addr.rsplit_once(':')?.1;
    let needle = format!("dlock-zk-{}-{port}", std::process::id());
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .find_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let cmdline = String::from_utf8_lossy(&cmdline);
            let program = cmdline.split('\0').next()?;
            (program.rsplit('/').next() == Some("java")
                && cmdline.contains("QuorumPeerMain")
                && cmdline.contains(&needle))
            .then_some(pid)
        })
}

/// What the section keeps of its clients for its text.
pub(crate) struct Kept {
    /// `ZooKeeper 3.8.0`.
    version: String,
    /// The session timeout the server granted.
    session_timeout: Duration,
    /// Whether the CPU of ZooKeeper's JVM and of etcd was measured (both PIDs found).
    cpu_measured: bool,
}

/// The section's servers and clients.
pub(crate) struct Clients {
    /// Kept for its lifetime: dropping it kills the JVM.
    server: ZkServer,
    zk_pid: Option<u32>,
    /// Kept for its lifetime: dropping it kills the member.
    _etcd_server: EtcdCluster,
    etcd_pid: Option<u32>,
    redis_server: RedisServer,
    url: String,
    etcd_url: String,
    redis_url: String,
    bare: zk::Client,
    zk: ZooKeeper,
    etcd: Etcd,
    etcd_bare: etcd_client::Client,
    redis: Redis,
}

impl Clients {
    /// `ZooKeeper 3.8.0`, from the server's `srvr`.
    fn version(&self) -> String {
        self.server
            .members
            .first()
            .and_then(|m| m.four_letters("srvr").ok())
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("Zookeeper version: "))
                    .map(|v| format!("ZooKeeper {}", v.split(['-', ',']).next().unwrap_or(v)))
            })
            .unwrap_or_else(|| "ZooKeeper".to_owned())
    }
}

impl Setup for Clients {
    const SECTION: &'static str = "zookeeper";
    const STARTING: Option<&'static str> = Some("zookeeper: starting a standalone server");
    const ROWS: &'static [&'static str] = &ROWS;
    const HANDOFF_ROWS: &'static [&'static str] = &HANDOFF_ROWS;

    type Extra = Kept;

    async fn start() -> Result<Clients> {
        let server = tokio::task::spawn_blocking(ZkServer::standalone)
            .await?
            .map_err(|e| format!("starting zookeeper: {e}"))?;
        let zk_pid = server.members.first().and_then(|m| jvm_pid(&m.addr()));
        let url = server.url(CHROOT, "");
        // dlock creates the chroot; the bare session works under it.
        let zk = ZooKeeper::connect(&url).await?;
        let bare = bare_session(&server.hosts()).await?;
        let etcd_server = EtcdCluster::start(1)?;
        let etcd_pid = etcd_server
            .members
            .first()
            .and_then(|m| stores::child_pid(&m.addr()));
        let etcd_url = etcd_server.url();
        // The member elects itself first: both clients retry until it serves.
        let etcd_bare = stores::etcd_client(&etcd_url).await?;
        let etcd = stores::etcd_connect(&etcd_url).await?;
        let redis_server = RedisServer::start()?;
        let redis_url = redis_server.url();
        let redis = Redis::connect(redis_url.as_str()).await?;
        Ok(Clients {
            server,
            zk_pid,
            _etcd_server: etcd_server,
            etcd_pid,
            redis_server,
            url,
            etcd_url,
            redis_url,
            bare,
            zk,
            etcd,
            etcd_bare,
            redis,
        })
    }

    fn extra(&self) -> Kept {
        Kept {
            version: tokio::task::block_in_place(|| self.version()),
            session_timeout: self.zk.session_timeout(),
            cpu_measured: self.zk_pid.is_some() && self.etcd_pid.is_some(),
        }
    }

    async fn tasks(&self, id: &'static str, n: usize, tag: &str) -> Result<Vec<BoxCycle>> {
        let mut tasks = Vec::with_capacity(n);
        for t in 0..n {
            let name = format!("bench:z:{id}:{tag}:{n}:{t}");
            let token = format!("{:032x}", 0x2c00_0000_0000_u128 + t as u128);
            tasks.push(match id {
                "limit" => ZkLimit::boxed(self.bare.clone(), &name, token),
                "dlock" => LockCycle::boxed(self.zk.clone(), name, stores::TTL)?,
                "etcd" => LockCycle::boxed(self.etcd.clone(), name, stores::TTL)?,
                _ => LockCycle::boxed(self.redis.clone(), name, stores::TTL)?,
            });
        }
        Ok(tasks)
    }

    async fn waiters(&self, id: &'static str, n: usize) -> Result<Vec<BoxWaiter>> {
        if id == "redis" {
            return contended::make_waiters(
                contended::Client::DlockPerWaiter,
                n,
                &self.redis_url,
                "",
            )
            .await;
        }
        let mut waiters = Vec::with_capacity(n);
        for i in 0..n {
            waiters.push(match id {
                "limit" => contended::boxed(BareWaiter {
                    client: bare_session(&self.server.hosts()).await?,
                    token: format!("{:032x}", 0x2cb0_0000_u128 + i as u128),
                }),
                "dlock" => contended::boxed(LockWaiter(ZooKeeper::connect(&self.url).await?)),
                _ => contended::boxed(LockWaiter(stores::etcd_connect(&self.etcd_url).await?)),
            });
        }
        Ok(waiters)
    }

    async fn round_trips(&self) -> Result<Vec<Duration>> {
        Ok(vec![
            zk_round_trip(&self.bare, 1_000).await?.quantile(0.5),
            stores::etcd_round_trip(&self.etcd_bare, 300)
                .await?
                .quantile(0.5),
            measure::round_trip(&self.redis_url, 1_000)
                .await?
                .quantile(0.5),
        ])
    }

    fn servers(&self) -> Vec<u32> {
        self.zk_pid
            .into_iter()
            .chain(self.etcd_pid)
            .chain(self.redis_server.pid())
            .collect()
    }
}

/// The section's results.
pub(crate) type Section = stores::Section<Clients>;

fn rows() -> Vec<Row> {
    vec![
        Row {
            id: "limit",
            label: "limit: bare `create` (ephemeral sequential) + `getChildren` + `delete`, one session"
                .to_owned(),
            round_trips: "3".to_owned(),
            limit: Some("limit"),
            reference: None,
            peer: None,
        },
        Row {
            id: "dlock",
            label: "**dlock** `Lock<ZooKeeper>`, one shared client".to_owned(),
            round_trips: "3".to_owned(),
            limit: Some("limit"),
            reference: Some("redis"),
            peer: Some("etcd"),
        },
        Row {
            id: "etcd",
            label: "dlock `Lock<Etcd>`, one shared client".to_owned(),
            round_trips: "3".to_owned(),
            limit: None,
            reference: Some("redis"),
            peer: None,
        },
        Row {
            id: "redis",
            label: "dlock `Lock<Redis>`, one shared client (reference)".to_owned(),
            round_trips: "2".to_owned(),
            limit: None,
            reference: None,
            peer: None,
        },
    ]
}

impl Section {
    fn handoff_rows(&self) -> Vec<HandoffRow> {
        let zk = self.rtts.first().copied().unwrap_or_default();
        let etcd = self.rtts.get(1).copied().unwrap_or(zk);
        let redis = self.rtts.get(2).copied().unwrap_or(zk);
        vec![
            HandoffRow {
                id: "limit",
                label:
                    "limit: the recipe by hand, a session per waiter (watch the node before ours)"
                        .to_owned(),
                rtt: zk,
                limit: None,
                reference: Some("redis"),
                peer: None,
            },
            HandoffRow {
                id: "dlock",
                label: "**dlock** `Lock<ZooKeeper>`, a client per waiter (sequence queue)"
                    .to_owned(),
                rtt: zk,
                limit: Some("limit"),
                reference: Some("redis"),
                peer: Some("etcd"),
            },
            HandoffRow {
                id: "etcd",
                label: "dlock `Lock<Etcd>`, a client per waiter (create-revision queue)".to_owned(),
                rtt: etcd,
                limit: None,
                reference: Some("redis"),
                peer: None,
            },
            HandoffRow {
                id: "redis",
                label: "dlock `Lock<Redis>`, a client per waiter (reference)".to_owned(),
                rtt: redis,
                limit: None,
                reference: None,
                peer: None,
            },
        ]
    }

    /// The section's Markdown.
    pub(crate) fn markdown(&self) -> String {
        let zk = self.rtts.first().copied().unwrap_or_default();
        let etcd = self.rtts.get(1).copied().unwrap_or(zk);
        let redis = self.rtts.get(2).copied().unwrap_or(zk);
        let mut md = format!(
            "\n## 6.4 ZooKeeper\n\n\
             A private standalone ZooKeeper ({}, dlock-test's kit: Debian's jar on the \
             machine's JVM with `-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Xmx256m`, \
             `tickTime=100`, the transaction log fsynced as by default, data directory in \
             the system temp directory), a private single-member etcd and a private \
             `redis-server`, on loopback. **dlock** = `Lock::builder(ZooKeeper::connect(url)?, \
             name).ttl(30 s)` (watchdog on; session timeout {}, so the lease is {}): an \
             ephemeral sequential node per attempt (its container directory first when the \
             server removed it), a listing of the directory, release by deleting the node. \
             **limit** = the same znode operations, bare, with zookeeper-client 0.11 on one \
             session. The etcd and Redis rows are dlock's `Lock<Etcd>` and `Lock<Redis>` \
             (as in sections 6.2 and 1), measured here again so that every row shares \
             this run: `× peer` divides by dlock's etcd lock (ZooKeeper has no lock service \
             of its own), `× reference` by dlock's Redis lock. Tasks of a client share its \
             session. Median of {} rounds: uncontended runs of {:.2} s, contended runs of \
             {:.2} s (step-aside mode as in section 2, a client per waiter, ttl 10 s). \
             Server CPU = {}, for every row. Round trip: ZooKeeper `exists` p50 {}, etcd \
             `Range` p50 {}, Redis PING p50 {}.\n\n### Uncontended\n\n",
            self.extra.version,
            fmt_dur(self.extra.session_timeout),
            fmt_dur(self.extra.session_timeout.min(stores::TTL)),
            self.rounds,
            self.run.as_secs_f64(),
            self.contended_run.as_secs_f64(),
            if self.extra.cpu_measured {
                "ZooKeeper's JVM + etcd + redis-server"
            } else {
                "the servers whose PID was found (ZooKeeper's JVM or etcd missing)"
            },
            fmt_dur(zk),
            fmt_dur(etcd),
            fmt_dur(redis),
        );
        md.push_str(&stores::uncontended_table(&rows(), &self.cells));
        md.push_str(
            "\n### Contended hand-off on one hot name\n\n\
             Waiters queue on the server in sequence order: each acquirer's node \
             `<lock key>/<token>-<sequence>` lives in its session, and each waiter watches \
             only the node just before its own (an `exists` watch), so a release (a \
             `delete`) wakes one waiter; when the deleted node was the only one in front, \
             the waiter holds the lock without listing the queue again. The limit does \
             that by hand; dlock adds one `exists` read of the waiter's own node (an \
             operator's `deleteall` takes it with the one in front: then it queues again, \
             not holds) and its engine (a follower task per waiter, the grant \
             handed to the waiting `lock()` call, the watchdog). `p50 × limit` = dlock's \
             hand-off p50 over the limit's, `p50 × peer` over dlock's etcd lock's, in the \
             same run.\n\n",
        );
        md.push_str(&stores::handoff_table(&self.handoff_rows(), &self.handoffs));
        md
    }
}
