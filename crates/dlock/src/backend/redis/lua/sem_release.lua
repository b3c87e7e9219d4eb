-- Give a holder's permits back, or leave the waiter queue, and wake the next waiter.
-- (queue.lua is prepended: the waiter queue's functions.)
-- KEYS[1]  zset: holder token -> lease expiry
-- KEYS[2]  hash: holder token -> permits held
-- KEYS[3]  the waiter queue: token -> arrival      KEYS[4]  token -> claim expiry
-- ARGV[1]  the holder (or waiter) token
-- ARGV[2]  the release channel; waiters' clients listen on '<channel>:<waiter id>'
-- ARGV[3]  'own': give back ARGV[1]'s permits; 'force': every holder's; 'leave': take
--          waiter ARGV[1] out of the queue
-- ARGV[4]  the grace in ms a woken waiter has to come
-- ARGV[5]  'leave': the waiter's client's waiter id
-- ARGV[#ARGV]  the publish command: PUBLISH, or SPUBLISH on a Redis Cluster (sharded)
-- returns  own: 1 the holder's lease was live and is gone now, 0 no live lease (expired
--          or never there); force: 1 if any live permit was held; leave: 1 if queued
-- The next waiter is woken when permits were freed (or the head left); with nobody
-- queued, nothing is published.
local now = q_now()
local grace, publish = tonumber(ARGV[4]), ARGV[#ARGV]
if ARGV[3] == 'leave' then
  local me = q_member(ARGV[5], ARGV[1])
  local was_head = redis.call('ZRANGE', KEYS[3], 0, 0)[1] == me
  local done = q_leave(KEYS[3], KEYS[4], me)
  if was_head then
    q_wake(KEYS[3], KEYS[4], ARGV[2], grace, publish)
  end
  return done
end
if ARGV[3] == 'force' then
  local live = redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf')
  redis.call('DEL', KEYS[1], KEYS[2])
  q_wake(KEYS[3], KEYS[4], ARGV[2], grace, publish)
  if live > 0 then
    return 1
  end
  return 0
end
local expiry = redis.call('ZSCORE', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
if expiry then
  q_wake(KEYS[3], KEYS[4], ARGV[2], grace, publish)
end
if expiry and tonumber(expiry) > now then
  return 1
end
return 0
