-- Release a lock if it is still ours, and wake exactly the next queued waiter.
-- KEYS[1]  the lock key
-- KEYS[2]  zset: waiter token -> arrival      KEYS[3]  zset: waiter token -> claim expiry
-- ARGV[1]  the owner token (ignored for 'force')
-- ARGV[2]  the release channel; each waiter listens on '<channel>:<its token>'
-- ARGV[3]  'own': release our hold; 'force': delete any holder; 'leave': take waiter
--          ARGV[1] out of the queue (waking the next head if the lock is free)
-- ARGV[4]  the grace in ms a woken waiter has to come and take the lock
-- ARGV[#ARGV]  the publish command: PUBLISH, or SPUBLISH on a Redis Cluster (sharded)
-- returns  1  own/force: a hold was deleted; leave: the waiter was queued
--          0  nothing changed (own: the key is absent or holds anything else, even a
--             non-string)
-- Nobody is told anything when nobody waits: no PUBLISH on the uncontended path.
local done
if ARGV[3] == 'own' then
  if redis.pcall('GET', KEYS[1]) ~= ARGV[1] then
    return 0
  end
  done = redis.call('DEL', KEYS[1])
elseif ARGV[3] == 'force' then
  done = redis.call('DEL', KEYS[1])
else
  done = redis.call('ZREM', KEYS[2], ARGV[1])
  redis.call('ZREM', KEYS[3], ARGV[1])
  if redis.call('EXISTS', KEYS[1]) == 1 then
    return done
  end
end
if redis.call('EXISTS', KEYS[2]) == 1 then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  for _, gone in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now)) do
    redis.call('ZREM', KEYS[2], gone)
  end
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
  local head = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
  if head then
    -- The head has at most the grace to come; if it crashed, its claim lapses and the
    -- others' fallback timers take over.
    local by = now + tonumber(ARGV[4])
    if (tonumber(redis.call('ZSCORE', KEYS[3], head)) or by) > by then
      redis.call('ZADD', KEYS[3], by, head)
    end
    redis.call(ARGV[#ARGV], ARGV[2] .. ':' .. head, KEYS[1])
  end
end
return done
