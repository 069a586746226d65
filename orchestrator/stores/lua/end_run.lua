-- @version 2
-- A run's end in Valkey, once Postgres holds it: the live hash moves to the terminal key (kept
-- for the cancel/retry window), and in the same call the end is counted and announced: /metrics'
-- runs by task and state and the duration histogram, the task's daily count (a task without a
-- daily cap; a capped one counts in Postgres), and PUBLISH on the run's ended channel. The end
-- is counted by the call that moves the hash, or that finds no hash to move (lost with Valkey:
-- counted without a duration), never by one that finds it already ended or another claim's.
-- KEYS[1] task:run:active:<runId>  KEYS[2] task:run:terminal:<runId>
-- KEYS[3] metrics:runs_total (hash "<task>|<state>" → count)
-- KEYS[4] metrics:duration (hash "<task>|<bucket index>" → count, "<task>|sum", "<task>|count")
-- KEYS[5] task:quota:<taskId>:<day> (the task's counts of the day)
-- KEYS[6] task:circuit:<taskId> (read only)
-- ARGV[1] target: completed | failed | cancelled  ARGV[2] now (ms)  ARGV[3] terminal ttl (s)
-- ARGV[4] expected owner, or "" to skip the fence  ARGV[5] task id
-- ARGV[6] "1": count a completed or failed end in KEYS[5] (v2: the target is the field; a
-- cancel is not counted), "0" not to (a capped task counts in Postgres)  ARGV[7] its ttl (s)
-- ARGV[8] the run's ended channel  ARGV[9] "1": say whether the circuit must hear of this end
-- ARGV[10..] duration bucket upper bounds (s), ascending
-- Returns {previous state, circuit} (v2): circuit is 1 when ARGV[9] asked and the circuit must
-- record this end (`hooks.circuit`), 0 when recording it would change nothing: a run completed
-- while its circuit is closed with no failure counted in a row, the end of nearly every run.
-- Errors: NO_RUN (counted and announced), ILLEGAL_TRANSITION <from> <to>, FENCED <owner>.
if #KEYS ~= 6 or #ARGV < 10 then
  return redis.error_reply("BAD_ARGS end_run expects 6 keys and at least 10 args")
end
local allowed = {
  pending = { completed = true, failed = true },
  active = { completed = true, failed = true },
  cancelling = { cancelled = true },
}
local target, now, task = ARGV[1], ARGV[2], ARGV[5]

local function count(started)
  redis.call("HINCRBY", KEYS[3], task .. "|" .. target, 1)
  if ARGV[6] == "1" and target ~= "cancelled" then
    redis.call("HINCRBY", KEYS[5], target, 1)
    redis.call("EXPIRE", KEYS[5], tonumber(ARGV[7]))
  end
  redis.call("PUBLISH", ARGV[8], target)
  local started_ms = tonumber(started)
  if not started_ms or tonumber(now) < started_ms then
    return
  end
  local seconds = (tonumber(now) - started_ms) / 1000
  local bucket = #ARGV - 9 -- past the last bound: +Inf
  for i = 10, #ARGV do
    if seconds <= tonumber(ARGV[i]) then
      bucket = i - 10
      break
    end
  end
  redis.call("HINCRBY", KEYS[4], task .. "|" .. bucket, 1)
  redis.call("HINCRBYFLOAT", KEYS[4], task .. "|sum", seconds)
  redis.call("HINCRBY", KEYS[4], task .. "|count", 1)
end

local state = redis.call("HGET", KEYS[1], "state")
if not state then
  local ended = redis.call("HGET", KEYS[2], "state")
  if ended then
    return redis.error_reply("ILLEGAL_TRANSITION " .. ended .. " " .. target)
  end
  count(nil)
  return redis.error_reply("NO_RUN")
end
if not (allowed[state] and allowed[state][target]) then
  return redis.error_reply("ILLEGAL_TRANSITION " .. state .. " " .. target)
end
local owner, started = unpack(redis.call("HMGET", KEYS[1], "owner", "started_at"))
if ARGV[4] ~= "" and owner ~= ARGV[4] then
  return redis.error_reply("FENCED " .. (owner or ""))
end
redis.call("HSET", KEYS[1], "state", target, "updated_at", now, "finished_at", now)
redis.call("RENAME", KEYS[1], KEYS[2])
redis.call("EXPIRE", KEYS[2], tonumber(ARGV[3]))
count(started)
local circuit = 0
if ARGV[9] == "1" then
  local closed, consecutive = unpack(redis.call("HMGET", KEYS[6], "state", "consecutive"))
  if not (target == "completed" and closed == "closed" and (tonumber(consecutive) or 0) == 0) then
    circuit = 1
  end
end
return {state, circuit}
