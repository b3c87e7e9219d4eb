-- Add (or, with a negative delta, remove) permits, atomically, within 0..=max.
-- KEYS[1]  the permit count
-- ARGV[1]  the delta
-- ARGV[2]  the count to start from if none is stored yet
-- ARGV[3]  the largest count allowed
-- ARGV[4]  the release channel        ARGV[#ARGV]  the publish command
-- returns  the new count, or -1 if it would leave 1..=max (nothing changed)
local count = tonumber(redis.call('GET', KEYS[1]) or ARGV[2]) + tonumber(ARGV[1])
if count < 1 or count > tonumber(ARGV[3]) then
  return -1
end
redis.call('SET', KEYS[1], count)
if tonumber(ARGV[1]) > 0 then
  redis.call(ARGV[#ARGV], ARGV[4], KEYS[1])
end
return count
