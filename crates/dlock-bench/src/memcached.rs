//! Section 6.1, Memcached: dlock's `Lock<Memcached>` on a private `memcached`, beside
//!
//! * **limit**: the meta commands the backend sends, bare, over a raw TCP socket (acquire:
//!   `ms … ME` + `ma` of the fence counter + `mg`, pipelined in one round trip; release:
//!   `mg` then `md … C<cas>`: three round trips a cycle);
//! * **reference**: dlock's `Lock<Redis>` on a private `redis-server` in the same run
//!   (with section 1's limit beside it).
//!
//! No Rust crate offers a memcached lock: no peer. Contended, memcached cannot announce a
//! release, so dlock's waiters back off (jittered, 10 ms doubling to 500 ms) — against the
//! Redis lock's pub/sub hand-off.

use std::time::Duration;

use dlock_test::server::{MemcachedServer, RedisServer};
use fencelock::backend::{Memcached, Redis};
use redis::aio::ConnectionManager;

use crate::Result;
use crate::contended::{self, BoxWaiter, LockWaiter};
use crate::measure;
use crate::report::fmt_dur;
use crate::stores::{
    self, BoxCycle, HandoffRow, LockCycle, MemcachedLimit, RedisLimit, Row, Setup,
};

/// Uncontended rows, in run order within a round (`dlock-each` only above one task).
const ROWS: [&str; 5] = ["limit", "dlock", "dlock-each", "redis-limit", "redis"];

/// Contended rows, in run order within a round.
const HANDOFF_ROWS: [&str; 2] = ["dlock", "redis"];

/// The section's servers and clients.
pub(crate) struct Clients {
    /// Kept for its lifetime: dropping it kills the server.
    _memcached: MemcachedServer,
    memcached_pid: u32,
    redis_server: RedisServer,
    addr: String,
    url: String,
    redis_url: String,
    mc: Memcached,
    redis_limit: ConnectionManager,
    release_sha: String,
    redis: Redis,
}

