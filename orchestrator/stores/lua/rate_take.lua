-- @version 1
-- Admit one run under a task's rate (a sliding-window log), or say how long until it could be.
-- KEYS[1] task:ratelimit:<taskId>   ZSET <runId>|<owner> → admission time (ms)
-- ARGV[1] member (<runId>|<owner>)  ARGV[2] count  ARGV[3] per (ms)
-- The window is half-open: an admission at t counts during [t, t + per). Admitting only while
-- fewer than `count` admissions are in the window means no interval of length `per` ever holds
-- more than `count` of them. Times come from Valkey's clock (TIME).
-- Returns 0 when admitted (or already admitted under this member), else the wait in ms until
-- the admission that frees a place leaves the window.
if #KEYS ~= 1 or #ARGV ~= 3 then
  return redis.error_reply("BAD_ARGS rate_take expects 1 key and 3 args")
end
local window, member = KEYS[1], ARGV[1]
local count, per = tonumber(ARGV[2]), tonumber(ARGV[3])
local clock = redis.call("TIME")
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
redis.call("ZREMRANGEBYSCORE", window, "-inf", now - per)
if redis.call("ZSCORE", window, member) then
  return 0
end
local admitted = redis.call("ZCARD", window)
if admitted < count then
  redis.call("ZADD", window, now, member)
  redis.call("PEXPIRE", window, per)
  return 0
end
-- With `admitted - count + 1` admissions to leave before there is room (more than one when
-- the rate was lowered by a deploy), the wait ends when the last of them leaves.
local freeing = redis.call("ZRANGE", window, admitted - count, admitted - count, "WITHSCORES")
return tonumber(freeing[2]) + per - now
