-- Take N permits of a semaphore, each holder's permits a lease of its own.
-- KEYS[1]  zset: holder token -> lease expiry (ms, server clock)
-- KEYS[2]  hash: holder token -> permits held
-- KEYS[3]  the permit count (set on first use from ARGV[3]; `set_permits` changes it)
-- ARGV[1]  the holder token
-- ARGV[2]  permits wanted (N >= 1)
-- ARGV[3]  the permit count to start with, if none is stored yet
-- ARGV[4]  lease length in milliseconds
-- returns  {1, 0}     acquired
--          {0, wait}  not enough free permits; wait = ms until the earliest lease ends
--                     (-1 if no holder has a lease, i.e. N exceeds the permit count)
local now_parts = redis.call('TIME')
local now = tonumber(now_parts[1]) * 1000 + math.floor(tonumber(now_parts[2]) / 1000)
-- Leases that ran out give their permits back.
local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)
for _, token in ipairs(expired) do
  redis.call('HDEL', KEYS[2], token)
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('SET', KEYS[3], ARGV[3], 'NX')
local capacity = tonumber(redis.call('GET', KEYS[3]))
local used = 0
for _, n in ipairs(redis.call('HVALS', KEYS[2])) do
  used = used + tonumber(n)
end
local want = tonumber(ARGV[2])
-- A repeat of a granted request (its reply lost) is granted again, not twice.
if redis.call('HGET', KEYS[2], ARGV[1]) then
  used = used - tonumber(redis.call('HGET', KEYS[2], ARGV[1]))
end
if used + want <= capacity then
  local ttl = tonumber(ARGV[4])
  redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
  redis.call('HSET', KEYS[2], ARGV[1], want)
  -- The holder keys vanish with the last lease; the permit count stays.
  local last = tonumber(redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')[2])
  redis.call('PEXPIREAT', KEYS[1], last)
  redis.call('PEXPIREAT', KEYS[2], last)
  return {1, 0}
end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if first[2] then
  return {0, tonumber(first[2]) - now}
end
return {0, -1}
