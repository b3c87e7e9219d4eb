-- The statements dlock's client runs against the objects of schema.sql, one after each
-- `-- statement: NAME` line; "S" stands for the quoted schema name, as in schema.sql.
-- Times left are milliseconds by the server's clock, never negative:
--   greatest(0, ceil(extract(epoch FROM (<expiry> - clock_timestamp())) * 1000))::bigint
-- A plain lock's waiters are those queued in "S".waiters (role 'l', claim not lapsed) and
-- those waiting in the server for its gate (a bigint advisory lock: classid is its high
-- half, objid its low half).

-- statement: acquire
SELECT granted, fence, wait_ms FROM "S".acquire($1::text, $2::text,
  $3::bigint, $4::boolean, $5::text, $6::text, $7::bigint, $8::boolean, $9::int)

-- statement: gate_acquire
SELECT granted, fence, wait_ms, gated FROM "S".gate_acquire($1::text, $2::text,
  $3::bigint, $4::text, $5::bigint, $6::boolean, $7::int, $8::boolean)

-- statement: gate_release
SELECT "S".gate_release($1::text, $2::text, $3::text, $4::bigint)

-- statement: release
SELECT "S".release($1::text, $2::text, $3::text, $4::bigint)

-- statement: extend
SELECT "S".extend_one($1::text, $2::text, $3::text, $4::bigint)

-- statement: extend_many
SELECT i FROM "S".extend_many($1::text[], $2::text[], $3::text[], $4::bigint[]) AS i

-- statement: inspect
-- Holder, its time left, fence, waiters (queued and at the gate).
SELECT CASE WHEN l.expires_at > clock_timestamp() THEN l.holder END,
       CASE WHEN l.expires_at > clock_timestamp() THEN
         greatest(0, ceil(extract(epoch FROM (l.expires_at - clock_timestamp())) * 1000))::bigint
       END,
       l.fence,
       (SELECT count(*) FROM "S".waiters q
         WHERE q.key = $1 AND q.role = 'l' AND q.claim_until > clock_timestamp())
       + (SELECT count(*) FROM pg_locks p
           WHERE p.locktype = 'advisory' AND NOT p.granted AND p.objsubid = 1
             AND p.database = (SELECT oid FROM pg_database WHERE datname = current_database())
             AND ((p.classid::bigint << 32) | p.objid::bigint) = "S".gate_key($1))
FROM "S".locks l WHERE l.key = $1

-- statement: list
SELECT l.key FROM "S".locks l
WHERE starts_with(l.key, $1)
  AND (l.expires_at > clock_timestamp()
       OR EXISTS (SELECT 1 FROM "S".leases e
                  WHERE e.key = l.key AND e.role <> 'h' AND e.expires_at > clock_timestamp()))

-- statement: sem_acquire
SELECT granted, fence, wait_ms, stored FROM "S".sem_acquire_checked($1::text,
  $2::text, $3::int, $4::int, $5::boolean, $6::bigint, $7::boolean, $8::text,
  $9::bigint, $10::bigint)

-- statement: sem_release
SELECT "S".sem_release($1::text, $2::text, $3::text, $4::bigint)

-- statement: sem_resize
SELECT "S".sem_resize($1::text, $2::int, $3::bigint, $4::int, $5::int, $6::bigint)

-- statement: sem_inspect
-- Permits in use, holders, the latest lease's time left, the stored count, queued
-- waiters.
SELECT coalesce(sum(e.n), 0)::bigint, count(e.token),
       max(greatest(0, ceil(extract(epoch FROM (e.expires_at - clock_timestamp())) * 1000))::bigint),
       (SELECT l.permits FROM "S".locks l WHERE l.key = $1),
       (SELECT count(*) FROM "S".waiters q
         WHERE q.key = $1 AND q.role = 'l' AND q.claim_until > clock_timestamp())
FROM "S".leases e WHERE e.key = $1 AND e.role = 'p' AND e.expires_at > clock_timestamp()

-- statement: re_acquire
SELECT status, fence, wait_ms FROM "S".re_acquire($1::text, $2::text, $3::text,
  $4::bigint, $5::int, $6::boolean, $7::text, $8::bigint)

-- statement: re_release
SELECT "S".re_release($1::text, $2::text, $3::text, $4::text, $5::bigint)

-- statement: re_inspect
-- Owner, its time left, fence, hold count, queued waiters.
SELECT CASE WHEN l.expires_at > clock_timestamp() THEN l.holder END,
       CASE WHEN l.expires_at > clock_timestamp() THEN
         greatest(0, ceil(extract(epoch FROM (l.expires_at - clock_timestamp())) * 1000))::bigint
       END,
       l.fence,
       CASE WHEN l.expires_at > clock_timestamp() THEN
         (SELECT count(*) FROM "S".leases e WHERE e.key = $1 AND e.role = 'h')
       ELSE 0 END,
       (SELECT count(*) FROM "S".waiters q
         WHERE q.key = $1 AND q.role = 'l' AND q.claim_until > clock_timestamp())
FROM "S".locks l WHERE l.key = $1

-- statement: rw_acquire
SELECT granted, fence, wait_ms FROM "S".rw_acquire($1::text, $2::text,
  $3::boolean, $4::bigint, $5::bigint, $6::text, $7::text)

-- statement: rw_release
SELECT "S".rw_release($1::text, $2::text, $3::text, $4::bigint, $5::bigint)

-- statement: rw_inspect
-- Writer, its time left, fence, live readers, the latest reader's time left, waiting
-- writers.
SELECT CASE WHEN l.expires_at > clock_timestamp() THEN l.holder END,
       CASE WHEN l.expires_at > clock_timestamp() THEN
         greatest(0, ceil(extract(epoch FROM (l.expires_at - clock_timestamp())) * 1000))::bigint
       END,
       l.fence,
       (SELECT count(*) FROM "S".leases e
         WHERE e.key = $1 AND e.role = 'r' AND e.expires_at > clock_timestamp()),
       (SELECT max(greatest(0, ceil(extract(epoch FROM (e.expires_at - clock_timestamp())) * 1000))::bigint)
          FROM "S".leases e
         WHERE e.key = $1 AND e.role = 'r' AND e.expires_at > clock_timestamp()),
       (SELECT count(*) FROM "S".waiters q
         WHERE q.key = $1 AND q.role = 'l' AND q.claim_until > clock_timestamp())
FROM "S".locks l WHERE l.key = $1

-- statement: publish
-- An election's record, written only while $4 holds the election's lock (the condition
-- of release and extend), and announced (at commit, on the channel the client's listener
-- follows) only when written: whether it was. The terms are not compared (a fence counter
-- that went back must not stop the election). FOR SHARE keeps the lock's row as it was
-- checked until the write commits: a release, an expiry's grant or a hand-over waits for
-- it, and a publish that waited for one of them checks the row as they left it (READ
-- COMMITTED rechecks a locked row's newest version).
WITH written AS (
    INSERT INTO "S".records AS r (key, term, data)
    SELECT $1::text, $2::bigint, $3::text
    WHERE EXISTS (SELECT 1 FROM "S".locks l
                  WHERE l.key = $1 AND l.holder = $4::text
                    AND l.expires_at > clock_timestamp()
                  FOR SHARE)
    ON CONFLICT (key) DO UPDATE SET term = excluded.term, data = excluded.data
    RETURNING r.key
)
SELECT count(pg_notify('dlk_records', w.key)::text) > 0 FROM written w

-- statement: record
SELECT term, data FROM "S".records WHERE key = $1
