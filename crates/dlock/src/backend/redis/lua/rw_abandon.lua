-- Withdraw a waiting writer's claim; readers it held back are told when none is left.
-- KEYS[1]  the writer key      KEYS[2]  waiting writers zset
-- ARGV[1]  the token           ARGV[2]  the release channel (readers: '<channel>:r')
-- ARGV[#ARGV]  the publish command: PUBLISH, or SPUBLISH on a Redis Cluster (sharded)
if redis.call('ZREM', KEYS[2], ARGV[1]) == 1 and redis.call('ZCARD', KEYS[2]) == 0 then
  redis.call(ARGV[#ARGV], ARGV[2] .. ':r', KEYS[1])
end
return 1
