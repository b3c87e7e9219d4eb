-- The start of a fence counter that moved. dlock's key layout (keys.rs) moved the
-- counter of a hash-tagged lock key from '<lock key>:fence' (which is another lock's key
-- now) to '{tag}<length>:<lock key>:fence'. Every script that mints fences passes that old
-- place as its LAST key (the counter itself for a lock key whose counter did not move):
-- a missing counter starts from the positive integer found there, once, so fences keep
-- increasing across the upgrade. The old key is only read; anything else there (a lock's
-- token, another type) is ignored.
local function fence_seed(counter)
  local old = KEYS[#KEYS]
  if old ~= counter and redis.call('EXISTS', counter) == 0 then
    local v = redis.pcall('GET', old)
    if type(v) == 'string' and #v <= 18 and string.match(v, '^[1-9]%d*$') then
      redis.call('SET', counter, v)
    end
  end
end
