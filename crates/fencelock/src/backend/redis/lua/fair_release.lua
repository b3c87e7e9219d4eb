-- Release a fair lock if it is ours, and wake exactly the next waiter in line.
-- KEYS[1]  the lock key     KEYS[2]  queue zset     KEYS[3]  claims zset
-- ARGV[1]  the token (ignored when ARGV[3] is 'force')
-- ARGV[2]  the release channel; each waiter listens on '<channel>:<its token>'
-- ARGV[3]  'own': release our hold; 'force': delete any holder; 'leave': take ARGV[1]
--          out of the queue (waking the next head if the lock is free)
-- returns  1 a hold was released (own/force) or the waiter was queued (leave), else 0
-- ARGV[#ARGV]  the publish command: PUBLISH, or SPUBLISH on a Redis Cluster (sharded)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local done = 0
if ARGV[3] == 'own' then
  if redis.pcall('GET', KEYS[1]) == ARGV[1] then
    redis.call('DEL', KEYS[1])
    done = 1
  end
elseif ARGV[3] == 'force' then
  done = redis.call('DEL', KEYS[1])
else
  done = redis.call('ZREM', KEYS[2], ARGV[1])
  redis.call('ZREM', KEYS[3], ARGV[1])
  if redis.call('EXISTS', KEYS[1]) == 1 then
    return done
  end
end
if done == 0 then
  return 0
end
for _, gone in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now)) do
  redis.call('ZREM', KEYS[2], gone)
end
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
local head = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
if head then
  redis.call(ARGV[#ARGV], ARGV[2] .. ':' .. head, KEYS[1])
end
return 1
