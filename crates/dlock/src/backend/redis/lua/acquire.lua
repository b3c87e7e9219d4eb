-- Acquire a lock and mint its fence, atomically.
-- KEYS[1]  the lock key (holds the owner token as a plain string)
-- KEYS[2]  the fence counter (same hash tag; never expires)
-- ARGV[1]  the owner token
-- ARGV[2]  the lease length in milliseconds
-- returns  {1, fence}  acquired; fence = the counter after INCR
--          {0, pttl}   held by someone else; pttl = the holder's PTTL (-1: no expiry)
--          A repeat of an acquire that was granted (its reply lost) finds our own token:
--          it renews the expiry and returns the fence of that grant.
--          error       WRONGTYPE if the lock key holds a non-string value; the INCR error
--                      if the fence counter cannot be incremented (the lock is then not
--                      left behind)
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local fence = redis.pcall('INCR', KEYS[2])
  if type(fence) == 'table' and fence.err then
    redis.call('DEL', KEYS[1])
    return redis.error_reply(fence.err .. ' (dlock fence counter ' .. KEYS[2] .. ')')
  end
  return {1, fence}
end
if redis.call('TYPE', KEYS[1]).ok ~= 'string' then
  return redis.error_reply('WRONGTYPE dlock lock key ' .. KEYS[1] .. ' holds a non-string value')
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, tonumber(redis.call('GET', KEYS[2])) or 0}
end
return {0, redis.call('PTTL', KEYS[1])}
