-- @version 1
-- Claim a pending run for one worker process: pending → active, owner recorded.
-- KEYS[1] task:run:active:<runId>
-- ARGV[1] owner (instance id + delivery)  ARGV[2] now (ms)  ARGV[3] ttl (s)
-- Errors: NO_RUN when the hash is missing; ILLEGAL_TRANSITION <from> active otherwise.
if #KEYS ~= 1 or #ARGV ~= 3 then
  return redis.error_reply("BAD_ARGS claim_run expects 1 key and 3 args")
end
local state = redis.call("HGET", KEYS[1], "state")
if not state then
  return redis.error_reply("NO_RUN")
end
if state ~= "pending" then
  return redis.error_reply("ILLEGAL_TRANSITION " .. state .. " active")
end
redis.call("HSET", KEYS[1], "state", "active", "owner", ARGV[1],
  "started_at", ARGV[2], "updated_at", ARGV[2])
redis.call("EXPIRE", KEYS[1], tonumber(ARGV[3]))
return 1
