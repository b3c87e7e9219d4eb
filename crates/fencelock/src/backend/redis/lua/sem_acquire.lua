-- Take N permits of a semaphore, each holder's permits a lease of its own; queue the
-- caller if it must wait. (queue.lua is prepended: the waiter queue's functions.)
-- KEYS[1]  zset: holder token -> lease expiry (ms, server clock)
-- KEYS[2]  hash: holder token -> permits held
-- KEYS[3]  the permit count (set on first use from ARGV[3]; `set_permits` changes it)
-- KEYS[4]  the waiter queue: token -> arrival      KEYS[5]  token -> claim expiry
-- KEYS[6]  the permits held: the running total of KEYS[2] (q_permits_used)
-- KEYS[7]  the name's hand-over counter (see q_hand_permits)
-- KEYS[8]  the counter's place before the key layout changed (fence.lua)
-- ARGV[1]  the holder token
-- ARGV[2]  permits wanted (N >= 1)
-- ARGV[3]  the permit count to start with, if none is stored yet
-- ARGV[4]  lease length in milliseconds
-- ARGV[5]  'wait': queue the caller if it cannot be granted now; 'try': don't
-- ARGV[6]  the waiter grace in ms         ARGV[7]  the release channel
-- ARGV[8]  the grace in ms a woken waiter has to come
-- ARGV[9]  the caller's client's waiter id
-- ARGV[10] '1': a release may hand permits over to the caller (its member is
--          '<id>:=<ttl ms>,<N>:<token>'); '0': it is woken and comes itself ('<id>:<token>')
-- ARGV[11] '1': refuse (take nothing, queue nothing) if the stored count is not ARGV[3]
-- ARGV[#ARGV]  the publish command: PUBLISH, or SPUBLISH on a Redis Cluster (sharded)
-- returns  {1, 0}     acquired (a repeat of a granted request is granted again, not twice)
--          {-2, count}  refused: the stored permit count is another (ARGV[11] = '1')
--          {0, wait, counter}  not now: not enough free permits, or the free ones are the
--                      queue head's; wait = ms until the earliest lease or the head's
--                      claim ends (-1 if no holder has a lease, i.e. N exceeds the permit
--                      count); counter = the hand-over counter now
-- Waiters are served in arrival order; a grant that leaves permits free hands them on.
local now, arrival = q_now()
-- Leases that ran out give their permits back.
local used, stored = q_permits_used(KEYS[1], KEYS[2], KEYS[6], now)
-- Every return below stores the total first.
local function done(reply)
  if used ~= stored then
    q_store_used(KEYS[1], KEYS[6], used)
  end
  return reply
end
local raw = redis.call('GET', KEYS[3])
if not raw then
  redis.call('SET', KEYS[3], ARGV[3])
  raw = ARGV[3]
end
local capacity = tonumber(raw)
if ARGV[11] == '1' and capacity ~= tonumber(ARGV[3]) then
  return done({-2, capacity or -1})
end
local want = tonumber(ARGV[2])
local mine = redis.call('HGET', KEYS[2], ARGV[1])
local others = used
if mine then
  others = used - tonumber(mine)
end
local me
if ARGV[10] == '1' then
  me = q_member(ARGV[9], '=' .. ARGV[4] .. ',' .. ARGV[2] .. ':' .. ARGV[1])
else
  me = q_member(ARGV[9], ARGV[1])
end
local head = nil
if redis.call('EXISTS', KEYS[4]) == 1 then
  head = q_head(KEYS[4], KEYS[5], now)
end
local fits = others + want <= capacity
if mine or (fits and (head == nil or head == me)) then
  local ttl = tonumber(ARGV[4])
  redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
  redis.call('HSET', KEYS[2], ARGV[1], want)
  used = others + want
  -- The holder keys vanish with the last lease; the permit count stays.
  local last = tonumber(redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')[2])
  redis.call('PEXPIREAT', KEYS[1], last)
  redis.call('PEXPIREAT', KEYS[2], last)
  if head ~= nil then
    q_leave(KEYS[4], KEYS[5], me)
    if used < capacity and redis.call('EXISTS', KEYS[4]) == 1 then
      used = q_add_granted(KEYS[2], used, q_hand_permits(KEYS[1], KEYS[2], KEYS[4], KEYS[5],
        KEYS[7], ARGV[7], tonumber(ARGV[8]), ARGV[#ARGV], capacity - used, now))
    end
  end
  return done({1, 0})
end
local wait = -1
if fits then
  wait = q_claim_left(KEYS[5], head, now, tonumber(ARGV[4]))
else
  local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  if first[2] then
    wait = tonumber(first[2]) - now
  end
end
if ARGV[5] == 'wait' then
  q_join(KEYS[4], KEYS[5], me, now, arrival, wait, tonumber(ARGV[6]))
end
return done({0, wait, tonumber(redis.pcall('GET', KEYS[7])) or 0})
