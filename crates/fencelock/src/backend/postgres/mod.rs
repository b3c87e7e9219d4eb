//! PostgreSQL: the classic database lock, as a lease with a durable fence.
//!
//! Each lock name is one row of `<schema>.locks` (`key`, `holder`, `expires_at`, `fence`),
//! and every operation is **one statement** on a pooled connection, so it is atomic by
//! PostgreSQL's row locking and needs no transaction of its own:
//!
//! * **Acquire**: the function `<schema>.acquire` locks the name's row, then grants if it
//!   is free (no holder, or its lease ran out by the *server's* clock,
//!   `clock_timestamp()`) and nobody is queued ahead: the holder, its expiry and the
//!   row's `fence` + 1 in the same step. A repeat of a granted request (its reply lost)
//!   finds our own token, renews the expiry and reports the same fence. When the row is
//!   held it reports the holder's remaining lease (the waiter's fallback timer).
//! * **Release** (`<schema>.release`) and **extend**: `… WHERE key = $1 AND holder = $2
//!   AND expires_at > clock_timestamp()` — compare-and-delete and compare-and-extend in
//!   one statement.
//! * **Renewal** of many leases (the watchdog's [`extend_many`](RawLock::extend_many)):
//!   one `UPDATE … FROM unnest(…)` for the whole batch, one round trip.
//! * **Waiting without polling**: a waiter that found the lock held takes a place in
//!   `<schema>.waiters` (in arrival order, claimed until its next attempt plus a grace)
//!   and sleeps. A release that frees the lock **hands it over** to the head of the queue
//!   in the same call: the holder set to the head's token with the head's lease, the
//!   next fence minted, and `pg_notify(<its client's channel>, '!<fence>:<token>')` tells
//!   it at commit that it holds the lock — the woken waiter sends nothing more (its lease
//!   counts from its latest attempt that found the lock held, as on Redis: SAFETY.md,
//!   "Hand-overs"). A head whose client's `LISTEN` session is gone
//!   (`pg_stat_get_activity`) is skipped. Each client `LISTEN`s on one channel of its
//!   own, on one extra connection opened at its first wait; nothing is sent when nobody
//!   waits. A free lock goes to the head only (no barging); the family's primitives wake
//!   their head instead (it then calls `acquire`). A lock whose lease lapsed without a
//!   release (its holder crashed or stalled) is handed over to the head by the first call
//!   that sees it, as a release would have.
//!   **What the waiters send while they wait** does not grow with their number: the head
//!   of a plain lock's queue and the next one look again when the holder's lease would
//!   end (so a holder that crashes is followed within its lease, and a lost notification
//!   costs time, never liveness); a waiter with two or more places ahead of it looks
//!   again only after ten of its leases (10 s ..= 40 s, and up to half as much again at
//!   random), its place claimed that long plus its grace, and the hand-over that makes it
//!   the head wakes it to look again. (Every waiter used to look again once per lease of
//!   the holder's: thousands of them kept the name's row busy with their attempts until
//!   the head could no longer come within its grace, and grants all but stopped.) The
//!   functions that read a queue take its indexes in order whatever the table's
//!   statistics say, so finding a name's head costs the same with ten places or ten
//!   thousand. A fair lock's and the family's waiters look again at the holder's
//!   remaining lease, as before.
//!   Places whose waiters stopped coming (killed clients) are cleaned by the store's own
//!   calls, never left to an operator: every call that looks at a name's queue drops that
//!   name's lapsed places (found through an index on `(key, claim_until)`, without
//!   visiting the live ones) and up to 256 lapsed places of any name (an index on
//!   `claim_until`; rows another call holds are skipped), and the first hand-over that
//!   meets a head whose `LISTEN` session is gone drops every place of the name whose
//!   session is gone, not one per turn.
//!   PostgreSQL signals every listening session of the database on each `NOTIFY`, so a
//!   hand-off this way costs more as more clients wait — which is why a plain lock's
//!   waiters normally wait inside the server instead:
//! * **Waiting in the server** (plain [`Lock`](crate::Lock)): a waiter's attempt runs on
//!   a *wait session* of its own (a second pool, `?wait_connections=N`, 16 by default) as
//!   `<schema>.gate_acquire`. A free lock is taken at once and the session goes back to the
//!   pool. A held lock is waited for on the name's **gate**, a session advisory lock
//!   (`<schema>.gate_key(name)`): PostgreSQL's lock manager queues the waiters in arrival
//!   order and wakes one at a time. The waiter that has the gate attempts; if the lock is
//!   still held (by a holder that came without the gate) it heads the queue above and is
//!   handed the lock with `NOTIFY` — one listener. It keeps the gate while it holds the
//!   lock, and its release (`<schema>.gate_release`: the row locked, the gate freed, the
//!   lock released, one statement) wakes exactly the next waiter, whose blocked
//!   statement goes on to take the lock once the release commits: no `NOTIFY`, no round
//!   trip. While that woken waiter takes it, it holds a transaction-scoped mark
//!   (`taking_key`) that stops a plain attempt from barging in between. The gate only
//!   orders waiters — who holds the lock is the row's alone, so fences, leases, expiry and
//!   `force_unlock` are as above. A gate wait lasts at most half the waiter's ttl (its
//!   lease counts from its attempt's sending, so a grant must come while most of it is
//!   left); then the waiter queues in the table — ahead of those still at the gate, which
//!   keeps the order roughly by arrival — and a gate kept by a process that stalled past
//!   its lease is passed by (the table's waiter takes the row once its lease lapsed). A caller that stops waiting cancels its statement in the server (a cancel
//!   request; a session whose statement failed is closed, which frees any gate it had);
//!   `try_lock_for`'s deadline ends the wait. Costs: one connection per waiting task (up
//!   to `wait_connections` per client; further waiters queue in the table) and per holder
//!   that came through the gate. The fair lock and the family's primitives wait in the
//!   table.
//!
//! # Elections
//!
//! An [`Election`](crate::Election)'s record is one row of `<schema>.records` (`key`: the
//! election's lock key, `term`, `data`). [`publish`](crate::raw::RawElection::publish) is
//! one statement, `INSERT … SELECT … WHERE EXISTS (<the lock's row holds the token, its
//! lease not run out>) … ON CONFLICT (key) DO UPDATE` — the holder and expiry condition of
//! release and extend, the row kept `FOR SHARE` until the write commits, so no release or
//! grant comes between the check and the write — which also sends
//! `pg_notify('dlk_records', <key>)` when it wrote the row (delivered at commit). Terms
//! are not compared: the lock decides who may write (a leader whose lease ran out writes
//! nothing, whatever its term). Releases are told to one waiter on its own client's channel,
//! but a record's write is for every observer on every client, so it goes out on this one
//! channel that all clients of the database share; a client `LISTEN`s on it (on its
//! `LISTEN` connection) from its first observer on, and wakes only the observers of that
//! key. If that connection drops, it is opened again (every second, while observers are
//! registered), and they read again once it listens, for a write they missed. Terms are
//! fences, so they fit the `bigint`; a value cannot contain NUL (PostgreSQL's `text`
//! cannot hold it: `InvalidArgument`). Like the fence, the row is never deleted.
//!
//! # Fences survive restarts
//!
//! A release clears the holder but keeps the row, so its `fence` only ever grows; the
//! grant that increments it commits like any write (WAL; `synchronous_commit` is on by
//! default), so fences strictly increase per name **across server restarts and crashes**
//! — unlike Redis without `appendfsync always`. What loses them: a failover to an
//! asynchronous standby that had not received the last commits (fences can then repeat),
//! restoring an older backup, or deleting the rows by hand.
//!
//! # Schema
//!
//! On connect, the client creates what it needs if anything is missing: the schema, the
//! tables `locks` (one row per name: `key`, `holder`, `expires_at`, `fence`), `leases`,
//! `waiters` and `records` (one row per election: `key`, `term`, `data`), and the
//! functions `acquire`, `release` and the others (idempotent; concurrent first connects
//! are serialised by a transaction-scoped advisory lock). [`schema_sql`] returns the
//! statements, for a DBA who prefers to run them by hand (a schema made by an earlier
//! version without `records` is completed on connect, which needs `CREATE` once). The
//! statements the client runs against them are in `statements.sql`, beside `schema.sql`
//! in the source, one per name.
//!
//! Keys are `text`, which cannot hold a NUL character: a name, key prefix or reentrant
//! owner with one is [`ErrorKind::InvalidArgument`] before the store is touched, in lease
//! and advisory mode alike, as the other limits on names are.
//!
//! The schema name is `dlock` unless the URL says `?schema=<name>` (lowercase letters,
//! digits and `_`, at most 63 bytes). If everything exists already, nothing is created, so
//! a role without `CREATE` can use a schema a DBA made. At run time the role needs
//! `USAGE` on the schema, `SELECT`, `INSERT`, `UPDATE`, `DELETE` on its tables (elections
//! use `SELECT`, `INSERT`, `UPDATE` on `records`, and `SELECT … FOR SHARE` on `locks`) and
//! `EXECUTE` on its functions (granted to `PUBLIC` by default).
//!
//! # Connections
//!
//! A pool (deadpool-postgres) of at most `max_connections` connections (8 by default, or
//! `?max_connections=N`): each call takes one for its one statement. Wait sessions are a
//! second pool of at most `wait_connections` (16; 0 turns waiting in the server off), and
//! the `LISTEN` session is one more connection. A broken connection
//! is dropped and replaced on the next call; every call is bounded by 5 s (`TimedOut`).
//! Everything else in the URL is libpq's (`postgres://user:pass@host:port/db`,
//! `postgresql://…`, `?host=/run/postgresql` for a unix socket, `application_name`, …).
//!
//! # Session timeouts
//!
//! A lock here is a row with an expiry, not a session: a server setting that ends
//! sessions (`idle_session_timeout`, `idle_in_transaction_session_timeout`, for the role
//! or the database) frees no lock: the pool replaces an ended connection, and a session
//! that ends while it keeps a name's gate (which only orders waiters) costs a failed call
//! or a wait in the table until the lease runs out, never a second holder.
//! `statement_timeout` shorter than a gate wait (at most half the waiter's ttl) cancels
//! that wait: the call fails, nothing held is lost. So none of them is reported or
//! refused (`dlock_test`'s `pg_lease_locks_do_not_depend_on_sessions` holds a lock across
//! a 1 s idle timeout); advisory mode ([`PgAdvisory`]), whose locks are sessions, turns
//! the idle timeouts off on its own sessions.
//!
//! # TLS (feature `postgres-tls`)
//!
//! `sslmode=require`, `verify-ca` or `verify-full` connects over TLS (rustls) — every
//! connection: the pool's, the `LISTEN` session's, advisory sessions — and **always
//! verifies** the server's certificate and name (as libpq's `verify-full`), against the
//! CA certificates in `sslrootcert=<PEM file>` or else the platform's roots. A certificate
//! that does not verify is [`ErrorKind::Backend`]. `disable`, `allow` and `prefer` (and no
//! `sslmode`) connect in plain text: dlock does not try TLS opportunistically. Without the
//! feature, asking for TLS is [`ErrorKind::InvalidArgument`].

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, PoolError, RecyclingMethod};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tokio_postgres::{NoTls, Row};

