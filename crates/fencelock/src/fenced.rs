//! The resource side of fencing: writes that the resource itself refuses when they carry a
//! fence below the highest it has seen (the "database optimistic lock" of the classic articles).
//!
//! A lease lock cannot stop a holder that stalls past its lease between checking its lock
//! and writing (a GC pause, a stalled VM): only the resource can, by remembering the
//! highest [`FencingToken`](crate::FencingToken) it has accepted and turning away anything older. These helpers
//! do that check and the write in one atomic step, and report a refusal as a typed
//! [`StaleFence`]:
//!
//! * [`RedisFenced`] (feature `redis`): a string value at a key, guarded by the highest
//!   fence seen, kept at `<key>:fence`; one script per access, optionally appending every
//!   accepted fence to a journal list.
//! * [`PgFencedTable`] (feature `postgres`): rows of your own table, with a fence column
//!   added by [`PgFencedTable::migration_sql`]; an update is `UPDATE … SET …, fence = $f
//!   WHERE key = $k AND fence <= $f`.
//!
//! A fence is accepted if it is **at least** the highest seen: the same holder may access
//! the resource many times under one grant.
//!
// Without their features, the helpers above link to this module's page (docs.rs, with
// every feature, shows them all).
#![cfg_attr(not(feature = "redis"), doc = "[`RedisFenced`]: self")]
#![cfg_attr(
    not(feature = "postgres"),
    doc = "[`PgFencedTable`]: self\n[`PgFencedTable::migration_sql`]: self"
)]

use std::fmt;

/// The resource refused an access: it has already accepted a newer fence, so the caller's
/// lock was (at some point) granted to someone else after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StaleFence {
    /// The fence the refused access carried.
    pub fence: u64,
    /// The highest fence the resource has accepted.
    pub highest: u64,
}

impl fmt::Display for StaleFence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "stale fence {}: the resource has accepted fence {} already (the lock passed to a newer holder)",
            self.fence, self.highest
        )
    }
}

impl std::error::Error for StaleFence {}

#[cfg(feature = "redis")]
pub use self::redis_fenced::RedisFenced;

#[cfg(feature = "redis")]
mod redis_fenced {
    use std::sync::LazyLock;

    use redis::Value;

    use super::StaleFence;
    use crate::error::{Error, ErrorKind, Result};
    use crate::token::FencingToken;

    /// KEYS[1] the value, KEYS[2] the highest fence seen, KEYS[3] (optional) the journal;
    /// ARGV[1] the fence, ARGV[2] 'r' (read) or 'w' (write), ARGV[3] the value to write.
    /// Returns {0, highest} refused, {1} written, {1, value} read (no value: {1}).
    const ACCESS: &str = r"
local highest = tonumber(redis.call('GET', KEYS[2]) or '0')
local fence = tonumber(ARGV[1])
if fence < highest then
  return {0, highest}
end
if fence > highest then
  redis.call('SET', KEYS[2], ARGV[1])
end
if ARGV[2] == 'w' then
  redis.call('SET', KEYS[1], ARGV[3])
  if KEYS[3] then
    redis.call('RPUSH', KEYS[3], ARGV[1])
  end
  return {1}
end
local value = redis.call('GET', KEYS[1])
if value then
  return {1, value}
end
return {1}
";

    /// The script's reply for an access under `fence` to `key`: refused (with the highest
    /// fence seen), done, or done with the value read; anything else is a `Backend` error.
    fn decode_access(
        reply: Vec<Value>,
        fence: u64,
        key: &str,
    ) -> Result<std::result::Result<Option<Value>, StaleFence>> {
        let int = |v: &Value| match v {
            Value::Int(n) => u64::try_from(*n).ok(),
            _ => None,
        };
        match reply.as_slice() {
            [ok, highest] if int(ok) == Some(0) => Ok(Err(StaleFence {
                fence,
                highest: int(highest).unwrap_or(0),
            })),
            [ok] if int(ok) == Some(1) => Ok(Ok(None)),
            [ok, value] if int(ok) == Some(1) => Ok(Ok(Some(value.clone()))),
            other => Err(Error::new(
                ErrorKind::Backend,
                format!("fenced access to {key}: unexpected reply {other:?}"),
            )),
        }
    }

