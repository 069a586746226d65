-- @version 1
-- Extend (ARGV[2] > 0) or release (ARGV[2] = 0) an identity, only if ARGV[1] still holds it.
-- KEYS[1] task:identity:<taskId>:<formula> (or a throttle's hold, task:throttle:<taskId>:<identity>)
-- ARGV[1] runId  ARGV[2] ttl (ms), 0 to release
-- Returns 1 when done, 0 when another run holds the identity (or nobody does).
if #KEYS ~= 1 or #ARGV ~= 2 then
  return redis.error_reply("BAD_ARGS identity_hold expects 1 key and 2 args")
end
if redis.call("GET", KEYS[1]) ~= ARGV[1] then
  return 0
end
if tonumber(ARGV[2]) == 0 then
  redis.call("DEL", KEYS[1])
else
  redis.call("PEXPIRE", KEYS[1], tonumber(ARGV[2]))
end
return 1