use crate::engine::Engine;
use crate::engine::LeaseKind;
use crate::engine::acquire::{Detached, Gone};
use crate::error::{Error, ErrorKind, Result};
use crate::keys::LockKeys;
use crate::raw::{Acquire, LockState, RawFencing, RawInspect, RawLock, ReleaseWatch, Renewal};
use crate::token::Token;

mod advisory;
mod election;
mod family;
mod listen;

pub use advisory::PgAdvisory;

// A crashed waiter's place lapses `waiter_grace` after the attempt it missed (for a plain
// lock's waiter far from the head, up to a minute on), and goes at once when a hand-over
// meets it: its client's `LISTEN` session is gone.
use crate::engine::wake::{WAKE_GRACE, waiter_grace};

/// The schema dlock's table lives in unless the URL names another (`?schema=`).
pub const DEFAULT_SCHEMA: &str = "dlock";
/// How many connections one client opens at most unless its URL says otherwise
/// (`?max_connections=N`).
pub const DEFAULT_MAX_CONNECTIONS: usize = 8;
/// How many plain-lock waiters of one client wait inside the server at once, each on a
/// session of its own, unless the URL says otherwise (`?wait_connections=N`, 0 for none);
/// further waiters queue in the waiters table (see the module docs).
pub const DEFAULT_WAIT_CONNECTIONS: usize = 16;
/// The largest `max_connections` a URL may ask for.
pub const MAX_CONNECTIONS_LIMIT: usize = 1024;
/// The bound on one call: taking a connection (or opening one) plus its statement.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// A namespace for the advisory lock that serialises schema creation (two-int form, so it
/// never collides with an application's one-bigint advisory locks).
const MIGRATION_LOCK_CLASS: i32 = 0x646c_6f63; // "dloc"

/// A PostgreSQL client for locks: a pool of connections, one statement per operation.
/// Cheap to clone; clones share the pool and the watchdog.
///
/// ```no_run
/// # async fn demo() -> fencelock::Result<()> {
/// let pg = fencelock::backend::Postgres::connect("postgres://app:secret@127.0.0.1/app").await?;
/// let lock = fencelock::Lock::builder(pg, "nightly").build()?;
/// let guard = lock.lock().await?;
/// println!("fence {}", guard.fencing_token());
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Postgres {
    inner: Arc<Inner>,
}

struct Inner {
    pool: Pool,
    /// Sessions that plain-lock waiters wait on inside the server (see the module docs).
    wait_sessions: Pool,
    /// Whether plain-lock waiters wait inside the server (`wait_connections` > 0).
    serve_waits: bool,
    /// Per token waiting or holding: its wait session (holding the gate), or none.
    gates: std::sync::Mutex<std::collections::HashMap<String, Gate>>,
    connector: Connector,
    listener: listen::Listener,
    /// Acquires in flight, run to completion (see [`Postgres::detached`]).
    inflight: Detached,
    sql: Statements,
    schema: String,
    store_id: String,
    engine: Engine,
}

/// A token's standing in server-side waiting (see the module docs).
enum Gate {
    /// Its wait session, holding the name's gate: the token waits at the head of the
    /// queue, or holds the lock.
    Held(Box<deadpool_postgres::Object>),
    /// It waits in the waiters table (no session was free, or its gate wait timed out).
    Queued,
}

/// dlock's statements (statements.sql, beside schema.sql), with the schema's name filled in.
struct Statements {
    acquire: String,
    gate_acquire: String,
    gate_release: String,
    release: String,
    extend: String,
    extend_many: String,
    inspect: String,
    list: String,
    sem_acquire: String,
    sem_release: String,
    sem_resize: String,
    sem_inspect: String,
    re_acquire: String,
    re_release: String,
    re_inspect: String,
    rw_acquire: String,
    rw_release: String,
    rw_inspect: String,
    publish: String,
    record: String,
}

