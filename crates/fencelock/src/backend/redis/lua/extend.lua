-- Reset a lock's lease if it is still ours.
-- KEYS[1]  the lock key
-- ARGV[1]  the owner token
-- ARGV[2]  the new lease length in milliseconds
-- returns  1  the key holds our token and now expires ARGV[2] ms from now
--          0  the key is absent or holds anything else, even a non-string (nothing changed)
if redis.pcall('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
