#!lua
-- needs: guard.lua frame.lua back.lua
-- REQUEUE: moves dead letters back to their queue, each with its attempt count reset to 1, its
-- `reason` header appended to a `dead-history` header and its `dead-at` dropped; a flow's parent
-- dead-lettered for a failed child (`crate::flow`) loses its `rs.flow.failed` header, so it runs
-- once requeued, and reads the dead child in its children. Called through
-- `crate::operate::dead::Requeue`.
--
-- KEYS: dead-letter list, then the destination's keys (back.lua: a list's levels, each dead
--       letter going back onto its own; a stream; a sharded channel).
-- ARGV: the destination (back.lua: list, stream, sharded or pubsub), then either `oldest` and a
--       count (the oldest dead letters, at most 1,000 a call) or `values` and the exact values
--       to move (each removed with LREM; one no longer there is skipped).
-- A list gets the values at its consuming end (RPUSH: they are handled next), a stream an XADD
-- of each one's fields (then one trim to its bound), a channel a PUBLISH (SPUBLISH). A dead
-- letter a stream cannot take (more fields than one XADD can) fails the call before any write.
-- Refused under maxmemory.
-- Returns how many were moved.
local dest, derr = dest_of(2, 1)
if not dest then return redis.error_reply(derr) end
local bad = wrong_types(dest_checks(dest, {{KEYS[1], 'list'}}))
if bad then return redis.error_reply(bad) end
local how = ARGV[dest.arg_end]
if how ~= 'oldest' and how ~= 'values' then
  return redis.error_reply('RSARGS requeue.lua: expected oldest or values at argument ' .. dest.arg_end .. ', got ' .. tostring(how))
end

-- `v` requeued: attempt 1, `reason` moved to the end of `dead-history`, `dead-at` and
-- `rs.flow.failed` dropped.
local function requeued(v)
  local layout = frame_layout(v)
  if not layout then return v end
  local reason, history
  local kept = {}
  for _, h in ipairs(layout.headers) do
    local k, val = string.sub(v, h[1], h[2]), string.sub(v, h[3], h[4])
    if k == 'reason' then
      reason = val
    elseif k == 'dead-history' then
      history = val
    elseif k ~= 'dead-at' and k ~= 'rs.flow.failed' then
      kept[#kept + 1] = u16_bytes(#k) .. k .. u32_bytes(#val) .. val
    end
  end
  if reason then history = history and (history .. '; ' .. reason) or reason end
  if history then
    kept[#kept + 1] = u16_bytes(12) .. 'dead-history' .. u32_bytes(#history) .. history
  end
  return '\0rs1' .. u32_bytes(1) .. string.sub(v, 9, layout.id[2]) .. u16_bytes(#kept) ..
    table.concat(kept) .. string.sub(v, layout.payload)
end

local taken = {}
if how == 'oldest' then
  local n = math.min(tonumber(ARGV[dest.arg_end + 1]) or 0, 1000)
  if n > 0 then
    local oldest = redis.call('LRANGE', KEYS[1], -n, -1)
    for i = #oldest, 1, -1 do taken[#taken + 1] = oldest[i] end
  end
else
  for i = dest.arg_end + 1, #ARGV do taken[#taken + 1] = ARGV[i] end
end
-- Every dead letter as its destination takes it, before anything is taken.
local items = {}
for i, v in ipairs(taken) do
  local item, why = dest_item(dest, requeued(v))
  if not item then
    return redis.error_reply('RSBADENTRY a dead letter cannot go back: ' .. why .. '; purge it instead')
  end
  items[i] = item
end
local moved = {}
for i, v in ipairs(taken) do
  if how == 'oldest' or redis.call('LREM', KEYS[1], -1, v) > 0 then moved[#moved + 1] = items[i] end
end
if how == 'oldest' and #moved > 0 then redis.call('LTRIM', KEYS[1], 0, -#moved - 1) end
return put_back(dest, moved, true)