impl Statements {
    /// The statements of statements.sql, with the schema's name filled in.
    fn new(schema: &str) -> Result<Statements> {
        let quoted = format!("\"{schema}\"");
        let mut named: std::collections::HashMap<&str, String> = Default::default();
        let mut current: Option<&str> = None;
        for line in include_str!("statements.sql").lines() {
            if let Some(name) = line.strip_prefix("-- statement: ") {
                current = Some(name.trim());
                named.insert(name.trim(), String::new());
            } else if let Some(name) = current
                && !line.trim_start().starts_with("--")
                && let Some(text) = named.get_mut(name)
            {
                text.push_str(&line.replace("\"S\"", &quoted));
                text.push('\n');
            }
        }
        let mut take = |name: &str| {
            named
                .remove(name)
                .map(|text| text.trim().to_owned())
                .filter(|text| !text.is_empty())
                .ok_or_else(|| {
                    Error::new(
                        ErrorKind::Backend,
                        format!("statements.sql has no statement {name:?}"),
                    )
                })
        };
        let statements = Statements {
            acquire: take("acquire")?,
            gate_acquire: take("gate_acquire")?,
            gate_release: take("gate_release")?,
            release: take("release")?,
            extend: take("extend")?,
            extend_many: take("extend_many")?,
            inspect: take("inspect")?,
            list: take("list")?,
            sem_acquire: take("sem_acquire")?,
            sem_release: take("sem_release")?,
            sem_resize: take("sem_resize")?,
            sem_inspect: take("sem_inspect")?,
            re_acquire: take("re_acquire")?,
            re_release: take("re_release")?,
            re_inspect: take("re_inspect")?,
            rw_acquire: take("rw_acquire")?,
            rw_release: take("rw_release")?,
            rw_inspect: take("rw_inspect")?,
            publish: take("publish")?,
            record: take("record")?,
        };
        match named.keys().next() {
            None => Ok(statements),
            Some(name) => Err(Error::new(
                ErrorKind::Backend,
                format!("statements.sql has a statement {name:?} that nothing runs"),
            )),
        }
    }
}

/// The statements that create dlock's objects in `schema` (what a client runs on first
/// use when any is missing), for a DBA who prefers to create them by hand.
///
/// # Errors
/// [`ErrorKind::InvalidArgument`] for a schema name dlock does not accept.
pub fn schema_sql(schema: &str) -> Result<String> {
    check_schema(schema)?;
    Ok(include_str!("schema.sql").replace("\"S\"", &format!("\"{schema}\"")))
}

fn check_schema(schema: &str) -> Result<()> {
    let ok = !schema.is_empty()
        && schema.len() <= 63
        && !schema.starts_with(|c: char| c.is_ascii_digit())
        && schema
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "invalid postgres schema name {schema:?}: use lowercase letters, digits and '_' (at most 63 bytes, not starting with a digit)"
        )))
    }
}

/// What a URL asks of dlock, apart from what it tells libpq.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Url {
    /// The URL without dlock's own parameters, for `tokio_postgres::Config`.
    libpq: String,
    schema: String,
    max_connections: usize,
    /// `wait_connections`: sessions for waiting in the server (0: none).
    wait_connections: usize,
    /// `sslmode` is `require`, `verify-ca` or `verify-full`: TLS, the server's certificate
    /// verified.
    tls: bool,
    /// `sslrootcert`: the CA certificates (PEM) to verify the server with, instead of the
    /// platform's.
    root_cert: Option<String>,
}

/// Splits dlock's own query parameters (`schema`, `max_connections`, `wait_connections`,
/// `sslrootcert`) off a
/// `postgres://` or `postgresql://` URL.
fn parse_url(url: &str) -> Result<Url> {
    let bad = |why: &str| Error::invalid(format!("invalid postgres URL {}: {why}", redact(url)));
    if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
        return Err(bad("expected postgres://user:password@host:port/database"));
    }
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let mut schema = DEFAULT_SCHEMA.to_owned();
    let mut max_connections = DEFAULT_MAX_CONNECTIONS;
    let mut wait_connections = DEFAULT_WAIT_CONNECTIONS;
    let mut tls = false;
    let mut root_cert = None;
    let mut rest = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("schema", v)) => schema = v.to_owned(),
            Some(("max_connections", v)) => {
                max_connections = v
                    .parse()
                    .ok()
                    .filter(|n| (1..=MAX_CONNECTIONS_LIMIT).contains(n))
                    .ok_or_else(|| {
                        bad(&format!(
                            "max_connections must be 1 to {MAX_CONNECTIONS_LIMIT}"
                        ))
                    })?;
            }
            Some(("wait_connections", v)) => {
                wait_connections = v
                    .parse()
                    .ok()
                    .filter(|n| *n <= MAX_CONNECTIONS_LIMIT)
                    .ok_or_else(|| {
                        bad(&format!(
                            "wait_connections must be 0 to {MAX_CONNECTIONS_LIMIT}"
                        ))
                    })?;
            }
            // libpq's modes; tokio-postgres knows disable, prefer and require.
            Some(("sslmode", "disable" | "allow" | "prefer")) => rest.push("sslmode=disable"),
            Some(("sslmode", "require" | "verify-ca" | "verify-full")) => {
                tls = true;
                rest.push("sslmode=require");
            }
            Some(("sslmode", other)) => {
                return Err(bad(&format!(
                    "unknown sslmode {other:?} (disable, allow, prefer, require, verify-ca, verify-full)"
                )));
            }
            Some(("sslrootcert", path)) => root_cert = Some(path.to_owned()),
            _ => rest.push(pair),
        }
    }
    if tls && !cfg!(feature = "postgres-tls") {
        return Err(bad(
            "TLS (sslmode=require or verify-*) needs fencelock's feature postgres-tls",
        ));
    }
    check_schema(&schema)?;
    let mut libpq = base.to_owned();
    if !rest.is_empty() {
        libpq.push('?');
        libpq.push_str(&rest.join("&"));
    }
    Ok(Url {
        libpq,
        schema,
        max_connections,
        wait_connections,
        tls,
        root_cert,
    })
}

/// A URL's dlock parameters and its libpq configuration (nothing is connected).
///
/// # Errors
/// [`ErrorKind::InvalidArgument`] for anything malformed; messages never show the
/// password.
pub(super) fn parse_config(url: &str) -> Result<(Url, tokio_postgres::Config)> {
    let parsed = parse_url(url)?;
    let config = tokio_postgres::Config::from_str(&parsed.libpq)
        .map_err(|e| Error::invalid(format!("invalid postgres URL {}: {e}", redact(url))))?;
    Ok((parsed, config))
}

/// The URL with its password replaced by `***`, for messages.
pub fn redact(url: &str) -> String {
    crate::backend::redact_url(url)
}

/// How a client's connections are made: plain, or TLS with the server's certificate
/// verified (feature `postgres-tls`, when the URL's `sslmode` asks for it).
#[derive(Clone)]
pub(crate) enum Connector {
    Plain,
    #[cfg(feature = "postgres-tls")]
    Tls(tokio_postgres_rustls::MakeRustlsConnect),
}

impl Connector {
    /// A pool of at most `size` connections made by this connector.
    fn pool(&self, config: &tokio_postgres::Config, size: usize) -> Result<Pool> {
        let manager_config = ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        };
        let manager = match self {
            Connector::Plain => Manager::from_config(config.clone(), NoTls, manager_config),
            #[cfg(feature = "postgres-tls")]
            Connector::Tls(tls) => {
                Manager::from_config(config.clone(), tls.clone(), manager_config)
            }
        };
        Pool::builder(manager)
            .max_size(size)
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .create_timeout(Some(CALL_TIMEOUT))
            .wait_timeout(Some(CALL_TIMEOUT))
            .recycle_timeout(Some(CALL_TIMEOUT))
            .build()
            .map_err(|e| Error::invalid(format!("postgres pool: {e}")))
    }

    /// Asks the server to cancel the statement running on `client`'s session.
    async fn cancel(&self, client: &tokio_postgres::Client) {
        let token = client.cancel_token();
        let sent = match self {
            Connector::Plain => token.cancel_query(NoTls).await,
            #[cfg(feature = "postgres-tls")]
            Connector::Tls(tls) => token.cancel_query(tls.clone()).await,
        };
        if let Err(e) = sent {
            tracing::debug!(error = %e, "cancelling a wait in the server failed");
        }
    }

    /// The connector a URL asks for.
    fn for_url(url: &Url) -> Result<Connector> {
        if !url.tls {
            return Ok(Connector::Plain);
        }
        #[cfg(feature = "postgres-tls")]
        {
            tls_connector(url.root_cert.as_deref())
        }
        #[cfg(not(feature = "postgres-tls"))]
        {
            Err(Error::invalid("TLS needs fencelock's feature postgres-tls"))
        }
    }

    /// Opens a connection and spawns the task that drives it: `on_message` sees its
    /// notices and notifications, `on_end` runs once it ends.
    async fn connect(
        &self,
        config: &tokio_postgres::Config,
        on_message: impl FnMut(tokio_postgres::AsyncMessage) + Send + 'static,
        on_end: impl FnOnce() + Send + 'static,
    ) -> std::result::Result<tokio_postgres::Client, tokio_postgres::Error> {
        match self {
            Connector::Plain => {
                let (client, connection) = config.connect(NoTls).await?;
                tokio::spawn(drive(connection, on_message, on_end));
                Ok(client)
            }
            #[cfg(feature = "postgres-tls")]
            Connector::Tls(tls) => {
                let (client, connection) = config.connect(tls.clone()).await?;
                tokio::spawn(drive(connection, on_message, on_end));
                Ok(client)
            }
        }
    }
}

