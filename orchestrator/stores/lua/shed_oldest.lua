-- @version 1
-- Runs on the BROKER Redis. Removes up to ARGV[1] waiting messages of one resource class,
-- least urgent priority first and, within a priority, the oldest run first (run ids are
-- ULIDs, so their order is their age). kombu LPUSHes and BRPOPs, so each list's oldest
-- message is at its right end.
-- KEYS[1] .. KEYS[n] the class's broker lists (see keys.broker_queue), grouped by priority step,
--            least urgent group first
-- ARGV[1] how many to remove  ARGV[2..] group sizes, one per priority step, in KEYS order
-- Returns the run ids of the removed messages (the part of headers.id after '#').
local listed = 0
for g = 2, #ARGV do
  listed = listed + (tonumber(ARGV[g]) or -#KEYS - 1)
end
if #KEYS < 1 or #ARGV < 2 or listed ~= #KEYS then
  return redis.error_reply("BAD_ARGS shed_oldest expects keys and group sizes summing to them")
end
local wanted = tonumber(ARGV[1])
local removed = {}
local first = 1
for g = 2, #ARGV do
  local last = first + tonumber(ARGV[g]) - 1
  while #removed < wanted do
    local best_key, best_run = nil, nil
    for i = first, last do
      local raw = redis.call("LINDEX", KEYS[i], -1)
      if raw then
        local id = cjson.decode(raw)["headers"]["id"] or ""
        local run = string.match(id, "#(.+)$") or id
        if best_run == nil or run < best_run then
          best_key, best_run = KEYS[i], run
        end
      end
    end
    if best_key == nil then
      break
    end
    redis.call("RPOP", best_key)
    removed[#removed + 1] = best_run
  end
  first = last + 1
end
return removed
