-- @version 1
-- Move the expiry of a run's half-open probe slot, or free the slot; other runs change nothing.
-- KEYS[1] task:circuit:<taskId>
-- ARGV[1] runId  ARGV[2] new slot expiry (ms), or 0 to free the slot
-- Returns 1 when ARGV[1] held the slot, 0 otherwise (another probe, none, or no hash).
if #KEYS ~= 1 or #ARGV ~= 2 then
  return redis.error_reply("BAD_ARGS circuit_probe expects 1 key and 2 args")
end
if redis.call("HGET", KEYS[1], "probe_run") ~= ARGV[1] or ARGV[1] == "" then
  return 0
end
if tonumber(ARGV[2]) == 0 then
  redis.call("HSET", KEYS[1], "probe_run", "", "probe_until", "")
else
  redis.call("HSET", KEYS[1], "probe_until", ARGV[2])
end
return 1
