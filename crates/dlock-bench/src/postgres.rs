//! Section 6.3, PostgreSQL: dlock's `Lock<Postgres>` on a private PostgreSQL, beside
//!
//! * **limit**: the two function calls dlock makes, bare, as prepared statements on one
//!   tokio-postgres connection (`SELECT … FROM dlock.acquire(…)`, `SELECT
//!   dlock.release(…)`: two round trips a cycle);
//! * **peer**: the `distributed-lock-postgres` crate (session advisory locks over a sqlx
//!   pool: a connection held per lock, no lease and no fence), as its docs show it;
//! * **reference**: dlock's `Lock<Redis>` on a private `redis-server` in the same run.
//!
//! Contended, dlock's waiters wait inside the server on the name's gate (a session
//! advisory lock on a wait session of their own) and the release frees the gate in its
//! own statement; the peer's waiters each block in `pg_advisory_lock` on a connection of
//! their own. In both, PostgreSQL's lock manager queues them and wakes one per release.

use std::sync::Arc;
use std::time::Duration;

use distributed_lock_core::traits::{DistributedLock, LockHandle, LockProvider};
use distributed_lock_postgres::PostgresLockProvider;
use distributed_lock_postgres::handle::PostgresLockHandle;
use dlock_test::postgres::PostgresServer;
use dlock_test::server::RedisServer;
use fencelock::backend::{Postgres, Redis};
use redis::aio::ConnectionManager;

use crate::Result;
use crate::contended::{self, BoxWaiter, LockWaiter, Waiter};
use crate::measure;
use crate::report::fmt_dur;
use crate::stores::{
    self, BoxCycle, HandoffRow, LockCycle, PgLimit, PgPeer, RedisLimit, Row, Setup,
};

/// Uncontended rows, in run order within a round.
const ROWS: [&str; 5] = ["limit", "dlock", "peer", "redis-limit", "redis"];

/// Contended rows, in run order within a round.
const HANDOFF_ROWS: [&str; 3] = ["dlock", "peer", "redis"];

/// A waiter of distributed-lock-postgres: a provider (and pool) of its own.
struct PeerWaiter(PostgresLockProvider);

impl Waiter for PeerWaiter {
    type Held = PostgresLockHandle;

    async fn acquire(&mut self, name: &str) -> Result<PostgresLockHandle> {
        Ok(self
            .0
            .create_lock(name)
            .acquire(None)
            .await
            .map_err(|e| format!("distributed-lock-postgres acquire: {e}"))?)
    }

    async fn release(&mut self, held: PostgresLockHandle, _name: &str) -> Result<()> {
        held.release()
            .await
            .map_err(|e| format!("distributed-lock-postgres release: {e}"))?;
        Ok(())
    }
}

/// The section's servers and clients.
pub(crate) struct Clients {
    server: PostgresServer,
    redis_server: RedisServer,
    url: String,
    redis_url: String,
    bare: Arc<tokio_postgres::Client>,
    pg: Postgres,
    peer: Arc<PostgresLockProvider>,
    redis_limit: ConnectionManager,
    release_sha: String,
    redis: Redis,
}

