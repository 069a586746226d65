-- @version 1
-- Runs on the BROKER Redis. The run ids of the messages in one slice of one broker list, so
-- the reconciler can tell whether a pending run's message still waits without copying whole
-- messages out of the broker. Slices keep each call short; kombu LPUSHes new messages on the
-- left and BRPOPs from the right, so walking from the left may see a message twice but never
-- skips one that stays in the list.
-- KEYS[1] a broker list (see keys.broker_queue)
-- ARGV[1] first index  ARGV[2] last index (LRANGE semantics)
-- Returns one entry per message in the slice: its run id (the part of headers.id after '#'),
-- or "" for a message that is not one of ours.
if #KEYS ~= 1 or #ARGV ~= 2 then
  return redis.error_reply("BAD_ARGS broker_run_ids expects 1 key and 2 args")
end
local found = {}
for i, raw in ipairs(redis.call("LRANGE", KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2]))) do
  local ok, message = pcall(cjson.decode, raw)
  local id = ""
  if ok and type(message) == "table" and type(message["headers"]) == "table" then
    local header = message["headers"]["id"]
    if type(header) == "string" then
      id = string.match(header, "#(.+)$") or ""
    end
  end
  found[i] = id
end
return found
