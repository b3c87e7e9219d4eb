-- Release a plain lock if it is still ours and nobody waits: rslock's compare-and-delete
-- plus one EXISTS. With waiters queued it changes nothing and says so: the client then
-- runs release.lua, which hands the lock over to the head of the queue.
-- KEYS[1]  the lock key
-- KEYS[2]  the waiter queue (mod.rs: waiters)
-- ARGV[1]  the owner token
-- returns  1   deleted (it was ours and nobody waits)
--          0   not ours (absent, or holds anything else, even a non-string): unchanged
--          -1  ours, but waiters queue: unchanged (the caller runs release.lua)
if redis.pcall('GET', KEYS[1]) == ARGV[1] then
  if redis.call('EXISTS', KEYS[2]) == 0 then
    return redis.call('DEL', KEYS[1])
  end
  return -1
end
return 0
