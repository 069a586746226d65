-- @version 1
-- Keyed concurrency with turns between keys (`hooks/keyed.py`). Per key of one task: at most
-- `max` holders, and at most one run dispatched (published, not yet claimed); the key's other
-- runs wait, by priority then age. With one message per key in the broker at a time, the keys'
-- runs reach the workers in turns: A, B, C, A, B, C, ...
-- KEYS[1] task:keyed:<taskId>:runs     HASH runId → "<version>\t<member>\t<jobId>"
-- KEYS[2] task:keyed:<taskId>:waiting  ZSET, scores 0: "<key>\n<priority><ms, 13 digits>\n<runId>"
-- KEYS[3] task:keyed:<taskId>:holders  ZSET "<key>\n<runId>|<owner>" → lease expiry (ms)
-- KEYS[4] task:keyed:<taskId>:held     ZSET, scores 0: the holders' members, counted by key
-- KEYS[5] task:keyed:<taskId>:queued   HASH key → "<runId>\t<ms>": the key's dispatched run;
--                                       its field "\n" is the key where the last sweep stopped
-- ARGV[1] verb  ARGV[2] max  ARGV[3] lease (ms)  ARGV[4] a dispatched run not claimed within
-- this (ms) no longer holds its key's turn (its message may be lost)
-- enqueue  ARGV[5] runId  ARGV[6] key  ARGV[7] priority  ARGV[8] jobId  ARGV[9] version
-- take     ARGV[5] runId  ARGV[6] owner, then enqueue's ARGV[6..9] to register a run not known
-- release  ARGV[5] runId  ARGV[6] owner   (a claim given back, the run to come back: a retry, a
--          put back, a pause that parked it; its place is freed and it is its key's turn again,
--          so the key's line waits for it rather than pour into the broker meanwhile)
-- finish   ARGV[5] runId  ARGV[6] owner   (the run ended: every place of it freed, it is forgotten)
-- renew    ARGV[5] runId  ARGV[6] owner   (a holder's heartbeat)
-- sweep    ARGV[5] the most keys to look at, after where the last sweep stopped (the leader's,
--          for leases run out and lost turns)
-- Times are Valkey's (TIME). Returns {verdict, dispatched...}: verdict 1 (done; taken), 0
-- (take: the run waits; renew: it holds no live lease) or -1 (take: the run is not registered
-- and no key was given); then runId, jobId, priority, version of each run dispatched now.
if #KEYS ~= 5 or #ARGV < 5 then
  return redis.error_reply("BAD_ARGS keyed expects 5 keys and at least 5 args")
end
local runs, waiting, holders, held, queued = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local verb, max = ARGV[1], tonumber(ARGV[2])
local lease, stale = tonumber(ARGV[3]), tonumber(ARGV[4])
local clock = redis.call("TIME")
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local out = {1}

-- Leases that ran out belonged to holders that crashed (or overran without a heartbeat).
local function expire()
  for _, holder in ipairs(redis.call("ZRANGEBYSCORE", holders, "-inf", now, "LIMIT", 0, 100)) do
    redis.call("ZREM", holders, holder)
    redis.call("ZREM", held, holder)
  end
end

local function holding(key)
  return redis.call("ZLEXCOUNT", held, "[" .. key .. "\n", "[" .. key .. "\n\255")
end

-- version, member, jobId (the last: a job id holds the identity, which may hold a tab)
local function entry(run)
  local value = redis.call("HGET", runs, run)
  if not value then
    return nil
  end
  return string.match(value, "^([^\t]*)\t([^\t]*)\t(.*)$")
end

local function key_of(member)
  return string.match(member, "^([^\n]*)\n")
end

local function turn_of(key)
  local turn = redis.call("HGET", queued, key)
  return turn and string.match(turn, "^([^\t]*)\t"), turn and tonumber(string.match(turn, "\t(%d+)$"))
end

local function register(run, key, priority, job, version)
  local member = key .. "\n" .. priority .. string.format("%013d", now) .. "\n" .. run
  redis.call("HSET", runs, run, version .. "\t" .. member .. "\t" .. job)
  return member
end

-- The key's next waiting run is dispatched when the key has room and no run dispatched. A turn
-- not claimed in time no longer holds the key (its run, if its message was lost, is published
-- again by the reconciler's pending check, which looks in the broker first).
local function dispatch(key)
  local turn, since = turn_of(key)
  if turn and now - since < stale then
    return
  end
  if holding(key) >= max then
    return
  end
  local first = redis.call("ZRANGEBYLEX", waiting, "[" .. key .. "\n", "[" .. key .. "\n\255",
    "LIMIT", 0, 1)[1]
  if not first then
    redis.call("HDEL", queued, key)
    return
  end
  redis.call("ZREM", waiting, first)
  local run = string.match(first, "\n([^\n]*)$")
  local version, _, job = entry(run)
  if not version then
    return -- forgotten meanwhile (Valkey lost it): the reconciler publishes it
  end
  redis.call("HSET", queued, key, run .. "\t" .. now)
  for _, value in ipairs({run, job, string.match(first, "\n(%d)"), version}) do
    table.insert(out, value)
  end
end

-- An end lets go of every place the run holds, whichever delivery took it, and forgets it.
local function let_go(run)
  local _, member = entry(run)
  if not member then
    return
  end
  local key = key_of(member)
  local mine = redis.call("ZRANGEBYLEX", held, "[" .. key .. "\n" .. run .. "|",
    "[" .. key .. "\n" .. run .. "|\255")
  redis.call("ZREM", waiting, member)
  redis.call("HDEL", runs, run)
  for _, holder in ipairs(mine) do
    redis.call("ZREM", holders, holder)
    redis.call("ZREM", held, holder)
  end
  if turn_of(key) == run then
    redis.call("HDEL", queued, key)
  end
  expire()
  dispatch(key)
end

if verb == "enqueue" then
  local run, key = ARGV[5], ARGV[6]
  local _, member = entry(run)
  member = member or register(run, key, ARGV[7], ARGV[8], ARGV[9])
  if turn_of(key) ~= run then
    redis.call("ZADD", waiting, "NX", 0, member)
  end
  expire()
  dispatch(key)
elseif verb == "take" then
  local run, owner = ARGV[5], ARGV[6]
  local _, member = entry(run)
  if not member then
    if #ARGV < 10 then
      return {-1}
    end
    member = register(run, ARGV[7], ARGV[8], ARGV[9], ARGV[10])
  end
  local key = key_of(member)
  local holder = key .. "\n" .. run .. "|" .. owner
  expire()
  if turn_of(key) == run then
    redis.call("HDEL", queued, key)
  end
  if redis.call("ZSCORE", holders, holder) or holding(key) < max then
    redis.call("ZADD", holders, now + lease, holder)
    redis.call("ZADD", held, 0, holder)
    redis.call("ZREM", waiting, member)
    dispatch(key)
  else
    redis.call("ZADD", waiting, 0, member)
    out[1] = 0
  end
elseif verb == "finish" then
  let_go(ARGV[5])
elseif verb == "release" then
  local run = ARGV[5]
  local _, member = entry(run)
  if member then
    local key = key_of(member)
    local holder = key .. "\n" .. run .. "|" .. ARGV[6]
    redis.call("ZREM", holders, holder)
    redis.call("ZREM", held, holder)
    redis.call("HSET", queued, key, run .. "\t" .. now)
  end
elseif verb == "renew" then
  local _, member = entry(ARGV[5])
  local holder = member and (key_of(member) .. "\n" .. ARGV[5] .. "|" .. ARGV[6])
  local expiry = holder and redis.call("ZSCORE", holders, holder)
  if expiry and tonumber(expiry) > now then
    redis.call("ZADD", holders, "XX", now + lease, holder)
  else
    out[1] = 0
  end
elseif verb == "sweep" then
  expire()
  local last = redis.call("HGET", queued, "\n")
  local from = last and ("(" .. last .. "\n\255") or "-"
  local key = nil
  for _ = 1, tonumber(ARGV[5]) do
    local first = redis.call("ZRANGEBYLEX", waiting, from, "+", "LIMIT", 0, 1)[1]
    if not first then
      key = nil
      break
    end
    key = key_of(first)
    dispatch(key)
    from = "(" .. key .. "\n\255"
  end
  -- A pass that reached the last key starts the next from the first.
  if key then
    redis.call("HSET", queued, "\n", key)
  else
    redis.call("HDEL", queued, "\n")
  end
else
  return redis.error_reply("BAD_ARGS keyed: unknown verb " .. tostring(verb))
end
return out
