-- dlock's objects in one schema; "S" stands for the quoted schema name. Idempotent: a
-- client runs all of it, under a transaction-scoped advisory lock, when any is missing.
CREATE SCHEMA IF NOT EXISTS "S";

-- One row per lock name, kept after release so that its fence only ever grows.
CREATE TABLE IF NOT EXISTS "S".locks (
    key        text COLLATE "C" PRIMARY KEY,
    holder     text,
    expires_at timestamptz,
    fence      bigint NOT NULL DEFAULT 0,
    permits    int  -- a semaphore's permit count
);

-- Leases of the primitives with more than one holder: a semaphore's permit holders
-- (role 'p', n permits), a read-write lock's readers ('r'), a reentrant lock's holds
-- ('h': one row per hold's request token; the lock's row has the owner and the expiry).
CREATE TABLE IF NOT EXISTS "S".leases (
    key        text COLLATE "C",
    token      text,
    role       "char" NOT NULL,
    n          int NOT NULL DEFAULT 1,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (key, token)
);

-- Waiters queued for a lock, in arrival order (role 'l'; `want` permits of a semaphore).
-- A release wakes the head only, with pg_notify(channel, coalesce(wake, token)) (a null
-- channel: its client did not listen yet, its timer wakes it); a waiter's place lapses at
-- claim_until unless it comes again. A read-write lock's blocked readers leave a row of
-- role 'r' too, which blocks nobody: it tells a release whom to wake.
CREATE TABLE IF NOT EXISTS "S".waiters (
    key         text COLLATE "C",
    token       text,
    role        "char" NOT NULL DEFAULT 'l',
    want        int NOT NULL DEFAULT 1,
    channel     text,
    wake        text,
    arrival     bigint GENERATED ALWAYS AS IDENTITY,
    claim_until timestamptz NOT NULL,
    PRIMARY KEY (key, token)
);
CREATE INDEX IF NOT EXISTS waiters_in_order ON "S".waiters (key, arrival);
-- Lapsed places, found without visiting the live ones: a name's (dropped by every call that
-- looks at its queue) and any name's (a bounded sweep in every such call, so the places
-- killed clients left on names nobody asks for again go too). See queue_head.
CREATE INDEX IF NOT EXISTS waiters_lapsed ON "S".waiters (key, claim_until);
CREATE INDEX IF NOT EXISTS waiters_by_claim ON "S".waiters (claim_until);
-- A waiter a release may hand the lock over to: the lease it asks for, and the backend pid
-- of its client's LISTEN session (a head whose session is gone is skipped).
ALTER TABLE "S".waiters ADD COLUMN IF NOT EXISTS ttl_ms bigint;
ALTER TABLE "S".waiters ADD COLUMN IF NOT EXISTS lpid int;
-- Whether the waiter was told, at its latest attempt, that it was far from the head of the
-- queue (and sleeps long, see far_wait): the hand-over that makes it the head wakes it.
ALTER TABLE "S".waiters ADD COLUMN IF NOT EXISTS far boolean NOT NULL DEFAULT false;

-- One row per election (key: its lock's key): the leader's record, written only while the
-- writer holds the lock (terms are not compared), and announced on the channel dlk_records
-- (payload: the key). Kept for good, like the fence: readers compare its holder with the
-- lock's.
CREATE TABLE IF NOT EXISTS "S".records (
    key  text COLLATE "C" PRIMARY KEY,
    term bigint NOT NULL,
    data text NOT NULL
);

-- Milliseconds from now_ts until t (never negative).
CREATE OR REPLACE FUNCTION "S".ms_until(t timestamptz, now_ts timestamptz) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $fn$
    SELECT greatest(0, ceil(extract(epoch FROM t - now_ts) * 1000))::bigint
$fn$;

-- How long a plain lock's waiter that is neither the head of the queue nor the next one
-- sleeps before it looks again (its place is claimed that long, plus its grace): ten of its
-- leases, within 10 s ..= 40 s, and up to half as much again at random, so that waiters
-- that queued together do not come back together. It needs no earlier look: a release hands
-- the lock to the head, and the hand-over that makes a far waiter the head wakes it
-- (hand_head), so it then looks again once per lease of the holder's, as the head does.
-- Without this, every waiter looked again once per lease of the holder's, and thousands of
-- them kept the name's row busy with their attempts until the head of the queue could no
-- longer come within its grace.
CREATE OR REPLACE FUNCTION "S".far_wait(ttl_ms bigint) RETURNS bigint
LANGUAGE sql VOLATILE AS $fn$
    SELECT (least(greatest(ttl_ms * 10, 10000), 40000) * (1 + random() / 2))::bigint
$fn$;

-- The functions that look at a queue (sweep_waiters, queue_head, hand_head, wake_head,
-- acquire) run with sorts and bitmap scans off, so that the planner takes the queue's
-- indexes in their order whatever its statistics say: a name's head is then one index
-- entry away, not a sort of the whole queue. A table whose statistics were taken while
-- its queues were short (or never: a new table) otherwise gets plans that read every
-- place of the name in every call, and thousands of waiters made each attempt
-- milliseconds long while it kept the name's row.
-- Drops up to 256 lapsed waiters of any name (claims ended by now_ts, the oldest first;
-- rows another call has locked are left to it): places left by killed clients on names
-- nobody asks for again go without an operator, a bounded cost per call.
CREATE OR REPLACE FUNCTION "S".sweep_waiters(now_ts timestamptz) RETURNS void
LANGUAGE sql
SET enable_sort TO off SET enable_bitmapscan TO off AS $fn$
    DELETE FROM "S".waiters AS q
    WHERE q.ctid = ANY (ARRAY(
        SELECT s.ctid FROM "S".waiters AS s
        WHERE s.claim_until <= now_ts
        ORDER BY s.claim_until
        LIMIT 256
        FOR UPDATE SKIP LOCKED))
$fn$;

-- Drops k's lapsed waiters (claims ended by now_ts; through waiters_lapsed, without
-- visiting the live ones) and a bounded batch of any name's, and returns the head of k's
-- queue (role 'l'; a row of nulls when nobody waits).
CREATE OR REPLACE FUNCTION "S".queue_head(k text, now_ts timestamptz) RETURNS "S".waiters
LANGUAGE plpgsql
SET enable_sort TO off SET enable_bitmapscan TO off AS $fn$
DECLARE
    head "S".waiters%ROWTYPE;
