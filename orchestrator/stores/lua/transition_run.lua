-- @version 4
-- Move a live run to a state that is not an end, if the move is in `allowed` (states.py's
-- RUN_TRANSITIONS): a claim given back or a run put back for its next attempt (active →
-- pending), a cancel asked (→ cancelling). The worker's claim is `claim_run.lua`; every end is
-- `end_run.lua` (v4: the terminal branch, which only tests still took, is gone).
-- KEYS[1] task:run:active:<runId>  KEYS[2] task:run:terminal:<runId>
-- ARGV[1] target state  ARGV[2] now (ms)  ARGV[3] active ttl (s)
-- ARGV[4] expected owner, or "" to skip the fence (operator actions)
-- Returns the previous state. Errors: NO_RUN, ILLEGAL_TRANSITION <from> <to>, FENCED <owner>.
if #KEYS ~= 2 or #ARGV ~= 4 then
  return redis.error_reply("BAD_ARGS transition_run expects 2 keys and 4 args")
end
local allowed = {
  pending = { cancelling = true },
  active = { cancelling = true, pending = true },
}
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
if ARGV[4] ~= "" and owner ~= ARGV[4] then
  return redis.error_reply("FENCED " .. (owner or ""))
end
redis.call("HSET", KEYS[1], "state", target, "updated_at", ARGV[2])
redis.call("EXPIRE", KEYS[1], tonumber(ARGV[3]))
return state