/// Drives `connection` until it ends.
async fn drive<S, T>(
    mut connection: tokio_postgres::Connection<S, T>,
    mut on_message: impl FnMut(tokio_postgres::AsyncMessage),
    on_end: impl FnOnce(),
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    while let Some(Ok(message)) = std::future::poll_fn(|cx| connection.poll_message(cx)).await {
        on_message(message);
    }
    on_end();
}

/// TLS that verifies the server's certificate against `root_cert` (PEM), or the
/// platform's roots.
#[cfg(feature = "postgres-tls")]
fn tls_connector(root_cert: Option<&str>) -> Result<Connector> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    match root_cert {
        Some(path) => {
            let bad =
                |e: &dyn std::fmt::Display| Error::invalid(format!("sslrootcert {path:?}: {e}"));
            for cert in CertificateDer::pem_file_iter(path).map_err(|e| bad(&e))? {
                roots.add(cert.map_err(|e| bad(&e))?).map_err(|e| bad(&e))?;
            }
        }
        None => {
            for cert in rustls_native_certs::load_native_certs().certs {
                let _ = roots.add(cert);
            }
        }
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| Error::invalid(format!("TLS: {e}")))?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(Connector::Tls(
        tokio_postgres_rustls::MakeRustlsConnect::new(config),
    ))
}

/// Refuses a server that does not take writes (a standby, or a role or database with
/// `default_transaction_read_only`): locks need the primary.
async fn check_read_write(client: &tokio_postgres::Client, doing: &str) -> Result<()> {
    let row = client
        .query_one(
            "SELECT current_setting('transaction_read_only') = 'on'",
            &[],
        )
        .await
        .map_err(|e| map_err(&e, doing))?;
    if row.get::<_, bool>(0) {
        return Err(Error::new(ErrorKind::Backend, READ_ONLY));
    }
    Ok(())
}

const READ_ONLY: &str =
    "the server is read-only (a standby, or default_transaction_read_only): locks need the primary";

/// Maps a driver error to dlock's kinds: connection failures are `Unavailable` (retryable),
/// a cancelled statement `TimedOut`, refusals (privileges, a read-only server, a wrong
/// password) `Backend`.
pub(crate) fn map_err(err: &tokio_postgres::Error, doing: &str) -> Error {
    let detail = err.to_string();
    let Some(code) = err.code() else {
        // No SQLSTATE: the connection (I/O, closed, TLS), or the client itself (a value
        // it could not encode or decode: dlock's bug, not the network's).
        let io = std::error::Error::source(err).is_some_and(|s| s.is::<std::io::Error>());
        // A failed TLS handshake (an untrusted certificate): configuration, not the network.
        let tls = detail.contains("TLS");
        let kind = if !tls && (err.is_closed() || io) {
            ErrorKind::Unavailable
        } else {
            ErrorKind::Backend
        };
        // The client's words name the step ("error connecting to server"), its cause says
        // why (connection refused, no such host, an untrusted certificate).
        let detail = match std::error::Error::source(err) {
            Some(cause) => format!("{detail}: {cause}"),
            None => detail,
        };
        return Error::new(kind, format!("{doing}: {detail}"));
    };
    let db = err
        .as_db_error()
        .map_or_else(|| detail.clone(), |d| d.message().to_owned());
    let class = &code.code()[..2];
    if *code == SqlState::QUERY_CANCELED {
        Error::new(
            ErrorKind::TimedOut,
            format!("{doing}: the statement was cancelled: {db}"),
        )
    } else if class == "08"
        || *code == SqlState::ADMIN_SHUTDOWN
        || *code == SqlState::CRASH_SHUTDOWN
        || *code == SqlState::CANNOT_CONNECT_NOW
        || *code == SqlState::T_R_DEADLOCK_DETECTED
        || *code == SqlState::T_R_SERIALIZATION_FAILURE
    {
        Error::new(ErrorKind::Unavailable, format!("{doing}: {db}"))
    } else if *code == SqlState::INVALID_PASSWORD || class == "28" {
        Error::new(
            ErrorKind::Backend,
            format!("{doing}: authentication failed: {db}"),
        )
    } else if *code == SqlState::INSUFFICIENT_PRIVILEGE {
        Error::new(
            ErrorKind::Backend,
            format!(
                "{doing}: the role lacks a privilege dlock needs (USAGE on the schema; SELECT, INSERT, UPDATE, DELETE on its tables; EXECUTE on its functions; CREATE for the first use): {db}"
            ),
        )
    } else if *code == SqlState::READ_ONLY_SQL_TRANSACTION {
        Error::new(
            ErrorKind::Backend,
            format!(
                "{doing}: the server is read-only (a standby, or default_transaction_read_only): locks need the primary: {db}"
            ),
        )
    } else {
        Error::new(
            ErrorKind::Backend,
            format!("{doing}: {db} (SQLSTATE {})", code.code()),
        )
    }
}

fn map_pool_err(err: PoolError, doing: &str) -> Error {
    match err {
        PoolError::Backend(e) => map_err(&e, doing),
        PoolError::Timeout(_) => Error::new(
            ErrorKind::TimedOut,
            format!("{doing}: no connection in time"),
        ),
        other => Error::new(ErrorKind::Unavailable, format!("{doing}: {other}")),
    }
}

/// A key PostgreSQL's `text` can hold: a NUL character in the name or the prefix is
/// [`ErrorKind::InvalidArgument`] before the store is touched (the server would refuse
/// the statement with "invalid byte sequence", a backend error), as the other limits on
/// names are. Every operation of every primitive, in both modes, checks its key.
pub(super) fn check_key(keys: &LockKeys) -> Result<()> {
    if keys.lock().contains('\0') {
        return Err(Error::invalid(format!(
            "lock {:?}: PostgreSQL cannot store a name or key prefix with a NUL character",
            keys.name()
        )));
    }
    Ok(())
}

/// The same for other text an operation stores or matches (`what` names it).
pub(super) fn check_text(text: &str, what: &str) -> Result<()> {
    if text.contains('\0') {
        return Err(Error::invalid(format!(
            "{what} {text:?}: PostgreSQL cannot store text with a NUL character"
        )));
    }
    Ok(())
}

fn ttl_ms(ttl: Duration) -> Result<i64> {
    let ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
    if ms < 1 {
        return Err(Error::invalid("a postgres lease must be at least 1 ms"));
    }
    Ok(ms)
}

fn fence_of(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

/// A connection of a [`Postgres`] client's pool, lent by [`Postgres::client`]: a
/// `tokio_postgres::Client` (through `Deref`), back in the pool when dropped.
pub struct PooledClient(deadpool_postgres::Object);

impl std::ops::Deref for PooledClient {
    type Target = tokio_postgres::Client;

    fn deref(&self) -> &tokio_postgres::Client {
        &self.0
    }
}

impl std::fmt::Debug for PooledClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PooledClient").finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Postgres {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Postgres")
            .field("store", &self.inner.store_id)
            .finish_non_exhaustive()
    }
}