BEGIN
    DELETE FROM "S".waiters AS q WHERE q.key = k AND q.claim_until <= now_ts;
    PERFORM "S".sweep_waiters(now_ts);
    SELECT * INTO head FROM "S".waiters AS q
    WHERE q.key = k AND q.role = 'l' ORDER BY q.arrival LIMIT 1;
    RETURN head;
END
$fn$;

-- Takes (or keeps) tok's place in k's queue, claimed until `claim`; with hand_ttl, a
-- release may hand the lock over to it for that long (its client's LISTEN session: lpid).
CREATE OR REPLACE FUNCTION "S".wait_in_line(k text, tok text, r "char", n int, chan text,
                                            wk text, claim timestamptz,
                                            hand_ttl bigint DEFAULT NULL,
                                            listener int DEFAULT NULL)
RETURNS void
LANGUAGE sql AS $fn$
    INSERT INTO "S".waiters AS q (key, token, role, want, channel, wake, claim_until,
                                  ttl_ms, lpid)
    VALUES (k, tok, r, n, chan, wk, claim, hand_ttl, listener)
    ON CONFLICT (key, token) DO UPDATE
    SET channel = coalesce(excluded.channel, q.channel), wake = excluded.wake,
        want = excluded.want, claim_until = excluded.claim_until,
        ttl_ms = excluded.ttl_ms, lpid = coalesce(excluded.lpid, q.lpid)
$fn$;

-- After a plain or fair lock k was freed: hands it over to the head of its queue (the
-- holder set to the head's token with the head's lease, the next fence minted, and
-- pg_notify(<its channel>, '!<fence>:<its wake name>') tells it, at commit, that it holds
-- the lock: it sends nothing more). A head whose LISTEN session is gone is dropped and
-- the next one tried; a head of the wake form (no lease given) is woken instead.
-- Returns whether a head was served.
CREATE OR REPLACE FUNCTION "S".hand_head(k text, wake_ms bigint) RETURNS boolean
LANGUAGE plpgsql
SET enable_sort TO off SET enable_bitmapscan TO off AS $fn$
DECLARE
    head   "S".waiters%ROWTYPE;
    now_ts timestamptz;
    f      bigint;
BEGIN
    LOOP
        now_ts := clock_timestamp();
        head := "S".queue_head(k, now_ts);
        IF head.token IS NULL THEN
            RETURN false;
        END IF;
        IF head.ttl_ms IS NULL OR head.channel IS NULL THEN
            RETURN "S".wake_head(k, wake_ms);
        END IF;
        IF head.lpid IS NULL
           OR EXISTS (SELECT 1 FROM pg_stat_get_activity(head.lpid)) THEN
            UPDATE "S".locks AS l
            SET holder = head.token,
                expires_at = now_ts + head.ttl_ms * interval '1 millisecond',
                fence = l.fence + 1
            WHERE l.key = k
            RETURNING l.fence INTO f;
            DELETE FROM "S".waiters AS q WHERE q.key = k AND q.token = head.token;
            PERFORM pg_notify(head.channel,
                              '!' || f || ':' || coalesce(head.wake, head.token));
            -- The next in line is the head now: if it sleeps long (far), it is woken to
            -- look again, and then looks once per lease of the new holder's, so that a
            -- holder that crashes is followed within its lease.
            SELECT * INTO head FROM "S".waiters AS q
            WHERE q.key = k AND q.role = 'l' ORDER BY q.arrival LIMIT 1;
            IF head.far AND head.channel IS NOT NULL THEN
                UPDATE "S".waiters AS q SET far = false
                WHERE q.key = k AND q.token = head.token;
                PERFORM pg_notify(head.channel, coalesce(head.wake, head.token));
            END IF;
            RETURN true;
        END IF;
        -- Its client no longer listens: it would never learn that it holds the lock. Nor
        -- would any other waiter of k whose client's LISTEN session is gone (killed
        -- clients leave many): all go at once, not one per turn of this loop.
        DELETE FROM "S".waiters AS q WHERE q.key = k AND q.token = head.token;
        DELETE FROM "S".waiters AS q
        WHERE q.key = k AND q.lpid IS NOT NULL
          AND q.lpid NOT IN (SELECT a.pid FROM pg_stat_get_activity(NULL) AS a
                             WHERE a.pid IS NOT NULL);
    END LOOP;
END
$fn$;

-- Drops k's lapsed waiters, then wakes the head of its queue (role 'l') and gives it
-- wake_ms to come. Returns whether there was one.
CREATE OR REPLACE FUNCTION "S".wake_head(k text, wake_ms bigint) RETURNS boolean
LANGUAGE plpgsql
SET enable_sort TO off SET enable_bitmapscan TO off AS $fn$
DECLARE
    head   "S".waiters%ROWTYPE;
    now_ts timestamptz := clock_timestamp();
