-- @version 1
-- Admission through a task's circuit breaker: admit, admit as the one half-open probe, or
-- refuse. An open circuit whose backoff has passed becomes half-open here.
-- KEYS[1] task:circuit:<taskId>
-- ARGV[1] now (ms)  ARGV[2] runId being admitted  ARGV[3] provisional probe slot ttl (ms)
-- Returns {verdict} for a closed circuit (nothing written), otherwise {verdict, field, value,
-- ...} with the whole hash after the call. Verdicts: closed (admitted), probe (admitted as
-- the probe; the slot is held until now + ttl), open (refused until half_open_at), busy
-- (refused: probe_run holds the slot until probe_until).
-- Errors: NO_CIRCUIT when the hash is missing (the caller rebuilds it from Postgres).
if #KEYS ~= 1 or #ARGV ~= 3 then
  return redis.error_reply("BAD_ARGS circuit_admit expects 1 key and 3 args")
end
if redis.call("EXISTS", KEYS[1]) == 0 then
  return redis.error_reply("NO_CIRCUIT")
end
local now = tonumber(ARGV[1])
local function num(field)
  return tonumber(redis.call("HGET", KEYS[1], field)) or 0
end
local function reply(verdict)
  local out = redis.call("HGETALL", KEYS[1])
  table.insert(out, 1, verdict)
  return out
end

if redis.call("HGET", KEYS[1], "state") == "closed" then
  return {"closed"}
end
if now < num("half_open_at") then
  return reply("open")
end
local probe = redis.call("HGET", KEYS[1], "probe_run") or ""
if probe ~= "" and now < num("probe_until") then
  return reply("busy")
end
redis.call("HSET", KEYS[1], "state", "half_open", "probe_run", ARGV[2],
  "probe_until", string.format("%d", now + tonumber(ARGV[3])), "updated_at", ARGV[1])
redis.call("HINCRBY", KEYS[1], "version", 1)
return reply("probe")
