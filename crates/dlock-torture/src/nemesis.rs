//! The nemesis: which faults a kind's run gets and when ([`plan`], [`schedule`]), and
//! [`Nemesis`], which injects each one into workers, links or servers and ends its window.

use std::time::Duration;

use dlock_test::clock::FakeClock;
use dlock_test::proxy::{Fault as ProxyFault, Proxy};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::checkers::Kill;
use crate::exit::Failure;
use crate::model::{
    CLIENT_JUMP, Config, Fault, FaultWindow, Kind, Nodes, REDLOCK_BRIDGE, ResourceKeys, Rng,
    monotonic_ns,
};
#[cfg(feature = "etcd")]
use crate::stores::etcd_victim;
use crate::stores::{LockServer, Store, zookeeper_victim};
use crate::workers::{Running, Spawner};

/// How fast the lock server's clock runs under `clock-fast`.
const CLOCK_RATE: f64 = 4.0;

/// Sets a fake clock right; a failure is reported, and the next fault's window shows it.
fn reset(clock: Option<&FakeClock>) {
    if let Some(Err(e)) = clock.map(FakeClock::reset) {
        eprintln!("dlock: torture: setting a fake clock right: {e}");
    }
}

/// The faults and duration of one kind (see [`Kind::applies`], [`Kind::in_quick_run`]:
/// under `--quick` with `--faults all`; faults named in `--faults` all apply).
pub(crate) fn plan(config: &Config, kind: Kind) -> (Vec<Fault>, Duration) {
    let faults: Vec<Fault> = config
        .faults
        .iter()
        .copied()
        .filter(|&f| kind.applies(f))
        .filter(|&f| !config.quick || config.faults_named || kind.in_quick_run(f))
        .filter(|f| !config.on_given(kind) || !config.not_on_given.contains(f))
        .collect();
    let duration = match kind {
        _ if !config.quick => config.duration,
        Kind::Memory => Duration::from_secs(8),
        Kind::RedlockImmediateRestart | Kind::RedlockDelayedRestart => Duration::from_secs(30),
        // Three ttls (9 s) apart, a pause's window lasting up to 3.5 of them and each
        // fault waiting for a grant (a hold, a lease and a half, apart): room for three.
        k if k.runs_commands() && !k.is_control() => Duration::from_secs(40),
        k if k.is_control() => Duration::from_secs(12),
        // Room for its seven quick faults, three ttls apart (see `schedule`).
        Kind::Redlock => Duration::from_secs(24),
        // Room for their four quick faults, three of their 2 s ttls apart.
        Kind::MemcachedFenced
        | Kind::MemcachedFamilyFenced
        | Kind::EtcdFenced
        | Kind::EtcdFamilyFenced
        | Kind::ZookeeperFenced => Duration::from_secs(30),
        _ => Duration::from_secs(30),
    };
    (faults, duration)
}

/// When each fault starts: spread over the run, each fault at least once, in a seeded
/// order, twice over when there is time. Every fault comes once before any comes again
/// (a round in a seeded order, then the next), and the kind's
/// [required fault](Kind::required_faults) (the first of them planned) comes first: even a run with room for a single
/// fault has it, and a fault whose turn slips (the nemesis starts none while another's
/// window is open) slips past a repeat of another, not past the run's end.
pub(crate) fn schedule(
    config: &Config,
    kind: Kind,
    faults: &[Fault],
    duration: Duration,
) -> Vec<(Duration, Fault)> {
    if faults.is_empty() {
        return Vec::new();
    }
    let mut rng = Rng(config.seed ^ (kind as u64).wrapping_mul(0x9e37_79b9));
    // A fault window lasts up to 2.5 ttl (and the nemesis never starts one while another
    // is open), so windows start three ttls apart.
    // The RedLock restart kinds' restarts need less room: one and a half ttls (a delayed
    // restart's window still ends before the next, as none starts while one is open).
    let slot = if kind.holds_long() {
        kind.ttl(config.ttl) * 3 / 2
    } else {
        kind.ttl(config.ttl) * 3
    };
    let room = usize::try_from(duration.as_millis() / slot.as_millis().max(1))
        .unwrap_or(1)
        .saturating_sub(1)
        .max(1);
    // The RedLock restart kinds repeat their one combined fault as often as there is room,
    // and so do the controls run under pauses alone: one pause that lands a moment late
    // (a loaded machine) must not leave a control uncaught.
    let n = if kind.holds_long() || (kind.is_control() && faults == [Fault::Pause]) {
        room
    } else {
        room.min(faults.len() * 2).max(faults.len().min(room))
    };
    let required = kind
        .required_faults()
        .iter()
        .copied()
        .find(|f| faults.contains(f));
    let mut order: Vec<Fault> = Vec::with_capacity(n);
    while order.len() < n {
        let mut round: Vec<Fault> = faults.to_vec();
        for i in (1..round.len()).rev() {
            round.swap(i, rng.below(i + 1));
        }
        if order.is_empty()
            && let Some(i) = required.and_then(|r| round.iter().position(|&f| f == r))
        {
            let first = round.remove(i);
            round.insert(0, first);
        }
        let take = (n - order.len()).min(round.len());
        order.extend(round.into_iter().take(take));
    }
    let step = duration / u32::try_from(n + 1).unwrap_or(1);
    order
        .into_iter()
        .enumerate()
        .map(|(i, f)| (step * u32::try_from(i + 1).unwrap_or(1), f))
        .collect()
}

