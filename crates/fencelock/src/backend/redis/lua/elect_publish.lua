-- Write an election's record if the caller holds the election's lock, and announce it.
-- KEYS[1]  the lock key (the plain lock: it holds the holder's token)
-- KEYS[2]  the record: a hash {term = the term in decimal, data = the leader's data},
--          never expiring (like the fence counter); in the lock key's cluster slot
-- ARGV[1]  the caller's token
-- ARGV[2]  the term, in decimal
-- ARGV[3]  the data
-- ARGV[4]  the record's channel: observers listen there as waiters listen for releases
-- ARGV[#ARGV]  the publish command: PUBLISH, or SPUBLISH on a Redis Cluster (sharded)
-- returns  1  written (a repeat overwrites it with the same) and announced
--          0  the lock is not the caller's (nothing written, nothing announced)
--
-- Terms are not compared: only the holder writes, and a server that restarted without
-- persistence mints smaller terms again, which must not lock its elections out.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('HSET', KEYS[2], 'term', ARGV[2], 'data', ARGV[3])
redis.call(ARGV[#ARGV], ARGV[4], KEYS[2])
return 1