BEGIN
    head := "S".queue_head(k, now_ts);
    IF head.token IS NULL THEN
        RETURN false;
    END IF;
    UPDATE "S".waiters AS q
    SET claim_until = least(q.claim_until, now_ts + wake_ms * interval '1 millisecond')
    WHERE q.key = k AND q.token = head.token;
    IF head.channel IS NOT NULL THEN
        PERFORM pg_notify(head.channel, coalesce(head.wake, head.token));
    END IF;
    RETURN true;
END
$fn$;

-- The key of lock k's gate: a session advisory lock that a plain lock's waiters queue
-- for inside the server, so that PostgreSQL's lock manager, not NOTIFY, wakes the next.
CREATE OR REPLACE FUNCTION "S".gate_key(k text) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $fn$
    SELECT hashtextextended('dlock-gate:"S":' || k, 0)
$fn$;

-- The key of the mark a waiter woken at k's gate holds (for its transaction) while it
-- takes the lock.
CREATE OR REPLACE FUNCTION "S".taking_key(k text) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $fn$
    SELECT hashtextextended('dlock-taking:"S":' || k, 0)
$fn$;

-- Whether a waiter woken at k's gate is taking the lock right now (it holds the mark; a
-- caller's own mark does not count). A session that keeps the gate while idle — a holder
-- whose lease lapsed while it stalled — holds no mark.
CREATE OR REPLACE FUNCTION "S".gate_busy(k text) RETURNS boolean
LANGUAGE sql AS $fn$
    SELECT NOT pg_try_advisory_xact_lock_shared("S".taking_key(k))
$fn$;

