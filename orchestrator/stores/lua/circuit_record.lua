-- @version 2
-- Record the end of one run of a task in its circuit breaker, and open, reopen or close it.
-- KEYS[1] task:circuit:<taskId>
-- ARGV[1] now (ms)  ARGV[2] runId  ARGV[3] verdict: success | failure | neutral
-- ARGV[4] consecutive failures that open it  ARGV[5] failure window (ms)
-- ARGV[6] failures within the window that open it
-- ARGV[7..] how long it stays open (ms) the 1st, 2nd, ... time in a row; the last repeats
-- `recent` holds "<ms>:<runId>" for the newest counted failures inside the window (at most
-- ARGV[6]); a failure of a run already listed there is a repeat and changes nothing.
-- Only the probe's own outcome closes or reopens a half-open circuit; other runs of the task
-- (admitted before it opened) update the counts only. While forced_until is ahead, failures
-- are counted but do not open it.
-- Returns {event, field, value, ...} with the hash after the call; {"unchanged"} alone when
-- nothing was written (v2: every success of a closed circuit, so the hash is not sent back).
-- Events: unchanged, counted, opened, reopened, closed, released (a probe ended without a
-- verdict).
-- Errors: NO_CIRCUIT when the hash is missing (the caller rebuilds it from Postgres).
if #KEYS ~= 1 or #ARGV < 7 then
  return redis.error_reply("BAD_ARGS circuit_record expects 1 key and at least 7 args")
end
local verdict = ARGV[3]
if verdict ~= "success" and verdict ~= "failure" and verdict ~= "neutral" then
  return redis.error_reply("BAD_ARGS circuit_record verdict " .. verdict)
end
if redis.call("EXISTS", KEYS[1]) == 0 then
  return redis.error_reply("NO_CIRCUIT")
end
local key = KEYS[1]
local now = tonumber(ARGV[1])
local run_id = ARGV[2]
local function num(field)
  return tonumber(redis.call("HGET", key, field)) or 0
end
local state = redis.call("HGET", key, "state")
local is_probe = state ~= "closed" and run_id ~= ""
  and redis.call("HGET", key, "probe_run") == run_id
local event = "unchanged"

if verdict == "success" then
  if is_probe then
    redis.call("HSET", key, "state", "closed", "consecutive", 0, "reopen_count", 0,
      "recent", "", "opened_at", "", "half_open_at", "", "probe_run", "", "probe_until", "")
    event = "closed"
  elseif num("consecutive") > 0 then
    redis.call("HSET", key, "consecutive", 0)
    event = "counted"
  end
elseif verdict == "failure" then
  local window_start = now - tonumber(ARGV[5])
  local limit = tonumber(ARGV[6])
  local recent = {}
  local repeated = false
  for entry in string.gmatch(redis.call("HGET", key, "recent") or "", "[^,]+") do
    local at, id = string.match(entry, "^(%d+):(.*)$")
    if id == run_id then
      repeated = true
    end
    if at and tonumber(at) > window_start then
      table.insert(recent, entry)
    end
  end
  if not repeated then
    table.insert(recent, string.format("%d", now) .. ":" .. run_id)
    while #recent > limit do
      table.remove(recent, 1)
    end
    local consecutive = num("consecutive") + 1
    redis.call("HSET", key, "consecutive", consecutive, "recent", table.concat(recent, ","))
    event = "counted"
    local opens = is_probe
    if state == "closed" and num("forced_until") <= now then
      opens = consecutive >= tonumber(ARGV[4]) or #recent >= limit
    end
    if opens then
      local reopen_count = num("reopen_count") + 1
      local open_ms = tonumber(ARGV[6 + math.min(reopen_count, #ARGV - 6)])
      redis.call("HSET", key, "state", "open", "reopen_count", reopen_count,
        "opened_at", ARGV[1], "half_open_at", string.format("%d", now + open_ms),
        "probe_run", "", "probe_until", "")
      event = reopen_count == 1 and "opened" or "reopened"
    end
  end
elseif is_probe then
  redis.call("HSET", key, "probe_run", "", "probe_until", "")
  event = "released"
end

if event == "unchanged" then
  return {event}
end
redis.call("HSET", key, "updated_at", ARGV[1])
redis.call("HINCRBY", key, "version", 1)
local out = redis.call("HGETALL", key)
table.insert(out, 1, event)
return out
