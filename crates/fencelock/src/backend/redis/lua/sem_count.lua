-- Count the permits held under live leases.
-- KEYS[1]  zset: holder token -> lease expiry
-- KEYS[2]  hash: holder token -> permits held
-- KEYS[3]  the permit count
-- returns  {permits in use, the permit count or -1 if none is stored}
local now_parts = redis.call('TIME')
local now = tonumber(now_parts[1]) * 1000 + math.floor(tonumber(now_parts[2]) / 1000)
local used = 0
for _, token in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf')) do
  used = used + tonumber(redis.call('HGET', KEYS[2], token) or '0')
end
return {used, tonumber(redis.call('GET', KEYS[3]) or '-1')}