-- Take lock k (a plain or fair lock) for tok for ttl_ms, or report how long to wait. With
-- queue, a caller that must wait takes (or keeps) a place in the queue, claimed until its
-- next attempt plus grace_ms, told on chan with wk (null: its token) — with hand, by a
-- hand-over of the lock (see hand_head; listener: its LISTEN session's pid), else by a
-- wake-up; a free lock goes to the head of the queue only (no barging), and while a
-- waiter woken at its gate is taking it, to that waiter (see gate_busy). A lock whose
-- lease lapsed without a release (its holder crashed or stalled) is handed over to the
-- head of the queue by the first call that sees it, as a release would have. A repeat of
-- a granted request renews it and reports the same fence. A plain lock's waiter that is
-- handed the lock (hand, no wk) and has two places ahead of it is told to wait
-- far_wait (the hand-over that makes it the head wakes it); the head and the next are told
-- the holder's remaining lease. Returns (granted, fence, wait_ms): the grant's fence or
-- the name's latest.
CREATE OR REPLACE FUNCTION "S".acquire(k text, tok text, ttl_ms bigint, queue boolean,
                                       chan text, wk text, grace_ms bigint,
                                       hand boolean, listener int)
RETURNS TABLE (granted boolean, fence bigint, wait_ms bigint)
LANGUAGE plpgsql
SET enable_sort TO off SET enable_bitmapscan TO off AS $fn$
DECLARE
    r      "S".locks%ROWTYPE;
    head   "S".waiters%ROWTYPE;
    now_ts timestamptz;
    w      bigint;
    distant boolean := false;
BEGIN
    -- The row lock serialises every operation on k; the clock is read after it.
    SELECT * INTO r FROM "S".locks AS l WHERE l.key = k FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO "S".locks AS l (key) VALUES (k) ON CONFLICT (key) DO NOTHING;
        SELECT * INTO r FROM "S".locks AS l WHERE l.key = k FOR UPDATE;
    END IF;
    now_ts := clock_timestamp();
    IF r.holder = tok AND r.expires_at > now_ts THEN
        UPDATE "S".locks AS l SET expires_at = now_ts + ttl_ms * interval '1 millisecond'
        WHERE l.key = k;
        RETURN QUERY SELECT true, r.fence, 0::bigint;
        RETURN;
    END IF;
    head := "S".queue_head(k, now_ts);
    IF (r.holder IS NULL OR r.expires_at <= now_ts) AND head.token <> tok
       AND head.ttl_ms IS NOT NULL AND head.channel IS NOT NULL THEN
        -- Lapsed with no release: nobody was handed it. The head is, now (or, when the
        -- places ahead were of gone clients, this caller).
        PERFORM "S".hand_head(k, 1000);
        SELECT * INTO r FROM "S".locks AS l WHERE l.key = k;
        now_ts := clock_timestamp();
        IF r.holder = tok AND r.expires_at > now_ts THEN
            RETURN QUERY SELECT true, r.fence, 0::bigint;
            RETURN;
        END IF;
        SELECT * INTO head FROM "S".waiters AS q
        WHERE q.key = k AND q.role = 'l' ORDER BY q.arrival LIMIT 1;
    END IF;
    IF (r.holder IS NULL OR r.expires_at <= now_ts)
       AND (head.token = tok OR (head.token IS NULL AND NOT "S".gate_busy(k))) THEN
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
        w := "S".ms_until(r.expires_at, now_ts);
    ELSE
        -- Free, but the head's: look again when its claim ends, or within a lease (claims
        -- behind a head that never comes must not chain).
        w := least(ttl_ms, "S".ms_until(head.claim_until, now_ts));
    END IF;
    IF queue AND hand AND wk IS NULL THEN
        -- Two places ahead (this caller's own, if it has one, or the end of the queue).
        SELECT count(*) >= 2 INTO distant FROM (
            SELECT 1 FROM "S".waiters AS q
            WHERE q.key = k AND q.role = 'l' AND q.token <> tok
              AND q.arrival < coalesce((SELECT p.arrival FROM "S".waiters AS p
                                        WHERE p.key = k AND p.token = tok),
                                       9223372036854775807)
            ORDER BY q.arrival LIMIT 2) AS ahead;
        IF distant THEN
            w := greatest(w, "S".far_wait(ttl_ms));
        END IF;
    END IF;
    IF queue THEN
        PERFORM "S".wait_in_line(k, tok, 'l', 1, chan, wk,
                                 now_ts + (w + grace_ms) * interval '1 millisecond',
                                 CASE WHEN hand THEN ttl_ms END, listener);
        UPDATE "S".waiters AS q SET far = distant
        WHERE q.key = k AND q.token = tok AND q.far <> distant;
    END IF;
    RETURN QUERY SELECT false, r.fence, w;
END
$fn$;

-- A plain lock's attempt to take or wait, on a wait session of its own. With first (the
-- session does not have k's gate): if the gate is free, it attempts with the gate in hand
-- and keeps it only if it must wait (as the head of the queue, told on chan); if the gate
-- is taken, it waits for it — in PostgreSQL's lock manager, in arrival order, at most
-- half of ttl_ms — then attempts, and keeps
-- the gate while it waits at the head of the queue and while it holds the lock;
-- gate_release frees it, and the lock manager wakes exactly the next waiter, whose
-- statement goes on to take the lock: no NOTIFY, no round trip. Without first (the session
-- has the gate) it attempts at once. A gate wait that times out fails with
-- lock_not_available. Returns acquire's row and whether the session keeps the gate.
-- The gate only orders waiters: who holds the lock is the locks row's alone.
CREATE OR REPLACE FUNCTION "S".gate_acquire(k text, tok text, ttl_ms bigint, chan text,
                                            grace_ms bigint, hand boolean, listener int,
                                            first boolean)
RETURNS TABLE (granted boolean, fence bigint, wait_ms bigint, gated boolean)
LANGUAGE plpgsql AS $fn$
DECLARE
    was   text := current_setting('lock_timeout');
    free  boolean := false;
    a     record;
BEGIN
    IF first THEN
        free := pg_try_advisory_lock("S".gate_key(k));
    END IF;
    IF first AND NOT free THEN
        -- Half a lease at most: the caller counts its lease from before the wait, so a
        -- grant must come while most of it is left.
        PERFORM set_config('lock_timeout', greatest(ttl_ms / 2, 1) || 'ms', true);
        PERFORM pg_advisory_lock("S".gate_key(k));
        PERFORM set_config('lock_timeout', was, true);
    END IF;
    PERFORM pg_advisory_xact_lock("S".taking_key(k));
    SELECT * INTO a FROM "S".acquire(k, tok, ttl_ms, true, chan, NULL, grace_ms, hand,
                                     listener);
    IF a.granted AND free THEN
        -- Nobody was waiting: the holder needs no gate (nor its session).
        PERFORM pg_advisory_unlock("S".gate_key(k));
        RETURN QUERY SELECT a.granted, a.fence, a.wait_ms, false;
        RETURN;
    END IF;
    RETURN QUERY SELECT a.granted, a.fence, a.wait_ms, true;
END
$fn$;

-- Release (or leave) lock k as release does, then free the session's gate.
CREATE OR REPLACE FUNCTION "S".gate_release(k text, tok text, mode text, wake_ms bigint)
RETURNS boolean
LANGUAGE plpgsql AS $fn$
DECLARE
    done boolean;
BEGIN
    -- The name's row first: the waiter the gate wakes takes the lock once we commit.
    PERFORM 1 FROM "S".locks AS l WHERE l.key = k FOR UPDATE;
    PERFORM pg_advisory_unlock_all();
    done := "S".release(k, tok, mode, wake_ms);
    RETURN done;
END
$fn$;

-- Release lock k: 'own' (tok's hold), 'force' (whoever holds it) or 'leave' (tok stops
-- waiting). When the lock is free afterwards, the head of the queue is woken (sent at
-- commit) and has wake_ms to come. Returns whether a hold was released ('own', 'force')
-- or tok was queued ('leave').
CREATE OR REPLACE FUNCTION "S".release(k text, tok text, mode text, wake_ms bigint)
RETURNS boolean
LANGUAGE plpgsql AS $fn$
DECLARE
    done boolean;
    held boolean;
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
        -- The name's row first, as every function takes it (no waiting in a circle).
        PERFORM 1 FROM "S".locks AS l WHERE l.key = k FOR UPDATE;
        DELETE FROM "S".waiters AS q WHERE q.key = k AND q.token = tok;
        done := FOUND;
        -- Handed the lock as it left: it passes it on.
        UPDATE "S".locks AS l SET holder = NULL, expires_at = NULL
        WHERE l.key = k AND l.holder = tok AND l.expires_at > clock_timestamp();
        IF FOUND THEN
            PERFORM "S".hand_head(k, wake_ms);
            RETURN true;
        END IF;
        SELECT l.holder IS NOT NULL AND l.expires_at > clock_timestamp() INTO held
        FROM "S".locks AS l WHERE l.key = k;
        IF held IS NOT FALSE OR NOT done THEN
            RETURN done;
        END IF;
    END IF;
    IF done THEN
        PERFORM "S".hand_head(k, wake_ms);
    END IF;
    RETURN done;
END
$fn$;

-- Renew one lease: kind 'l' a lock's holder, 'p' a semaphore's permits, 'h' a reentrant
-- lock's hold (the lock's expiry), 'w' a read-write lock's writer or reader.
CREATE OR REPLACE FUNCTION "S".extend_one(kind text, k text, tok text, ttl_ms bigint)
RETURNS boolean
LANGUAGE plpgsql AS $fn$
DECLARE
    now_ts timestamptz := clock_timestamp();
    until  timestamptz := clock_timestamp() + ttl_ms * interval '1 millisecond';
