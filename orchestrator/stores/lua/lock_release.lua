-- @version 1
-- Release a loop lock, only if the caller still holds it (orchestrator/cluster/locks.py).
-- KEYS[1] lock:orch:<name>
-- ARGV[1] the holder's token
-- Returns 1 when released, 0 when the lock was gone or held by another token.
if #KEYS ~= 1 or #ARGV ~= 1 then
  return redis.error_reply("BAD_ARGS lock_release expects 1 key and 1 arg")
end
if redis.call("GET", KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call("DEL", KEYS[1])
return 1
