-- @version 1
-- Take one record off the drain's poison list (orchestrator/runs/drain.py) for an operator:
-- discard it, or replay it (its entry goes back onto the pending list). Removing the record
-- and pushing its entry happen together, so two operators replaying the same record at once
-- queue it once, and a full pending list leaves the record where it was.
-- KEYS[1] task:drain:poison  KEYS[2] task:drain:pending
-- ARGV[1] the poison record, exactly as listed  ARGV[2] the entry to push ("" to discard)
-- ARGV[3] the most entries the pending list may hold
-- Returns 1 when done, 0 when the record is no longer on the list, -1 when the pending list
-- is full (nothing changed).
if #KEYS ~= 2 or #ARGV ~= 3 then
  return redis.error_reply("BAD_ARGS drain_unpoison expects 2 keys and 3 args")
end
if ARGV[2] ~= "" and redis.call("LLEN", KEYS[2]) >= tonumber(ARGV[3]) then
  return -1
end
if redis.call("LREM", KEYS[1], 1, ARGV[1]) == 0 then
  return 0
end
if ARGV[2] ~= "" then
  redis.call("LPUSH", KEYS[2], ARGV[2])
end
return 1
