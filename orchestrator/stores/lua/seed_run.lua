-- @version 3
-- Seed the live hash of a new run in state `pending`.
-- KEYS[1] task:run:active:<runId>  KEYS[2] metrics:delivery_total (hash event → count)
-- KEYS[3] metrics:start_outcomes_total (hash "<taskId>|<outcome>" → count)
-- ARGV[1] runId  ARGV[2] taskId  ARGV[3] priority  ARGV[4] now (ms)  ARGV[5] ttl (s)
-- ARGV[6] 1 to count the run's message as published for /metrics (v2: the count the seed's
-- caller sent beside it), 0 not to  ARGV[7] 1 to count the run as a start's `started` outcome
-- (v3: `start_run`'s own, in the call it makes anyway), 0 not to
-- ARGV[8..] pipeline stage names, each seeded `waiting`
-- Returns 1 when seeded, 0 when the hash already existed (seeding is idempotent).
if #KEYS ~= 3 or #ARGV < 7 then
  return redis.error_reply("BAD_ARGS seed_run expects 3 keys and at least 7 args")
end
if ARGV[6] == "1" then
  redis.call("HINCRBY", KEYS[2], "published", 1)
end
if ARGV[7] == "1" then
  redis.call("HINCRBY", KEYS[3], ARGV[2] .. "|started", 1)
end
if redis.call("EXISTS", KEYS[1]) == 1 then
  return 0
end
redis.call("HSET", KEYS[1],
  "state", "pending", "run_id", ARGV[1], "task_id", ARGV[2], "priority", ARGV[3],
  "owner", "", "created_at", ARGV[4], "updated_at", ARGV[4])
for i = 8, #ARGV do
  redis.call("HSET", KEYS[1], "stage:" .. ARGV[i], "waiting")
end
redis.call("EXPIRE", KEYS[1], tonumber(ARGV[5]))
return 1
