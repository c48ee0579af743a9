#!lua
-- FLOW_START: writes a flow's record, once, and says which children are still to be published.
-- Called through `crate::flow::StartFlow`, before any child is published; a publish of the same
-- flow sent again (a lost reply, a crash halfway) finds the record and publishes only the
-- children not yet marked sent (`flow/sent.lua`). Refused under maxmemory (no allow-oom flag):
-- it only adds. Prepended with guard.lua.
--
-- KEYS: the record (a hash in the parent queue's slot).
-- ARGV: the flow's id, the parent's frame, the policy ('fail' or 'continue'), the record's ttl
--       in ms (the flow's max age), then each child's id, in order (at most 1000).
-- The record's fields: id, state ('pending', then 'enqueued' or 'failed'), policy, parent,
-- left (children not over), ids (the children's ids, one a line), and per child `c:<id>`:
-- 'u' (not yet published), 'p' (published), 'a' (acked), 'x' (dead), 'd' (dropped), with
-- `r:<id>`: its result, or its dead letter's reason (`flow/done.lua`).
-- Returns the ids of the children still to be published ('u').
local ttl = tonumber(ARGV[4])
local n = #ARGV - 4
if not ttl or ttl < 1 or n < 1 or n > 1000 or (ARGV[3] ~= 'fail' and ARGV[3] ~= 'continue') then
  return redis.error_reply('RSARGS flow/start.lua: an id, a parent, a policy, a ttl and 1 to 1000 children')
end
local bad = wrong_types({{KEYS[1], 'hash'}})
if bad then return redis.error_reply(bad) end
if redis.call('EXISTS', KEYS[1]) == 0 then
  local ids = {}
  for i = 5, #ARGV do ids[#ids + 1] = ARGV[i] end
  redis.call('HSET', KEYS[1], 'id', ARGV[1], 'state', 'pending', 'policy', ARGV[3],
    'parent', ARGV[2], 'left', n, 'ids', table.concat(ids, '\n'))
  for i = 5, #ARGV do redis.call('HSET', KEYS[1], 'c:' .. ARGV[i], 'u') end
  redis.call('PEXPIRE', KEYS[1], ttl)
end
local unsent = {}
for i = 5, #ARGV do
  if redis.call('HGET', KEYS[1], 'c:' .. ARGV[i]) == 'u' then unsent[#unsent + 1] = ARGV[i] end
end
return unsent
