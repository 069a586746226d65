-- @version 1
-- A running run's heartbeat: proves the owner alive and reports what it should know.
-- KEYS[1] task:run:active:<runId>
-- ARGV[1] owner (the claim's instance id)  ARGV[2] ttl (s)
-- Returns {state, cancel_requested_at (ms or ""), now (ms, Valkey's clock)}; state is ""
-- when the live hash is gone and "fenced" when another owner holds the run (the caller
-- must stop writing). Nothing is written unless the caller still owns the run.
if #KEYS ~= 1 or #ARGV ~= 2 then
  return redis.error_reply("BAD_ARGS heartbeat_run expects 1 key and 2 args")
end
local time = redis.call("TIME")
local now = tostring(tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000))
local fields = redis.call("HMGET", KEYS[1], "state", "owner", "cancel_requested_at")
if not fields[1] then
  return {"", "", now}
end
if fields[2] ~= ARGV[1] then
  return {"fenced", "", now}
end
redis.call("HSET", KEYS[1], "heartbeat_at", now)
redis.call("EXPIRE", KEYS[1], tonumber(ARGV[2]))
return {fields[1], fields[3] or "", now}