BEGIN
    IF kind = 'l' OR kind = 'w' THEN
        UPDATE "S".locks AS l SET expires_at = until
        WHERE l.key = k AND l.holder = tok AND l.expires_at > now_ts;
        IF FOUND OR kind = 'l' THEN
            RETURN FOUND;
        END IF;
    END IF;
    IF kind = 'h' THEN
        UPDATE "S".locks AS l SET expires_at = until
        WHERE l.key = k AND l.expires_at > now_ts
          AND EXISTS (SELECT 1 FROM "S".leases AS e
                      WHERE e.key = k AND e.token = tok AND e.role = 'h');
        RETURN FOUND;
    END IF;
    UPDATE "S".leases AS e SET expires_at = until
    WHERE e.key = k AND e.token = tok AND e.expires_at > now_ts
      AND e.role = CASE WHEN kind = 'w' THEN 'r' ELSE 'p' END::"char";
    RETURN FOUND;
END
$fn$;

-- Renew a batch of leases (kinds as extend_one), in key order (so two batches never wait
-- for each other in a circle); returns the 1-based positions of those renewed.
CREATE OR REPLACE FUNCTION "S".extend_many(kinds text[], ks text[], toks text[],
                                           ttls bigint[])
RETURNS SETOF bigint
LANGUAGE plpgsql AS $fn$
DECLARE
    x record;
BEGIN
    FOR x IN SELECT * FROM unnest(kinds, ks, toks, ttls) WITH ORDINALITY
                           AS u(kind, key, token, ttl, i)
             ORDER BY u.key
    LOOP
        IF "S".extend_one(x.kind, x.key, x.token, x.ttl) THEN
            RETURN NEXT x.i;
        END IF;
    END LOOP;
END
$fn$;

-- Take n of semaphore k's permits for tok (its permit count `start` if none is stored),
-- in arrival order. Returns (granted, 0, wait_ms); wait_ms -1: no lease to wait for (n
-- exceeds the count). A grant that leaves permits free wakes the next in line.
CREATE OR REPLACE FUNCTION "S".sem_acquire(k text, tok text, n int, start int, ttl_ms bigint,
                                           queue boolean, chan text, grace_ms bigint,
                                           wake_ms bigint)
RETURNS TABLE (granted boolean, fence bigint, wait_ms bigint)
LANGUAGE plpgsql AS $fn$
DECLARE
    r         "S".locks%ROWTYPE;
    head      "S".waiters%ROWTYPE;
    now_ts    timestamptz;
    cap       int;
    used      bigint;
    first_end timestamptz;
    w         bigint;
BEGIN
    INSERT INTO "S".locks AS l (key, permits) VALUES (k, start) ON CONFLICT (key) DO NOTHING;
    SELECT * INTO r FROM "S".locks AS l WHERE l.key = k FOR UPDATE;
    now_ts := clock_timestamp();
    cap := coalesce(r.permits, start);
    IF r.permits IS NULL THEN
        UPDATE "S".locks AS l SET permits = cap WHERE l.key = k;
    END IF;
    DELETE FROM "S".leases AS e WHERE e.key = k AND e.expires_at <= now_ts;
    UPDATE "S".leases AS e SET expires_at = now_ts + ttl_ms * interval '1 millisecond'
    WHERE e.key = k AND e.token = tok;
    IF FOUND THEN
        RETURN QUERY SELECT true, 0::bigint, 0::bigint;
        RETURN;
    END IF;
    SELECT coalesce(sum(e.n), 0), min(e.expires_at) INTO used, first_end
    FROM "S".leases AS e WHERE e.key = k;
    head := "S".queue_head(k, now_ts);
    IF used + n <= cap AND (head.token IS NULL OR head.token = tok) THEN
        INSERT INTO "S".leases (key, token, role, n, expires_at)
        VALUES (k, tok, 'p', n, now_ts + ttl_ms * interval '1 millisecond');
        DELETE FROM "S".waiters AS q WHERE q.key = k AND q.token = tok;
        IF used + n < cap THEN
            PERFORM "S".wake_head(k, wake_ms);
        END IF;
        RETURN QUERY SELECT true, 0::bigint, 0::bigint;
        RETURN;
    END IF;
    IF used + n <= cap THEN
        w := least(ttl_ms, "S".ms_until(head.claim_until, now_ts));
    ELSIF first_end IS NOT NULL THEN
        w := "S".ms_until(first_end, now_ts);
    ELSE
        w := -1;
    END IF;
    IF queue THEN
        PERFORM "S".wait_in_line(k, tok, 'l', n, chan, NULL,
            now_ts + ((CASE WHEN w < 0 THEN 1000 ELSE w END) + grace_ms)
                     * interval '1 millisecond');
    END IF;
    RETURN QUERY SELECT false, 0::bigint, w;
END
$fn$;

-- Give back tok's permits ('own'), every live permit ('force'), or tok's place in line
-- ('leave'); then wake the next in line. Returns whether anything was given back (or tok
-- was queued).
CREATE OR REPLACE FUNCTION "S".sem_release(k text, tok text, mode text, wake_ms bigint)
RETURNS boolean
LANGUAGE plpgsql AS $fn$
DECLARE
    done boolean;
