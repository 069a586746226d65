-- @version 1
-- Renew a loop lock if the caller still holds it: the fencing check a loop makes before each
-- write batch (orchestrator/cluster/locks.py). Comparing and renewing in one script means a holder
-- whose lease ran out, and was taken by another process, can never renew it back.
-- KEYS[1] lock:orch:<name>
-- ARGV[1] the holder's token  ARGV[2] lease (ms)
-- Returns 1 when the caller holds the lock (the lease now ends ARGV[2] ms from now), 0 when
-- the lock is gone or held by another token (nothing is written then).
if #KEYS ~= 1 or #ARGV ~= 2 then
  return redis.error_reply("BAD_ARGS lock_renew expects 1 key and 2 args")
end
if redis.call("GET", KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call("PEXPIRE", KEYS[1], tonumber(ARGV[2]))
return 1
