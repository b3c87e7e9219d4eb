-- Give a holder's permits back and announce it, once per permit.
-- KEYS[1]  zset: holder token -> lease expiry
-- KEYS[2]  hash: holder token -> permits held
-- ARGV[1]  the holder token
-- ARGV[2]  the release channel
-- returns  1  the holder's lease was live and is gone now
--          0  no live lease under that token (expired or never there)
-- ARGV[#ARGV]  the publish command: PUBLISH, or SPUBLISH on a Redis Cluster (sharded)
local now_parts = redis.call('TIME')
local now = tonumber(now_parts[1]) * 1000 + math.floor(tonumber(now_parts[2]) / 1000)
local expiry = redis.call('ZSCORE', KEYS[1], ARGV[1])
local n = tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '0')
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
if expiry and tonumber(expiry) > now then
  for _ = 1, math.max(n, 1) do
    redis.call(ARGV[#ARGV], ARGV[2], KEYS[1])
  end
  return 1
end
return 0
