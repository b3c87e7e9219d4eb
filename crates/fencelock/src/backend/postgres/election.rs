//! Elections' records: one row of `<schema>.records` per election, keyed by its lock key.

use super::{Postgres, check_key};
use crate::error::{Error, ErrorKind, Result};
use crate::keys::LockKeys;
use crate::raw::{RawElection, ReleaseWatch};
use crate::token::Token;

/// The record is a row written by one statement — `INSERT … SELECT … WHERE EXISTS (the
/// lock's row holds the token, its lease not run out by the server's clock) ON CONFLICT
/// DO UPDATE`, the lock's row kept `FOR SHARE` until the write commits — that also
/// announces the write (`pg_notify` on `dlk_records`, sent at commit, only when the row
/// was written). Terms are not compared. Observers of every client hear it on their
/// client's `LISTEN` connection.
impl RawElection for Postgres {
    async fn publish(&self, keys: &LockKeys, token: &Token, term: u64, data: &str) -> Result<bool> {
        check_key(keys)?;
        let term = i64::try_from(term).map_err(|_| {
            Error::invalid(format!(
                "election {:?}: term {term} does not fit PostgreSQL's bigint",
                keys.name()
            ))
        })?;
        if data.contains('\0') {
            // PostgreSQL's text cannot hold it (the server would refuse the statement).
            return Err(Error::invalid(format!(
                "election {:?}: a value stored in PostgreSQL cannot contain NUL characters",
                keys.name()
            )));
        }
        let rows = self
            .query(
                &self.inner.sql.publish,
                &[&keys.lock(), &term, &data, &token.as_str()],
                "publishing an election's record",
            )
            .await?;
        Ok(rows.first().is_some_and(|row| row.get::<_, bool>(0)))
    }

    async fn record(&self, keys: &LockKeys) -> Result<Option<(u64, String)>> {
        check_key(keys)?;
        let doing = "reading an election's record";
        let rows = self
            .query(&self.inner.sql.record, &[&keys.lock()], doing)
            .await?;
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        let term = u64::try_from(row.get::<_, i64>(0)).map_err(|_| {
            Error::new(
                ErrorKind::Backend,
                format!(
                    "{doing}: election {:?} has a negative term stored",
                    keys.name()
                ),
            )
        })?;
        Ok(Some((term, row.get(1))))
    }

    /// Every client's writes of records are announced on one shared channel
    /// (`dlk_records`, the lock key as payload), which this client's `LISTEN` connection
    /// listens on from the first observer on.
    async fn watch_record(&self, keys: &LockKeys) -> Result<ReleaseWatch> {
        check_key(keys)?;
        self.inner.listener.watch_record(keys.lock()).await
    }
}
