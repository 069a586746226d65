-- @version 3
-- Ask a live run to cancel: pending|active → cancelling, stamp the request time (Valkey's
-- clock) and tell the process that owns it. A run already cancelling is left as is.
-- v3: the message goes to its owner's cancel channel (one per worker process, which its run
-- watch listens on for its whole life), not to a channel of the run's own, and names the run:
-- "cancel <runId>" (keys.cancel_message), the run id read from the hash. A run nobody has
-- claimed yet (no owner) is told nothing: its claim will refuse it.
-- KEYS[1] task:run:active:<runId>  KEYS[2] task:run:terminal:<runId>
-- KEYS[3] <namespace>:task:cancel:  (the owners' channels' prefix, keys.cancel_channel_prefix:
--         the owner's channel is it followed by the hash's `owner`; not a key)
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
local found = redis.call("HMGET", KEYS[1], "owner", "run_id")
if found[1] and found[1] ~= "" and found[2] and found[2] ~= "" then
  redis.call("PUBLISH", KEYS[3] .. found[1], "cancel " .. found[2])
end
return state
