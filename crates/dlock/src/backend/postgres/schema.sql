-- dlock's objects in one schema; "S" stands for the quoted schema name. Idempotent: a
-- client runs all of it, under a transaction-scoped advisory lock, when any is missing.
CREATE SCHEMA IF NOT EXISTS "S";

-- One row per lock name, kept after release so that its fence only ever grows.
CREATE TABLE IF NOT EXISTS "S".locks (
    key        text COLLATE "C" PRIMARY KEY,
    holder     text,
    expires_at timestamptz,
    fence      bigint NOT NULL DEFAULT 0
);

-- Waiters queued for a lock, in arrival order. A release wakes the head only, on its
-- client's channel; a waiter's place lapses at claim_until unless it comes again.
CREATE TABLE IF NOT EXISTS "S".waiters (
    key         text COLLATE "C",
    token       text,
    channel     text NOT NULL,
    arrival     bigint GENERATED ALWAYS AS IDENTITY,
    claim_until timestamptz NOT NULL,
    PRIMARY KEY (key, token)
);
CREATE INDEX IF NOT EXISTS waiters_in_order ON "S".waiters (key, arrival);

-- Take lock k for tok for ttl_ms, or report how long to wait. With chan, a caller that
-- must wait takes (or keeps) a place in the queue, claimed until its next attempt plus
-- grace_ms; a free lock goes to the head of the queue only (no barging). A repeat of a
-- granted request renews it and reports the same fence.
-- Returns (granted, fence, wait_ms): the fence of the grant, or the name's latest.
CREATE OR REPLACE FUNCTION "S".acquire(k text, tok text, ttl_ms bigint, chan text,
                                       grace_ms bigint)
RETURNS TABLE (granted boolean, fence bigint, wait_ms bigint)
LANGUAGE plpgsql AS $fn$
DECLARE
    r      "S".locks%ROWTYPE;
    head   "S".waiters%ROWTYPE;
    now_ts timestamptz;
    w      bigint;
BEGIN
    INSERT INTO "S".locks AS l (key) VALUES (k) ON CONFLICT (key) DO NOTHING;
    -- The row lock serialises every operation on k; the clock is read after it.
    SELECT * INTO r FROM "S".locks AS l WHERE l.key = k FOR UPDATE;
    now_ts := clock_timestamp();
    IF r.holder = tok AND r.expires_at > now_ts THEN
        UPDATE "S".locks AS l SET expires_at = now_ts + ttl_ms * interval '1 millisecond'
        WHERE l.key = k;
        RETURN QUERY SELECT true, r.fence, 0::bigint;
        RETURN;
    END IF;
    DELETE FROM "S".waiters AS q WHERE q.key = k AND q.claim_until <= now_ts;
    SELECT * INTO head FROM "S".waiters AS q WHERE q.key = k ORDER BY q.arrival LIMIT 1;
    IF (r.holder IS NULL OR r.expires_at <= now_ts)
       AND (head.token IS NULL OR head.token = tok) THEN
        UPDATE "S".locks AS l
        SET holder = tok, expires_at = now_ts + ttl_ms * interval '1 millisecond',
            fence = l.fence + 1
        WHERE l.key = k
        RETURNING l.fence INTO r.fence;
        IF head.token IS NOT NULL THEN
            DELETE FROM "S".waiters AS q WHERE q.key = k AND q.token = tok;
        END IF;
        RETURN QUERY SELECT true, r.fence, 0::bigint;
        RETURN;
    END IF;
    IF r.holder IS NOT NULL AND r.expires_at > now_ts THEN
        w := ceil(extract(epoch FROM r.expires_at - now_ts) * 1000);
    ELSE
        -- Free, but the head's: look again when its claim ends, or within a lease (claims
        -- behind a head that never comes must not chain).
        w := least(ttl_ms, greatest(0, ceil(extract(epoch FROM head.claim_until - now_ts) * 1000)));
    END IF;
    IF chan IS NOT NULL THEN
        INSERT INTO "S".waiters AS q (key, token, channel, claim_until)
        VALUES (k, tok, chan, now_ts + (w + grace_ms) * interval '1 millisecond')
        ON CONFLICT (key, token) DO UPDATE
        SET channel = excluded.channel, claim_until = excluded.claim_until;
    END IF;
    RETURN QUERY SELECT false, r.fence, w;
END
$fn$;

-- Release k: 'own' (tok's hold), 'force' (whoever holds it) or 'leave' (tok stops waiting).
-- When the lock is free afterwards, the head of the queue is woken (pg_notify on its
-- client's channel, naming its token; sent at commit) and has wake_ms to come.
-- Returns whether a hold was released ('own', 'force') or tok was queued ('leave').
CREATE OR REPLACE FUNCTION "S".release(k text, tok text, mode text, wake_ms bigint)
RETURNS boolean
LANGUAGE plpgsql AS $fn$
DECLARE
    done   boolean;
    held   boolean;
    head   "S".waiters%ROWTYPE;
    now_ts timestamptz;
BEGIN
    IF mode = 'own' THEN
        UPDATE "S".locks AS l SET holder = NULL, expires_at = NULL
        WHERE l.key = k AND l.holder = tok AND l.expires_at > clock_timestamp();
        done := FOUND;
    ELSIF mode = 'force' THEN
        UPDATE "S".locks AS l SET holder = NULL, expires_at = NULL
        WHERE l.key = k AND l.expires_at > clock_timestamp();
        done := FOUND;
    ELSE
        SELECT l.holder IS NOT NULL AND l.expires_at > clock_timestamp() INTO held
        FROM "S".locks AS l WHERE l.key = k FOR UPDATE;
        DELETE FROM "S".waiters AS q WHERE q.key = k AND q.token = tok;
        done := FOUND;
        IF held IS NOT FALSE OR NOT done THEN
            RETURN done;
        END IF;
    END IF;
    IF NOT done THEN
        RETURN false;
    END IF;
    now_ts := clock_timestamp();
    DELETE FROM "S".waiters AS q WHERE q.key = k AND q.claim_until <= now_ts;
    SELECT * INTO head FROM "S".waiters AS q WHERE q.key = k ORDER BY q.arrival LIMIT 1;
    IF head.token IS NOT NULL THEN
        UPDATE "S".waiters AS q
        SET claim_until = least(q.claim_until, now_ts + wake_ms * interval '1 millisecond')
        WHERE q.key = k AND q.token = head.token;
        PERFORM pg_notify(head.channel, head.token);
    END IF;
    RETURN done;
END
$fn$;
