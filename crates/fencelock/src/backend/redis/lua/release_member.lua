-- Release a RedLock member's key if it is still ours (compare-and-delete; nobody queues
-- on a quorum member, so nothing is announced).
-- KEYS[1]  the lock key
-- ARGV[1]  the owner token
-- returns  1  the key held our token and is deleted
--          0  the key is absent or holds anything else, even a non-string (nothing changed)
if redis.pcall('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
