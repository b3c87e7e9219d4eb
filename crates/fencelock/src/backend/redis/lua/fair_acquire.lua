-- Take a fair lock in arrival order, queueing the caller if it must wait.
-- KEYS[1]  the lock key (holder token with expiry, as a plain lock)
-- KEYS[2]  zset: waiter token -> arrival (server time in microseconds)
-- KEYS[3]  zset: waiter token -> claim expiry (ms, server clock)
-- KEYS[4]  the fence counter (never expires)
-- KEYS[5]  the fence counter's place before the key layout changed (fence.lua)
-- ARGV[1]  the token        ARGV[2]  the lease length in ms
-- ARGV[3]  the waiter grace in ms
-- returns  {1, fence}  granted (a repeat of a granted request is granted again)
--          {0, wait}   queued; wait = ms until the holder's lease or the head's claim ends
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local arrival = tonumber(t[1]) * 1000000 + tonumber(t[2])
for _, gone in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now)) do
  redis.call('ZREM', KEYS[2], gone)
end
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
local pttl = redis.call('PTTL', KEYS[1])
if pttl ~= -2 and redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, tonumber(redis.call('GET', KEYS[4])) or 0}
end
local function grant()
  fence_seed(KEYS[4])
  local fence = redis.pcall('INCR', KEYS[4])
  if type(fence) == 'table' and fence.err then
    return redis.error_reply(fence.err .. ' (dlock fence counter ' .. KEYS[4] .. ')')
  end
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  redis.call('ZREM', KEYS[2], ARGV[1])
  redis.call('ZREM', KEYS[3], ARGV[1])
  return {1, fence}
end
-- Free and nobody queued: granted without queueing.
if pttl == -2 and redis.call('EXISTS', KEYS[2]) == 0 then
  return grant()
end
if not redis.call('ZSCORE', KEYS[2], ARGV[1]) then
  redis.call('ZADD', KEYS[2], arrival, ARGV[1])
end
local head = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
local wait
if pttl ~= -2 then
  wait = pttl
elseif head == ARGV[1] then
  return grant()
else
  -- At most a lease: a claim made behind the head's ends within a lease and a grace of
  -- this attempt (uncapped, claims behind a head that never comes would chain, each a
  -- grace past the one in front, and outlive every waiter).
  wait = math.min(tonumber(ARGV[2]),
    math.max(0, (tonumber(redis.call('ZSCORE', KEYS[3], head)) or now) - now))
end
redis.call('ZADD', KEYS[3], now + math.max(wait, 0) + tonumber(ARGV[3]), ARGV[1])
local last = redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')[2]
redis.call('PEXPIREAT', KEYS[2], last)
redis.call('PEXPIREAT', KEYS[3], last)
return {0, wait}
