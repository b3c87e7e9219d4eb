-- Release a lock if it is still ours, and wake exactly the next queued waiter.
-- (queue.lua is prepended: the waiter queue's functions.)
-- KEYS[1]  the lock key (a plain lock's string, or a reentrant lock's hash for 'force'
--          and 'leave')
-- KEYS[2]  the waiter queue: token -> arrival      KEYS[3]  token -> claim expiry
-- ARGV[1]  the owner token (ignored for 'force')
-- ARGV[2]  the release channel; waiters' clients listen on '<channel>:<waiter id>'
-- ARGV[3]  'own': release our hold; 'force': delete any holder; 'leave': take waiter
--          ARGV[1] out of the queue (waking the next head if the lock is free)
-- ARGV[4]  the grace in ms a woken waiter has to come and take the lock
-- ARGV[5]  'leave': the waiter's client's waiter id
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
  done = q_leave(KEYS[2], KEYS[3], q_member(ARGV[5], ARGV[1]))
  if redis.call('EXISTS', KEYS[1]) == 1 then
    return done
  end
end
q_wake(KEYS[2], KEYS[3], ARGV[2], tonumber(ARGV[4]), ARGV[#ARGV])
return done
