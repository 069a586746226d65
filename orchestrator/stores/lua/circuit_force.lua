-- @version 1
-- An operator force-enables a task's circuit: closed, counts and backoff reset, and failures
-- do not open it again until forced_until.
-- KEYS[1] task:circuit:<taskId>
-- ARGV[1] now (ms)  ARGV[2] forced_until (ms)  ARGV[3] actor (who forced it)
-- Returns {field, value, ...}: the hash after the call.
-- Errors: NO_CIRCUIT when the hash is missing (the caller rebuilds it from Postgres first, so
-- the version keeps counting up from the mirror's).
if #KEYS ~= 1 or #ARGV ~= 3 then
  return redis.error_reply("BAD_ARGS circuit_force expects 1 key and 3 args")
end
if redis.call("EXISTS", KEYS[1]) == 0 then
  return redis.error_reply("NO_CIRCUIT")
end
redis.call("HSET", KEYS[1], "state", "closed", "consecutive", 0, "reopen_count", 0,
  "recent", "", "opened_at", "", "half_open_at", "", "probe_run", "", "probe_until", "",
  "forced_until", ARGV[2], "forced_by", ARGV[3], "updated_at", ARGV[1])
redis.call("HINCRBY", KEYS[1], "version", 1)
return redis.call("HGETALL", KEYS[1])
