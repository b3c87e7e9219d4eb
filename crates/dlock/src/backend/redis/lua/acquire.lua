-- Acquire a lock and mint its fence, atomically; queue the caller if it must wait.
-- KEYS[1]  the lock key (holds the owner token as a plain string)
-- KEYS[2]  the fence counter (same hash tag; never expires)
-- KEYS[3]  zset: waiter token -> arrival (server time in microseconds)
-- KEYS[4]  zset: waiter token -> claim expiry (ms, server clock)
-- ARGV[1]  the owner token
-- ARGV[2]  the lease length in milliseconds
-- ARGV[3]  'wait': take a place in the waiter queue if the lock cannot be granted now (the
--          caller listens on '<release channel>:<token>'); 'try': don't
-- ARGV[4]  the waiter grace in ms: how long a claim outlives the caller's next attempt
-- returns  {1, fence}  acquired; fence = the counter after INCR
--          {0, wait}   held by someone else, or free but reserved for the waiter at the
--                      head of the queue; wait = ms until the holder's lease or the
--                      head's claim ends (-1: a holder without expiry)
--          A repeat of an acquire that was granted (its reply lost) finds our own token:
--          it renews the expiry and returns the fence of that grant.
--          error       WRONGTYPE if the lock key holds a non-string value; the INCR error
--                      if the fence counter cannot be incremented (the lock is then not
--                      left behind)
local function mint()
  local fence = redis.pcall('INCR', KEYS[2])
  if type(fence) == 'table' and fence.err then
    redis.call('DEL', KEYS[1])
    return redis.error_reply(fence.err .. ' (dlock fence counter ' .. KEYS[2] .. ')')
  end
  return {1, fence}
end
-- Nobody queued: the classic lock, and the only path an uncontended acquire takes.
if redis.call('EXISTS', KEYS[3]) == 0
    and redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return mint()
end
local holder = redis.pcall('GET', KEYS[1])
if type(holder) == 'table' and holder.err then
  return redis.error_reply('WRONGTYPE dlock lock key ' .. KEYS[1] .. ' holds a non-string value')
end
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, tonumber(redis.call('GET', KEYS[2])) or 0}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- Waiters whose claims lapsed (crashed, gone) leave the queue.
for _, gone in ipairs(redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now)) do
  redis.call('ZREM', KEYS[3], gone)
end
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)
local wait
if holder then
  wait = redis.call('PTTL', KEYS[1])
else
  -- Free: the head of the queue may take it, nobody else (no barging past waiters).
  local head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
  if head == nil or head == ARGV[1] then
    redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
    redis.call('ZREM', KEYS[3], ARGV[1])
    redis.call('ZREM', KEYS[4], ARGV[1])
    return mint()
  end
  wait = math.max(0, (tonumber(redis.call('ZSCORE', KEYS[4], head)) or now) - now)
end
if ARGV[3] == 'wait' then
  if not redis.call('ZSCORE', KEYS[3], ARGV[1]) then
    redis.call('ZADD', KEYS[3], tonumber(t[1]) * 1000000 + tonumber(t[2]), ARGV[1])
  end
  -- A holder without expiry gives no deadline: the caller retries within a second.
  local next_attempt = wait
  if next_attempt < 0 then next_attempt = 1000 end
  redis.call('ZADD', KEYS[4], now + next_attempt + tonumber(ARGV[4]), ARGV[1])
  local last = redis.call('ZRANGE', KEYS[4], -1, -1, 'WITHSCORES')[2]
  redis.call('PEXPIREAT', KEYS[3], last)
  redis.call('PEXPIREAT', KEYS[4], last)
end
return {0, wait}
