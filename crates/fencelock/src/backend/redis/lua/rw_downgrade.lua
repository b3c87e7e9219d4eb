-- Turn the write hold into a read hold, atomically.
-- KEYS[1]  the writer key      KEYS[2]  readers zset
-- ARGV[1]  the token           ARGV[2]  the read lease in milliseconds
-- ARGV[3]  the release channel (readers listen on '<channel>:r')
-- returns  1 downgraded, 0 the write hold was not live
-- ARGV[#ARGV]  the publish command: PUBLISH, or SPUBLISH on a Redis Cluster (sharded)
if redis.pcall('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('DEL', KEYS[1])
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), ARGV[1])
local last = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
redis.call('PEXPIREAT', KEYS[2], last[2])
redis.call(ARGV[#ARGV], ARGV[3] .. ':r', KEYS[1])
return 1
