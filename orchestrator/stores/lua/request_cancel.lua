-- @version 2
-- Ask a live run to cancel: pending|active → cancelling, stamp the request time (Valkey's
-- clock) and publish on the run's cancel channel. A run already cancelling is left as is.
-- KEYS[1] task:run:active:<runId>  KEYS[2] task:run:terminal:<runId>
-- KEYS[3] <namespace>:task:cancel:<runId>  (pub/sub channel, keys.cancel_channel)
-- ARGV[1] actor  ARGV[2] active ttl (s)
-- Returns the previous state. Errors: NO_RUN, ILLEGAL_TRANSITION <from> cancelling.
if #KEYS ~= 3 or #ARGV ~= 2 then
  return redis.error_reply("BAD_ARGS request_cancel expects 3 keys and 2 args")
end
local state = redis.call("HGET", KEYS[1], "state")
if not state then
  local ended = redis.call("HGET", KEYS[2], "state")
  if ended then
    return redis.error_reply("ILLEGAL_TRANSITION " .. ended .. " cancelling")
  end
  return redis.error_reply("NO_RUN")
end
if state == "cancelling" then
  return state
end
if state ~= "pending" and state ~= "active" then
  return redis.error_reply("ILLEGAL_TRANSITION " .. state .. " cancelling")
end
local time = redis.call("TIME")
local now = tostring(tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000))
redis.call("HSET", KEYS[1], "state", "cancelling", "updated_at", now,
  "cancel_requested_at", now, "cancelled_by", ARGV[1])
redis.call("EXPIRE", KEYS[1], tonumber(ARGV[2]))
redis.call("PUBLISH", KEYS[3], "cancel")
return state
