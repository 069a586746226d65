-- @version 1
-- Renew a live concurrency lease (the heartbeat of a run that holds a slot).
-- KEYS[1] task:concurrency:<taskId>:holders    ZSET <runId>|<owner> → lease expiry (ms)
-- ARGV[1] holder (<runId>|<owner>)  ARGV[2] lease (ms)
-- Returns 1 when renewed, 0 when the holder has no live lease: a lease that ran out may
-- already have gone to another run, so it is never revived.
if #KEYS ~= 1 or #ARGV ~= 2 then
  return redis.error_reply("BAD_ARGS concurrency_refresh expects 1 key and 2 args")
end
local holders, holder, lease = KEYS[1], ARGV[1], tonumber(ARGV[2])
local clock = redis.call("TIME")
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local expiry = redis.call("ZSCORE", holders, holder)
if not expiry then
  return 0
end
if tonumber(expiry) <= now then
  redis.call("ZREM", holders, holder)
  return 0
end
redis.call("ZADD", holders, "XX", now + lease, holder)
if redis.call("PTTL", holders) < lease then
  redis.call("PEXPIRE", holders, lease)
end
return 1
