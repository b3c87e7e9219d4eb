-- Add (or, with a negative delta, remove) permits, or set their count, atomically, within
-- 1..=max; hand added permits over to waiters.
-- (queue.lua is prepended: the waiter queue's functions.)
-- KEYS[1]  the permit count
-- KEYS[2]  the waiter queue: token -> arrival      KEYS[3]  token -> claim expiry
-- KEYS[4]  zset: holder token -> lease expiry       KEYS[5]  hash: holder token -> permits
-- KEYS[6]  the permits held: the running total of KEYS[5] (q_permits_used)
-- KEYS[7]  the hand-over counter
-- KEYS[8]  the counter's place before the key layout changed (fence.lua)
-- ARGV[1]  the delta ('add') or the new count ('set')
-- ARGV[2]  the count to start from if none is stored yet
-- ARGV[3]  the largest count allowed
-- ARGV[4]  the release channel        ARGV[5]  'add' or 'set'
-- ARGV[6]  the grace in ms a woken waiter has to come
-- ARGV[#ARGV]  the publish command
-- returns  the new count, or -1 if it would leave 1..=max (nothing changed)
local old = tonumber(redis.call('GET', KEYS[1]) or ARGV[2])
local count = tonumber(ARGV[1])
if ARGV[5] == 'add' then
  count = old + count
end
if count < 1 or count > tonumber(ARGV[3]) then
  return -1
end
redis.call('SET', KEYS[1], count)
if count > old and redis.call('EXISTS', KEYS[2]) == 1 then
  local now = q_now()
  local used, stored = q_permits_used(KEYS[4], KEYS[5], KEYS[6], now)
  used = q_add_granted(KEYS[5], used, q_hand_permits(KEYS[4], KEYS[5], KEYS[2], KEYS[3],
    KEYS[7], ARGV[4], tonumber(ARGV[6]), ARGV[#ARGV], count - used, now))
  if used ~= stored then
    q_store_used(KEYS[4], KEYS[6], used)
  end
end
return count
