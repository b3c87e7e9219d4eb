-- Give back one hold of a reentrant lock; the last one deletes it and announces it.
-- KEYS[1]  the lock hash
-- ARGV[1]  the owner
-- ARGV[2]  the request token of the hold
-- ARGV[3]  the release channel
-- returns  1  the hold was live and is given back
--          0  no such hold (already given back, expired, or another owner's): no change
-- ARGV[#ARGV]  the publish command: PUBLISH, or SPUBLISH on a Redis Cluster (sharded)
if redis.pcall('HEXISTS', KEYS[1], 't:' .. ARGV[2]) ~= 1 or not redis.call('HGET', KEYS[1], ARGV[1]) then
  return 0
end
redis.call('HDEL', KEYS[1], 't:' .. ARGV[2])
if redis.call('HINCRBY', KEYS[1], ARGV[1], -1) <= 0 then
  redis.call('DEL', KEYS[1])
  redis.call(ARGV[#ARGV], ARGV[3], KEYS[1])
end
return 1
