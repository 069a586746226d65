-- @version 3
-- Move a run to another state if the move is in `allowed` (states.py's RUN_TRANSITIONS). A
-- terminal state moves the hash to task:run:terminal:<runId> (kept for the cancel/retry
-- window).
-- KEYS[1] task:run:active:<runId>  KEYS[2] task:run:terminal:<runId>
-- ARGV[1] target state  ARGV[2] now (ms)  ARGV[3] active ttl (s)  ARGV[4] terminal ttl (s)
-- ARGV[5] expected owner, or "" to skip the fence (operator actions)
-- v2: active → pending (a transient failure waiting for its next attempt).
-- v3: pending → completed (a claim Postgres lost, ended by its own end; states.py).
-- Returns the previous state. Errors: NO_RUN, ILLEGAL_TRANSITION <from> <to>, FENCED <owner>.
if #KEYS ~= 2 or #ARGV ~= 5 then
  return redis.error_reply("BAD_ARGS transition_run expects 2 keys and 5 args")
end
local allowed = {
  pending = { active = true, cancelling = true, failed = true, completed = true },
  active = { completed = true, failed = true, cancelling = true, pending = true },
  cancelling = { cancelled = true },
}
local terminal = { completed = true, failed = true, cancelled = true }
local target = ARGV[1]
local state = redis.call("HGET", KEYS[1], "state")
if not state then
  local ended = redis.call("HGET", KEYS[2], "state")
  if ended then
    return redis.error_reply("ILLEGAL_TRANSITION " .. ended .. " " .. target)
  end
  return redis.error_reply("NO_RUN")
end
if not (allowed[state] and allowed[state][target]) then
  return redis.error_reply("ILLEGAL_TRANSITION " .. state .. " " .. target)
end
local owner = redis.call("HGET", KEYS[1], "owner")
if ARGV[5] ~= "" and owner ~= ARGV[5] then
  return redis.error_reply("FENCED " .. (owner or ""))
end
redis.call("HSET", KEYS[1], "state", target, "updated_at", ARGV[2])
if terminal[target] then
  redis.call("HSET", KEYS[1], "finished_at", ARGV[2])
  redis.call("RENAME", KEYS[1], KEYS[2])
  redis.call("EXPIRE", KEYS[2], tonumber(ARGV[4]))
else
  redis.call("EXPIRE", KEYS[1], tonumber(ARGV[3]))
end
return state
