-- @version 3
-- Claim a pending run for one worker process: pending → active, owner recorded.
-- KEYS[1] task:run:active:<runId>  KEYS[2] task:run:terminal:<runId>
-- KEYS[3] task:run:reseeded:<runId>
-- ARGV[1] owner (instance id)  ARGV[2] now (ms)  ARGV[3] ttl (s)
-- Errors: ILLEGAL_TRANSITION <from> active when the run is live in another state or has
-- ended (v2: an ended run is not mistaken for a lost hash); NO_RUN when neither key exists;
-- SETTLING <ms left> (v3) while the hash, seeded again after Valkey lost it, is marked: a
-- handler may still hold a claim Postgres has not heard of, and only it claims the run then
-- (`live.claim_again` clears the mark first).
if #KEYS ~= 3 or #ARGV ~= 3 then
  return redis.error_reply("BAD_ARGS claim_run expects 3 keys and 3 args")
end
local state = redis.call("HGET", KEYS[1], "state")
if not state then
  local ended = redis.call("HGET", KEYS[2], "state")
  if ended then
    return redis.error_reply("ILLEGAL_TRANSITION " .. ended .. " active")
  end
  return redis.error_reply("NO_RUN")
end
if state ~= "pending" then
  return redis.error_reply("ILLEGAL_TRANSITION " .. state .. " active")
end
local settling = redis.call("PTTL", KEYS[3])
if settling > 0 then
  return redis.error_reply("SETTLING " .. settling)
end
redis.call("HSET", KEYS[1], "state", "active", "owner", ARGV[1],
  "started_at", ARGV[2], "updated_at", ARGV[2])
redis.call("EXPIRE", KEYS[1], tonumber(ARGV[3]))
return 1
