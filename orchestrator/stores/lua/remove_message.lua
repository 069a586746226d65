-- @version 1
-- Runs on the BROKER Redis. Removes one run's waiting message from its queue, if it is
-- still waiting (a message a worker has reserved is not in these lists).
-- KEYS[1] .. KEYS[n] the queue's priority lists (see keys.broker_queue)
-- ARGV[1] runId  ARGV[2] how many lists KEYS holds (a check on the caller)
-- Returns 1 when a message was removed, 0 when none was waiting.
if #KEYS < 1 or #ARGV ~= 2 or tonumber(ARGV[2]) ~= #KEYS then
  return redis.error_reply("BAD_ARGS remove_message expects its lists and 2 args")
end
local suffix = "#" .. ARGV[1]
for i = 1, #KEYS do
  for _, raw in ipairs(redis.call("LRANGE", KEYS[i], 0, -1)) do
    local id = cjson.decode(raw)["headers"]["id"] or ""
    if string.sub(id, -#suffix) == suffix then
      redis.call("LREM", KEYS[i], 1, raw)
      return 1
    end
  end
end
return 0
