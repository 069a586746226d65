-- @version 3
-- Move one pipeline stage of a live run if the move is in `allowed` (states.py's
-- STAGE_TRANSITIONS).
-- v2: active → waiting (a stage whose TransientError waits for its next attempt).
-- v3: a run already ended moves a stage to an ended state (completed, failed, skipped) in its
--     terminal snapshot: Postgres made the move before the run's end, whose process settled
--     the run before this one followed (a stage skipped by one worker while another ended the
--     run with it counted as ended). Toward waiting or active, an ended run's stage never moves.
-- KEYS[1] task:run:active:<runId>  KEYS[2] task:run:terminal:<runId>
-- ARGV[1] stage name  ARGV[2] target state  ARGV[3] now (ms)
-- Returns the previous stage state. Errors: NO_RUN, NO_STAGE <name>,
-- ILLEGAL_TRANSITION <from> <to>.
if #KEYS ~= 2 or #ARGV ~= 3 then
  return redis.error_reply("BAD_ARGS transition_stage expects 2 keys and 3 args")
end
local allowed = {
  waiting = { active = true, skipped = true },
  active = { completed = true, failed = true, waiting = true },
}
local ended = { completed = true, failed = true, skipped = true }
local hash = KEYS[1]
if redis.call("EXISTS", hash) == 0 then
  hash = KEYS[2]
  if not ended[ARGV[2]] or redis.call("EXISTS", hash) == 0 then
    return redis.error_reply("NO_RUN")
  end
end
local field = "stage:" .. ARGV[1]
local state = redis.call("HGET", hash, field)
if not state then
  return redis.error_reply("NO_STAGE " .. ARGV[1])
end
if not (allowed[state] and allowed[state][ARGV[2]]) then
  return redis.error_reply("ILLEGAL_TRANSITION " .. state .. " " .. ARGV[2])
end
redis.call("HSET", hash, field, ARGV[2], "updated_at", ARGV[3])
return state