impl Postgres {
    /// Connects to the server at `url` (`postgres://` or `postgresql://`, as libpq takes
    /// it, plus dlock's `schema` and `max_connections` parameters), checks that it takes
    /// writes, and creates dlock's table if it is missing (see the [module docs](self)).
    ///
    /// # Errors
    /// [`ErrorKind::InvalidArgument`] for a malformed URL; [`ErrorKind::Unavailable`] if
    /// the server cannot be reached; [`ErrorKind::Backend`] for a wrong password, a
    /// read-only server, or a role that may not create the missing table. Passwords never
    /// appear in messages.
    pub async fn connect(url: &str) -> Result<Postgres> {
        let (parsed, config) = parse_config(url)?;
        let connector = Connector::for_url(&parsed)?;
        let pool = connector.pool(&config, parsed.max_connections)?;
        let wait_sessions = connector.pool(&config, parsed.wait_connections.max(1))?;
        let hosts = config
            .get_hosts()
            .iter()
            .map(|h| match h {
                tokio_postgres::config::Host::Tcp(h) => h.clone(),
                #[cfg(unix)]
                tokio_postgres::config::Host::Unix(p) => p.display().to_string(),
            })
            .collect::<Vec<_>>()
            .join(",");
        let ports = config
            .get_ports()
            .iter()
            .map(u16::to_string)
            .collect::<Vec<_>>()
            .join(",");
        let store_id = format!(
            "postgres:{hosts}:{ports}/{}/{}",
            config.get_dbname().unwrap_or(""),
            parsed.schema
        );
        let pg = Postgres {
            inner: Arc::new(Inner {
                pool,
                wait_sessions,
                serve_waits: parsed.wait_connections > 0,
                gates: std::sync::Mutex::default(),
                listener: listen::Listener::new(config.clone(), connector.clone())?,
                connector,
                inflight: Detached::default(),
                sql: Statements::new(&parsed.schema)?,
                schema: parsed.schema.clone(),
                store_id,
                engine: Engine::new(),
            }),
        };
        pg.migrate(&parsed.schema).await.map_err(|e| {
            let message = format!("connecting to {}: {}", redact(url), e.message());
            Error::new(e.kind(), message).retryable(e.is_retryable())
        })?;
        Ok(pg)
    }

    /// The schema dlock's tables live in (`dlock` unless the URL says `?schema=`).
    pub fn schema(&self) -> &str {
        &self.inner.schema
    }

    /// A connection from this client's pool (returned to it on drop), for the
    /// application's own statements — e.g. a [`PgFencedTable`](crate::fenced::PgFencedTable)
    /// write under a guard's fence — without a second pool or a second set of credentials.
    ///
    /// # Errors
    /// As the lock operations: [`ErrorKind::Unavailable`] if no connection could be had
    /// within the call timeout, [`ErrorKind::Backend`] for a refused login.
    pub async fn client(&self) -> Result<PooledClient> {
        self.inner
            .pool
            .get()
            .await
            .map(PooledClient)
            .map_err(|e| map_pool_err(e, "taking a pooled connection"))
    }

    /// Refuses a read-only server, then creates the schema and table unless the table is
    /// there already (so a role without `CREATE` can use a table a DBA made).
    async fn migrate(&self, schema: &str) -> Result<()> {
        let doing = "preparing dlock's table";
        let work = async {
            let mut client = self
                .inner
                .pool
                .get()
                .await
                .map_err(|e| map_pool_err(e, doing))?;
            let row = client
                .query_one(
                    "SELECT current_setting('transaction_read_only') = 'on',
                            to_regclass($1) IS NOT NULL AND to_regclass($2) IS NOT NULL
                            AND to_regclass($3) IS NOT NULL AND to_regclass($5) IS NOT NULL
                            AND to_regprocedure($4) IS NOT NULL
                            AND to_regprocedure($6) IS NOT NULL",
                    &[
                        &format!("\"{schema}\".locks"),
                        &format!("\"{schema}\".waiters"),
                        &format!("\"{schema}\".leases"),
                        // Created last, and named for this version: an older schema (or
                        // one whose creation stopped half-way) gets the whole file again.
                        &format!("\"{schema}\".schema_version_4()"),
                        // Added after version 2: a schema without it gets the file again.
                        &format!("\"{schema}\".records"),
                        // Likewise (a semaphore's other permit count is refused).
                        &format!(
                            "\"{schema}\".sem_acquire_checked(text, text, int, int, boolean, \
                             bigint, boolean, text, bigint, bigint)"
                        ),
                    ],
                )
                .await
                .map_err(|e| map_err(&e, doing))?;
            if row.get::<_, bool>(0) {
                return Err(Error::new(ErrorKind::Backend, READ_ONLY));
            }
            if row.get::<_, bool>(1) {
                return Ok(());
            }
            let tx = client.transaction().await.map_err(|e| map_err(&e, doing))?;
            tx.execute(
                "SELECT pg_advisory_xact_lock($1, hashtext($2))",
                &[&MIGRATION_LOCK_CLASS, &schema],
            )
            .await
            .map_err(|e| map_err(&e, doing))?;
            tx.batch_execute(&schema_sql(schema)?)
                .await
                .map_err(|e| map_err(&e, doing))?;
            tx.commit().await.map_err(|e| map_err(&e, doing))
        };
        tokio::time::timeout(CALL_TIMEOUT, work)
            .await
            .map_err(|_| Error::new(ErrorKind::TimedOut, format!("{doing}: no reply in time")))?
    }

    /// Runs one of dlock's statements (prepared once per connection) within the call bound.
    async fn query(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
        doing: &'static str,
    ) -> Result<Vec<Row>> {
        let work = async {
            let client = self
                .inner
                .pool
                .get()
                .await
                .map_err(|e| map_pool_err(e, doing))?;
            let statement = client
                .prepare_cached(sql)
                .await
                .map_err(|e| map_err(&e, doing))?;
            client
                .query(&statement, params)
                .await
                .map_err(|e| map_err(&e, doing))
        };
        tokio::time::timeout(CALL_TIMEOUT, work)
            .await
            .map_err(|_| Error::new(ErrorKind::TimedOut, format!("{doing}: no reply in time")))?
    }
}

impl RawLock for Postgres {
    const QUEUES_WAITERS: bool = true;
    const QUEUES_ONLY_LISTENERS: bool = true;
    const WAITS_IN_STORE: bool = true;

    async fn acquire(&self, keys: &LockKeys, token: &Token, ttl: Duration) -> Result<Acquire> {
        check_key(keys)?;
        self.acquire_lock(keys, token, ttl, false).await
    }

    async fn acquire_or_queue(
        &self,
        keys: &LockKeys,
        token: &Token,
        ttl: Duration,
    ) -> Result<Acquire> {
        check_key(keys)?;
        self.acquire_lock(keys, token, ttl, true).await
    }

    async fn release(&self, keys: &LockKeys, token: &Token) -> Result<bool> {
        check_key(keys)?;
        self.settled(token).await;
        self.release_lock(keys, token.as_str(), "own").await
    }

    async fn abandon(&self, keys: &LockKeys, token: &Token, _ttl: Duration) -> Result<()> {
        check_key(keys)?;
        self.settled(token).await;
        self.release_lock(keys, token.as_str(), "leave")
            .await
            .map(|_| ())
    }

    /// Fair-lock waiters and blocked readers listen for `keys`' own name (a fair lock's
    /// side key per waiter; a read-write lock's readers' side): the release names it.
    async fn watch(&self, keys: &LockKeys) -> Result<ReleaseWatch> {
        check_key(keys)?;
        self.inner.listener.watch(keys.lock()).await
    }

