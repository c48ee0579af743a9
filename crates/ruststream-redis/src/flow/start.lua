#!lua
-- needs: guard.lua
-- FLOW_START: writes a flow's record, once, and says which children are still to be published.
-- Called through `crate::flow::StartFlow`, before any child is published; a publish of the same
-- flow sent again (a lost reply, a crash halfway, a reader's repair) finds the record and
-- publishes only the children not yet marked sent (`flow/sent.lua`). Refused under maxmemory
-- (no allow-oom flag): it only adds.
--
-- KEYS: the record (a hash in the parent queue's slot), the parent queue's publishing set (a
--       sorted set in the same slot: record key -> ms it was started or taken for repair).
-- ARGV: the flow's id, the parent's frame, the policy ('fail' or 'continue'), the record's ttl
--       in ms (the flow's max age), the flow's plan (`flow/plan.rs`; '' for a repair, which
--       never makes a record: one gone has expired), then each child's id, in order (at most
--       1000).
-- The record's fields: id, state ('pending', then 'enqueued' or 'failed'), policy, parent,
-- left (children not over), ids (the children's ids, one a line), plan (until no child is 'u'),
-- and per child `c:<id>`: 'u' (not yet published), 'p' (published), 'a' (acked), 'x' (dead),
-- 'd' (dropped), with `r:<id>`: its result, or its dead letter's reason (`flow/done.lua`).
-- Making the record also adds it to the publishing set, scored with the server's now, and
-- makes the set live at least the record's ttl.
-- Returns the ids of the children still to be published ('u').
local ttl = tonumber(ARGV[4])
local n = #ARGV - 5
if not ttl or ttl < 1 or n < 1 or n > 1000 or (ARGV[3] ~= 'fail' and ARGV[3] ~= 'continue') then
  return redis.error_reply('RSARGS flow/start.lua: an id, a parent, a policy, a ttl, a plan and 1 to 1000 children')
end
local bad = wrong_types({{KEYS[1], 'hash'}, {KEYS[2], 'zset'}})
if bad then return redis.error_reply(bad) end
if redis.call('EXISTS', KEYS[1]) == 0 then
  if ARGV[5] == '' then return {} end
  local ids = {}
  for i = 6, #ARGV do ids[#ids + 1] = ARGV[i] end
  redis.call('HSET', KEYS[1], 'id', ARGV[1], 'state', 'pending', 'policy', ARGV[3],
    'parent', ARGV[2], 'left', n, 'ids', table.concat(ids, '\n'), 'plan', ARGV[5])
  for i = 6, #ARGV do redis.call('HSET', KEYS[1], 'c:' .. ARGV[i], 'u') end
  redis.call('PEXPIRE', KEYS[1], ttl)
  local t = redis.call('TIME')
  redis.call('ZADD', KEYS[2], tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000), KEYS[1])
  if redis.call('PTTL', KEYS[2]) < ttl then redis.call('PEXPIRE', KEYS[2], ttl) end
end
local unsent = {}
for i = 6, #ARGV do
  if redis.call('HGET', KEYS[1], 'c:' .. ARGV[i]) == 'u' then unsent[#unsent + 1] = ARGV[i] end
end
return unsent
