-- @version 1
-- Count one more delivery of a live run's message.
-- KEYS[1] task:run:active:<runId>
-- ARGV[1] unused marker "delivery" (keeps the contract explicit)
-- Returns the deliveries so far, or 0 when the run has no live hash (nothing to count on).
if #KEYS ~= 1 or #ARGV ~= 1 then
  return redis.error_reply("BAD_ARGS count_delivery expects 1 key and 1 arg")
end
if redis.call("EXISTS", KEYS[1]) == 0 then
  return 0
end
return redis.call("HINCRBY", KEYS[1], "deliveries", 1)
