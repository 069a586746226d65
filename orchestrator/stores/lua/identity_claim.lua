-- @version 1
-- Claim the identity of a new run, or report who holds it.
-- KEYS[1] task:identity:<taskId>:<formula>
-- ARGV[1] runId  ARGV[2] ttl (ms)  ARGV[3] a holder runId we may replace ("" for none)
-- Returns "" when the key now names ARGV[1]; otherwise the holder's runId and its PTTL as
-- "<runId> <pttl>" (a short PTTL means the holder is still provisional).
if #KEYS ~= 1 or #ARGV ~= 3 then
  return redis.error_reply("BAD_ARGS identity_claim expects 1 key and 3 args")
end
local holder = redis.call("GET", KEYS[1])
if holder and holder ~= ARGV[3] and holder ~= ARGV[1] then
  return holder .. " " .. redis.call("PTTL", KEYS[1])
end
redis.call("SET", KEYS[1], ARGV[1], "PX", tonumber(ARGV[2]))
return ""