    /// A waiter listens on its client's channel; a release names the waiter it wakes.
    async fn watch_for(&self, _keys: &LockKeys, token: &Token) -> Result<ReleaseWatch> {
        self.inner.listener.watch(token.as_str()).await
    }

    fn watch_ready(&self, _keys: &LockKeys, token: &Token) -> Option<ReleaseWatch> {
        self.inner
            .listener
            .is_up()
            .then(|| self.inner.listener.register(token.as_str()))
    }

    async fn extend(&self, keys: &LockKeys, token: &Token, ttl: Duration) -> Result<bool> {
        check_key(keys)?;
        self.extend_kind(LeaseKind::Lock, keys, token, ttl).await
    }

    async fn extend_many(&self, renewals: &[Renewal]) -> Vec<Result<bool>> {
        let mut kinds = Vec::with_capacity(renewals.len());
        let mut keys = Vec::with_capacity(renewals.len());
        let mut tokens = Vec::with_capacity(renewals.len());
        let mut ttls = Vec::with_capacity(renewals.len());
        for r in renewals {
            kinds.push(kind_code(r.kind));
            keys.push(r.keys.lock());
            tokens.push(r.token.as_str());
            ttls.push(ttl_ms(r.ttl).unwrap_or(i64::MAX));
        }
        match self
            .query(
                &self.inner.sql.extend_many,
                &[&kinds, &keys, &tokens, &ttls],
                "renewing leases",
            )
            .await
        {
            Ok(rows) => {
                let mut renewed = vec![false; renewals.len()];
                for row in rows {
                    let i = row.get::<_, i64>(0);
                    if let Some(slot) = usize::try_from(i - 1).ok().and_then(|i| renewed.get_mut(i))
                    {
                        *slot = true;
                    }
                }
                renewed.into_iter().map(Ok).collect()
            }
            Err(e) => renewals
                .iter()
                .map(|_| {
                    Err(Error::new(e.kind(), e.message().to_owned()).retryable(e.is_retryable()))
                })
                .collect(),
        }
    }

    fn store_id(&self) -> String {
        self.inner.store_id.clone()
    }

    fn store_label(&self) -> &'static str {
        "postgres"
    }

    fn engine(&self) -> &Engine {
        &self.inner.engine
    }
}

/// Decodes `(granted, fence, wait_ms)`: a negative wait means no lease to wait for.
fn granted(rows: &[Row], doing: &str) -> Result<Acquire> {
    let row = rows
        .first()
        .ok_or_else(|| Error::new(ErrorKind::Backend, format!("{doing}: no reply row")))?;
    Ok(if row.get::<_, bool>(0) {
        Acquire::Acquired {
            fence: fence_of(row.get(1)),
        }
    } else {
        Acquire::Held {
            remaining: u64::try_from(row.get::<_, i64>(2))
                .ok()
                .map(Duration::from_millis),
        }
    })
}

/// How `extend_one` names a lease's kind.
fn kind_code(kind: LeaseKind) -> &'static str {
    match kind {
        LeaseKind::Permits => "p",
        LeaseKind::Reentrant => "h",
        LeaseKind::ReadWrite => "w",
        // A plain or fair lock's holder; kinds added later renew as a lock would.
        _ => "l",
    }
}

impl Postgres {
    /// Renews one lease of `kind`.
    async fn extend_kind(
        &self,
        kind: LeaseKind,
        keys: &LockKeys,
        token: &Token,
        ttl: Duration,
    ) -> Result<bool> {
        let ms = ttl_ms(ttl)?;
        let rows = self
            .query(
                &self.inner.sql.extend,
                &[&kind_code(kind), &keys.lock(), &token.as_str(), &ms],
                "extending a lease",
            )
            .await?;
        Ok(rows.first().is_some_and(|row| row.get::<_, bool>(0)))
    }

