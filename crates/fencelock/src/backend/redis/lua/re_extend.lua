-- Renew a reentrant lock's expiry if the hold under this token is live.
-- KEYS[1]  the lock hash
-- ARGV[1]  the request token of the hold
-- ARGV[2]  the lease length in milliseconds
-- returns  1 renewed, 0 no such hold
if redis.pcall('HEXISTS', KEYS[1], 't:' .. ARGV[1]) == 1 then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