/// Everything the nemesis acts on during one kind's run.
pub(crate) struct Nemesis<'a> {
    pub(crate) store: Store<'a>,
    /// Each worker slot's links: a proxy per lock server (per RedLock node).
    pub(crate) proxies: Vec<Vec<Proxy>>,
    pub(crate) spawner: Spawner,
    pub(crate) running: Vec<Running>,
    pub(crate) windows: Vec<FaultWindow>,
    /// Timed ends of fault windows: (when, what to undo, index into `windows`).
    pub(crate) undo: Vec<(u64, Undo, usize)>,
    pub(crate) kills: Vec<Kill>,
    /// A paused worker due to resume at the next acquire by another (or the deadline).
    pub(crate) resume: Option<(u64, Undo, usize)>,
    pub(crate) ttl: Duration,
    /// Chooses the RedLock nodes, etcd members or ZooKeeper servers a fault hits (used by
    /// no other kind, so theirs keep their choices per seed).
    pub(crate) node_rng: Rng,
    /// The lock server's clock, when this kind's faults move it.
    pub(crate) store_clock: Option<FakeClock>,
    /// The workers' wall clock, when this kind's faults move it.
    pub(crate) client_clock: Option<FakeClock>,
    /// Client clock jumps so far: forward on the first, third, …, back on the others.
    pub(crate) client_jumps: usize,
    /// RedLock, etcd or ZooKeeper restarts so far: on RedLock the first, third, … are
    /// delayed, the others at once; on etcd and ZooKeeper the first, third, … hit the
    /// leader, the others a follower.
    pub(crate) node_restarts: usize,
}

