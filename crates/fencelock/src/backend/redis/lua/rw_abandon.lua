-- Withdraw a waiting writer's claim: readers it held back are told when no writer waits
-- any more; if the lock is free, the next waiting writer is woken (the leaver may have
-- been the one a release woke).
-- KEYS[1]  the writer key      KEYS[2]  waiting writers zset      KEYS[3]  readers zset
-- ARGV[1]  the token           ARGV[2]  the release channel (readers: '<channel>:r',
--          a writer's client: '<channel>:w:<waiter id>', the message naming its token)
-- ARGV[3]  the writer's client's waiter id
-- ARGV[#ARGV]  the publish command: PUBLISH, or SPUBLISH on a Redis Cluster (sharded)
if redis.call('ZREM', KEYS[2], ARGV[3] .. ':' .. ARGV[1]) == 1 then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
  local writer = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
  if not writer then
    redis.call(ARGV[#ARGV], ARGV[2] .. ':r', KEYS[1])
  elseif redis.call('EXISTS', KEYS[1]) == 0 and redis.call('ZCARD', KEYS[3]) == 0 then
    local sep = string.find(writer, ':', 1, true)
    redis.call(ARGV[#ARGV], ARGV[2] .. ':w:' .. string.sub(writer, 1, sep - 1), string.sub(writer, sep + 1))
  end
end
return 1
