//! Advisory-lock mode: PostgreSQL's own session locks behind dlock's API (see
//! [`PgAdvisory`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use super::{CALL_TIMEOUT, Connector, check_key, check_read_write, map_err, parse_config, redact};
use crate::engine::Engine;
use crate::error::{Error, ErrorKind, Result};
use crate::keys::LockKeys;
use crate::raw::{Acquire, Kind, LockState, RawInspect, RawLock};
use crate::token::Token;

/// A PostgreSQL client whose locks are session advisory locks: exclusive by default,
/// shared from [`shared`](PgAdvisory::shared). Cheap to clone; clones share their sessions
/// and the watchdog. PostgreSQL's own session locks (`pg_advisory_lock`), as many
/// services already use them, behind dlock's API.
///
/// Each held lock has a **dedicated connection** (its session): the lock is
/// `pg_try_advisory_lock(hashtextextended(<lock key>, 0))` taken there, and it lasts
/// exactly as long as that session. There is no ttl on the server: the lock's "lease" in
/// dlock is a liveness check — each renewal asks that session whether it still holds the
/// lock (`pg_locks`), and a session that died (terminated, the server restarted, the
/// connection broke) makes the renewal fail, so `lost()` fires. Waiters poll with backoff.
///
/// What it guarantees, and what it costs (see SAFETY.md):
///
/// * no expiry: a holder that stalls keeps the lock for as long as its connection lives —
///   nobody else gets in, however long it stalls (safe, not live);
/// * no fencing token ([`RawFencing`](crate::raw::RawFencing) is not implemented, so
///   `fencing_token()` does not compile): when the session dies (a server restart, a
///   terminated backend) the lock is free at once, while the old holder learns it only at
///   its next check, up to a third of the ttl later;
/// * one connection per held lock, on top of the client's pool: mind `max_connections`;
/// * server settings that end sessions: each session turns `idle_session_timeout` and
///   `idle_in_transaction_session_timeout` off for itself (set for the role or the
///   database, either would end a holding session after it sat idle that long, freeing
///   its lock at once); `statement_timeout` can only cancel one of dlock's short
///   statements (an attempt or a check fails: no lock is freed by it); an operator's
///   `pg_terminate_backend` or a pooler that closes idle server connections still ends a
///   session (use lease mode, [`Postgres`](super::Postgres), where that matters);
/// * with the watchdog off nothing checks the session, so the guard cannot vouch for the
///   hold past its ttl: it reports itself lost then, and its `release()` returns
///   `LockLost` although the unlock ran on the session and the lock is free (keep the
///   watchdog on in advisory mode).
///
/// Names map to PostgreSQL's 64-bit advisory keys by `hashtextextended(<lock key>, 0)`
/// (the lock key is the prefix plus the name, `dlock:<name>` by default), so other code
/// can take the same lock with `SELECT pg_advisory_lock(hashtextextended('dlock:<name>',
/// 0))`. Two names can collide on one key (a 64-bit hash): they then exclude each other.
/// A lock key that starts with `dlock-gate:"` or `dlock-taking:"` is refused
/// (`InvalidArgument`): [`Postgres`](super::Postgres)'s lease mode takes advisory keys of
/// those texts for its own locks' gates, in the same database.
///
/// ```no_run
/// # async fn demo() -> fencelock::Result<()> {
/// use std::time::Duration;
/// let pg = fencelock::backend::PgAdvisory::connect("postgres://app:secret@127.0.0.1/app").await?;
/// // The ttl is how often the session is checked (every third of it), not an expiry.
/// let lock = fencelock::Lock::builder(pg, "nightly").ttl(Duration::from_secs(3)).build()?;
/// let guard = lock.lock().await?;
/// tokio::select! {
///     () = guard.lost() => eprintln!("the session holding the lock is gone"),
///     () = tokio::time::sleep(Duration::from_secs(1)) => {}
/// }
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct PgAdvisory {
    inner: Arc<Inner>,
    shared: bool,
}

struct Inner {
    config: tokio_postgres::Config,
    connector: Connector,
    /// Sessions holding a lock, by the holder's token.
    held: Mutex<HashMap<String, Arc<Session>>>,
    /// Sessions that hold nothing, kept for the next acquire.
    idle: Mutex<Vec<Session>>,
    store_id: String,
    engine: Engine,
}

/// One dedicated connection.
struct Session {
    client: tokio_postgres::Client,
    /// Set when the connection ended.
    closed: Arc<AtomicBool>,
}

