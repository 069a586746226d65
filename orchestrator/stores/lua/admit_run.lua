-- @version 1
-- A start's admission, in the common case in one read: whether the hooks that judge every
-- start (`RunHook.excused_at_admission`: the pause, the circuit) have anything to say about
-- it, and the start counted in its task's day (a task without a daily cap).
-- KEYS[1] the pauses in force (`keys.pauses`)  KEYS[2] task:circuit:<taskId>
-- KEYS[3] task:quota:<taskId>:<day>
-- ARGV[1] the pause field of the task  ARGV[2] that of its resource class
-- ARGV[3] "1": count the start in KEYS[3] ("started"), "" not to  ARGV[4] the count's ttl (s)
-- Returns 1 when those hooks must judge the start: a pause of the task or its class that
-- refuses starts, or a circuit that is not closed (or has no hash: the hook rebuilds it);
-- 0 when they would admit it without a word. The count is taken either way; a start refused
-- after it gives it back (`live.give_back_start`).
if #KEYS ~= 3 or #ARGV ~= 4 then
  return redis.error_reply("BAD_ARGS admit_run expects 3 keys and 4 args")
end
if ARGV[3] == "1" then
  redis.call("HINCRBY", KEYS[3], "started", 1)
  redis.call("EXPIRE", KEYS[3], tonumber(ARGV[4]))
end
local paused = redis.call("HMGET", KEYS[1], ARGV[1], ARGV[2])
if paused[1] == "refuse" or paused[2] == "refuse" then
  return 1
end
if redis.call("HGET", KEYS[2], "state") ~= "closed" then
  return 1
end
return 0
