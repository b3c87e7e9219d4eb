-- Release a lock if it is still ours and hand it over to the next queued waiter.
-- (queue.lua is prepended: the waiter queue's functions.)
-- KEYS[1]  the lock key (a plain lock's string, or a reentrant lock's hash for 'force'
--          and 'leave')
-- KEYS[2]  the waiter queue: token -> arrival      KEYS[3]  token -> claim expiry
-- KEYS[4]  the fence counter
-- ARGV[1]  the owner token (ignored for 'force')
-- ARGV[2]  the release channel; waiters' clients listen on '<channel>:<waiter id>'
-- ARGV[3]  'own': release our hold; 'force': delete any holder; 'leave': take waiter
--          ARGV[1] out of the queue (handing the lock on if it was granted to it as it
--          left, or to the next head if the lock is free)
-- ARGV[4]  the grace in ms a woken waiter has to come and take the lock
-- ARGV[5]  'leave': the waiter's client's waiter id
-- ARGV[6]  'leave': the waiter's ttl in ms (part of a plain lock waiter's member)
-- ARGV[#ARGV]  the publish command: PUBLISH, or SPUBLISH on a Redis Cluster (sharded)
-- returns  1  own/force: a hold was deleted; leave: the waiter was queued
--          0  nothing changed (own: the key is absent or holds anything else, even a
--             non-string)
-- Nobody is told anything when nobody waits: no PUBLISH on the uncontended path.
--
-- Direct hand-over: a plain lock's waiter ('<id>:=<ttl>:<token>') at the head of the
-- queue is granted the lock here, in the release's own step: the key set to its token
-- with its ttl and the next fence minted, and the message on its client's channel
-- '=<fence>:<token>' tells it that it holds the lock — the waiter sends nothing more. A
-- head whose client does not listen (PUBLISH reaches nobody: it crashed, or its pub/sub
-- connection is down) is dropped and the next one is tried. Other waiters (a reentrant
-- lock's, '<id>:<token>') are woken to take the lock themselves.
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
    local sep = string.find(head, ':', 1, true)
    local rest = string.sub(head, sep + 1)
    if string.sub(rest, 1, 1) ~= '=' then
      q_wake(q, c, ARGV[2], tonumber(ARGV[4]), publish)
      return
    end
    local id = string.sub(head, 1, sep - 1)
    local sep2 = string.find(rest, ':', 1, true)
    local ttl, token = string.sub(rest, 2, sep2 - 1), string.sub(rest, sep2 + 1)
    q_leave(q, c, head)
    local fence = redis.pcall('INCR', KEYS[4])
    local to = ARGV[2] .. ':' .. id
    if type(fence) == 'table' then
      -- A broken fence counter: wake the waiter, whose own attempt reports it.
      redis.call(publish, to, token)
      return
    end
    if redis.call(publish, to, '=' .. fence .. ':' .. token) > 0 then
      redis.call('SET', KEYS[1], token, 'PX', ttl)
      return
    end
  end
end

local done
if ARGV[3] == 'own' then
  if redis.pcall('GET', KEYS[1]) ~= ARGV[1] then
    return 0
  end
  done = redis.call('DEL', KEYS[1])
elseif ARGV[3] == 'force' then
  done = redis.call('DEL', KEYS[1])
else
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