impl Session {
    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst) || self.client.is_closed()
    }
}

/// Sets the idle timeouts PostgreSQL has (`idle_session_timeout` from version 14) to 0
/// for the session, returning each one's value before.
const NO_IDLE_TIMEOUTS: &str = "SELECT name::text, current_setting(name),
       set_config(name, '0', false)
  FROM pg_settings
 WHERE name IN ('idle_session_timeout', 'idle_in_transaction_session_timeout')";

/// How many idle sessions a client keeps.
const MAX_IDLE: usize = 8;

impl std::fmt::Debug for PgAdvisory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgAdvisory")
            .field("store", &self.inner.store_id)
            .field("shared", &self.shared)
            .finish_non_exhaustive()
    }
}

impl PgAdvisory {
    /// Connects to the server at `url` (as [`Postgres::connect`](super::Postgres::connect)
    /// takes it; `schema` is ignored: advisory locks need no table) and checks that it
    /// takes locks (a primary, not a read-only standby).
    ///
    /// # Errors
    /// As [`Postgres::connect`](super::Postgres::connect).
    pub async fn connect(url: &str) -> Result<PgAdvisory> {
        let (parsed, config) = parse_config(url)?;
        let connector = Connector::for_url(&parsed)?;
        let pg = PgAdvisory {
            inner: Arc::new(Inner {
                store_id: format!("postgres-advisory:{}", redact(&parsed.libpq)),
                config,
                connector,
                held: Mutex::new(HashMap::new()),
                idle: Mutex::new(Vec::new()),
                engine: Engine::new(),
            }),
            shared: false,
        };
        let session = pg.open().await.map_err(|e| {
            let message = format!("connecting to {}: {}", redact(url), e.message());
            Error::new(e.kind(), message).retryable(e.is_retryable())
        })?;
        check_read_write(&session.client, "checking the server")
            .await
            .map_err(|e| {
                let message = format!("connecting to {}: {}", redact(url), e.message());
                Error::new(e.kind(), message).retryable(e.is_retryable())
            })?;
        pg.park(session);
        Ok(pg)
    }

    /// The same client taking **shared** advisory locks (`pg_try_advisory_lock_shared`):
    /// shared holders exclude exclusive ones only.
    #[must_use]
    pub fn shared(&self) -> PgAdvisory {
        PgAdvisory {
            inner: Arc::clone(&self.inner),
            shared: true,
        }
    }

    fn held(&self) -> MutexGuard<'_, HashMap<String, Arc<Session>>> {
        self.inner
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn idle(&self) -> MutexGuard<'_, Vec<Session>> {
        self.inner
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Opens a dedicated connection, driven by a task of its own.
    async fn open(&self) -> Result<Session> {
        let doing = "opening an advisory-lock session";
        let closed = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&closed);
        let connect = self.inner.connector.connect(
            &self.inner.config,
            |_| {},
            move || flag.store(true, Ordering::SeqCst),
        );
        let client = tokio::time::timeout(CALL_TIMEOUT, connect)
            .await
            .map_err(|_| Error::new(ErrorKind::TimedOut, format!("{doing}: no reply in time")))?
            .map_err(|e| map_err(&e, doing))?;
        // The session holds its locks while it sits idle: a server that ends idle
        // sessions would free them at once (another holder granted while this one still
        // works). Both timeouts are the user's to set (for the role or database too), so
        // the session turns them off for itself.
        let doing = "turning off the session's idle timeouts";
        let rows = tokio::time::timeout(CALL_TIMEOUT, client.query(NO_IDLE_TIMEOUTS, &[]))
            .await
            .map_err(|_| Error::new(ErrorKind::TimedOut, format!("{doing}: no reply in time")))?
            .map_err(|e| map_err(&e, doing))?;
        for row in rows {
            let (name, was): (String, String) = (row.get(0), row.get(1));
            if was != "0" {
                tracing::debug!(
                    "advisory-lock session: {name}={was} (the role's or database's) turned \
                     off for this session: it would end the session and free its locks"
                );
            }
        }
        Ok(Session { client, closed })
    }

    /// An idle session, or a new one.
    async fn session(&self) -> Result<Session> {
        loop {
            let Some(session) = self.idle().pop() else {
                return self.open().await;
            };
            if !session.is_closed() {
                return Ok(session);
            }
        }
    }

    /// Keeps `session` for the next acquire (it holds nothing).
    fn park(&self, session: Session) {
        let mut idle = self.idle();
        if idle.len() < MAX_IDLE && !session.is_closed() {
            idle.push(session);
        }
    }

    /// A statement on `session` within the call bound.
    async fn ask(
        &self,
        session: &Session,
        sql: &str,
        key: &str,
        doing: &'static str,
    ) -> Result<bool> {
        let row = tokio::time::timeout(CALL_TIMEOUT, session.client.query_one(sql, &[&key]))
            .await
            .map_err(|_| Error::new(ErrorKind::TimedOut, format!("{doing}: no reply in time")))?
            .map_err(|e| map_err(&e, doing))?;
        Ok(row.get::<_, bool>(0))
    }
}

