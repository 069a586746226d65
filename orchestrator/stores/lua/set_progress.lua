-- @version 1
-- Record a live run's progress without resurrecting an ended run's hash.
-- KEYS[1] task:run:active:<runId>
-- ARGV[1] progress JSON  ARGV[2] now (ms)
-- Returns 1 when recorded, 0 when the run is no longer live.
if #KEYS ~= 1 or #ARGV ~= 2 then
  return redis.error_reply("BAD_ARGS set_progress expects 1 key and 2 args")
end
if redis.call("EXISTS", KEYS[1]) == 0 then
  return 0
end
redis.call("HSET", KEYS[1], "progress", ARGV[1], "progress_at", ARGV[2])
return 1
