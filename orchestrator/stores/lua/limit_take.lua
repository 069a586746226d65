-- @version 1
-- Take units of one or more named limits for one taker, all or none (`hooks/limits.py`).
-- Per limit i, four keys, the limit's key (`<key>`) part of the first two (KEYS[1] is the first
-- limit's window, ARGV[1] the taker's token):
-- KEYS[4i-3] limit:<id>:<key>:window   ZSET "<token>#<unit>" → admission (ms): its rate
-- KEYS[4i-2] limit:<id>:<key>:holders  ZSET "<token>#<unit>" → lease expiry (ms): its concurrency
-- KEYS[4i-1] limit:<id>:keys           ZSET key → last use (ms): the keys seen, for operators
-- KEYS[4i]   limit:<id>:waiting        ZSET "<key>\n<runId>" → when it will ask again (ms)
-- ARGV[1] token (one taker: a run's pickup, or one `ctx.limit`)  ARGV[2] units
-- ARGV[3] lease (ms)  ARGV[4] margin (ms)  ARGV[5] runId  ARGV[6] forget (ms): keys unused and
-- waiting runs not back for this long leave those sets
-- then per limit i: ARGV[6+4i-3] rate count (0: no rate)  ARGV[6+4i-2] rate span (ms)
-- ARGV[6+4i-1] concurrency (0: none)  ARGV[6+4i] the key
-- A rate admits while fewer than `count` admissions lie within the last span plus `margin` (the
-- margin keeps the runs' own starts, a little after their admissions, within the rate too).
-- Times are Valkey's (TIME). Returns {wait, full, refused...}: {0, 0} when every limit admitted
-- the units (the taker already holding them counts); else `wait`, the ms before the rates that
-- refused could admit them, `full`, 1 when a concurrency refused (until a holder leaves), and
-- the positions (from 1) of the limits that refused; only they note the run as waiting.
if #KEYS == 0 or #KEYS % 4 ~= 0 or #ARGV ~= 6 + #KEYS then
  return redis.error_reply("BAD_ARGS limit_take expects 4 keys per limit and 6 + 4 per limit args")
end
local token, units = ARGV[1], tonumber(ARGV[2])
local lease, margin, run = tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5]
local forget = tonumber(ARGV[6])
local clock = redis.call("TIME")
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local wait, full = 0, 0
local refused = {}

for i = 1, #KEYS / 4 do
  local window, holders = KEYS[4 * i - 3], KEYS[4 * i - 2]
  local count, span = tonumber(ARGV[6 + 4 * i - 3]), tonumber(ARGV[6 + 4 * i - 2])
  local most = tonumber(ARGV[6 + 4 * i - 1])
  if count > 0 then
    redis.call("ZREMRANGEBYSCORE", window, "-inf", now - span - margin)
    if not redis.call("ZSCORE", window, token .. "#1") then
      local admitted = redis.call("ZCARD", window)
      if admitted + units > count then
        local freeing = redis.call("ZRANGE", window, admitted + units - count - 1,
          admitted + units - count - 1, "WITHSCORES")
        wait = math.max(wait, tonumber(freeing[2]) + span + margin - now)
        refused[i] = true
      end
    end
  end
  if most > 0 then
    redis.call("ZREMRANGEBYSCORE", holders, "-inf", now)
    if not redis.call("ZSCORE", holders, token .. "#1")
      and redis.call("ZCARD", holders) + units > most then
      full = 1
      refused[i] = true
    end
  end
end

local out = {wait, full}
for i = 1, #KEYS / 4 do
  local key = ARGV[6 + 4 * i]
  local seen, waiting = KEYS[4 * i - 1], KEYS[4 * i]
  redis.call("ZREMRANGEBYSCORE", waiting, "-inf", now - forget)
  redis.call("ZREMRANGEBYSCORE", seen, "-inf", now - forget)
  if refused[i] then
    redis.call("ZADD", waiting, now + math.max(wait, 1000), key .. "\n" .. run)
    table.insert(out, i)
  else
    redis.call("ZREM", waiting, key .. "\n" .. run)
  end
  if wait == 0 and full == 0 then
    local window, holders = KEYS[4 * i - 3], KEYS[4 * i - 2]
    local span, most = tonumber(ARGV[6 + 4 * i - 2]), tonumber(ARGV[6 + 4 * i - 1])
    for unit = 1, units do
      if tonumber(ARGV[6 + 4 * i - 3]) > 0 then
        redis.call("ZADD", window, "NX", now, token .. "#" .. unit)
        redis.call("PEXPIRE", window, span + margin)
      end
      if most > 0 then
        redis.call("ZADD", holders, now + lease, token .. "#" .. unit)
        if redis.call("PTTL", holders) < lease then
          redis.call("PEXPIRE", holders, lease)
        end
      end
    end
  end
  redis.call("ZADD", seen, now, key)
end
return out