impl Nemesis<'_> {
    pub(crate) fn ttl_ns(&self) -> u64 {
        u64::try_from(self.ttl.as_nanos()).unwrap_or(u64::MAX)
    }

    /// The servers a fault hits: some of RedLock's nodes, the links to some of etcd's
    /// members or ZooKeeper's servers, or the one server. (Which etcd member or ZooKeeper
    /// server restarts depends on who leads when it happens: [`inject`](Self::inject)
    /// chooses it.)
    pub(crate) fn choose_nodes(&mut self, fault: Fault) -> Nodes {
        match &self.store {
            // The node every majority of either half includes.
            Store::Quorum { .. } if self.spawner.kind.holds_long() => Nodes::one(REDLOCK_BRIDGE),
            Store::Quorum { nodes, .. } => Nodes::minority(nodes.len(), &mut self.node_rng),
            #[cfg(feature = "etcd")]
            Store::Etcd { cluster, .. } if fault != Fault::Restart => {
                Nodes::some(cluster.members.len(), &mut self.node_rng)
            }
            // The command kinds cut a `dlock` process off from the whole ensemble: a
            // partition, not a fail-over to another server.
            Store::ZooKeeper { ensemble, .. } if self.spawner.kind.runs_commands() => {
                Nodes::all(ensemble.members.len())
            }
            Store::ZooKeeper { ensemble, .. } if fault != Fault::Restart => {
                Nodes::some(ensemble.members.len(), &mut self.node_rng)
            }
            _ => Nodes::FIRST,
        }
    }

    /// Injects `fault`, aimed at `running[victim]` where it needs a worker, and records
    /// its window if it took effect. Returns whether it did (the caller tries again later
    /// when it did not: a fault planned and never injected fails the kind).
    pub(crate) async fn inject(
        &mut self,
        fault: Fault,
        victim: Option<usize>,
    ) -> Result<bool, Failure> {
        let t = monotonic_ns();
        let ttl_ns = self.ttl_ns();
        let half_ttls = move |k: u64| t + k * ttl_ns / 2;
        let admin_timeout = self.ttl * 2;
        let has_nodes = self.store.has_nodes();
        let mut nodes = if fault.hits_nodes() {
            self.choose_nodes(fault)
        } else {
            Nodes::FIRST
        };
        // A RedLock restart may become a delayed one, an etcd restart a leader's or a
        // follower's.
        let mut happened = fault;
        // (took effect, the worker aimed at, how the window ends)
        let (effect, worker, undo): (bool, Option<usize>, Option<(u64, Undo)>) = match fault {
            Fault::Pause => match victim.map(|v| &mut self.running[v]) {
                Some(r) => match r.child.id().and_then(|p| i32::try_from(p).ok()) {
                    Some(pid) if kill(Pid::from_raw(pid), Signal::SIGSTOP).is_ok() => {
                        r.faulted = true;
                        (
                            true,
                            Some(r.id),
                            Some((half_ttls(5), Undo::Continue(r.id, pid))),
                        )
                    }
                    _ => (false, None, None),
                },
                None => (false, None, None),
            },
            Fault::Kill => match victim {
                Some(v) => {
                    let r = &mut self.running[v];
                    let _ = r.child.start_kill();
                    let _ = r.child.wait().await;
                    r.alive = false;
                    r.killed = true;
                    self.kills.push(Kill {
                        worker: r.id,
                        t: monotonic_ns(),
                        was_holding: r.holding,
                    });
                    let (slot, id) = (r.slot, r.id);
                    let next = self.running.iter().map(|r| r.id).max().unwrap_or(0) + 1;
                    let replacement = self.spawner.spawn(next, slot)?;
                    self.running.push(replacement);
                    (true, Some(id), None)
                }
                None => (false, None, None),
            },
            Fault::Freeze => {
                let frozen = match &mut self.store {
                    Store::Redis {
                        server: LockServer::Own(s),
                        ..
                    } => s.freeze().is_ok(),
                    Store::Postgres {
                        server: Some(server),
                        ..
                    } => {
                        server.freeze();
                        true
                    }
                    // Every node chosen, whether or not another failed.
                    Store::Quorum { nodes: servers, .. } => {
                        nodes
                            .iter()
                            .filter(|&i| servers[i].freeze().is_ok())
                            .count()
                            > 0
                    }
                    _ => false,
                };
                if frozen {
                    (true, None, Some((half_ttls(4), Undo::Thaw(nodes))))
                } else {
                    (false, None, None)
                }
            }
            Fault::ClientPause => {
                let ms = (2 * self.spawner.ttl_ms).to_string();
                let pause = redis::cmd("CLIENT")
                    .arg("PAUSE")
                    .arg(&ms)
                    .arg("ALL")
                    .to_owned();
                let paused = match &mut self.store {
                    Store::Redis { admin: conn, .. } => admin(conn, &pause, admin_timeout).await,
                    Store::Quorum { admins, .. } => {
                        let mut any = false;
                        for i in nodes.iter() {
                            any |= admin(&mut admins[i], &pause, admin_timeout).await;
                        }
                        any
                    }
                    #[cfg(feature = "etcd")]
                    Store::Etcd { .. } => false,
                    Store::Memcached(_)
                    | Store::Postgres { .. }
                    | Store::Sentinel(_)
                    | Store::Cluster(_)
                    | Store::ZooKeeper { .. } => false,
                };
                if paused {
                    (true, None, Some((half_ttls(4), Undo::Unpause(nodes))))
                } else {
                    (false, None, None)
                }
            }
            Fault::Restart
            | Fault::DelayedRestart
            | Fault::LeaderRestart
            | Fault::MemberRestart
            | Fault::CrashRestart => match &mut self.store {
                Store::Redis { server, .. } => match server {
                    LockServer::Own(s) => (s.restart().is_ok(), None, None),
                    LockServer::Given(_) | LockServer::Postgres(_) => (false, None, None),
                },
                Store::Quorum { nodes: servers, .. } => {
                    self.node_restarts += 1;
                    let delayed = match self.spawner.kind {
                        Kind::RedlockDelayedRestart => true,
                        Kind::RedlockImmediateRestart => false,
                        _ => self.node_restarts % 2 == 1,
                    };
                    if delayed {
                        // Down until every lease the nodes held has run out elsewhere too.
                        happened = Fault::DelayedRestart;
                        for i in nodes.iter() {
                            servers[i].kill();
                        }
                        (true, None, Some((half_ttls(4), Undo::Revive(nodes))))
                    } else {
                        happened = Fault::Restart;
                        let restarted = nodes
                            .iter()
                            .filter(|&i| servers[i].restart().is_ok())
                            .count()
                            > 0;
                        (restarted, None, None)
                    }
                }
                Store::Memcached(s) => (s.restart().is_ok(), None, None),
                // Their one server fault is the failover.
                Store::Sentinel(_) | Store::Cluster(_) => (false, None, None),
                // A crash: every process killed, then started again on its data at once.
                Store::Postgres {
                    server: Some(server),
                    ..
                } => {
                    happened = Fault::CrashRestart;
                    (server.restart().is_ok(), None, None)
                }
                // The server `--url` named is not ours to restart.
                Store::Postgres { server: None, .. } => (false, None, None),
                #[cfg(feature = "etcd")]
                Store::Etcd { cluster, admins } => {
                    self.node_restarts += 1;
                    let leader_turn = self.node_restarts % 2 == 1;
                    match etcd_victim(cluster, admins, leader_turn, &mut self.node_rng).await {
                        Some((i, leads)) => {
                            happened = if leads {
                                Fault::LeaderRestart
                            } else {
                                Fault::MemberRestart
                            };
                            cluster.members[i].kill();
                            nodes = Nodes::one(i);
                            (true, None, Some((half_ttls(4), Undo::Revive(nodes))))
                        }
                        None => (false, None, None),
                    }
                }
                Store::ZooKeeper { ensemble, .. } => {
                    self.node_restarts += 1;
                    let leader_turn = self.node_restarts % 2 == 1;
                    match zookeeper_victim(ensemble, leader_turn, &mut self.node_rng).await {
                        Some((i, leads)) => {
                            happened = if leads {
                                Fault::LeaderRestart
                            } else {
                                Fault::MemberRestart
                            };
                            ensemble.members[i].kill();
                            nodes = Nodes::one(i);
                            (true, None, Some((half_ttls(4), Undo::Revive(nodes))))
                        }
                        None => (false, None, None),
                    }
                }
            },
            Fault::ScriptFlush => {
                let flush = redis::cmd("SCRIPT").arg("FLUSH").to_owned();
                let flushed = match &mut self.store {
                    Store::Redis { admin: conn, .. } => admin(conn, &flush, admin_timeout).await,
                    Store::Quorum { admins, .. } => {
                        let mut any = false;
                        for i in nodes.iter() {
                            any |= admin(&mut admins[i], &flush, admin_timeout).await;
                        }
                        any
                    }
                    #[cfg(feature = "etcd")]
                    Store::Etcd { .. } => false,
                    Store::Memcached(_)
                    | Store::Postgres { .. }
                    | Store::Sentinel(_)
                    | Store::Cluster(_)
                    | Store::ZooKeeper { .. } => false,
                };
                (flushed, None, None)
            }
            // The replica was frozen by `prepare_failover`; a grant (or its deadline) has
            // come: the master dies, the replica thaws, and the window lasts until the
            // replica is promoted and the old master is back as its replica.
            Fault::Failover => match &mut self.store {
                Store::Sentinel(sentinel) => {
                    tokio::task::block_in_place(|| sentinel.kill_master());
                    (true, None, Some((half_ttls(1), Undo::Promote)))
                }
                Store::Cluster(cluster) => {
                    tokio::task::block_in_place(|| cluster.kill_master());
                    (true, None, Some((half_ttls(1), Undo::Promote)))
                }
                _ => (false, None, None),
            },
            // A clock moved until the window's end, when it is set right.
            Fault::ClockJump | Fault::ClockBack | Fault::ClockFast | Fault::ClientClock => {
                let (clock, undo) = if fault == Fault::ClientClock {
                    self.client_jumps += 1;
                    (&self.client_clock, Undo::ClientClockReset)
                } else {
                    (&self.store_clock, Undo::ClockReset)
                };
                let moved = clock.as_ref().map(|clock| match fault {
                    Fault::ClockJump => clock.jump_forward(self.ttl * 2),
                    Fault::ClockBack => clock.jump_backward(self.ttl * 2),
                    Fault::ClockFast => clock.run_fast(CLOCK_RATE),
                    // The workers' clock: forward on the first, third, … jump, back on the others.
                    _ if self.client_jumps % 2 == 1 => clock.jump_forward(CLIENT_JUMP),
                    _ => clock.jump_backward(CLIENT_JUMP),
                });
                match moved {
                    Some(Ok(())) => (true, None, Some((half_ttls(4), undo))),
                    Some(Err(e)) => {
                        eprintln!("dlock: torture: moving a clock ({}): {e}", fault.id());
                        (false, None, None)
                    }
                    None => (false, None, None),
                }
            }
            Fault::Delay | Fault::Blackhole | Fault::Close => match victim {
                Some(v) => {
                    let slot = self.running[v].slot;
                    let links: Vec<&Proxy> = self
                        .proxies
                        .get(slot)
                        .map(|links| nodes.iter().filter_map(|i| links.get(i)).collect())
                        .unwrap_or_default();
                    if links.is_empty() {
                        (false, None, None)
                    } else {
                        let undo = match fault {
                            Fault::Delay => {
                                for proxy in &links {
                                    proxy.set_fault(ProxyFault::Delay(self.ttl * 3 / 5));
                                }
                                Some((half_ttls(4), Undo::Pass(slot, nodes)))
                            }
                            Fault::Blackhole => {
                                for proxy in &links {
                                    proxy.set_fault(ProxyFault::Blackhole);
                                }
                                Some((half_ttls(4), Undo::Pass(slot, nodes)))
                            }
                            _ => {
                                for proxy in &links {
                                    proxy.close_all();
                                }
                                None
                            }
                        };
                        if undo.is_some() {
                            self.running[v].faulted = true;
                        }
                        (true, Some(self.running[v].id), undo)
                    }
                }
                None => (false, None, None),
            },
        };
        if effect {
            let end = undo.as_ref().map_or_else(monotonic_ns, |(at, _)| *at);
            self.windows.push(FaultWindow {
                fault: happened,
                start: t,
                end,
                worker,
                nodes: if has_nodes && fault.hits_nodes() {
                    nodes.list()
                } else {
                    Vec::new()
                },
            });
            if let Some((at, what)) = undo {
                self.undo.push((at, what, self.windows.len() - 1));
            }
        }
        Ok(effect)
    }

    /// The key of the kind's lock, as the store names it (a cluster's failover hits its
    /// slot).
    fn lock_key(&self) -> Option<String> {
        let keys = ResourceKeys::parse(&self.spawner.keys_base);
        self.spawner
            .kind
            .lock_keys(&keys)
            .map(|k| k.lock().to_owned())
    }

    /// The first step of a failover: freezes the replica that will be promoted, so that
    /// the next grant reaches the master alone. Whether it could be done now (the
    /// replica in sync).
    pub(crate) fn prepare_failover(&mut self) -> bool {
        let key = self.lock_key();
        match &mut self.store {
            Store::Sentinel(sentinel) => tokio::task::block_in_place(|| sentinel.freeze_replica()),
            Store::Cluster(cluster) => key.is_some_and(|key| {
                tokio::task::block_in_place(|| cluster.freeze_replica(&key)).is_some()
            }),
            _ => false,
        }
    }

    /// Cuts every worker slot's links to the other half's nodes (the `redlock-*-restart`
    /// kinds): the even slots reach nodes 0, 1 and the bridge, the odd ones the bridge,
    /// 3 and 4.
    pub(crate) fn partition(&self) {
        for (slot, links) in self.proxies.iter().enumerate() {
            let cut: &[usize] = if slot % 2 == 0 { &[3, 4] } else { &[0, 1] };
            for &i in cut {
                if let Some(proxy) = links.get(i) {
                    proxy.set_fault(ProxyFault::Blackhole);
                }
            }
        }
    }

    /// Resumes a paused worker waiting for its moment (now, or at its deadline).
    pub(crate) fn resume(&mut self, now: u64, force: bool) {
        if let Some((deadline, what, w)) = self.resume
            && (force || deadline <= now)
        {
            self.resume = None;
            self.undo.push((now, what, w));
            self.heal(now, true);
        }
    }

    /// Ends the fault windows that are due (all of them with `all`).
    pub(crate) fn heal(&mut self, now: u64, all: bool) {
        let mut i = 0;
        while i < self.undo.len() {
            if all || self.undo[i].0 <= now {
                let (_, what, w) = self.undo.swap_remove(i);
                if let (Undo::Continue(..), false) = (what, all) {
                    // Resume the paused holder just after another worker acquired: its
                    // late write and release then meet a live holder, as they would in
                    // production under load.
                    self.resume = Some((now + self.ttl_ns(), what, w));
                    continue;
                }
                match what {
                    Undo::ClockReset => reset(self.store_clock.as_ref()),
                    Undo::ClientClockReset => reset(self.client_clock.as_ref()),
                    _ => {
                        let start = monotonic_ns();
                        if !what.apply(&mut self.store, &self.proxies) {
                            // No promotion: the old master's empty restart is what the
                            // store went through (fences and holds forgotten).
                            self.windows.push(FaultWindow {
                                fault: Fault::Restart,
                                start,
                                end: monotonic_ns(),
                                worker: None,
                                nodes: Vec::new(),
                            });
                        }
                    }
                }
                match what {
                    Undo::Continue(id, _) => {
                        if let Some(r) = self.running.iter_mut().find(|r| r.id == id) {
                            r.faulted = false;
                        }
                    }
                    Undo::Pass(slot, _) => {
                        for r in self.running.iter_mut().filter(|r| r.slot == slot) {
                            r.faulted = false;
                        }
                    }
                    Undo::Thaw(_)
                    | Undo::Unpause(_)
                    | Undo::Revive(_)
                    | Undo::Promote
                    | Undo::ClockReset
                    | Undo::ClientClockReset => {}
                }
                self.windows[w].end = monotonic_ns();
            } else {
                i += 1;
            }
        }
    }
}

