-- Give a holder's permits back, or leave the waiter queue, and wake the next waiter.
-- (queue.lua is prepended: the waiter queue's functions.)
-- KEYS[1]  zset: holder token -> lease expiry
-- KEYS[2]  hash: holder token -> permits held
-- KEYS[3]  the waiter queue: token -> arrival      KEYS[4]  token -> claim expiry
-- KEYS[5]  the permit count
-- KEYS[6]  the permits held: the running total of KEYS[2] (q_permits_used)
-- KEYS[7]  the hand-over counter
-- KEYS[8]  the counter's place before the key layout changed (fence.lua)
-- ARGV[1]  the holder (or waiter) token
-- ARGV[2]  the release channel; waiters' clients listen on '<channel>:<waiter id>'
-- ARGV[3]  'own': give back ARGV[1]'s permits; 'force': every holder's; 'leave': take
--          waiter ARGV[1] out of the queue
-- ARGV[4]  the grace in ms a woken waiter has to come
-- ARGV[5]  'leave': the waiter's client's waiter id
-- ARGV[6]  'leave': the waiter's ttl in ms         ARGV[7]  'leave': the permits it wanted
-- ARGV[#ARGV]  the publish command: PUBLISH, or SPUBLISH on a Redis Cluster (sharded)
-- returns  own: 1 the holder's lease was live and is gone now, 0 no live lease (expired
--          or never there); force: 1 if any live permit was held; leave: 1 if queued
-- Freed permits are handed over to the queue's heads (q_hand_permits) when permits were
-- freed or the head left; with nobody queued, nothing is published. A waiter that leaves
-- holding permits handed over to it as it left gives them back (and on). The running
-- total of permits held follows every holder that leaves (a lease that ran out included)
-- and every hand-over, in this same step.
local now = q_now()
local grace, publish = tonumber(ARGV[4]), ARGV[#ARGV]
-- The permits held (expired leases given back), then `token`'s taken out of them.
local function give_back(token)
  local used, stored = q_permits_used(KEYS[1], KEYS[2], KEYS[6], now)
  local n = redis.call('HGET', KEYS[2], token)
  if n then
    used = used - tonumber(n)
    redis.call('ZREM', KEYS[1], token)
    redis.call('HDEL', KEYS[2], token)
  end
  return used, stored
end
-- Hands the free permits over to the queue's heads, then stores the total.
local function hand_over(used, stored)
  if redis.call('EXISTS', KEYS[3]) == 1 then
    local capacity = tonumber(redis.call('GET', KEYS[5])) or 0
    used = q_add_granted(KEYS[2], used, q_hand_permits(KEYS[1], KEYS[2], KEYS[3], KEYS[4],
      KEYS[7], ARGV[2], grace, publish, capacity - used, now))
  end
  if used ~= stored then
    q_store_used(KEYS[1], KEYS[6], used)
  end
end
if ARGV[3] == 'leave' then
  local plain = q_member(ARGV[5], ARGV[1])
  local handed = q_member(ARGV[5], '=' .. ARGV[6] .. ',' .. ARGV[7] .. ':' .. ARGV[1])
  local head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
  local done = math.max(q_leave(KEYS[3], KEYS[4], plain), q_leave(KEYS[3], KEYS[4], handed))
  if redis.call('HEXISTS', KEYS[2], ARGV[1]) == 1 then
    -- Handed over to us as we left: give the permits back, and on.
    hand_over(give_back(ARGV[1]))
  elseif head == plain or head == handed then
    hand_over(q_permits_used(KEYS[1], KEYS[2], KEYS[6], now))
  end
  return done
end
if ARGV[3] == 'force' then
  local live = redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf')
  redis.call('DEL', KEYS[1], KEYS[2], KEYS[6])
  hand_over(0, nil)
  if live > 0 then
    return 1
  end
  return 0
end
local expiry = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not expiry then
  return 0
end
-- A lease that ran out gave its permits back in give_back's first step already.
hand_over(give_back(ARGV[1]))
if tonumber(expiry) > now then
  return 1
end
return 0
