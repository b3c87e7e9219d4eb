-- Write an election's record unless a newer term is stored, and announce the write.
-- KEYS[1]  the record: a hash {term = the term in decimal, data = the leader's data},
--          never expiring (like the fence counter)
-- ARGV[1]  the term: a u64 in decimal, without leading zeros
-- ARGV[2]  the data
-- ARGV[3]  the record's channel: observers listen there as waiters listen for releases
-- ARGV[#ARGV]  the publish command: PUBLISH, or SPUBLISH on a Redis Cluster (sharded)
-- returns  1  written (a repeat of the same term overwrites it) and announced
--          0  the stored term is greater (nothing written, nothing announced)
--          an error if the stored term is not a decimal number (the key was tampered with)
--
-- Terms are fences, and fences are u64: Lua numbers are doubles, exact only up to 2^53,
-- so the terms are compared as digit strings instead (the longer is greater; of equal
-- length, the first differing digit decides), byte by byte: string '<' would go through
-- the server's locale (strcoll).
local function greater(a, b)
  if #a ~= #b then
    return #a > #b
  end
  for i = 1, #a do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then
      return x > y
    end
  end
  return false
end
local stored = redis.call('HGET', KEYS[1], 'term')
if stored then
  if not (stored == '0' or string.find(stored, '^[1-9]%d*$')) then
    return redis.error_reply('ERR the election record ' .. KEYS[1] ..
      ' holds a term that is not a decimal number: it was tampered with')
  end
  if greater(stored, ARGV[1]) then
    return 0
  end
end
redis.call('HSET', KEYS[1], 'term', ARGV[1], 'data', ARGV[2])
redis.call(ARGV[#ARGV], ARGV[3], KEYS[1])
return 1
