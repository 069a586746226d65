-- @version 1
-- Append lines to a run's live log, each numbered in the run's own sequence, and tell the
-- run's log followers (SSE clients) that there is more.
-- KEYS[1] task:log:<runId>  (list: "<seq>\t<entry JSON>", oldest first, the last ARGV[1] kept)
-- KEYS[2] task:log:<runId>:seq  (string: the last seq given)
-- ARGV[1] cap (lines kept)  ARGV[2] ttl (ms)  ARGV[3] channel  ARGV[4..] entry JSON, in order
-- Returns the seq of the last line appended.
if #KEYS ~= 2 or #ARGV < 4 then
  return redis.error_reply("BAD_ARGS log_append expects 2 keys and at least 4 args")
end
local seq = 0
for i = 4, #ARGV do
  seq = redis.call("INCR", KEYS[2])
  redis.call("RPUSH", KEYS[1], seq .. "\t" .. ARGV[i])
end
redis.call("LTRIM", KEYS[1], -tonumber(ARGV[1]), -1)
redis.call("PEXPIRE", KEYS[1], ARGV[2])
redis.call("PEXPIRE", KEYS[2], ARGV[2])
redis.call("PUBLISH", ARGV[3], seq)
return seq
