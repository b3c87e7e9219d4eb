-- Release a lock if it is still ours, and announce the release to waiters.
-- KEYS[1]  the lock key
-- ARGV[1]  the owner token
-- ARGV[2]  the release channel (same hash tag as the lock key)
-- returns  1  the key held our token and is deleted
--          0  the key is absent or holds anything else, even a non-string (nothing changed)
-- ARGV[#ARGV]  the publish command: PUBLISH, or SPUBLISH on a Redis Cluster (sharded)
if redis.pcall('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call(ARGV[#ARGV], ARGV[2], KEYS[1])
  return 1
end
return 0
