-- @version 1
-- Push one entry onto a bounded list (the pending-write drain, orchestrator/runs/drain.py); a full
-- list refuses the entry rather than dropping an older one.
-- KEYS[1] task:drain:pending
-- ARGV[1] the entry (JSON)  ARGV[2] the most entries the list may hold
-- Returns the list's new length, or 0 when the list was full and nothing was pushed.
if #KEYS ~= 1 or #ARGV ~= 2 then
  return redis.error_reply("BAD_ARGS drain_push expects 1 key and 2 args")
end
if redis.call("LLEN", KEYS[1]) >= tonumber(ARGV[2]) then
  return 0
end
return redis.call("LPUSH", KEYS[1], ARGV[1])