/// Runs an admin command on the lock server, once more if the first try meets a
/// connection a restart broke; bounded in time. Returns whether it succeeded.
pub(crate) async fn admin(
    conn: &mut redis::aio::ConnectionManager,
    cmd: &redis::Cmd,
    limit: Duration,
) -> bool {
    for _ in 0..2 {
        if let Ok(Ok(())) = tokio::time::timeout(limit, cmd.query_async::<()>(conn)).await {
            return true;
        }
    }
    false
}

/// A running worker to aim a fault at: one that holds the lock if any, else any.
pub(crate) fn pick(running: &[Running], rng: &mut Rng) -> Option<usize> {
    let alive: Vec<usize> = (0..running.len())
        .filter(|&i| running[i].alive && !running[i].faulted)
        .collect();
    let holding: Vec<usize> = alive
        .iter()
        .copied()
        .filter(|&i| running[i].holding)
        .collect();
    let pool = if holding.is_empty() { &alive } else { &holding };
    (!pool.is_empty()).then(|| pool[rng.below(pool.len())])
}

/// How a fault window ends.
#[derive(Clone, Copy)]
pub(crate) enum Undo {
    /// SIGCONT worker `id` (process `pid`).
    Continue(usize, i32),
    /// SIGCONT frozen servers.
    Thaw(Nodes),
    /// `CLIENT UNPAUSE` servers.
    Unpause(Nodes),
    /// Let traffic through a worker slot's links to these servers again.
    Pass(usize, Nodes),
    /// Start killed RedLock nodes again, empty, or killed etcd members and ZooKeeper
    /// servers from their data.
    Revive(Nodes),
    /// Wait for the replica's promotion, then start the old master again as its replica.
    Promote,
    /// Set the lock server's clock right (real time, real rate).
    ClockReset,
    /// Set the workers' clock right.
    ClientClockReset,
}

