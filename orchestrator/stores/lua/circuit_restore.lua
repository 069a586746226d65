-- @version 1
-- Rebuild a task's missing circuit hash from its Postgres mirror (task_circuit_state), or
-- create it closed when the task has no mirror row. An existing hash is left alone: Valkey is
-- authoritative while it has the state. The probe slot is not mirrored and starts empty.
-- KEYS[1] task:circuit:<taskId>
-- ARGV[1] version  ARGV[2] state  ARGV[3] consecutive  ARGV[4] reopen_count
-- ARGV[5] opened_at (ms or "")  ARGV[6] half_open_at (ms or "")  ARGV[7] forced_until (ms or "")
-- ARGV[8] forced_by  ARGV[9] recent ("<ms>:<runId>,...")  ARGV[10] updated_at (ms)
-- Returns 1 when written, 0 when the hash already existed.
if #KEYS ~= 1 or #ARGV ~= 10 then
  return redis.error_reply("BAD_ARGS circuit_restore expects 1 key and 10 args")
end
if redis.call("EXISTS", KEYS[1]) == 1 then
  return 0
end
redis.call("HSET", KEYS[1], "version", ARGV[1], "state", ARGV[2], "consecutive", ARGV[3],
  "reopen_count", ARGV[4], "opened_at", ARGV[5], "half_open_at", ARGV[6],
  "forced_until", ARGV[7], "forced_by", ARGV[8], "recent", ARGV[9], "updated_at", ARGV[10],
  "probe_run", "", "probe_until", "")
return 1