    /// Runs an acquire under `token` to completion even if its caller stops waiting
    /// (cancelled), on the engine's [`Detached`]: a grant that comes back after the caller
    /// left is given back by `give_back`, after the grant; until it is done, the token's
    /// release and withdrawal wait ([`settled`](Postgres::settled)).
    ///
    /// `call` and `give_back` get the client, the keys and the token, owned; `call` also
    /// gets a receiver that ends when the caller stops waiting (to cancel a wait in the
    /// server).
    ///
    /// A plain function returning the engine's future (not an `async` layer around it):
    /// every layer deepens the future types of the callers.
    fn detached<'a, F, Fut, G, GFut>(
        &'a self,
        keys: &LockKeys,
        token: &'a Token,
        call: F,
        give_back: G,
    ) -> impl std::future::Future<Output = Result<Acquire>> + 'a
    where
        F: FnOnce(Postgres, LockKeys, Token, Gone) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Result<Acquire>> + Send + 'static,
        G: FnOnce(Postgres, LockKeys, Token) -> GFut + Send + 'static,
        GFut: std::future::Future<Output = ()> + Send + 'static,
    {
        let (pg, k, t) = (self.clone(), keys.clone(), token.clone());
        let (gpg, gk, gt) = (self.clone(), keys.clone(), token.clone());
        self.inner.inflight.run(
            token,
            move |gone| call(pg, k, t, gone),
            move || give_back(gpg, gk, gt),
        )
    }

    /// Waits until no acquire under `token` is in flight.
    fn settled<'a>(&'a self, token: &'a Token) -> impl std::future::Future<Output = ()> + 'a {
        self.inner.inflight.settled(token)
    }

    /// One attempt, run to completion even if the caller is cancelled (see
    /// [`detached`](Postgres::detached)).
    async fn acquire_lock(
        &self,
        keys: &LockKeys,
        token: &Token,
        ttl: Duration,
        queue: bool,
    ) -> Result<Acquire> {
        // Taken here, on the caller's task: the attempt runs on a task of its own.
        let store_wait = crate::observe::StoreWait::reporter();
        self.detached(
            keys,
            token,
            move |pg, k, t, gone| async move {
                if queue && pg.inner.serve_waits {
                    pg.gated_attempt(&k, &t, ttl, gone, &store_wait).await
                } else {
                    pg.attempt(&k, &t, ttl, waiter_grace(ttl), queue, None)
                        .await
                }
            },
            |pg, k, t| async move {
                let _ = pg.release_lock(&k, t.as_str(), "own").await;
            },
        )
        .await
    }

    /// The channel a waiting attempt leaves for its wake-up: this client's, once it
    /// listens (the connection is opened again here if it dropped since the waiter
    /// registered; if that fails, the attempt leaves none and its timer covers it).
    async fn wake_channel(&self) -> Option<&str> {
        let listener = &self.inner.listener;
        if !listener.is_up() {
            let _ = listener.ensure_up().await;
        }
        listener.is_up().then(|| listener.channel())
    }

    /// One attempt at a plain or fair lock. With `queue`, a caller that must wait takes a
    /// place in the queue, to be handed the lock by a release: a plain lock's waiter is
    /// told under its token, a fair lock's under its own `side` name (and only once it
    /// listens for it).
    async fn attempt(
        &self,
        keys: &LockKeys,
        token: &Token,
        ttl: Duration,
        grace: Duration,
        queue: bool,
        side: Option<&str>,
    ) -> Result<Acquire> {
        let listener = &self.inner.listener;
        let channel = if queue {
            self.wake_channel()
                .await
                .filter(|_| side.is_none_or(|name| listener.is_registered(name)))
        } else {
            None
        };
        let doing = if side.is_some() {
            "acquiring a fair lock"
        } else {
            "acquiring a lock"
        };
        let rows = self
            .query(
                &self.inner.sql.acquire,
                &[
                    &keys.lock(),
                    &token.as_str(),
                    &ttl_ms(ttl)?,
                    &queue,
                    &channel,
                    &side,
                    &ttl_ms(grace)?,
                    // A queued waiter is handed the lock by the release (it listens).
                    &channel.is_some(),
                    &listener.pid(),
                ],
                doing,
            )
            .await?;
        let reply = granted(&rows, doing)?;
        if channel.is_some() {
            self.raise_floor(&rows, side.unwrap_or(token.as_str()), &reply);
        }
        Ok(reply)
    }

    fn gates(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, Gate>> {
        self.inner
            .gates
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A plain lock's queueing attempt, waiting inside the server where it can (see the
    /// module docs): on a wait session, a free lock is taken at once; a held one is waited
    /// for on the name's gate, in arrival order, and attempted once the gate is ours; the
    /// session keeps the gate while the token heads the queue or holds the lock. Without a
    /// free wait session, or once a gate wait timed out, the token queues in the waiters
    /// table as [`attempt`](Postgres::attempt) does. When `gone` ends (the caller left), a
    /// wait in the server is cancelled. An attempt that waited for the gate tells
    /// `store_wait` (the caller's `dlock.wait`).
    async fn gated_attempt(
        &self,
        keys: &LockKeys,
        token: &Token,
        ttl: Duration,
        mut gone: Gone,
        store_wait: &crate::observe::StoreWaitReporter,
    ) -> Result<Acquire> {
        let grace = waiter_grace(ttl);
        let standing = self.gates().remove(token.as_str());
        let (session, first) = match standing {
            Some(Gate::Held(session)) => (*session, false),
            Some(Gate::Queued) => return self.queued_attempt(keys, token, ttl).await,
            None => {
                let no_wait = deadpool_postgres::Timeouts {
                    wait: Some(Duration::ZERO),
                    create: Some(CALL_TIMEOUT),
                    recycle: Some(CALL_TIMEOUT),
                };
                match self.inner.wait_sessions.timeout_get(&no_wait).await {
                    Ok(session) => (session, true),
                    Err(_) => return self.queued_attempt(keys, token, ttl).await,
                }
            }
        };
        if first
            && !matches!(
                gone.try_recv(),
                Err(tokio::sync::oneshot::error::TryRecvError::Empty)
            )
        {
            // The caller left before the attempt began (the session holds no gate yet).
            return Err(Error::new(ErrorKind::Unavailable, "the waiter left"));
        }
        let doing = "waiting for a lock";
        let channel = self.wake_channel().await;
        let params: [&(dyn ToSql + Sync); 8] = [
            &keys.lock(),
            &token.as_str(),
            &ttl_ms(ttl)?,
            &channel,
            &ttl_ms(grace)?,
            &channel.is_some(),
            &self.inner.listener.pid(),
            &first,
        ];
        let call = async {
            let statement = session.prepare_cached(&self.inner.sql.gate_acquire).await?;
            let wait = session.query(&statement, &params);
            tokio::pin!(wait);
            // The statement is sent on its first poll, before a cancellation can be.
            tokio::select! {
                biased;
                rows = &mut wait => rows,
                _ = &mut gone => {
                    self.inner.connector.cancel(&session).await;
                    wait.await
                }
            }
        };
        // The server bounds a gate wait by ttl / 2; one that stops answering must not hold
        // the waiter forever.
        let bound = if first { ttl / 2 } else { Duration::ZERO } + CALL_TIMEOUT;
        let rows = match tokio::time::timeout(bound, call).await {
            Ok(Ok(rows)) => rows,
            Ok(Err(e)) if e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) => {
                // Half a lease went by at the gate (long holds, or a gate kept by a holder
                // that stalled): queue in the table, ahead of those still at the gate.
                store_wait.waited();
                drop(deadpool_postgres::Object::take(session));
                return self.queued_attempt(keys, token, ttl).await;
            }
            // The session may hold the gate (advisory locks outlive a failed statement):
            // it is closed, which frees it.
            Ok(Err(e)) => {
                drop(deadpool_postgres::Object::take(session));
                return Err(map_err(&e, doing));
            }
            Err(_) => {
                drop(deadpool_postgres::Object::take(session));
                return Err(
                    Error::new(ErrorKind::TimedOut, format!("{doing}: no reply in time"))
                        .retryable(true),
                );
            }
        };
        let reply = granted(&rows, doing)?;
        if channel.is_some() {
            self.raise_floor(&rows, token.as_str(), &reply);
        }
        let keeps_gate = rows.first().is_some_and(|row| row.get::<_, bool>(3));
        if first && keeps_gate && matches!(reply, Acquire::Acquired { .. }) {
            // Granted with the gate kept: the gate was not free (a free gate is given
            // back with a grant), so the statement waited for it.
            store_wait.waited();
        }
        // Whether the session keeps the gate (else it goes back to the pool).
        if keeps_gate {
            self.gates()
                .insert(token.as_str().to_owned(), Gate::Held(Box::new(session)));
        }
        Ok(reply)
    }

    /// A queueing attempt in the waiters table, remembered for the token's next attempts
    /// (until its release or withdrawal).
    async fn queued_attempt(
        &self,
        keys: &LockKeys,
        token: &Token,
        ttl: Duration,
    ) -> Result<Acquire> {
        self.gates().insert(token.as_str().to_owned(), Gate::Queued);
        self.attempt(keys, token, ttl, waiter_grace(ttl), true, None)
            .await
    }

    /// After a queueing attempt that found the lock held: hand-overs to `name` minted
    /// before it (fence up to the reply's counter) are void.
    fn raise_floor(&self, rows: &[Row], name: &str, reply: &Acquire) {
        if let (Acquire::Held { .. }, Some(row)) = (reply, rows.first()) {
            self.inner.listener.raise_floor(name, fence_of(row.get(1)));
        }
    }

    /// `<schema>.release` in `mode` ('own', 'force', 'leave'); a token that has its
    /// name's gate frees it in the same statement, on its wait session.
    async fn release_lock(&self, keys: &LockKeys, token: &str, mode: &str) -> Result<bool> {
        let wake = ttl_ms(WAKE_GRACE)?;
        let standing = if mode == "force" {
            None
        } else {
            self.gates().remove(token)
        };
        if let Some(Gate::Held(session)) = standing {
            let session = *session;
            let doing = "releasing a lock";
            let call = async {
                let statement = session.prepare_cached(&self.inner.sql.gate_release).await?;
                session
                    .query_one(&statement, &[&keys.lock(), &token, &mode, &wake])
                    .await
            };
            match tokio::time::timeout(CALL_TIMEOUT, call).await {
                Ok(Ok(row)) => return Ok(row.get::<_, bool>(0)),
                // The session is gone, and its gate with it: release through the pool.
                Ok(Err(e)) => {
                    tracing::debug!(error = %map_err(&e, doing), "releasing on the wait session failed");
                    drop(deadpool_postgres::Object::take(session));
                }
                Err(_) => drop(deadpool_postgres::Object::take(session)),
            }
        }
        let rows = self
            .query(
                &self.inner.sql.release,
                &[&keys.lock(), &token, &mode, &wake],
                "releasing a lock",
            )
            .await?;
        Ok(rows.first().is_some_and(|row| row.get::<_, bool>(0)))
    }
}

/// Fences are the row's counter, incremented by the granting statement itself and kept
/// across releases and restarts; see the module docs for what can still repeat them.
impl RawFencing for Postgres {}

impl RawInspect for Postgres {
    const KINDS_TOLD_APART_UNDER_ONE_PREFIX: bool = true;

    crate::raw::inspect_each_kind!();

    async fn list(&self, prefix: &str, pattern: &str, limit: usize) -> Result<Vec<String>> {
        check_text(prefix, "key prefix")?;
        check_text(pattern, "pattern")?;
        crate::observe::listed(self.store_label(), pattern, async move {
            let rows = self
                .query(&self.inner.sql.list, &[&prefix], "listing locks")
                .await?;
            Ok(rows
                .iter()
                .filter_map(|row| {
                    let key: String = row.get(0);
                    let name = key.strip_prefix(prefix)?.to_owned();
                    super::glob_match(pattern.as_bytes(), name.as_bytes()).then_some(name)
                })
                .take(limit)
                .collect())
        })
        .await
    }
}

