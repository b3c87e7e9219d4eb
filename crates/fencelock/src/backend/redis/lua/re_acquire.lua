-- Take one hold of a reentrant lock (hash layout), atomically; queue the
-- caller if another owner holds it. (queue.lua is prepended: the waiter queue.)
-- KEYS[1]  the lock hash: owner -> hold count, ':fence' -> the tenure's fence,
--          't:<token>' -> 1 for every live hold (so a repeated request is recognised)
-- KEYS[2]  the fence counter (same hash tag; never expires)
-- KEYS[3]  the waiter queue: token -> arrival      KEYS[4]  token -> claim expiry
-- KEYS[5]  the fence counter's place before the key layout changed (fence.lua)
-- ARGV[1]  the owner (always contains '/', so it never collides with the other fields)
-- ARGV[2]  the request token of this hold
-- ARGV[3]  the lease length in milliseconds
-- ARGV[4]  the reentrancy limit
-- ARGV[5]  'wait': queue the caller if it must wait; 'try': don't
-- ARGV[6]  the waiter grace in ms
-- ARGV[7]  the caller's client's waiter id (its member is '<id>:<token>')
-- returns  {1, fence}  a hold (new tenure: a new fence; re-entry: the tenure's fence)
--          {0, wait}   another owner holds it, or it is free but the queue head's;
--                      wait = ms until its lease or the head's claim ends
--          {2, count}  the owner is at the reentrancy limit (nothing changed)
local kind = redis.call('TYPE', KEYS[1]).ok
local me = q_member(ARGV[7], ARGV[2])
if kind == 'none' then
  if redis.call('EXISTS', KEYS[3]) == 1 then
    local now, arrival = q_now()
    local head = q_head(KEYS[3], KEYS[4], now)
    if head ~= nil and head ~= me then
      local wait = q_claim_left(KEYS[4], head, now, tonumber(ARGV[3]))
      if ARGV[5] == 'wait' then
        q_join(KEYS[3], KEYS[4], me, now, arrival, wait, tonumber(ARGV[6]))
      end
      return {0, wait}
    end
    q_leave(KEYS[3], KEYS[4], me)
  end
  fence_seed(KEYS[2])
  local fence = redis.pcall('INCR', KEYS[2])
  if type(fence) == 'table' and fence.err then
    return redis.error_reply(fence.err .. ' (dlock fence counter ' .. KEYS[2] .. ')')
  end
  redis.call('HSET', KEYS[1], ARGV[1], 1, ':fence', fence, 't:' .. ARGV[2], 1)
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return {1, fence}
end
if kind ~= 'hash' then
  return redis.error_reply('WRONGTYPE dlock reentrant lock key ' .. KEYS[1] .. ' holds a non-hash value')
end
local count = redis.call('HGET', KEYS[1], ARGV[1])
if not count then
  local pttl = redis.call('PTTL', KEYS[1])
  if ARGV[5] == 'wait' then
    local now, arrival = q_now()
    q_head(KEYS[3], KEYS[4], now)
    q_join(KEYS[3], KEYS[4], me, now, arrival, pttl, tonumber(ARGV[6]))
  end
  return {0, pttl}
end
if redis.call('HEXISTS', KEYS[1], 't:' .. ARGV[2]) == 0 then
  if tonumber(count) >= tonumber(ARGV[4]) then
    return {2, tonumber(count)}
  end
  redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
  redis.call('HSET', KEYS[1], 't:' .. ARGV[2], 1)
end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return {1, tonumber(redis.call('HGET', KEYS[1], ':fence')) or 0}