    static SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(ACCESS));

    /// A string value in Redis that only accepts accesses whose fence is at least the
    /// highest it has seen (kept at `<key>:fence`). On a Redis Cluster, give the key a
    /// hash tag (`{stock}:sku-1`) so that its fence key lands in the same slot.
    ///
    /// ```no_run
    /// # async fn demo(guard: fencelock::LockGuard<fencelock::backend::Redis>) -> Result<(), Box<dyn std::error::Error>> {
    /// let mut conn = redis::Client::open("redis://127.0.0.1/")?
    ///     .get_multiplexed_async_connection()
    ///     .await?;
    /// let stock = fencelock::fenced::RedisFenced::new("stock:sku-1");
    /// let fence = guard.fencing_token();
    /// let left: i64 = match stock.read(&mut conn, fence).await? {
    ///     Ok(v) => v.and_then(|v| v.parse().ok()).unwrap_or(0),
    ///     Err(stale) => return Err(stale.into()), // a newer holder got there first
    /// };
    /// if left > 0 {
    ///     stock.write(&mut conn, fence, &(left - 1).to_string()).await??;
    /// }
    /// # Ok(()) }
    /// ```
    #[derive(Debug, Clone)]
    pub struct RedisFenced {
        key: String,
        fence_key: String,
        journal: Option<String>,
    }

    impl RedisFenced {
        /// The value at `key`, its highest fence at `<key>:fence`.
        pub fn new(key: impl Into<String>) -> RedisFenced {
            let key = key.into();
            RedisFenced {
                fence_key: format!("{key}:fence"),
                key,
                journal: None,
            }
        }

        /// Keeps the highest fence at `fence_key` instead.
        #[must_use]
        pub fn fence_key(mut self, fence_key: impl Into<String>) -> RedisFenced {
            self.fence_key = fence_key.into();
            self
        }

        /// Also appends every accepted write's fence to the list at `journal`, in the same
        /// step (an audit trail: the order in which the resource accepted its writes).
        #[must_use]
        pub fn journal(mut self, journal: impl Into<String>) -> RedisFenced {
            self.journal = Some(journal.into());
            self
        }

        /// The key of the value.
        pub fn key(&self) -> &str {
            &self.key
        }

        async fn access<C: redis::aio::ConnectionLike>(
            &self,
            conn: &mut C,
            fence: FencingToken,
            write: Option<&str>,
        ) -> Result<std::result::Result<Option<Value>, StaleFence>> {
            let mut invocation = SCRIPT.key(&self.key);
            invocation.key(&self.fence_key);
            if let Some(journal) = &self.journal {
                invocation.key(journal);
            }
            invocation
                .arg(fence.get())
                .arg(if write.is_some() { "w" } else { "r" })
                .arg(write.unwrap_or(""));
            let reply: Vec<Value> = invocation.invoke_async(conn).await.map_err(|e| {
                let retryable = e.is_io_error() || e.is_timeout() || e.is_connection_dropped();
                Error::new(
                    if retryable {
                        ErrorKind::Unavailable
                    } else {
                        ErrorKind::Backend
                    },
                    format!("fenced access to {}: {e}", self.key),
                )
            })?;
            decode_access(reply, fence.get(), &self.key)
        }

        /// Reads the value under `fence` (recording it as the highest seen, so that older
        /// holders are refused from now on). `Ok(Err(StaleFence))` if a newer fence was
        /// seen already.
        ///
        /// # Errors
        /// Redis failures.
        pub async fn read<C: redis::aio::ConnectionLike>(
            &self,
            conn: &mut C,
            fence: FencingToken,
        ) -> Result<std::result::Result<Option<String>, StaleFence>> {
            Ok(self.access(conn, fence, None).await?.map(|v| match v {
                Some(Value::BulkString(bytes)) => {
                    Some(String::from_utf8_lossy(&bytes).into_owned())
                }
                Some(Value::SimpleString(s)) => Some(s),
                _ => None,
            }))
        }

        /// Writes `value` under `fence`, unless a newer fence was seen already
        /// (`Ok(Err(StaleFence))`, nothing written).
        ///
        /// # Errors
        /// Redis failures.
        pub async fn write<C: redis::aio::ConnectionLike>(
            &self,
            conn: &mut C,
            fence: FencingToken,
            value: &str,
        ) -> Result<std::result::Result<(), StaleFence>> {
            Ok(self.access(conn, fence, Some(value)).await?.map(|_| ()))
        }
    }

    /// Hostile input: whatever the script's reply holds.
    #[cfg(test)]
    mod props {
        use proptest::prelude::*;
        use redis::Value;

        use super::{StaleFence, decode_access};

        fn value() -> impl Strategy<Value = Value> {
            prop_oneof![
                Just(Value::Nil),
                (-2i64..3).prop_map(Value::Int),
                any::<i64>().prop_map(Value::Int),
                prop::collection::vec(any::<u8>(), 0..16).prop_map(Value::BulkString),
                "[ -~]{0,8}".prop_map(Value::SimpleString),
                Just(Value::Array(vec![])),
            ]
        }

        proptest! {
            #![proptest_config(dlock_hostile::cases(256))]

            #[test]
            fn any_reply_decodes_or_is_a_backend_error(
                reply in prop::collection::vec(value(), 0..4),
                fence in any::<u64>(),
            ) {
                let ok = |v: &Value| matches!(v, Value::Int(n) if *n == 1);
                let refused = |v: &Value| matches!(v, Value::Int(0));
                match decode_access(reply.clone(), fence, "k") {
                    Ok(Err(StaleFence { fence: f, .. })) => {
                        prop_assert_eq!(f, fence);
                        prop_assert!(reply.len() == 2 && refused(&reply[0]));
                    }
                    Ok(Ok(None)) => prop_assert!(reply.len() == 1 && ok(&reply[0])),
                    Ok(Ok(Some(v))) => {
                        prop_assert!(reply.len() == 2 && ok(&reply[0]));
                        prop_assert_eq!(&v, &reply[1]);
                    }
                    Err(e) => prop_assert_eq!(e.kind(), crate::ErrorKind::Backend),
                }
            }

            #[test]
            fn refusals_carry_the_highest_fence(fence in any::<u64>(), highest in 0..i64::MAX) {
                let decoded = decode_access(vec![Value::Int(0), Value::Int(highest)], fence, "k")
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                prop_assert_eq!(
                    decoded,
                    Err(StaleFence { fence, highest: highest.unsigned_abs() })
                );
            }
        }
    }
}

