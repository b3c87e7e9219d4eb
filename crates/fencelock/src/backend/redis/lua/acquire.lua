-- Acquire a lock and mint its fence, atomically; queue the caller if it must wait.
-- The fast path comes first (after fence.lua), before the waiter queue's functions
-- (queue.lua, then acquire_queued.lua follow it: scripts.rs), so that an uncontended acquire does not pay
-- for defining them.
-- KEYS[1]  the lock key (holds the owner token as a plain string)
-- KEYS[2]  the fence counter (same hash tag; never expires)
-- KEYS[3]  the waiter queue: token -> arrival      KEYS[4]  token -> claim expiry
-- KEYS[5]  the fence counter's place before the key layout changed (fence.lua)
-- ARGV[1]  the owner token
-- ARGV[2]  the lease length in milliseconds
-- ARGV[3]  'wait': take a place in the waiter queue if the lock cannot be granted now (the
--          caller listens on '<release channel>:<waiter id>'); 'try': don't
-- ARGV[4]  the waiter grace in ms: how long a claim outlives the caller's next attempt
-- ARGV[5]  the caller's client's waiter id
-- ARGV[6]  '1': a release may hand the lock over to the caller (its member is
--          '<id>:=<ttl ms>:<token>', see release.lua); '0': it must be woken and take the
--          lock itself (its member is '<id>:<token>'; clients that wait for replicas)
-- returns  {1, fence}  acquired; fence = the counter after INCR
--          {0, wait, counter}  held by someone else, or free but reserved for the waiter
--                      at the head of the queue; wait = ms until the holder's lease or the
--                      head's claim ends (-1: a holder without expiry); counter = the
--                      fence counter now, so that the caller can tell a hand-over made
--                      after this reply (its fence is higher) from an older one
--          A repeat of an acquire that was granted (its reply lost) finds our own token:
--          it renews the expiry and returns the fence of that grant.
--          error       WRONGTYPE if the lock key holds a non-string value; the INCR error
--                      if the fence counter cannot be incremented (the lock is then not
--                      left behind)
local function mint()
  fence_seed(KEYS[2])
  local fence = redis.pcall('INCR', KEYS[2])
  if type(fence) == 'table' and fence.err then
    redis.call('DEL', KEYS[1])
    return redis.error_reply(fence.err .. ' (dlock fence counter ' .. KEYS[2] .. ')')
  end
  return {1, fence}
end
-- Nobody queued: the classic lock, and the only path an uncontended acquire takes.
if redis.call('EXISTS', KEYS[3]) == 0
    and redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return mint()
end