impl Setup for Clients {
    const SECTION: &'static str = "postgres";
    const STARTING: Option<&'static str> = Some("postgres: starting a server");
    const ROWS: &'static [&'static str] = &ROWS;
    const HANDOFF_ROWS: &'static [&'static str] = &HANDOFF_ROWS;

    type Extra = ();

    async fn start() -> Result<Clients> {
        let server = PostgresServer::start()?;
        let url = server.url();
        // dlock creates its schema on first use; the limit then calls its functions.
        let pg = Postgres::connect(&url).await?;
        let bare = Arc::new(server.try_admin().await?);
        let peer = Arc::new(
            PostgresLockProvider::new(url.clone())
                .await
                .map_err(|e| format!("distributed-lock-postgres: {e}"))?,
        );
        let redis_server = RedisServer::start()?;
        let redis_url = redis_server.url();
        let mut redis_limit = measure::connection_manager(&redis_url).await?;
        let release_sha: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(stores::RELEASE)
            .query_async(&mut redis_limit)
            .await?;
        let redis = Redis::connect(redis_url.as_str()).await?;
        Ok(Clients {
            server,
            redis_server,
            url,
            redis_url,
            bare,
            pg,
            peer,
            redis_limit,
            release_sha,
            redis,
        })
    }

    fn extra(&self) {}

    async fn tasks(&self, id: &'static str, n: usize, tag: &str) -> Result<Vec<BoxCycle>> {
        let mut tasks = Vec::with_capacity(n);
        for t in 0..n {
            let name = format!("bench:p:{id}:{tag}:{n}:{t}");
            let token = format!("{:032x}", 0x9a5d_0000_0000_u128 + t as u128);
            tasks.push(match id {
                "limit" => PgLimit::boxed(Arc::clone(&self.bare), name, token).await?,
                "dlock" => LockCycle::boxed(self.pg.clone(), name, stores::TTL)?,
                "peer" => PgPeer::boxed(Arc::clone(&self.peer), name),
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
        let mut waiters = Vec::with_capacity(n);
        match id {
            "redis" => {
                return contended::make_waiters(
                    contended::Client::DlockPerWaiter,
                    n,
                    &self.redis_url,
                    "",
                )
                .await;
            }
            "peer" => {
                for _ in 0..n {
                    waiters.push(contended::boxed(PeerWaiter(
                        PostgresLockProvider::new(self.url.clone())
                            .await
                            .map_err(|e| format!("distributed-lock-postgres: {e}"))?,
                    )));
                }
            }
            _ => {
                for _ in 0..n {
                    waiters.push(contended::boxed(LockWaiter(
                        Postgres::connect(&self.url).await?,
                    )));
                }
            }
        }
        Ok(waiters)
    }

    async fn round_trips(&self) -> Result<Vec<Duration>> {
        Ok(vec![
            stores::pg_round_trip(&self.bare, 1_000)
                .await?
                .quantile(0.5),
            measure::round_trip(&self.redis_url, 1_000)
                .await?
                .quantile(0.5),
        ])
    }

    /// The postmaster only: its backends are processes of their own, not counted.
    fn servers(&self) -> Vec<u32> {
        self.server
            .pid()
            .into_iter()
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
            label: "limit: bare `dlock.acquire` + `dlock.release` calls, one connection".to_owned(),
            round_trips: "2".to_owned(),
            limit: Some("limit"),
            reference: None,
            peer: None,
        },
        Row {
            id: "dlock",
            label: "**dlock** `Lock<Postgres>`, one shared client (pool of 8)".to_owned(),
            round_trips: "2".to_owned(),
            limit: Some("limit"),
            reference: Some("redis"),
            peer: Some("peer"),
        },
        Row {
            id: "peer",
            label: "distributed-lock-postgres 0.2 (advisory lock on a pooled connection)"
                .to_owned(),
            round_trips: "6 (BEGIN, SAVEPOINT, SET LOCAL, lock, COMMIT; unlock)".to_owned(),
            limit: Some("limit"),
            reference: None,
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
        let pg = self.rtts.first().copied().unwrap_or_default();
        let redis = self.rtts.get(1).copied().unwrap_or(pg);
        vec![
            HandoffRow {
                id: "dlock",
                label: "**dlock** `Lock<Postgres>`, a client per waiter (waits in the server at the name's gate)"
                    .to_owned(),
                rtt: pg,
                limit: None,
                reference: Some("redis"),
                peer: Some("peer"),
            },
            HandoffRow {
                id: "peer",
                label:
                    "distributed-lock-postgres, a provider per waiter (`pg_advisory_lock` blocks)"
                        .to_owned(),
                rtt: pg,
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
        let pg = self.rtts.first().copied().unwrap_or_default();
        let redis = self.rtts.get(1).copied().unwrap_or(pg);
        let mut md = format!(
            "\n## 6.3 PostgreSQL\n\n\
             A private PostgreSQL ({}; `fsync=off`, `synchronous_commit` on) and a private \
             `redis-server`, on loopback. **dlock** = `Lock::builder(Postgres::connect(url)?, \
             name).ttl(30 s)` (watchdog on, lease mode: a row per name, a fence per grant). \
             **limit** = the two function calls it makes, bare, as prepared statements on \
             one tokio-postgres connection. **peer** = distributed-lock-postgres 0.2 \
             (`PostgresLockProvider::new(url)`, `create_lock(name).acquire(None)`, \
             `release()`): a session advisory lock held on a pooled sqlx connection (pool of \
             10), no lease, no fence. **reference** = dlock's `Lock<Redis>` in the same run. \
             Median of {} rounds: uncontended runs of {:.2} s, contended runs of {:.2} s \
             (step-aside mode as in section 2, a client per waiter, ttl 10 s). Server CPU = \
             the postmaster + redis-server (PostgreSQL's backends are processes of their \
             own and are not counted). Round trip: PostgreSQL `SELECT 1` p50 {}, Redis PING \
             p50 {}.\n\n### Uncontended\n\n",
            pg_version(),
            self.rounds,
            self.run.as_secs_f64(),
            self.contended_run.as_secs_f64(),
            fmt_dur(pg),
            fmt_dur(redis),
        );
        md.push_str(&stores::uncontended_table(&rows(), &self.cells));
        md.push_str(
            "\n### Contended hand-off on one hot name\n\n\
             dlock's waiters each wait inside the server, on a wait session of their own, \
             for the name's gate (a session advisory lock); the holder's release frees the \
             gate in the same statement, and PostgreSQL's lock manager wakes the next \
             waiter, whose statement then takes the lock (lease, fence) and replies: no \
             `NOTIFY`, no round trip from the client. The peer's waiters each block inside \
             `pg_advisory_lock` on a connection of their own, so the lock manager hands \
             the lock itself on (no lease, no fence). `p50 × peer` = dlock's hand-off p50 \
             over the peer's in the same run.\n\n",
        );
        md.push_str(&stores::handoff_table(&self.handoff_rows(), &self.handoffs));
        md
    }
}

/// `PostgreSQL 15.x`, from `postgres --version` in the kit's bin directory.
fn pg_version() -> String {
    dlock_test::postgres::version().unwrap_or_else(|| "PostgreSQL".to_owned())
}
