-- The plain lock's release, continued (after release.lua and queue.lua): waiters queue,
-- or another mode than 'own'.
local publish = ARGV[#ARGV]

local function hand_over()
  local q, c = KEYS[2], KEYS[3]
  if redis.call('EXISTS', q) == 0 then
    return
  end
  local now = q_now()
  while true do
    local head = q_head(q, c, now)
    if not head then
      return
    end
    local id, ttl, token = q_hand_parts(head)
    if not id then
      q_wake(q, c, ARGV[2], tonumber(ARGV[4]), publish)
      return
    end
    local granted = q_offer(q, c, KEYS[4], ARGV[2], publish, head, id, token)
    if granted == nil then
      return
    end
    if granted then
      redis.call('SET', KEYS[1], token, 'PX', ttl)
      return
    end
  end
end

-- 'own': released above (waiters queue).
local done = 1
if ARGV[3] == 'force' then
  done = redis.call('DEL', KEYS[1])
elseif ARGV[3] == 'leave' then
  done = q_leave(KEYS[2], KEYS[3], q_member(ARGV[5], '=' .. ARGV[6] .. ':' .. ARGV[1]))
  -- A reentrant lock's waiter.
  done = math.max(done, q_leave(KEYS[2], KEYS[3], q_member(ARGV[5], ARGV[1])))
  if redis.pcall('GET', KEYS[1]) == ARGV[1] then
    -- Handed over to us as we left: hand it on.
    redis.call('DEL', KEYS[1])
  elseif redis.call('EXISTS', KEYS[1]) == 1 then
    return done
  end
end
hand_over()
return done