BEGIN
    PERFORM 1 FROM "S".locks AS l WHERE l.key = k FOR UPDATE;
    IF mode = 'own' THEN
        DELETE FROM "S".leases AS e
        WHERE e.key = k AND e.token = tok AND e.expires_at > clock_timestamp();
    ELSIF mode = 'force' THEN
        DELETE FROM "S".leases AS e WHERE e.key = k AND e.expires_at > clock_timestamp();
    ELSE
        DELETE FROM "S".waiters AS q WHERE q.key = k AND q.token = tok;
    END IF;
    done := FOUND;
    IF done THEN
        PERFORM "S".wake_head(k, wake_ms);
    END IF;
    RETURN done;
END
$fn$;

-- Change semaphore k's permit count: set it to `target`, or (with target null) add delta
-- to it (`start` if none is stored) if the result stays within 1..=max. Wakes the next
-- in line. Returns the new count, or null if nothing changed.
CREATE OR REPLACE FUNCTION "S".sem_resize(k text, target int, delta bigint, start int,
                                          max_permits int, wake_ms bigint)
RETURNS int
LANGUAGE plpgsql AS $fn$
DECLARE
    r    "S".locks%ROWTYPE;
    new_count bigint;
BEGIN
    INSERT INTO "S".locks AS l (key, permits) VALUES (k, start) ON CONFLICT (key) DO NOTHING;
    SELECT * INTO r FROM "S".locks AS l WHERE l.key = k FOR UPDATE;
    new_count := coalesce(target, coalesce(r.permits, start) + delta);
    IF target IS NULL AND (new_count < 1 OR new_count > max_permits) THEN
        RETURN NULL;
    END IF;
    UPDATE "S".locks AS l SET permits = new_count WHERE l.key = k;
    PERFORM "S".wake_head(k, wake_ms);
    RETURN new_count;
END
$fn$;

