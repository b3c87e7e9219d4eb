-- The waiter queue, shared by every primitive that serves one waiter per release. This
-- file is included in their scripts (scripts.rs), after fence.lua (q_offer mints with
-- fence_seed: those scripts pass the old place of their counter as their last key); it
-- defines functions only.
-- A queue is two sorted sets under the lock's hash tag:
--   q: waiter member -> arrival (server time in microseconds): the order
--   c: waiter member -> claim expiry (ms, server clock): a waiter's claim lasts until its
--      next expected attempt plus a grace and is renewed at every attempt, so a crashed
--      waiter leaves the queue by itself
-- The client listens on '<release channel>:<waiter id>' (one subscription per client and
-- lock, kept between waits). A waiter's member is either
--   '<waiter id>:=<what it asked for>:<token>' — a release hands the lock (or permits)
--      over to it in its own step and tells it '!<counter>:<token>' (the plain lock's
--      release.lua, q_hand_permits below), or
--   '<waiter id>:<token>' — a release wakes it, naming its token (q_wake), and it takes
--      the lock with its own attempt (the reentrant lock, the read-write lock's writers,
--      and clients that wait for replicas after every grant).

-- The member of waiter `token` of client `id`.
local function q_member(id, token)
  return id .. ':' .. token
end

-- Server time: (ms, µs).
local function q_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000),
    tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- Drops the waiters whose claims lapsed; returns the head's token, or nil.
local function q_head(q, c, now)
  local lapsed = redis.call('ZRANGEBYSCORE', c, '-inf', now)
  if #lapsed > 0 then
    for _, gone in ipairs(lapsed) do
      redis.call('ZREM', q, gone)
    end
    redis.call('ZREMRANGEBYSCORE', c, '-inf', now)
  end
  return redis.call('ZRANGE', q, 0, 0)[1]
end

-- Milliseconds until `token`'s claim lapses, at most `cap` (the caller's lease length).
-- The cap keeps claims from chaining: a waiter behind the head claims until the head's
-- claim ends plus its grace, so without it each waiter that dies behind a dead head would
-- push the claims (and the sets' expiry) another grace further out; capped, every claim
-- ends within a lease and a grace of the attempt that made it, and a waiter behind a head
-- that does not come simply looks again after a lease.
local function q_claim_left(c, token, now, cap)
  return math.min(cap, math.max(0, (tonumber(redis.call('ZSCORE', c, token)) or now) - now))
end

-- Both sets live as long as the latest claim.
local function q_keep(q, c)
  local last = redis.call('ZRANGE', c, -1, -1, 'WITHSCORES')[2]
  if last then
    redis.call('PEXPIREAT', q, last)
    redis.call('PEXPIREAT', c, last)
  end
end

-- Takes `token` into the queue (keeping its place if it has one), claiming it until its
-- next attempt, `wait` ms from now (negative: unknown, within a second), plus `grace` ms.
local function q_join(q, c, token, now, arrival, wait, grace)
  redis.call('ZADD', q, 'NX', arrival, token)
  if wait < 0 then
    wait = 1000
  end
  redis.call('ZADD', c, now + wait + grace, token)
  q_keep(q, c)
end

-- Takes `token` out of the queue; returns 1 if it was in it.
local function q_leave(q, c, token)
  redis.call('ZREM', c, token)
  return redis.call('ZREM', q, token)
end

-- Wakes the head of the queue, if any, on its client's channel (the message names its
-- token), giving it at most `grace` ms to come (then its claim lapses and the others'
-- fallback timers take over).
local function q_wake(q, c, channel, grace, publish)
  if redis.call('EXISTS', q) == 0 then
    return
  end
  local now = q_now()
  local head = q_head(q, c, now)
  if head then
    local by = now + grace
    if (tonumber(redis.call('ZSCORE', c, head)) or by) > by then
      redis.call('ZADD', c, by, head)
      q_keep(q, c)
    end
    local sep = string.find(head, ':', 1, true)
    redis.call(publish, channel .. ':' .. string.sub(head, 1, sep - 1), string.sub(head, sep + 1))
  end
end


-- The permits of a semaphore held now: its running total, kept at `used` beside the
-- holders (holders: token -> lease expiry; counts: token -> permits) by every script that
-- changes them, after the leases that ran out gave theirs back (their permits leave the
-- total as their entries leave the holders). A missing total is rebuilt from the counts:
-- a semaphore written before the total was kept, and a total whose key ran out (it never
-- outlives the leases it counts, q_store_used) start again from what the holders hold.
-- Returns the total and the value stored (nil if none): a script that ends with another
-- total stores it (q_store_used) before it returns, whatever it returns.
-- The permits the holders of a semaphore hold, summed from their counts.
local function q_sum_counts(counts)
  local total = 0
  for _, n in ipairs(redis.call('HVALS', counts)) do
    total = total + tonumber(n)
  end
  return total
