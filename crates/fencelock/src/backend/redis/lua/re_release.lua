-- Give back one hold of a reentrant lock; the last one deletes it and wakes the next
-- queued waiter. (queue.lua is prepended: the waiter queue's functions.)
-- KEYS[1]  the lock hash
-- KEYS[2]  the waiter queue: token -> arrival      KEYS[3]  token -> claim expiry
-- KEYS[4]  the fence counter's place before the key layout changed (fence.lua; a release
--          of a reentrant lock wakes, never mints)
-- ARGV[1]  the owner
-- ARGV[2]  the request token of the hold
-- ARGV[3]  the release channel; waiters' clients listen on '<channel>:<waiter id>'
-- ARGV[4]  the grace in ms a woken waiter has to come
-- returns  1  the hold was live and is given back
--          0  no such hold (already given back, expired, or another owner's): no change
-- ARGV[#ARGV]  the publish command: PUBLISH, or SPUBLISH on a Redis Cluster (sharded)
if redis.pcall('HEXISTS', KEYS[1], 't:' .. ARGV[2]) ~= 1 or not redis.call('HGET', KEYS[1], ARGV[1]) then
  return 0
end
redis.call('HDEL', KEYS[1], 't:' .. ARGV[2])
if redis.call('HINCRBY', KEYS[1], ARGV[1], -1) <= 0 then
  redis.call('DEL', KEYS[1])
  q_wake(KEYS[2], KEYS[3], ARGV[3], tonumber(ARGV[4]), ARGV[#ARGV])
end
return 1