-- Take a hold of reentrant lock k for owner under request token tok. Returns (1, fence, 0)
-- a hold (a new tenure: a new fence; a re-entry: the tenure's), (0, fence, wait_ms)
-- another owner holds it or it is the queue head's, (2, holds, 0) owner is at the limit.
CREATE OR REPLACE FUNCTION "S".re_acquire(k text, owner text, tok text, ttl_ms bigint,
                                          lim int, queue boolean, chan text, grace_ms bigint)
RETURNS TABLE (status int, fence bigint, wait_ms bigint)
LANGUAGE plpgsql AS $fn$
DECLARE
    r      "S".locks%ROWTYPE;
    head   "S".waiters%ROWTYPE;
    now_ts timestamptz;
    until  timestamptz;
    holds  bigint;
    w      bigint;
BEGIN
    INSERT INTO "S".locks AS l (key) VALUES (k) ON CONFLICT (key) DO NOTHING;
    SELECT * INTO r FROM "S".locks AS l WHERE l.key = k FOR UPDATE;
    now_ts := clock_timestamp();
    until := now_ts + ttl_ms * interval '1 millisecond';
    IF r.holder IS NOT NULL AND r.expires_at <= now_ts THEN
        -- The tenure lapsed: its holds with it.
        DELETE FROM "S".leases AS e WHERE e.key = k AND e.role = 'h';
        UPDATE "S".locks AS l SET holder = NULL, expires_at = NULL WHERE l.key = k;
        r.holder := NULL;
    END IF;
    IF r.holder = owner THEN
        PERFORM 1 FROM "S".leases AS e WHERE e.key = k AND e.token = tok AND e.role = 'h';
        IF NOT FOUND THEN
            SELECT count(*) INTO holds FROM "S".leases AS e WHERE e.key = k AND e.role = 'h';
            IF holds >= lim THEN
                RETURN QUERY SELECT 2, holds, 0::bigint;
                RETURN;
            END IF;
            INSERT INTO "S".leases (key, token, role, n, expires_at)
            VALUES (k, tok, 'h', 1, until);
        END IF;
        UPDATE "S".locks AS l SET expires_at = until WHERE l.key = k;
        RETURN QUERY SELECT 1, r.fence, 0::bigint;
        RETURN;
    END IF;
    head := "S".queue_head(k, now_ts);
    IF r.holder IS NULL AND (head.token IS NULL OR head.token = tok) THEN
        UPDATE "S".locks AS l SET holder = owner, expires_at = until, fence = l.fence + 1
        WHERE l.key = k
        RETURNING l.fence INTO r.fence;
        INSERT INTO "S".leases (key, token, role, n, expires_at) VALUES (k, tok, 'h', 1, until);
        DELETE FROM "S".waiters AS q WHERE q.key = k AND q.token = tok;
        RETURN QUERY SELECT 1, r.fence, 0::bigint;
        RETURN;
    END IF;
    IF r.holder IS NOT NULL THEN
        w := "S".ms_until(r.expires_at, now_ts);
    ELSE
        w := least(ttl_ms, "S".ms_until(head.claim_until, now_ts));
    END IF;
    IF queue THEN
        PERFORM "S".wait_in_line(k, tok, 'l', 1, chan, NULL,
                                 now_ts + (w + grace_ms) * interval '1 millisecond');
    END IF;
    RETURN QUERY SELECT 0, r.fence, w;
END
$fn$;

-- Give back owner's hold under tok ('own'; the last hold frees the lock), or every hold
-- ('force'). A freed lock wakes the next in line. Returns whether a live hold went.
CREATE OR REPLACE FUNCTION "S".re_release(k text, owner text, tok text, mode text,
                                          wake_ms bigint)
RETURNS boolean
LANGUAGE plpgsql AS $fn$
DECLARE
    r "S".locks%ROWTYPE;
BEGIN
    SELECT * INTO r FROM "S".locks AS l WHERE l.key = k FOR UPDATE;
    IF r.holder IS NULL OR r.expires_at <= clock_timestamp()
       OR (mode = 'own' AND r.holder <> owner) THEN
        RETURN false;
    END IF;
    IF mode = 'own' THEN
        DELETE FROM "S".leases AS e WHERE e.key = k AND e.token = tok AND e.role = 'h';
        IF NOT FOUND THEN
            RETURN false;
        END IF;
        PERFORM 1 FROM "S".leases AS e WHERE e.key = k AND e.role = 'h';
        IF FOUND THEN
            RETURN true;
        END IF;
    ELSE
        DELETE FROM "S".leases AS e WHERE e.key = k AND e.role = 'h';
    END IF;
    UPDATE "S".locks AS l SET holder = NULL, expires_at = NULL WHERE l.key = k;
    PERFORM "S".wake_head(k, wake_ms);
    RETURN true;
END
$fn$;

-- Wakes every client with a reader of k blocked (its row of role 'r'), once each.
CREATE OR REPLACE FUNCTION "S".wake_readers(k text) RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
    x record;
BEGIN
    FOR x IN DELETE FROM "S".waiters AS q WHERE q.key = k AND q.role = 'r'
             RETURNING q.channel, q.wake
    LOOP
        IF x.channel IS NOT NULL THEN
            PERFORM pg_notify(x.channel, x.wake);
        END IF;
    END LOOP;
END
$fn$;

-- Take read-write lock k for reading or writing (writers first: a live waiting writer
-- holds new readers back; writers do not queue behind each other). A blocked writer
-- claims its wait until its next attempt plus grace_ms; a blocked reader leaves a row
-- (role 'r', woken on chan with wk_r) that blocks nobody. Returns (granted, fence,
-- wait_ms); readers' fence is 0.
CREATE OR REPLACE FUNCTION "S".rw_acquire(k text, tok text, write boolean, ttl_ms bigint,
                                          grace_ms bigint, chan text, wk_r text)
RETURNS TABLE (granted boolean, fence bigint, wait_ms bigint)
LANGUAGE plpgsql AS $fn$
DECLARE
    r       "S".locks%ROWTYPE;
    now_ts  timestamptz;
    until   timestamptz;
    writing boolean;
    first   timestamptz;
    w       bigint;
BEGIN
    INSERT INTO "S".locks AS l (key) VALUES (k) ON CONFLICT (key) DO NOTHING;
    SELECT * INTO r FROM "S".locks AS l WHERE l.key = k FOR UPDATE;
    now_ts := clock_timestamp();
    until := now_ts + ttl_ms * interval '1 millisecond';
    DELETE FROM "S".leases AS e WHERE e.key = k AND e.role = 'r' AND e.expires_at <= now_ts;
    DELETE FROM "S".waiters AS q WHERE q.key = k AND q.claim_until <= now_ts;
    writing := r.holder IS NOT NULL AND r.expires_at > now_ts;
    IF NOT write THEN
        UPDATE "S".leases AS e SET expires_at = until
        WHERE e.key = k AND e.token = tok AND e.role = 'r';
        IF FOUND THEN
            RETURN QUERY SELECT true, 0::bigint, 0::bigint;
            RETURN;
        END IF;
        IF writing THEN
            w := "S".ms_until(r.expires_at, now_ts);
        ELSE
            SELECT min(q.claim_until) INTO first FROM "S".waiters AS q
            WHERE q.key = k AND q.role = 'l';
            IF first IS NULL THEN
                INSERT INTO "S".leases (key, token, role, n, expires_at)
                VALUES (k, tok, 'r', 1, until);
                RETURN QUERY SELECT true, 0::bigint, 0::bigint;
                RETURN;
            END IF;
            w := "S".ms_until(first, now_ts);
        END IF;
        IF chan IS NOT NULL THEN
            PERFORM "S".wait_in_line(k, tok, 'r', 1, chan, wk_r,
                                     now_ts + (w + grace_ms) * interval '1 millisecond');
        END IF;
        RETURN QUERY SELECT false, 0::bigint, w;
        RETURN;
    END IF;
    IF writing AND r.holder = tok THEN
        UPDATE "S".locks AS l SET expires_at = until WHERE l.key = k;
        DELETE FROM "S".waiters AS q WHERE q.key = k AND q.token = tok;
        RETURN QUERY SELECT true, r.fence, 0::bigint;
        RETURN;
    END IF;
    IF writing THEN
        w := "S".ms_until(r.expires_at, now_ts);
    ELSE
        SELECT min(e.expires_at) INTO first FROM "S".leases AS e
        WHERE e.key = k AND e.role = 'r';
        w := CASE WHEN first IS NULL THEN NULL ELSE "S".ms_until(first, now_ts) END;
    END IF;
    IF w IS NOT NULL THEN
        PERFORM "S".wait_in_line(k, tok, 'l', 1, chan, NULL,
                                 now_ts + (w + grace_ms) * interval '1 millisecond');
        RETURN QUERY SELECT false, r.fence, w;
        RETURN;
    END IF;
    UPDATE "S".locks AS l SET holder = tok, expires_at = until, fence = l.fence + 1
    WHERE l.key = k
    RETURNING l.fence INTO r.fence;
    DELETE FROM "S".waiters AS q WHERE q.key = k AND q.token = tok;
    RETURN QUERY SELECT true, r.fence, 0::bigint;
END
$fn$;

-- Release the writer's or a reader's hold under tok ('own'), turn the write hold into a
-- read hold ('downgrade', reader lease ttl_ms), withdraw a waiting writer ('leave'), or
-- clear every hold and waiting writer ('force'). When nobody holds the lock afterwards,
-- one waiting writer is woken, or else every blocked reader. Returns whether it acted.
CREATE OR REPLACE FUNCTION "S".rw_release(k text, tok text, mode text, ttl_ms bigint,
                                          wake_ms bigint)
RETURNS boolean
LANGUAGE plpgsql AS $fn$
DECLARE
    r      "S".locks%ROWTYPE;
    now_ts timestamptz;
    done   boolean := false;
BEGIN
    SELECT * INTO r FROM "S".locks AS l WHERE l.key = k FOR UPDATE;
    now_ts := clock_timestamp();
    IF mode = 'own' OR mode = 'downgrade' THEN
        IF r.holder = tok AND r.expires_at > now_ts THEN
            UPDATE "S".locks AS l SET holder = NULL, expires_at = NULL WHERE l.key = k;
            done := true;
            IF mode = 'downgrade' THEN
                INSERT INTO "S".leases (key, token, role, n, expires_at)
                VALUES (k, tok, 'r', 1, now_ts + ttl_ms * interval '1 millisecond')
                ON CONFLICT (key, token) DO UPDATE SET expires_at = excluded.expires_at;
                PERFORM "S".wake_readers(k);
                RETURN true;
            END IF;
        ELSIF mode = 'own' THEN
            DELETE FROM "S".leases AS e
            WHERE e.key = k AND e.token = tok AND e.role = 'r' AND e.expires_at > now_ts;
            done := FOUND;
        END IF;
    ELSIF mode = 'leave' THEN
        DELETE FROM "S".waiters AS q WHERE q.key = k AND q.token = tok;
        done := FOUND;
    ELSE
        done := r.holder IS NOT NULL AND r.expires_at > now_ts;
        UPDATE "S".locks AS l SET holder = NULL, expires_at = NULL WHERE l.key = k;
        DELETE FROM "S".leases AS e WHERE e.key = k AND e.role = 'r' AND e.expires_at > now_ts;
        done := done OR FOUND;
        DELETE FROM "S".waiters AS q WHERE q.key = k AND q.role = 'l';
    END IF;
    IF NOT done THEN
        RETURN false;
    END IF;
    PERFORM 1 FROM "S".locks AS l
    WHERE l.key = k AND l.holder IS NOT NULL AND l.expires_at > now_ts;
    IF FOUND THEN
        RETURN true;
    END IF;
    -- No writer: the last reader out lets one waiting writer in; with no writer waiting,
    -- the blocked readers may come.
    PERFORM 1 FROM "S".leases AS e WHERE e.key = k AND e.role = 'r' AND e.expires_at > now_ts;
    IF NOT FOUND AND "S".wake_head(k, wake_ms) THEN
        RETURN true;
    END IF;
    PERFORM 1 FROM "S".waiters AS q
    WHERE q.key = k AND q.role = 'l' AND q.claim_until > now_ts;
    IF NOT FOUND THEN
        PERFORM "S".wake_readers(k);
    END IF;
    RETURN true;
END
$fn$;

-- sem_acquire, refusing (strict) when the stored permit count is not `start`: nothing is
-- taken or queued, and the stored count is returned. Returns (granted, 0, wait_ms, the
-- stored count or NULL if none was).
CREATE OR REPLACE FUNCTION "S".sem_acquire_checked(k text, tok text, n int, start int,
                                                   strict boolean, ttl_ms bigint,
                                                   queue boolean, chan text, grace_ms bigint,
                                                   wake_ms bigint)
RETURNS TABLE (granted boolean, fence bigint, wait_ms bigint, stored int)
LANGUAGE plpgsql AS $fn$
DECLARE
    cap int;
BEGIN
    IF strict THEN
        INSERT INTO "S".locks AS l (key, permits) VALUES (k, start)
        ON CONFLICT (key) DO NOTHING;
        SELECT l.permits INTO cap FROM "S".locks AS l WHERE l.key = k FOR UPDATE;
        IF cap IS NOT NULL AND cap <> start THEN
            RETURN QUERY SELECT false, 0::bigint, -1::bigint, cap;
            RETURN;
        END IF;
    END IF;
    RETURN QUERY SELECT a.granted, a.fence, a.wait_ms, start
    FROM "S".sem_acquire(k, tok, n, start, ttl_ms, queue, chan, grace_ms, wake_ms) AS a;
END
$fn$;

-- The schema's version, created last: a client that does not find it (a newer dlock
-- names a newer one) runs this whole file again, every statement of which is idempotent.
-- Version 2's is kept, so that a client of that version finds its own and leaves the
-- newer functions alone. Version 3: waiters_lapsed, waiters_by_claim, sweep_waiters.
-- Version 4: waiters.far, far_wait; acquire hands a lapsed lock over to the head.
CREATE OR REPLACE FUNCTION "S".schema_version_2() RETURNS int
LANGUAGE sql IMMUTABLE AS $fn$
    SELECT 2
$fn$;
CREATE OR REPLACE FUNCTION "S".schema_version_3() RETURNS int
LANGUAGE sql IMMUTABLE AS $fn$
    SELECT 3
$fn$;
CREATE OR REPLACE FUNCTION "S".schema_version_4() RETURNS int
LANGUAGE sql IMMUTABLE AS $fn$
    SELECT 4
$fn$;
