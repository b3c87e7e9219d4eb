//! dlock's safety harness: `dlock torture`, a bounded, seeded, Jepsen-style safety check,
//! and `dlock demo`, the oversell scenario. Built as the `dlock-torture` binary,
//! which the `dlock` command runs for `dlock torture` and `dlock demo`: the lock tool users
//! install links no test kit, no server spawner and no fault proxy.
//!
//! Per lock kind: worker processes loop acquire → read-modify-write → release against the
//! lock server (each through its own fault-injecting TCP proxy), the protected resources
//! live on a separate, never-faulted redis-server, and a nemesis injects faults on a
//! schedule drawn from the seed. The history is checked afterwards (`checkers`, one file per property).
//!
//! What each kind must show, under every fault (an overlap is *excused* only when one of
//! the two holders was paused while holding, or a restart without persistence — a server,
//! or RedLock nodes started empty at once — fell inside the pair; fences may start over
//! only after a restart). Every kind but the controls must also keep the lock moving:
//! every worker asks for it all the time, so after each grant the next one comes within
//! ttl + ε; a stretch without a grant longer than twice that, with no fault or crash
//! under way or ended less than twice that before, is a *stall*, and fails the run (twice:
//! so that a loaded machine's scheduling hiccup is not taken for a stuck lock).
//!
//! | kind | what the workers do | expected |
//! |---|---|---|
//! | `dlock` | [`Lock`](fencelock::Lock), unfenced counter | overlaps and lost increments only in excused windows; lock free within ttl + ε after a holder's crash; no orphan keys |
//! | `dlock-fenced` | [`Lock`](fencelock::Lock), fenced resource | 0 stale writes accepted, 0 fenced increments lost, fences strictly increasing in grant order, never reused; liveness and orphans as `dlock` |
//! | `fair-fenced` | [`FairLock`](fencelock::FairLock) (`dlock-fair:` keys), fenced | as `dlock-fenced`, with one waiter grace (half a ttl here) added to the reacquire bound after a crash; no hold, queue entry or claim left |
//! | `rwlock-fenced` | [`RwLock`](fencelock::RwLock) (`dlock-rw:` keys): two of every three holds on the write side, fenced; the third a read hold that reads the resource | as `dlock-fenced` for the writers; no read hold overlaps a write hold outside excused windows; no writer, reader lease or writer claim left |
//! | `reentrant-fenced` | [`ReentrantLock`](fencelock::ReentrantLock) (`dlock-re:` keys, a hash), an owner per worker, entered again inside every hold, then the fenced write, inner hold released first | as `dlock-fenced`; every re-entry made while the outer hold was valid gets the outer hold's fence (a mismatch or refusal fails the run) |
//! | `election-fenced` | [`Election`](fencelock::Election) (`dlock-election:` keys): each worker campaigns with its id, writes as leader with its **term** as the fence, then resigns | as `dlock-fenced`: 0 stale terms accepted, 0 fenced increments lost, terms strictly increasing in grant order and never reused; liveness and orphans as `dlock` (the leader's record never expires, as the fence counter: it is no orphan) |
//! | `redlock` | [`Lock`](fencelock::Lock) over [`Quorum`](fencelock::backend::Quorum)`<Redis>`: 5 redis-servers of its own (whatever `--url` says), each worker reaching each node through its own proxy; unfenced counter (a quorum has no fence) | as `dlock`: no overlap outside pause windows and windows where nodes restarted empty at once (the known RedLock hazard: a node that forgot a key can let a second majority form; such overlaps are counted apart); lock free within ttl + ε after a holder's crash; no lock key left on any node |
//! | `postgres-fenced` | [`Lock`](fencelock::Lock) over [`Postgres`](fencelock::backend::Postgres): a PostgreSQL of its own, fenced; `restart` is a crash (every process SIGKILLed, started again on its data at once) | 0 stale writes accepted, 0 fenced increments lost, fences strictly increasing in grant order and never reused — a restart excuses no reset (the fence is a committed row); liveness and orphans as `dlock` |
//! | `memcached-fenced` | [`Lock`](fencelock::Lock) over [`Memcached`](fencelock::backend::Memcached): a memcached of its own, ttl at least 2 s (its expiry clock ticks in seconds), fenced | 0 stale writes accepted, 0 fenced increments lost, fences strictly increasing in grant order between restarts; overlaps only in pause/restart windows. A restart forgets the fence counter: fences start over at 1, and the resource refuses them (counted as refused) until the counter passes the highest fence it saw — the fenced resource's liveness suffers, its safety does not |
//! | `memcached-family-fenced` | [`RwLock`](fencelock::RwLock) over [`Memcached`](fencelock::backend::Memcached): the `memcached-fenced` kind's server, ttl and faults (restart, kill, pause, the network faults, the server's and the workers' clock faults); writers fenced, every few turns a worker takes the read side instead (the writer holds the plain lock's item; readers and waiting writers are listed in one index item changed by CAS, each alive while its lease item is) | as `memcached-fenced`: 0 stale writes accepted, 0 fenced increments lost, fences strictly increasing in grant order between restarts; overlaps (writer with writer, reader with writer) only in pause/restart windows; no writer's item left |
//! | `etcd-fenced` (a harness built with `--features etcd`) | [`Lock`](fencelock::Lock) over `fencelock::backend::Etcd`: a 3-member etcd cluster of its own, each worker reaching each member through its own proxy, ttl at least 2 s (leases count whole seconds), fenced (each acquirer queues a key `<lock key>/<token>` on a lease of its own; the fence is the holder's queue key's create revision) | 0 stale writes accepted, 0 fenced increments lost, fences strictly increasing in grant order and never reused, across member and leader restarts too (a revision never repeats); overlaps only in pause windows — a member's or the leader's restart excuses none (raft keeps the lock); lock free within ttl + ε after a holder's crash; no key left at the lock key or under `<lock key>/` — no holder's or waiter's queue key (an etcd prefix read) |
//! | `etcd-family-fenced` (a harness built with `--features etcd`) | [`RwLock`](fencelock::RwLock) over `fencelock::backend::Etcd`: the `etcd-fenced` kind's cluster, proxies, ttl and faults; writers fenced, every few turns a worker takes the read side instead (readers' and writers' keys share one queue under the lock key, writers first) | as `etcd-fenced`: 0 stale writes accepted, 0 fenced increments lost, fences strictly increasing in grant order and never reused across member and leader restarts; overlaps only in pause windows; no key left under `<lock key>/` |
//! | `zookeeper-fenced` | [`Lock`](fencelock::Lock) over [`ZooKeeper`](fencelock::backend::ZooKeeper): a 3-server ensemble of its own (chroot `/dlock-torture`), each worker reaching each server through its own proxy, the session timeout equal to the ttl (at least 2 s), fenced (each acquirer queues an ephemeral sequential node `/<lock key>/<token>-<seq>`; the fence is the holder's node's creation zxid) | 0 stale writes accepted, 0 fenced increments lost, fences strictly increasing in grant order and never reused, across member and leader restarts too (a zxid never repeats: a new leader starts a new epoch in its high 32 bits); overlaps only in pause windows — a server's or the leader's restart excuses none (the quorum keeps the nodes); lock free within ttl + ε after a holder's crash (its node goes when its session expires, a session timeout = ttl after its last ping); no lock node left in `/<lock key>` |
//! | `sentinel-fenced` | [`Lock`](fencelock::Lock) on `redis+sentinel://`: a master, a replica and 3 sentinels of its own, workers straight to them (no proxy); fenced; faults pause, kill and `failover` (the replica frozen, the next grant to the master alone, the master killed, the replica thawed and promoted, the old master back empty until the sentinels make it a replica) | overlaps, repeated fences and stale writes only where a failover window touches them (SAFETY.md: a grant the replica never received dies with the master); outside, as `dlock-fenced` |
//! | `sentinel-wait-fenced` | as `sentinel-fenced`, with `min_replicas(1)` | a failover excuses nothing: as `dlock-fenced` |
//! | `cluster-fenced` | [`Lock`](fencelock::Lock) on `redis+cluster://`: 3 masters with a replica each, of its own; the lock slot's master fails over as above | as `sentinel-fenced` |
//! | `redlock-delayed-restart` | [`Lock`](fencelock::Lock) over a 5-node quorum; the even workers reach nodes 0, 1, 2, the odd ones 2, 3, 4 (the others' links blackholed), so every majority includes node 2; a holder holds half a lease without renewing; node 2 is killed on a grant and started empty after 2 × ttl; ttl at least 3 s | no overlap at all: a delayed restart is RedLock's answer to the hazard below |
//! | `run-supervised` | processes of the shipped `dlock` binary beside this one: `dlock run --ttl 3s` (at least; the default `--kill-grace`, 10 s) on the Redis lock server, its command a shell that ignores SIGTERM, writes for a lease and a third, and leaves a writer in the background that writes after it has exited; unfenced, to a file every write appends to with CLOCK_MONOTONIC (`command`); faults: a pause of the `dlock` process (not its command) and a partition of its links, each at a grant | no write of a command, nor of anything it started, after the next holder's grant, unless that holder's `dlock` was paused; stalls and orphans as `dlock` |
//! | `run-supervised-zookeeper` | as `run-supervised`, on a 3-server ZooKeeper ensemble of its own, session timeout 3 s: a lease of two thirds of it (2 s), under the ttl; the partition cuts all three links | as `run-supervised` |
//! | `memory` | [`Lock`](fencelock::Lock) on the memory backend, threads, stalls only | as `dlock-fenced` |
//! | `setnx-expire` … `plain-del` | the known-broken locks (controls): SETNX then EXPIRE, SETNX+GETSET (the classic blog recipe), GET then DEL, a plain DEL | must be caught by their own bug, or the run fails |
//! | `redlock-immediate-restart` | control: as `redlock-delayed-restart`, but node 2 restarts empty at once, within the holder's ttl (RedLock's restart hazard: a combination, as neither the split nor the restart alone lets a second majority form) | must show an overlap only such a restart explains, or the run fails |
//! | `run-unsupervised` | control: `run-supervised`'s command under `dlock acquire --ttl 3s` (no renewal, no supervisor), then `dlock release` | must show a write after the next holder's grant, or the run fails |
//!
//! A run must also test what it says it tested: a kind that exists for one fault (the
//! controls; `redlock-*-restart`, the bridge node's restart; the `sentinel-*` and
//! `cluster-fenced` kinds, a failover) fails as *not exercised* when that fault never took
//! effect, and any kind fails when a fault scheduled in its run never did (a fault that
//! cannot be injected at its turn — no worker to aim it at, a replica not in sync — is
//! tried again half a ttl later while the run lasts; the schedule puts a kind's own fault
//! first, and every fault once before any comes again). A kind named in `--kinds` without
//! its fault in `--faults` is a usage error.
//!
//! `--url` names the lock server instead of a redis-server of the run's own: a Redis URL
//! for the single-Redis kinds, or a PostgreSQL URL (`postgres://`, `postgresql://`), on
//! which `postgres-fenced` runs (alone, under `--kinds all`), its lock under the run's
//! own name there, audited for orphans and deleted afterwards. The faults that need to own
//! the server (freeze, restart, the server clock faults) are skipped there with a note;
//! the workers reach it through their proxies where a proxy can stand in for it (one TCP
//! host, no TLS), else straight, without the network faults. Passwords are never printed
//! (every URL shown is redacted) and reach the worker processes in their environment, not
//! on their command line.
//!
//! Clock faults (on servers of the run's own, started under a fake clock: libfaketime,
//! or the test kit's shim for redis-server): `clock-jump` steps the lock server's wall
//! clock 2 × ttl forward, `clock-back` 2 × ttl back, `clock-fast` runs it four times as
//! fast, each for 2 × ttl; they run on `dlock-fenced`, `postgres-fenced`,
//! `memcached-fenced` and `memcached-family-fenced`, and excuse an overlap only where leases expire by the wall clock
//! (Redis, PostgreSQL — fencing must still refuse every stale write); memcached's expiry
//! follows its monotonic clock, so there they excuse nothing. `client-clock` steps the
//! workers' wall clock an hour forward (then back) on those and on `etcd-fenced` and
//! `zookeeper-fenced`, and excuses nothing anywhere: dlock reads only the monotonic clock.
//! A clock fault that cannot run on this machine (no libfaketime; for redis-server, no C
//! compiler for the kit's shim) fails the run at once where it was asked for — named in
//! `--faults`, or in the CI profile (`--quick` with the kinds named, or `$CI` set) — and
//! is skipped with a note otherwise.
//!
//! The nemesis per kind: every fault for the single-Redis kinds; for `redlock` the node
//! faults (freeze, client-pause, restart, script-flush) hit 1 or 2 of the 5 nodes, and the
//! network faults (delay, blackhole, close) one worker's links to 1 or 2 nodes, never more
//! than 2 nodes at a time; its restarts alternate between starting the nodes empty only
//! after 2 × ttl (RedLock's delayed restart: must not cause an overlap) and at once (the
//! hazard: excused). `memcached-fenced` and `memcached-family-fenced` take pause, kill,
//! restart and the network faults (memcached has no freeze here, no `CLIENT PAUSE`, no
//! scripts). So does `etcd-fenced`:
//! its restarts kill one member and start it again from its data after 2 × ttl — the
//! leader (the member whose `status` names itself leader) at the first, third, …, a
//! follower otherwise — and its network faults hit one worker's links to 1, 2 or all 3
//! members (the test kit gives no member's pid to freeze). `zookeeper-fenced` takes the
//! same faults in the same forms: its restarts kill the leader (the server whose `srvr`
//! says `Mode: leader`) at the first, third, …, a follower otherwise, and start it again
//! from its data directory after 2 × ttl; its network faults hit one worker's links to 1,
//! 2 or all 3 servers.
//!
//! The crate, bottom up: `model` (kinds, faults, fault windows, resource keys, the run's
//! configuration and clock) ← `failover` (the Sentinel and Cluster topologies and their
//! failover) ← `stores` (the servers a kind runs on, their audit) ← `nemesis` (the
//! schedule and the fault injection) and `workers` (worker processes) ← `run` (the
//! orchestrator) ← `soak` (`--soak`: rounds of every kind beside one client holding
//! 10 000 leases, its memory and descriptors over time); `worker` is one worker
//! process's loop (`command` the command kinds' workers, their shell command and its
//! writes), `checkers` turn a history into findings, `report` and `timelines`
//! present them; `demo` is the oversell demo.