#[cfg(feature = "postgres")]
pub use self::pg_fenced::PgFencedTable;

#[cfg(feature = "postgres")]
mod pg_fenced {
    use tokio_postgres::GenericClient;
    use tokio_postgres::types::ToSql;

    use super::StaleFence;
    use crate::error::{Error, Result};
    use crate::token::FencingToken;

    /// Rows of your own PostgreSQL table that only accept updates whose fence is at least
    /// the highest the row has seen, kept in a fence column (`dlock_fence` unless you name
    /// another) that [`migration_sql`](PgFencedTable::migration_sql) adds.
    ///
    /// ```no_run
    /// # async fn demo(client: &tokio_postgres::Client, guard: fencelock::LockGuard<fencelock::backend::Postgres>) -> Result<(), Box<dyn std::error::Error>> {
    /// let stock = fencelock::fenced::PgFencedTable::new("shop.stock", "sku")?;
    /// client.batch_execute(&stock.migration_sql()).await?; // once, with your migrations
    /// // UPDATE shop.stock SET qty = qty - 1, dlock_fence = $3
    /// //   WHERE sku = $2 AND dlock_fence <= $3 AND qty > 0
    /// match stock
    ///     .update(client, "qty = qty - 1", "qty > 0", &[], &"sku-1", guard.fencing_token())
    ///     .await?
    /// {
    ///     Ok(0) => println!("sold out"),
    ///     Ok(_) => println!("sold one"),
    ///     Err(stale) => println!("refused: {stale}"),
    /// }
    /// # Ok(()) }
    /// ```
    #[derive(Debug, Clone)]
    pub struct PgFencedTable {
        table: String,
        key: String,
        fence: String,
    }

    /// `name` quoted, if it is a plain identifier (optionally `schema.name`).
    fn quoted(name: &str, what: &str) -> Result<String> {
        let part = |p: &str| {
            !p.is_empty()
                && p.len() <= 63
                && !p.starts_with(|c: char| c.is_ascii_digit())
                && p.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        };
        let parts: Vec<&str> = name.split('.').collect();
        if parts.len() > 2 || !parts.iter().all(|p| part(p)) {
            return Err(Error::invalid(format!(
                "invalid {what} {name:?}: use lowercase letters, digits and '_' (a table may be schema.table)"
            )));
        }
        Ok(parts
            .iter()
            .map(|p| format!("\"{p}\""))
            .collect::<Vec<_>>()
            .join("."))
    }

    impl PgFencedTable {
        /// Rows of `table` (`name` or `schema.name`) found by `key_column`.
        ///
        /// # Errors
        /// [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) unless both
        /// are plain lowercase identifiers.
        pub fn new(table: &str, key_column: &str) -> Result<PgFencedTable> {
            Ok(PgFencedTable {
                table: quoted(table, "table name")?,
                key: quoted(key_column, "column name")?,
                fence: quoted("dlock_fence", "column name")?,
            })
        }

        /// Keeps the fence in `column` instead of `dlock_fence`.
        ///
        /// # Errors
        /// As [`new`](PgFencedTable::new).
        pub fn fence_column(mut self, column: &str) -> Result<PgFencedTable> {
            self.fence = quoted(column, "column name")?;
            Ok(self)
        }

