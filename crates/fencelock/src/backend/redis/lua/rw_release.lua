-- Release the writer's or a reader's hold; wake whoever may now come in: one waiting
-- writer (writers first), else every waiting reader.
-- KEYS[1]  the writer key      KEYS[2]  readers zset      KEYS[3]  waiting writers zset
--          ('<waiter id>:<token>' -> claim expiry)
-- ARGV[1]  the token           ARGV[2]  the release channel; readers listen on
--          '<channel>:r', a waiting writer's client on '<channel>:w:<waiter id>' (the
--          message names the writer's token)
-- returns  1 released, 0 no live hold under the token
-- ARGV[#ARGV]  the publish command: PUBLISH, or SPUBLISH on a Redis Cluster (sharded)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local publish = ARGV[#ARGV]
-- Called when the lock may be free: one writer if any waits, else the readers.
local function wake(readers_too)
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
  local writer = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
  if writer then
    if redis.call('ZCARD', KEYS[2]) == 0 then
      local sep = string.find(writer, ':', 1, true)
      redis.call(publish, ARGV[2] .. ':w:' .. string.sub(writer, 1, sep - 1), string.sub(writer, sep + 1))
    end
  elseif readers_too then
    redis.call(publish, ARGV[2] .. ':r', KEYS[1])
  end
end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
if redis.pcall('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  wake(true)
  return 1
end
if redis.call('ZREM', KEYS[2], ARGV[1]) == 1 then
  wake(false)
  return 1
end
return 0
