-- @version 1
-- Take one of a task's concurrency slots for a run, or record that the run must wait.
-- KEYS[1] task:concurrency:<taskId>:holders    ZSET <runId>|<owner> → lease expiry (ms)
-- KEYS[2] task:concurrency:<taskId>:waiters    ZSET <runId> → when it first found no slot (ms)
-- KEYS[3] task:concurrency:<taskId>:postponed  HASH <runId> → "<postponements>:<last seen ms>"
-- ARGV[1] holder (<runId>|<owner>)  ARGV[2] runId  ARGV[3] limit  ARGV[4] lease (ms)
-- ARGV[5] a waiter not seen for this long (ms) has left the line
-- Times come from Valkey's clock (TIME), so the hosts' clocks never matter.
-- Returns {1, 0, 0} when the slot is held (taken now, or already held by this holder: the
-- lease is renewed), else {0, postponements, rank}: this run's postponements so far, this
-- one included, and how many runs wait ahead of it in the line.
if #KEYS ~= 3 or #ARGV ~= 5 then
  return redis.error_reply("BAD_ARGS concurrency_take expects 3 keys and 5 args")
end
local holders, waiters, postponed = KEYS[1], KEYS[2], KEYS[3]
local holder, run = ARGV[1], ARGV[2]
local limit, lease, stale = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local clock = redis.call("TIME")
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)

local function hold()
  redis.call("ZADD", holders, now + lease, holder)
  if redis.call("PTTL", holders) < lease then
    redis.call("PEXPIRE", holders, lease)
  end
end

-- A lease that has run out belonged to a holder that crashed (or overran without a refresh).
redis.call("ZREMRANGEBYSCORE", holders, "-inf", now)
if redis.call("ZSCORE", holders, holder) then
  hold()
  return {1, 0, 0}
end
if redis.call("ZCARD", holders) < limit then
  hold()
  redis.call("ZREM", waiters, run)
  redis.call("HDEL", postponed, run)
  return {1, 0, 0}
end

-- Waiters that stopped coming back (cancelled, or their message lost) leave the front of the
-- line, so the runs that are still waiting move up; further back they are dropped when they
-- reach the front. Each pass drops at least one waiter or ends the loop.
local dropped = true
while dropped do
  dropped = false
  for _, other in ipairs(redis.call("ZRANGE", waiters, 0, limit - 1)) do
    local entry = redis.call("HGET", postponed, other)
    local seen = entry and tonumber(string.match(entry, ":(%d+)$"))
    if other ~= run and (not seen or now - seen > stale) then
      redis.call("ZREM", waiters, other)
      redis.call("HDEL", postponed, other)
      dropped = true
    end
  end
end

local entry = redis.call("HGET", postponed, run)
local count = (entry and tonumber(string.match(entry, "^(%d+):")) or 0) + 1
redis.call("HSET", postponed, run, count .. ":" .. now)
-- NX: a run keeps the place it took the first time it found no slot.
redis.call("ZADD", waiters, "NX", now, run)
redis.call("PEXPIRE", waiters, stale)
redis.call("PEXPIRE", postponed, stale)
return {0, count, redis.call("ZRANK", waiters, run)}
