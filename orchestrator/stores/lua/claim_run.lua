-- @version 5
-- Claim a pending run for one worker process: pending → active, owner recorded, unless a
-- pause holds it (v4: the pause check of every pickup, in the claim's own call).
-- KEYS[1] task:run:active:<runId>  KEYS[2] task:run:terminal:<runId>
-- KEYS[3] task:run:reseeded:<runId>  KEYS[4] the pauses in force (`keys.pauses`)
-- ARGV[1] owner (instance id)  ARGV[2] now (ms)  ARGV[3] ttl (s)
-- ARGV[4] the pause field of the run's task  ARGV[5] that of its resource class ("" and "":
-- no pause holds this claim: a running run's claim taken back)
-- Errors: ILLEGAL_TRANSITION <from> active when the run is live in another state or has
-- ended (v2: an ended run is not mistaken for a lost hash); NO_RUN when neither key exists;
-- SETTLING <ms left> (v3) while the hash, seeded again after Valkey lost it, is marked: a
-- handler may still hold a claim Postgres has not heard of, and only it claims the run then
-- (`live.claim_again` clears the mark first); PAUSED <field> (v4) for a pending run its task's
-- or class's pause holds (the run stays pending, unclaimed; the resume publishes it again).
-- v5: a closed run window is a mirror field valued "window" (`orchestrator.windows`); it holds
-- every run but an operator's (priority 1: "run now", an operator's retry), which passes it.
if #KEYS ~= 4 or #ARGV ~= 5 then
  return redis.error_reply("BAD_ARGS claim_run expects 4 keys and 5 args")
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
if ARGV[4] ~= "" then
  local paused = redis.call("HMGET", KEYS[4], ARGV[4], ARGV[5])
  local priority = nil
  for i = 1, 2 do
    if paused[i] == "window" and priority == nil then
      priority = redis.call("HGET", KEYS[1], "priority") or ""
    end
    if paused[i] and (paused[i] ~= "window" or priority ~= "1") then
      return redis.error_reply("PAUSED " .. ARGV[3 + i])
    end
  end
end
redis.call("HSET", KEYS[1], "state", "active", "owner", ARGV[1],
  "started_at", ARGV[2], "updated_at", ARGV[2])
redis.call("EXPIRE", KEYS[1], tonumber(ARGV[3]))
return 1
