-- Renew the writer's or a reader's lease.
-- KEYS[1]  the writer key      KEYS[2]  readers zset
-- ARGV[1]  the token           ARGV[2]  the lease length in milliseconds
-- returns  1 renewed, 0 no live hold under the token
if redis.pcall('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local expiry = redis.call('ZSCORE', KEYS[2], ARGV[1])
if expiry and tonumber(expiry) > now then
  redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), ARGV[1])
  local last = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
  redis.call('PEXPIREAT', KEYS[2], last[2])
  return 1
end
return 0
