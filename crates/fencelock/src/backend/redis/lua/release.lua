-- Release a lock if it is still ours and hand it over to the next queued waiter.
-- The uncontended release comes first, before the waiter queue's functions (queue.lua,
-- then release_queued.lua follow it: scripts.rs).
-- KEYS[1]  the lock key (a plain lock's string, or a reentrant lock's hash for 'force'
--          and 'leave')
-- KEYS[2]  the waiter queue: token -> arrival      KEYS[3]  token -> claim expiry
-- KEYS[4]  the fence counter
-- KEYS[5]  the fence counter's place before the key layout changed (fence.lua)
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
-- '!<fence>:<token>' tells it that it holds the lock — the waiter sends nothing more. A
-- head whose client does not listen (PUBLISH reaches nobody: it crashed, or its pub/sub
-- connection is down) is dropped and the next one is tried (on one server; a cluster's
-- shard counts only its own node's subscribers, so there every head is granted). Waiters
-- of the other form ('<id>:<token>': a reentrant lock's, or a client's that waits for
-- replicas) are woken to take the lock themselves.
if ARGV[3] == 'own' then
  if redis.pcall('GET', KEYS[1]) ~= ARGV[1] then
    return 0
  end
  redis.call('DEL', KEYS[1])
  if redis.call('EXISTS', KEYS[2]) == 0 then
    return 1
  end
end