        /// The migration that adds the fence column (idempotent).
        pub fn migration_sql(&self) -> String {
            format!(
                "ALTER TABLE {} ADD COLUMN IF NOT EXISTS {} bigint NOT NULL DEFAULT 0;",
                self.table, self.fence
            )
        }

        /// Runs `UPDATE <table> SET <set>, <fence> = $f WHERE <key> = $k AND <fence> <= $f
        /// [AND <only_if>]` and returns how many rows it changed, or `Err(StaleFence)` if
        /// the row has accepted a newer fence. `set` and `only_if` are SQL you write (never
        /// user input): their parameters are `$1..$n`, bound from `params`; the key and the
        /// fence follow as `$n+1` and `$n+2`. `Ok(0)` means no such row, or `only_if` was
        /// false.
        ///
        /// # Errors
        /// Store failures (as [`Postgres`](crate::backend::Postgres) maps them).
        pub async fn update<C: GenericClient + Sync>(
            &self,
            client: &C,
            set: &str,
            only_if: &str,
            params: &[&(dyn ToSql + Sync)],
            key: &(dyn ToSql + Sync),
            fence: FencingToken,
        ) -> Result<std::result::Result<u64, StaleFence>> {
            let n = params.len();
            let value = i64::try_from(fence.get()).unwrap_or(i64::MAX);
            let condition = if only_if.trim().is_empty() {
                String::new()
            } else {
                format!(" AND ({only_if})")
            };
            let sql = format!(
                "UPDATE {t} SET {set}, {f} = ${fp} WHERE {k} = ${kp} AND {f} <= ${fp}{condition}",
                t = self.table,
                f = self.fence,
                k = self.key,
                kp = n + 1,
                fp = n + 2,
            );
            let mut all: Vec<&(dyn ToSql + Sync)> = params.to_vec();
            all.push(key);
            all.push(&value);
            let doing = "a fenced update";
            let changed = client
                .execute(sql.as_str(), &all)
                .await
                .map_err(|e| crate::backend::postgres::map_err(&e, doing))?;
            if changed > 0 {
                return Ok(Ok(changed));
            }
            let row = client
                .query_opt(
                    format!(
                        "SELECT {f} FROM {t} WHERE {k} = $1",
                        f = self.fence,
                        t = self.table,
                        k = self.key
                    )
                    .as_str(),
                    &[key],
                )
                .await
                .map_err(|e| crate::backend::postgres::map_err(&e, doing))?;
            match row.map(|r| r.get::<_, i64>(0)) {
                Some(highest) if highest > value => Ok(Err(StaleFence {
                    fence: fence.get(),
                    highest: u64::try_from(highest).unwrap_or(0),
                })),
                _ => Ok(Ok(0)),
            }
        }

        /// Reads `columns` (SQL you write) of the row at `key` under `fence`, recording the
        /// fence as the row's highest so that older holders are refused from now on (a
        /// fenced read takes the row lock, as the update does). `Ok(None)`: no such row.
        ///
        /// # Errors
        /// Store failures.
        pub async fn read<C: GenericClient + Sync>(
            &self,
            client: &C,
            columns: &str,
            key: &(dyn ToSql + Sync),
            fence: FencingToken,
        ) -> Result<std::result::Result<Option<tokio_postgres::Row>, StaleFence>> {
            let value = i64::try_from(fence.get()).unwrap_or(i64::MAX);
            let sql = format!(
                "UPDATE {t} SET {f} = $2 WHERE {k} = $1 AND {f} <= $2 RETURNING {columns}",
                t = self.table,
                f = self.fence,
                k = self.key,
            );
            let doing = "a fenced read";
            let row = client
                .query_opt(sql.as_str(), &[key, &value])
                .await
                .map_err(|e| crate::backend::postgres::map_err(&e, doing))?;
            if row.is_some() {
                return Ok(Ok(row));
            }
            let highest = client
                .query_opt(
                    format!(
                        "SELECT {f} FROM {t} WHERE {k} = $1",
                        f = self.fence,
                        t = self.table,
                        k = self.key
                    )
                    .as_str(),
                    &[key],
                )
                .await
                .map_err(|e| crate::backend::postgres::map_err(&e, doing))?;
            match highest.map(|r| r.get::<_, i64>(0)) {
                Some(h) if h > value => Ok(Err(StaleFence {
                    fence: fence.get(),
                    highest: u64::try_from(h).unwrap_or(0),
                })),
                _ => Ok(Ok(None)),
            }
        }
    }
}