end

local function q_permits_used(holders, counts, used, now)
  local stored = tonumber(redis.call('GET', used))
  local total = stored
  local gone = redis.call('ZRANGEBYSCORE', holders, '-inf', now)
  if #gone > 0 then
    for _, token in ipairs(gone) do
      if total then
        total = total - (tonumber(redis.call('HGET', counts, token)) or 0)
      end
      redis.call('HDEL', counts, token)
    end
    redis.call('ZREMRANGEBYSCORE', holders, '-inf', now)
  end
  return total or q_sum_counts(counts), stored
end

-- Adds the permits q_hand_permits granted to the running total `total` (a grant to a
-- token that held permits already: the total is summed again from the counts).
local function q_add_granted(counts, total, granted)
  if granted < 0 then
    return q_sum_counts(counts)
  end
  return total + granted
end

-- Stores `total` as the permits held (q_permits_used). The key runs out when the latest
-- lease does as the holders stand now (a renewal does not touch it, so it may run out
-- first and be rebuilt): a total never outlives the holders it counts.
local function q_store_used(holders, used, total)
  local last = redis.call('ZRANGE', holders, -1, -1, 'WITHSCORES')[2]
  if total <= 0 or not last then
    redis.call('DEL', used)
    return
  end
  redis.call('SET', used, total)
  redis.call('PEXPIREAT', used, last)
end

-- Splits a hand-over member '<id>:=<wanted>:<token>' into its client's waiter id, what it
-- asked for (the text between '=' and the next ':') and its token; nil for a member that
-- is woken instead ('<id>:<token>').
local function q_hand_parts(member)
  local sep = string.find(member, ':', 1, true)
  if string.sub(member, sep + 1, sep + 1) ~= '=' then
    return nil
  end
  local sep2 = string.find(member, ':', sep + 1, true)
  return string.sub(member, 1, sep - 1), string.sub(member, sep + 2, sep2 - 1),
    string.sub(member, sep2 + 1)
end

-- Offers a grant to the hand-over member `head` (client `id`, `token`): takes it off the
-- queue, mints the next value of `counter` and tells its client '!<value>:<token>' (the
-- value lets the waiter tell this grant from an older one). Returns true if the grant
-- stands (the client listens; on a cluster, where SPUBLISH counts only its own node's
-- subscribers, always), false if nobody heard it (the caller tries the next head), nil if
-- the counter cannot be incremented (the head is woken instead; its own attempt reports
-- the error).
local function q_offer(q, c, counter, channel, publish, head, id, token)
  q_leave(q, c, head)
  local to = channel .. ':' .. id
  fence_seed(counter)
  local seq = redis.pcall('INCR', counter)
  if type(seq) == 'table' then
    redis.call(publish, to, token)
    return nil
  end
  return redis.call(publish, to, '!' .. seq .. ':' .. token) > 0 or publish == 'SPUBLISH'
end

-- Hands `free` permits of a semaphore over to the queue's heads, first come first served:
-- a head '<id>:=<ttl ms>,<n>:<token>' that fits is granted its n permits (a lease of its
-- ttl) in this very step (q_offer); a head whose client does not listen is dropped and
-- the next one tried. A head that does not fit stops the hand-over; a head of the other
-- form ('<id>:<token>': its client waits for replicas) is woken to come and take its
-- permits itself. The caller has seen the queue `q` exist. Returns the permits granted
-- (the caller adds them to the running total, q_permits_used), or -1 if a grant went to a
-- token that held permits already (the caller rebuilds the total from the counts).
local function q_hand_permits(holders, counts, q, c, counter, channel, grace, publish, free, now)
  local granted_total = 0
  while free > 0 do
    local head = q_head(q, c, now)
    if not head then
      break
    end
    local id, wanted, token = q_hand_parts(head)
    if not id then
      q_wake(q, c, channel, grace, publish)
      break
    end
    local comma = string.find(wanted, ',', 1, true)
    local ttl = tonumber(string.sub(wanted, 1, comma - 1))
    local n = tonumber(string.sub(wanted, comma + 1))
    if n > free then
      break
    end
    local granted = q_offer(q, c, counter, channel, publish, head, id, token)
    if granted == nil then
      break
    end
    if granted then
      redis.call('ZADD', holders, now + ttl, token)
      if redis.call('HSET', counts, token, n) == 0 then
        granted_total = -1 / 0
      end
      local last = tonumber(redis.call('ZRANGE', holders, -1, -1, 'WITHSCORES')[2])
      redis.call('PEXPIREAT', holders, last)
      redis.call('PEXPIREAT', counts, last)
      free = free - n
      granted_total = granted_total + n
    end
  end
  if granted_total < 0 then
    return -1
  end
  return granted_total
end