/// The plain lock's inspection, for [`RawInspect`].
impl Postgres {
    pub(crate) async fn inspect_plain(&self, keys: &LockKeys) -> Result<LockState> {
        check_key(keys)?;
        let rows = self
            .query(
                &self.inner.sql.inspect,
                &[&keys.lock()],
                "inspecting a lock",
            )
            .await?;
        Ok(match rows.first() {
            Some(row) => {
                let fence = fence_of(row.get(2));
                let queued = u64::try_from(row.get::<_, i64>(3)).unwrap_or(0);
                LockState::new(
                    row.get::<_, Option<String>>(0),
                    row.get::<_, Option<i64>>(1)
                        .and_then(|ms| u64::try_from(ms).ok())
                        .map(Duration::from_millis),
                    (fence > 0).then_some(fence),
                )
                .with_queued(u32::try_from(queued).unwrap_or(u32::MAX))
                .with_waiting_clients(queued)
            }
            None => LockState::new(None, None, None),
        })
    }

    pub(crate) async fn force_unlock_plain(&self, keys: &LockKeys) -> Result<bool> {
        check_key(keys)?;
        self.release_lock(keys, "", "force").await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_give_libpq_its_part_and_dlock_its_own() {
        let u =
            parse_url("postgres://u:p@h:5432/db?schema=locks_2&sslmode=disable").expect("valid");
        assert_eq!(u.libpq, "postgres://u:p@h:5432/db?sslmode=disable");
        assert_eq!(u.schema, "locks_2");
        assert_eq!(u.max_connections, DEFAULT_MAX_CONNECTIONS);
        let u = parse_url("postgresql://h/db?max_connections=3").expect("valid");
        assert_eq!(
            (u.libpq.as_str(), u.max_connections),
            ("postgresql://h/db", 3)
        );
        assert_eq!(u.schema, DEFAULT_SCHEMA);
        for bad in [
            "redis://h",
            "postgres://h/db?schema=Bad",
            "postgres://h/db?schema=",
            "postgres://h/db?schema=a;drop",
            "postgres://h/db?max_connections=0",
            "postgres://h/db?max_connections=x",
        ] {
            assert_eq!(
                parse_url(bad).map(|_| ()).map_err(|e| e.kind()),
                Err(ErrorKind::InvalidArgument),
                "{bad}"
            );
        }
    }

    #[test]
    fn passwords_never_reach_messages() {
        assert_eq!(
            redact("postgres://app:s3cret@db:5432/x?sslmode=disable"),
            "postgres://app:***@db:5432/x?sslmode=disable"
        );
        assert_eq!(
            redact("postgresql://h/x?user=a&password=s3cret"),
            "postgresql://h/x?user=a&password=***"
        );
        assert_eq!(redact("postgres://h/x"), "postgres://h/x");
        let err = parse_url("postgres://app:s3cret@h/x?max_connections=0").expect_err("bad");
        assert!(!err.to_string().contains("s3cret"), "{err}");
    }

    /// statements.sql has every statement the client runs, each in the schema it is
    /// given, and the record's announcement on the channel the listener follows.
    #[test]
    fn the_statements_beside_the_schema_are_all_there() {
        let sql = Statements::new("my schema").expect("statements.sql parses");
        for text in [
            &sql.acquire,
            &sql.inspect,
            &sql.rw_inspect,
            &sql.publish,
            &sql.record,
        ] {
            assert!(text.contains("\"my schema\"."), "{text}");
            assert!(!text.contains("\"S\""), "{text}");
            assert!(!text.contains("--"), "comments are left out: {text}");
        }
        assert!(
            sql.publish
                .contains(&format!("pg_notify('{}'", listen::RECORDS_CHANNEL)),
            "{}",
            sql.publish
        );
    }

    #[test]
    fn the_schema_sql_quotes_a_checked_name() {
        assert!(
            schema_sql("dlock")
                .expect("valid")
                .contains("\"dlock\".locks")
        );
        assert!(schema_sql("x\"; DROP TABLE t; --").is_err());
    }
}

/// Hostile input: URLs of both schemes, through dlock's parameters and libpq's parser.
/// Every row (`row <table> <key>`) and advisory key (`advisory <text hashed>`) lock `keys`
/// of `primitive` uses: lease mode's rows, keyed by the lock key in every table of
/// `schema.sql`, and the advisory keys `schema.sql` derives from the lock key (read out of
/// its `hashtextextended('<text>' || k, 0)` calls); `advisory`: advisory mode's one key.
#[cfg(test)]
pub(crate) fn key_set(primitive: &str, keys: &LockKeys) -> Vec<String> {
    if primitive == "advisory" {
        return advisory::advisory_key(keys)
            .map(|k| vec![format!("advisory {k}")])
            .unwrap_or_default();
    }
    // The texts schema.sql hashes with a lock key, read once.
    static DERIVED: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    let derived = DERIVED.get_or_init(|| {
        let sql = schema_sql(DEFAULT_SCHEMA).expect("the schema");
        for table in ["locks", "leases", "waiters", "records"] {
            assert!(sql.contains(&format!(".{table} (\n    key ")), "{table}");
        }
        let texts: Vec<String> = sql
            .split("hashtextextended('")
            .skip(1)
            .filter_map(|part| {
                let (text, rest) = part.split_once('\'')?;
                rest.trim_start()
                    .starts_with("|| k")
                    .then(|| text.to_owned())
            })
            .collect();
        assert_eq!(texts.len(), 2, "gate_key and taking_key");
        texts
    });
    let k = keys.lock();
    let mut out = Vec::new();
    for table in ["locks", "leases", "waiters", "records"] {
        if table != "records" || primitive == "election" {
            out.push(format!("row {table} {k}"));
        }
    }
    out.extend(derived.iter().map(|text| format!("advisory {text}{k}")));
    out
}

#[cfg(test)]
mod props {
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(crate::backend::hostile::cases(48))]
        /// No name reaches another lock's rows or advisory keys, in lease or advisory mode
        /// (DESIGN.md principle 9).
        #[test]
        fn distinct_locks_share_no_row_or_advisory_key(
            names in proptest::collection::vec(crate::keys::namespace::hostile_name(), 1..3)
        ) {
            let mut primitives = crate::keys::namespace::PRIMITIVES.to_vec();
            primitives.push(("advisory", crate::keys::DEFAULT_PREFIX));
            crate::keys::namespace::check_disjoint(&primitives, &names, super::key_set)?;
        }
    }

    use super::parse_config;
    use crate::backend::hostile::{any_url, cases, check, url_with_password};

    const SCHEMES: &[&str] = &["postgres", "postgresql"];

    #[test]
    fn odd_passwords_stay_hidden() {
        for (url, secret) in [
            ("postgres://u:pa/ss!w@h:x/db", "pa/ss!w"),
            ("postgres://u:pa?ss!w@h/db?max_connections=0", "pa?ss!w"),
            ("postgres://u:pa#ss!w@h/db?sslmode=bogus", "pa#ss!w"),
            ("postgres://u:s3cret!@h/db?bogus=1", "s3cret!"),
            ("postgres://h/db?sslpassword=s3cret!&schema=X", "s3cret!"),
            ("postgres://h/db?pass=s3cret!", "s3cret!"),
        ] {
            let err = parse_config(url).map(|_| ()).expect_err(url);
            assert_eq!(err.kind(), crate::ErrorKind::InvalidArgument, "{url}");
            assert!(!format!("{err} {err:?}").contains(secret), "{err:?}");
        }
    }

    proptest! {
        #![proptest_config(cases(256))]

        #[test]
        fn any_string_parses_or_is_invalid(url in any_url(SCHEMES)) {
            check(&parse_config(&url), "")?;
        }

        #[test]
        fn passwords_never_reach_errors((url, secret) in url_with_password(SCHEMES)) {
            check(&parse_config(&url), &secret)?;
        }
    }
}