/// `pg_locks` rows of advisory key `hashtextextended($1, 0)` (a bigint key: its high 32
/// bits in `classid`, its low 32 bits in `objid`, `objsubid` 1).
const KEY_ROWS: &str = "FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1
      AND classid = ((hashtextextended($1, 0) >> 32) & 4294967295)::bigint::oid
      AND objid = (hashtextextended($1, 0) & 4294967295)::bigint::oid";

/// What `hashtextextended(…, 0)` turns into lock `keys`' advisory key: the lock key —
/// unless it spells one of the advisory keys that lease mode derives from its lock keys
/// (`schema.sql`'s `gate_key` and `taking_key`), which is refused.
///
/// # Errors
/// `InvalidArgument` for such a lock key.
pub(super) fn advisory_key(keys: &LockKeys) -> Result<&str> {
    let key = keys.lock();
    for reserved in ["dlock-gate:\"", "dlock-taking:\""] {
        if key.starts_with(reserved) {
            return Err(crate::error::Error::invalid(format!(
                "lock key {key:?} starts with {reserved:?}: PostgreSQL lease mode keeps \
                 advisory keys of that form for its own gates; choose another name"
            )));
        }
    }
    Ok(key)
}

impl RawLock for PgAdvisory {
    async fn acquire(&self, keys: &LockKeys, token: &Token, _ttl: Duration) -> Result<Acquire> {
        check_key(keys)?;
        if let Some(session) = self.held().get(token.as_str())
            && !session.is_closed()
        {
            // A repeat of a granted request.
            return Ok(Acquire::Acquired { fence: 0 });
        }
        let session = self.session().await?;
        let sql = if self.shared {
            "SELECT pg_try_advisory_lock_shared(hashtextextended($1, 0))"
        } else {
            "SELECT pg_try_advisory_lock(hashtextextended($1, 0))"
        };
        // Dropped (and so closed) if this call is cancelled or fails: a lock its caller
        // never heard of goes with its session.
        let got = self
            .ask(
                &session,
                sql,
                advisory_key(keys)?,
                "taking an advisory lock",
            )
            .await?;
        if !got {
            self.park(session);
            return Ok(Acquire::Held { remaining: None });
        }
        self.held()
            .insert(token.as_str().to_owned(), Arc::new(session));
        Ok(Acquire::Acquired { fence: 0 })
    }

    async fn release(&self, keys: &LockKeys, token: &Token) -> Result<bool> {
        check_key(keys)?;
        let Some(session) = self.held().remove(token.as_str()) else {
            return Ok(false);
        };
        if session.is_closed() {
            return Ok(false); // the session, and with it the lock, is gone
        }
        let sql = if self.shared {
            "SELECT pg_advisory_unlock_shared(hashtextextended($1, 0))"
        } else {
            "SELECT pg_advisory_unlock(hashtextextended($1, 0))"
        };
        let released = self
            .ask(&session, sql, keys.lock(), "releasing an advisory lock")
            .await?;
        // A renewal still running may share it: then it closes when the last one drops.
        if released && let Ok(session) = Arc::try_unwrap(session) {
            self.park(session);
        }
        Ok(released)
    }

    /// A liveness check: the session still holds the lock.
    async fn extend(&self, keys: &LockKeys, token: &Token, _ttl: Duration) -> Result<bool> {
        check_key(keys)?;
        let session = match self.held().get(token.as_str()) {
            Some(session) if !session.is_closed() => Arc::clone(session),
            _ => return Ok(false),
        };
        let sql =
            format!("SELECT EXISTS (SELECT 1 {KEY_ROWS} AND pid = pg_backend_pid() AND granted)");
        let checked = tokio::time::timeout(
            CALL_TIMEOUT,
            session.client.query_one(sql.as_str(), &[&keys.lock()]),
        )
        .await;
        match checked {
            Ok(Ok(row)) => Ok(row.get::<_, bool>(0)),
            // The session is gone: so is its lock.
            Ok(Err(e)) if e.is_closed() => Ok(false),
            Ok(Err(e)) => Err(map_err(&e, "checking an advisory lock")),
            Err(_) => Err(Error::new(
                ErrorKind::TimedOut,
                "checking an advisory lock: no reply in time",
            )),
        }
    }

