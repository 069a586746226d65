-- @version 1
-- Count a run's end for /metrics, cluster-wide: runs by task and state, and (when it was
-- claimed) its duration in the task's histogram. Runs after the end's move, in its pipeline.
-- KEYS[1] task:run:terminal:<runId> (started_at, finished_at: ms)
-- KEYS[2] metrics:runs_total (hash "<task>|<state>" → count)
-- KEYS[3] metrics:duration (hash "<task>|<bucket index>" → count, "<task>|sum", "<task>|count")
-- ARGV[1] task  ARGV[2] state  ARGV[3..] bucket upper bounds in seconds, ascending
-- Returns the duration in ms, or -1 when the run was never claimed.
if #KEYS ~= 3 or #ARGV < 3 then
  return redis.error_reply("BAD_ARGS metrics_end expects 3 keys and at least 3 args")
end
local task = ARGV[1]
redis.call("HINCRBY", KEYS[2], task .. "|" .. ARGV[2], 1)
local started = tonumber(redis.call("HGET", KEYS[1], "started_at"))
local finished = tonumber(redis.call("HGET", KEYS[1], "finished_at"))
if not started or not finished or finished < started then
  return -1
end
local seconds = (finished - started) / 1000
local bucket = #ARGV - 2  -- past the last bound: +Inf
for i = 3, #ARGV do
  if seconds <= tonumber(ARGV[i]) then
    bucket = i - 3
    break
  end
end
redis.call("HINCRBY", KEYS[3], task .. "|" .. bucket, 1)
redis.call("HINCRBYFLOAT", KEYS[3], task .. "|sum", seconds)
redis.call("HINCRBY", KEYS[3], task .. "|count", 1)
return finished - started
