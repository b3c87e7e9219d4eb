-- Take a read-write lock for reading or writing: many readers or one writer, writers first.
-- KEYS[1]  the writer key (the writer's token, with its expiry, as a plain lock)
-- KEYS[2]  zset: reader token -> lease expiry (ms, server clock)
-- KEYS[3]  zset: waiting writer '<waiter id>:<token>' -> claim expiry (ms, server clock)
-- KEYS[4]  the fence counter (writers only; never expires)
-- KEYS[5]  the fence counter's place before the key layout changed (fence.lua)
-- ARGV[1]  'r' or 'w'
-- ARGV[2]  the token
-- ARGV[3]  the lease length in milliseconds
-- ARGV[4]  the waiting writer's grace in milliseconds
-- ARGV[5]  the caller's client's waiter id (a waiting writer's member is '<id>:<token>')
-- returns  {1, fence}  granted (fence 0 for readers); a repeat of a granted request
--                      (same token) is granted again
--          {0, wait}   not now; wait = ms until the blocking hold or claim ends (-1: unknown)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[3])
local me = ARGV[5] .. ':' .. ARGV[2]
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
local writer_pttl = redis.call('PTTL', KEYS[1])
local function keep_until_last(key)
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if last[2] then
    redis.call('PEXPIREAT', key, last[2])
  end
end
if ARGV[1] == 'r' then
  if redis.call('ZSCORE', KEYS[2], ARGV[2]) then
    redis.call('ZADD', KEYS[2], now + ttl, ARGV[2])
    keep_until_last(KEYS[2])
    return {1, 0}
  end
  if writer_pttl ~= -2 then
    return {0, writer_pttl}
  end
  local claim = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
  if claim[2] then
    return {0, tonumber(claim[2]) - now}
  end
  redis.call('ZADD', KEYS[2], now + ttl, ARGV[2])
  keep_until_last(KEYS[2])
  return {1, 0}
end
if writer_pttl ~= -2 and redis.call('GET', KEYS[1]) == ARGV[2] then
  redis.call('PEXPIRE', KEYS[1], ttl)
  redis.call('ZREM', KEYS[3], me)
  return {1, tonumber(redis.call('GET', KEYS[4])) or 0}
end
local wait = -1
if writer_pttl ~= -2 then
  wait = writer_pttl
else
  local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
  if first[2] then
    wait = tonumber(first[2]) - now
  end
end
if writer_pttl ~= -2 or wait >= 0 then
  redis.call('ZADD', KEYS[3], now + math.max(wait, 0) + tonumber(ARGV[4]), me)
  keep_until_last(KEYS[3])
  return {0, wait}
end
fence_seed(KEYS[4])
local fence = redis.pcall('INCR', KEYS[4])
if type(fence) == 'table' and fence.err then
  return redis.error_reply(fence.err .. ' (dlock fence counter ' .. KEYS[4] .. ')')
end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ttl)
redis.call('ZREM', KEYS[3], me)
return {1, fence}
