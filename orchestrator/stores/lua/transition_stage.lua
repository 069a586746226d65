-- @version 2
-- Move one pipeline stage of a live run if the move is in `allowed` (states.py's
-- STAGE_TRANSITIONS).
-- v2: active → waiting (a stage whose TransientError waits for its next attempt).
-- KEYS[1] task:run:active:<runId>
-- ARGV[1] stage name  ARGV[2] target state  ARGV[3] now (ms)
-- Returns the previous stage state. Errors: NO_RUN, NO_STAGE <name>,
-- ILLEGAL_TRANSITION <from> <to>.
if #KEYS ~= 1 or #ARGV ~= 3 then
  return redis.error_reply("BAD_ARGS transition_stage expects 1 key and 3 args")
end
local allowed = {
  waiting = { active = true, skipped = true },
  active = { completed = true, failed = true, waiting = true },
}
if redis.call("EXISTS", KEYS[1]) == 0 then
  return redis.error_reply("NO_RUN")
end
local field = "stage:" .. ARGV[1]
local state = redis.call("HGET", KEYS[1], field)
if not state then
  return redis.error_reply("NO_STAGE " .. ARGV[1])
end
if not (allowed[state] and allowed[state][ARGV[2]]) then
  return redis.error_reply("ILLEGAL_TRANSITION " .. state .. " " .. ARGV[2])
end
redis.call("HSET", KEYS[1], field, ARGV[2], "updated_at", ARGV[3])
return state
