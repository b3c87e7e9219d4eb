-- Renew a holder's permit lease if it is still live.
-- KEYS[1]  zset: holder token -> lease expiry
-- KEYS[2]  hash: holder token -> permits held
-- ARGV[1]  the holder token
-- ARGV[2]  the new lease length in milliseconds
-- returns  1  renewed;  0  no live lease under that token
local now_parts = redis.call('TIME')
local now = tonumber(now_parts[1]) * 1000 + math.floor(tonumber(now_parts[2]) / 1000)
local expiry = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not expiry or tonumber(expiry) <= now then
  return 0
end
redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[2]), ARGV[1])
local last = tonumber(redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')[2])
redis.call('PEXPIREAT', KEYS[1], last)
redis.call('PEXPIREAT', KEYS[2], last)
return 1
