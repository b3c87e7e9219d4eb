-- The plain lock's acquire, continued (after acquire.lua and queue.lua): the lock is held,
-- or waiters queue.
local holder = redis.pcall('GET', KEYS[1])
if type(holder) == 'table' and holder.err then
  return redis.error_reply('WRONGTYPE dlock lock key ' .. KEYS[1] .. ' holds a non-string value')
end
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, tonumber(redis.call('GET', KEYS[2])) or 0}
end
local me
if ARGV[6] == '1' then
  me = q_member(ARGV[5], '=' .. ARGV[2] .. ':' .. ARGV[1])
else
  me = q_member(ARGV[5], ARGV[1])
end
local now, arrival = q_now()
local head = q_head(KEYS[3], KEYS[4], now)
local wait
if holder then
  wait = redis.call('PTTL', KEYS[1])
elseif head == nil or head == me then
  -- Free, and ours to take: the head of the queue may, nobody else (no barging).
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  q_leave(KEYS[3], KEYS[4], me)
  return mint()
else
  wait = q_claim_left(KEYS[4], head, now, tonumber(ARGV[2]))
end
if ARGV[3] == 'wait' then
  q_join(KEYS[3], KEYS[4], me, now, arrival, wait, tonumber(ARGV[4]))
end
return {0, wait, tonumber(redis.pcall('GET', KEYS[2])) or 0}