    fn store_id(&self) -> String {
        self.inner.store_id.clone()
    }

    fn store_label(&self) -> &'static str {
        "postgres-advisory"
    }

    fn engine(&self) -> &Engine {
        &self.inner.engine
    }
}

impl RawInspect for PgAdvisory {
    /// Only the plain lock: advisory locks have no other kind.
    async fn inspect(&self, kind: Kind, keys: &LockKeys) -> Result<LockState> {
        match kind {
            Kind::Lock => self.inspect_plain(keys).await,
            _ => Err(kind.unsupported(self.store_label())),
        }
    }

    /// Only the plain lock: advisory locks have no other kind.
    async fn force_unlock(&self, kind: Kind, keys: &LockKeys) -> Result<bool> {
        match kind {
            Kind::Lock => self.force_unlock_plain(keys).await,
            _ => Err(kind.unsupported(self.store_label())),
        }
    }

    /// Advisory keys are hashes: the names behind them cannot be listed.
    async fn list(&self, _prefix: &str, pattern: &str, _limit: usize) -> Result<Vec<String>> {
        crate::observe::listed(self.store_label(), pattern, async move {
            Err(Error::invalid(
                "advisory locks cannot be listed: PostgreSQL keeps only their 64-bit hashes",
            ))
        })
        .await
    }
}

/// The plain lock's inspection, for [`RawInspect`].
impl PgAdvisory {
    /// The holder is shown as its session's backend pid (`pid <n>`, or `<n> sessions` for
    /// shared holders); waiting clients are sessions blocked in `pg_advisory_lock` on the
    /// same key (dlock's own waiters poll, and are not counted). No ttl, no fence.
    pub(crate) async fn inspect_plain(&self, keys: &LockKeys) -> Result<LockState> {
        check_key(keys)?;
        let session = self.session().await?;
        let sql = format!(
            "SELECT count(*) FILTER (WHERE granted), count(*) FILTER (WHERE NOT granted),
                    min(pid) FILTER (WHERE granted) {KEY_ROWS}"
        );
        let row = tokio::time::timeout(
            CALL_TIMEOUT,
            session.client.query_one(sql.as_str(), &[&keys.lock()]),
        )
        .await
        .map_err(|_| {
            Error::new(
                ErrorKind::TimedOut,
                "inspecting an advisory lock: no reply in time",
            )
        })?
        .map_err(|e| map_err(&e, "inspecting an advisory lock"))?;
        self.park(session);
        let holders: i64 = row.get(0);
        let waiting: i64 = row.get(1);
        let holder = match holders {
            0 => None,
            1 => row.get::<_, Option<i32>>(2).map(|pid| format!("pid {pid}")),
            n => Some(format!("{n} sessions")),
        };
        Ok(LockState::new(holder, None, None)
            .with_holders(u32::try_from(holders).unwrap_or(u32::MAX))
            .with_waiting_clients(u64::try_from(waiting).unwrap_or(0)))
    }

    /// Terminates the sessions holding the lock (`pg_terminate_backend`): the only way to
    /// take an advisory lock from its holder. Needs the privilege to signal those backends.
    pub(crate) async fn force_unlock_plain(&self, keys: &LockKeys) -> Result<bool> {
        check_key(keys)?;
        let session = self.session().await?;
        let sql = format!(
            "SELECT coalesce(bool_or(pg_terminate_backend(pid)), false)
             FROM (SELECT DISTINCT pid {KEY_ROWS} AND granted) holders"
        );
        let row = tokio::time::timeout(
            CALL_TIMEOUT,
            session.client.query_one(sql.as_str(), &[&keys.lock()]),
        )
        .await
        .map_err(|_| {
            Error::new(
                ErrorKind::TimedOut,
                "force-unlocking an advisory lock: no reply in time",
            )
        })?
        .map_err(|e| map_err(&e, "force-unlocking an advisory lock"))?;
        self.park(session);
        Ok(row.get::<_, bool>(0))
    }
}
