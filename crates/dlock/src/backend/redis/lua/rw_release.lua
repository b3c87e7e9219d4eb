-- Release the writer's or a reader's hold; announce when a writer may now come in.
-- KEYS[1]  the writer key      KEYS[2]  readers zset
-- ARGV[1]  the token           ARGV[2]  the release channel; readers listen on
--          '<channel>:r', writers on '<channel>:w'
-- returns  1 released, 0 no live hold under the token
-- ARGV[#ARGV]  the publish command: PUBLISH, or SPUBLISH on a Redis Cluster (sharded)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if redis.pcall('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
  if redis.call('ZCARD', KEYS[2]) == 0 then
    redis.call(ARGV[#ARGV], ARGV[2] .. ':w', KEYS[1])
  end
  redis.call(ARGV[#ARGV], ARGV[2] .. ':r', KEYS[1])
  return 1
end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
if redis.call('ZREM', KEYS[2], ARGV[1]) == 1 then
  if redis.call('ZCARD', KEYS[2]) == 0 then
    redis.call(ARGV[#ARGV], ARGV[2] .. ':w', KEYS[1])
  end
  return 1
end
return 0