impl Setup for Clients {
    const SECTION: &'static str = "memcached";
    const ROWS: &'static [&'static str] = &ROWS;
    const HANDOFF_ROWS: &'static [&'static str] = &HANDOFF_ROWS;
    /// dlock's Memcached client is not cancel-safe: an acquire cancelled while its
    /// request is in flight (as every waiter's is when the warm-up ends) leaves the
    /// client's one connection with unread replies, which its next requests take for their
    /// own (`Memcached::call` keeps the connection in its slot across the awaits and
    /// resets it only on an error or its own timeout, not when the future is dropped).
    /// The measured run therefore gets fresh waiters; it is not itself affected (nothing
    /// is cancelled until its end).
    const REUSE_WAITERS: bool = false;

    type Extra = ();

    async fn start() -> Result<Clients> {
        let memcached = MemcachedServer::start()?;
        let memcached_pid = stores::memcached_pid(&memcached)?;
        let redis_server = RedisServer::start()?;
        let url = memcached.url();
        let addr = format!("127.0.0.1:{}", memcached.port());
        let redis_url = redis_server.url();
        let mc = Memcached::connect(&url).await?;
        let mut redis_limit = measure::connection_manager(&redis_url).await?;
        let release_sha: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(stores::RELEASE)
            .query_async(&mut redis_limit)
            .await?;
        let redis = Redis::connect(redis_url.as_str()).await?;
        Ok(Clients {
            _memcached: memcached,
            memcached_pid,
            redis_server,
            addr,
            url,
            redis_url,
            mc,
            redis_limit,
            release_sha,
            redis,
        })
    }

    fn extra(&self) {}

    /// `dlock-each` is the same as `dlock` at one task.
    fn runs(id: &str, n: usize) -> bool {
        !(id == "dlock-each" && n == 1)
    }

    async fn tasks(&self, id: &'static str, n: usize, tag: &str) -> Result<Vec<BoxCycle>> {
        let mut tasks = Vec::with_capacity(n);
        for t in 0..n {
            let name = format!("bench:m:{id}:{tag}:{n}:{t}");
            let token = format!("{:032x}", 0x3e3c_0000_0000_u128 + t as u128);
            tasks.push(match id {
                "limit" => MemcachedLimit::boxed(&self.addr, name, token).await?,
                "dlock" => LockCycle::boxed(self.mc.clone(), name, stores::TTL)?,
                "dlock-each" => {
                    LockCycle::boxed(Memcached::connect(&self.url).await?, name, stores::TTL)?
                }
                "redis-limit" => RedisLimit::boxed(
                    vec![self.redis_limit.clone()],
                    &self.release_sha,
                    name,
                    token,
                    None,
                ),
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
        for _ in 0..n {
            waiters.push(contended::boxed(LockWaiter(
                Memcached::connect(&self.url).await?,
            )));
        }
        Ok(waiters)
    }

    async fn round_trips(&self) -> Result<Vec<Duration>> {
        Ok(vec![
            stores::memcached_round_trip(&self.addr, 1_000)
                .await?
                .quantile(0.5),
            measure::round_trip(&self.redis_url, 1_000)
                .await?
                .quantile(0.5),
        ])
    }

    fn servers(&self) -> Vec<u32> {
        std::iter::once(self.memcached_pid)
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
            label: "limit: bare meta commands, a raw socket per task".to_owned(),
            round_trips: "3 (`ms`+`ma`+`mg`; `mg`; `md`)".to_owned(),
            limit: Some("limit"),
            reference: None,
            peer: None,
        },
        Row {
            id: "dlock",
            label: "**dlock** `Lock<Memcached>`, one shared client".to_owned(),
            round_trips: "3".to_owned(),
            limit: Some("limit"),
            reference: Some("redis"),
            peer: None,
        },
        Row {
            id: "dlock-each",
            label: "**dlock** `Lock<Memcached>`, a client per task".to_owned(),
            round_trips: "3".to_owned(),
            limit: Some("limit"),
            reference: Some("redis"),
            peer: None,
        },
        Row {
            id: "redis-limit",
            label: "Redis limit: bare `SET NX PX` + `EVALSHA`".to_owned(),
            round_trips: "2".to_owned(),
            limit: Some("redis-limit"),
            reference: None,
            peer: None,
        },
        Row {
            id: "redis",
            label: "dlock `Lock<Redis>`, one shared client (reference)".to_owned(),
            round_trips: "2".to_owned(),
            limit: Some("redis-limit"),
            reference: None,
            peer: None,
        },
    ]
}

impl Section {
    fn handoff_rows(&self) -> Vec<HandoffRow> {
        let mc = self.rtts.first().copied().unwrap_or_default();
        let redis = self.rtts.get(1).copied().unwrap_or(mc);
        vec![
            HandoffRow {
                id: "dlock",
                label: "**dlock** `Lock<Memcached>` (waiters back off)".to_owned(),
                rtt: mc,
                limit: None,
                reference: Some("redis"),
                peer: None,
            },
            HandoffRow {
                id: "redis",
                label: "dlock `Lock<Redis>` (pub/sub; reference)".to_owned(),
                rtt: redis,
                limit: None,
                reference: None,
                peer: None,
            },
        ]
    }

    /// The section's Markdown.
    pub(crate) fn markdown(&self) -> String {
        let mc = self.rtts.first().copied().unwrap_or_default();
        let redis = self.rtts.get(1).copied().unwrap_or(mc);
        let mut md = format!(
            "\n## 6.1 Memcached\n\n\
             A private `memcached` (64 MB, no UDP) and a private `redis-server`, on loopback. \
             **dlock** = `Lock::builder(Memcached::connect(url)?, name).ttl(30 s)` (watchdog \
             on); tasks sharing one client run side by side on its pool of up to 8 \
             connections. **limit** = the meta commands it sends, bare, over a raw TCP \
             socket per task: `ms <key> <len> T30 ME` + `ma <fence> N0 J1 v` + `mg <key> v t` \
             pipelined, then `mg <key> v c`, then `md <key> C<cas>`. **reference** = \
             dlock's `Lock<Redis>` (section 1) in the same run. No Rust crate offers a \
             memcached lock: no peer. Median of {} rounds: uncontended runs of {:.2} s, \
             contended runs of {:.2} s (step-aside mode as in section 2, a client per \
             waiter, ttl 10 s). Server CPU = memcached + redis-server. Round trip: \
             memcached `mn` p50 {}, Redis PING p50 {}.\n\n### Uncontended\n\n",
            self.rounds,
            self.run.as_secs_f64(),
            self.contended_run.as_secs_f64(),
            fmt_dur(mc),
            fmt_dur(redis),
        );
        md.push_str(&stores::uncontended_table(&rows(), &self.cells));
        md.push_str(
            "\n### Contended hand-off on one hot name\n\n\
             Memcached has no notification: a waiter that finds the lock held sleeps a \
             jittered backoff (10 ms doubling to 500 ms, or the holder's remaining ttl if \
             shorter) and asks again. With holds this short the lock is free most of the \
             time, so many hand-offs are an attempt that happened to land just after a \
             release (the p50); the backoff shows in the p99, the waits and the \
             acquisitions per second.\n\n",
        );
        md.push_str(&stores::handoff_table(&self.handoff_rows(), &self.handoffs));
        md
    }
}