#![forbid(unsafe_code)]

mod args;
mod checkers;
mod command;
mod demo;
mod exit;
mod failover;
mod model;
mod nemesis;
mod report;
mod run;
mod signals;
mod soak;
mod stores;
mod timelines;
mod worker;
mod workers;

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches};

use crate::args::{Cli, Command};
use crate::exit::Failure;

/// `dlock torture`: one run of every kind, or with `--soak` rounds of them beside one
/// client holding many leases.
async fn torture(args: args::TortureArgs) -> Result<u8, Failure> {
    let setup = run::setup(&args).await?;
    match args.soak {
        Some(duration) => soak::soak(duration, args.soak_leases, setup, &args.out).await,
        None => run::once(setup, &args.out).await,
    }
}

/// The environment variable `dlock` sets when it runs this binary for `dlock torture` or
/// `dlock demo`: usage and help then name the command as the user typed it.
pub const VIA_DLOCK: &str = "DLOCK_TORTURE_VIA_DLOCK";

/// The `dlock-torture` program: parses `std::env::args`, runs the subcommand, and returns
/// its exit code (0 passed, 1 an unexpected result, 64 usage, 69 a store unavailable).
pub fn main() -> ExitCode {
    let mut command = Cli::command();
    if std::env::var_os(VIA_DLOCK).is_some() {
        command = command.bin_name("dlock");
    }
    let cli = match command
        .try_get_matches()
        .and_then(|m| Cli::from_arg_matches(&m))
    {
        Ok(cli) => cli,
        Err(err) if err.use_stderr() => {
            // A usage error: one line, and the usage code.
            let text = err.to_string();
            let first_paragraph = text.split("\n\n").next().unwrap_or("bad usage");
            let line = first_paragraph
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ");
            return exit::finish(Err(Failure::usage(format!(
                "{} (see --help)",
                line.trim_start_matches("error: ")
            ))));
        }
        Err(help_or_version) => {
            let _ = help_or_version.print();
            return ExitCode::from(exit::SUCCESS);
        }
    };
    // A command's write: no runtime, so that it starts and ends quickly.
    if let Command::TortureAppend(args) = &cli.command {
        return exit::finish(command::append(args));
    }
    // A worker runs on one thread, so that a stall it simulates also stops its lease
    // renewal, as a real process pause would.
    let runtime = if matches!(
        cli.command,
        Command::DemoWorker(_) | Command::TortureWorker(_)
    ) {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Runtime::new()
    };
    let runtime = match runtime {
        Ok(rt) => rt,
        Err(e) => {
            return exit::finish(Err(Failure::new(
                exit::UNAVAILABLE,
                format!("cannot start the async runtime: {e}"),
            )));
        }
    };
    exit::finish(runtime.block_on(async move {
        match cli.command {
            Command::Demo(args) => demo::demo(args).await,
            Command::DemoWorker(args) => demo::worker(args).await,
            Command::Torture(args) => torture(args).await,
            Command::TortureWorker(args) => worker::run(args).await,
            Command::SoakHolder(args) => soak::holder(args).await,
            Command::TortureAppend(args) => command::append(&args),
        }
    }))
}