impl Undo {
    /// Whether it went as planned: `false` only for a failover whose promotion the
    /// sentinels or the cluster never made (its old master then came back empty under
    /// its replica: a restart without persistence of the whole store).
    pub(crate) fn apply(self, store: &mut Store<'_>, proxies: &[Vec<Proxy>]) -> bool {
        match (self, store) {
            (Undo::Continue(_, pid), _) => {
                let _ = kill(Pid::from_raw(pid), Signal::SIGCONT);
            }
            (
                Undo::Thaw(_),
                Store::Redis {
                    server: LockServer::Own(s),
                    ..
                },
            ) => {
                let _ = s.thaw();
            }
            (
                Undo::Thaw(_),
                Store::Postgres {
                    server: Some(server),
                    ..
                },
            ) => server.thaw(),
            (Undo::Thaw(nodes), Store::Quorum { nodes: servers, .. }) => {
                for i in nodes.iter() {
                    let _ = servers[i].thaw();
                }
            }
            (Undo::Unpause(nodes), store) => {
                let admins: Vec<redis::aio::ConnectionManager> = match store {
                    Store::Redis { admin, .. } => vec![admin.clone()],
                    Store::Quorum { admins, .. } => nodes
                        .iter()
                        .filter_map(|i| admins.get(i).cloned())
                        .collect(),
                    #[cfg(feature = "etcd")]
                    Store::Etcd { .. } => Vec::new(),
                    Store::Memcached(_)
                    | Store::Postgres { .. }
                    | Store::Sentinel(_)
                    | Store::Cluster(_)
                    | Store::ZooKeeper { .. } => Vec::new(),
                };
                // Pipelined after the pause's own expiry at the latest; no need to wait.
                for mut admin in admins {
                    tokio::spawn(async move {
                        let _: Result<(), _> = redis::cmd("CLIENT")
                            .arg("UNPAUSE")
                            .query_async(&mut admin)
                            .await;
                    });
                }
            }
            (Undo::Pass(slot, nodes), _) => {
                if let Some(links) = proxies.get(slot) {
                    for proxy in nodes.iter().filter_map(|i| links.get(i)) {
                        proxy.set_fault(ProxyFault::Pass);
                    }
                }
            }
            (Undo::Revive(nodes), Store::Quorum { nodes: servers, .. }) => {
                for i in nodes.iter() {
                    if let Err(e) = servers[i].restart() {
                        eprintln!("dlock: torture: RedLock node {i} did not start again: {e}");
                    }
                }
            }
            #[cfg(feature = "etcd")]
            (Undo::Revive(nodes), Store::Etcd { cluster, .. }) => {
                for i in nodes.iter() {
                    if let Some(Err(e)) = cluster.members.get_mut(i).map(|m| m.restart()) {
                        eprintln!("dlock: torture: etcd member {i} did not start again: {e}");
                    }
                }
            }
            (Undo::Revive(nodes), Store::ZooKeeper { ensemble, .. }) => {
                for i in nodes.iter() {
                    if let Some(Err(e)) = ensemble.members.get_mut(i).map(|m| m.restart()) {
                        eprintln!("dlock: torture: ZooKeeper server {i} did not start again: {e}");
                    }
                }
            }
            (Undo::Promote, Store::Sentinel(sentinel)) => {
                if !tokio::task::block_in_place(|| sentinel.finish()) {
                    eprintln!("dlock: torture: the sentinels promoted no replica in time");
                    return false;
                }
            }
            (Undo::Promote, Store::Cluster(cluster)) => {
                if !tokio::task::block_in_place(|| cluster.finish()) {
                    eprintln!("dlock: torture: the cluster promoted no replica in time");
                    return false;
                }
            }
            (
                Undo::Thaw(_)
                | Undo::Revive(_)
                | Undo::Promote
                | Undo::ClockReset
                | Undo::ClientClockReset,
                _,
            ) => {}
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(quick: bool) -> Config {
        Config {
            workers: 4,
            ttl: Duration::from_secs(1),
            seed: 1,
            faults: Fault::ALL.to_vec(),
            faults_named: false,
            given: None,
            not_on_given: Vec::new(),
            all_kinds: true,
            quick,
            duration: Duration::from_secs(20),
            store_clock: None,
            client_clock: None,
        }
    }

    #[test]
    fn every_kind_s_quick_run_has_room_for_each_of_its_faults() {
        let config = config(true);
        for kind in Kind::ALL.into_iter().filter(|&k| k != Kind::Memory) {
            let (faults, duration) = plan(&config, kind);
            let planned = schedule(&config, kind, &faults, duration);
            for fault in &faults {
                assert!(
                    planned.iter().any(|(_, f)| f == fault),
                    "{}: {} not scheduled in {duration:?}",
                    kind.id(),
                    fault.id()
                );
            }
        }
    }

    #[test]
    fn a_given_server_keeps_its_skipped_faults_only_for_the_kinds_on_it() {
        let mut config = config(false);
        config.given = Some(crate::model::Given::Redis);
        config.not_on_given = vec![Fault::Freeze, Fault::Restart];
        let (faults, _) = plan(&config, Kind::Dlock);
        assert!(!faults.contains(&Fault::Freeze) && !faults.contains(&Fault::Restart));
        let (faults, _) = plan(&config, Kind::Redlock);
        assert!(faults.contains(&Fault::Freeze) && faults.contains(&Fault::Restart));
        let (faults, _) = plan(&config, Kind::MemcachedFenced);
        assert!(!faults.contains(&Fault::Freeze) && faults.contains(&Fault::Restart));
        let (faults, _) = plan(&config, Kind::EtcdFenced);
        assert!(!faults.contains(&Fault::Freeze) && faults.contains(&Fault::Restart));
        let (faults, _) = plan(&config, Kind::ZookeeperFenced);
        assert!(!faults.contains(&Fault::Freeze) && faults.contains(&Fault::Restart));
        // On a Redis URL, postgres-fenced runs on a PostgreSQL of its own: restarted.
        let (faults, _) = plan(&config, Kind::PostgresFenced);
        assert!(faults.contains(&Fault::Freeze) && faults.contains(&Fault::Restart));
        // On a PostgreSQL URL, postgres-fenced runs on that server: neither.
        config.given = Some(crate::model::Given::Postgres);
        let (faults, _) = plan(&config, Kind::PostgresFenced);
        assert!(!faults.contains(&Fault::Freeze) && !faults.contains(&Fault::Restart));
        assert!(faults.contains(&Fault::Pause) && faults.contains(&Fault::Kill));
    }

    #[test]
    fn the_fault_a_kind_exists_for_comes_first_even_when_there_is_room_for_one() {
        for quick in [true, false] {
            let mut config = config(quick);
            for duration in [
                Duration::from_secs(1),
                Duration::from_secs(4),
                Duration::from_secs(30),
            ] {
                config.duration = duration;
                for seed in 0..20 {
                    config.seed = seed;
                    for kind in Kind::ALL {
                        let Some(&required) = kind.required_faults().first() else {
                            continue;
                        };
                        let (faults, duration) = plan(&config, kind);
                        assert!(faults.contains(&required), "{}", kind.id());
                        let planned = schedule(&config, kind, &faults, duration);
                        assert_eq!(
                            planned.first().map(|p| p.1),
                            Some(required),
                            "{} (seed {seed}, {duration:?}): {planned:?}",
                            kind.id()
                        );
                    }
                }
            }
        }
        // The kinds without one keep a seeded order: not always the same fault first.
        let mut config = config(false);
        let firsts: std::collections::HashSet<&str> = (0..20)
            .map(|seed| {
                config.seed = seed;
                let (faults, duration) = plan(&config, Kind::DlockFenced);
                schedule(&config, Kind::DlockFenced, &faults, duration)[0]
                    .1
                    .id()
            })
            .collect();
        assert!(firsts.len() > 1, "{firsts:?}");
    }

    #[test]
    fn faults_named_under_quick_all_apply_and_fit_the_kinds_quick_run() {
        let clock = [
            Fault::ClockJump,
            Fault::ClockBack,
            Fault::ClockFast,
            Fault::ClientClock,
        ];
        let mut config = config(true);
        // Under `all`, the quick runs of memcached, etcd and ZooKeeper leave the clock
        // faults out (the CI's quick run has no room for them there); setnx-getset's has
        // the workers' clock jump beside pause and kill.
        for kind in [
            Kind::MemcachedFenced,
            Kind::EtcdFenced,
            Kind::ZookeeperFenced,
        ] {
            let (faults, _) = plan(&config, kind);
            assert!(!faults.iter().any(|f| f.moves_a_clock()), "{}", kind.id());
        }
        let (faults, _) = plan(&config, Kind::SetnxGetset);
        assert_eq!(faults, vec![Fault::Pause, Fault::Kill, Fault::ClientClock]);
        // Named, each kind takes every one that applies to it, and its quick run has room
        // for each.
        config.faults = clock.to_vec();
        config.faults_named = true;
        for (kind, expected) in [
            (Kind::MemcachedFenced, &clock[..]),
            (Kind::EtcdFenced, &[Fault::ClientClock][..]),
            (Kind::ZookeeperFenced, &[Fault::ClientClock][..]),
            (Kind::SetnxGetset, &[Fault::ClientClock][..]),
            (Kind::DlockFenced, &clock[..]),
            (Kind::Dlock, &[][..]),
            (Kind::PlainDel, &[][..]),
        ] {
            let (faults, duration) = plan(&config, kind);
            assert_eq!(faults, expected, "{}", kind.id());
            let planned = schedule(&config, kind, &faults, duration);
            for fault in &faults {
                assert!(
                    planned.iter().any(|(_, f)| f == fault),
                    "{}: {} not scheduled: {planned:?}",
                    kind.id(),
                    fault.id()
                );
            }
        }
        // The jump alone comes first in setnx-getset's run (twice: forward, then back).
        let (faults, duration) = plan(&config, Kind::SetnxGetset);
        let planned = schedule(&config, Kind::SetnxGetset, &faults, duration);
        assert_eq!(
            planned.iter().map(|p| p.1).collect::<Vec<_>>(),
            vec![Fault::ClientClock; 2]
        );
    }

    #[test]
    fn every_fault_comes_once_before_any_comes_again() {
        let mut config = config(false);
        config.duration = Duration::from_secs(60);
        for seed in 0..20 {
            config.seed = seed;
            for kind in [
                Kind::Dlock,
                Kind::SentinelFenced,
                Kind::PlainDel,
                Kind::Redlock,
            ] {
                let (faults, duration) = plan(&config, kind);
                let planned = schedule(&config, kind, &faults, duration);
                assert!(planned.len() > faults.len(), "{}: {planned:?}", kind.id());
                let first_round: std::collections::HashSet<&str> =
                    planned[..faults.len()].iter().map(|p| p.1.id()).collect();
                assert_eq!(
                    first_round.len(),
                    faults.len(),
                    "{}: {planned:?}",
                    kind.id()
                );
                // Spread over the run, in order.
                assert!(planned.windows(2).all(|w| w[0].0 < w[1].0));
                assert!(planned.last().is_some_and(|p| p.0 < duration));
            }
        }
    }
}
