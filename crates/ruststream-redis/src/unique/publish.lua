#!lua
-- needs: guard.lua back.lua unique/claim.lua
-- PUBLISH_UNIQUE: puts onto a list or a stream the messages whose id no other publish holds a
-- window for (unique_claim), each marking its id for its own window. Called through
-- `crate::unique::PublishUnique`.
--
-- KEYS: the destination's keys (back.lua: a list's levels up to the messages' own, or a
--       stream), then one unique key per message.
-- ARGV: the publish's token, the destination (back.lua: a list with its ttl, or a stream with
--       its bound), then per message its window ms and its frame (a stream gets its fields,
--       back.lua).
-- Returns how many of the messages this publish enqueued (a resent publish counts what its first
-- run enqueued). Refused under maxmemory (no allow-oom flag), like every publish.
local dest, derr = dest_of(1, 2)
if not dest then return redis.error_reply(derr) end
if dest.kind ~= 'list' and dest.kind ~= 'stream' then
  return redis.error_reply('RSARGS publish_unique.lua: a unique publish goes onto a list or a stream')
end
local first_key, first_arg = dest.key_end, dest.arg_end
local checks = dest_checks(dest, {})
for k = first_key, #KEYS do checks[#checks + 1] = {KEYS[k], 'string'} end
local bad = wrong_types(checks)
if bad then return redis.error_reply(bad) end
if #ARGV - first_arg + 1 ~= 2 * (#KEYS - first_key + 1) then
  return redis.error_reply('RSARGS publish_unique.lua: ' .. #ARGV .. ' arguments for ' .. (#KEYS - first_key + 1) .. ' messages')
end
-- Every message checked and converted before the first write: {window, item}.
local msgs = {}
for i = first_arg, #ARGV, 2 do
  local w = tonumber(ARGV[i])
  if not w or w < 1 then
    return redis.error_reply('RSARGS publish_unique.lua: malformed window at argument ' .. i)
  end
  local item, why = dest_item(dest, ARGV[i + 1])
  if not item then
    return redis.error_reply('RSBADENTRY publish_unique.lua: the message at argument ' .. (i + 1) .. ' cannot be published: ' .. why)
  end
  msgs[#msgs + 1] = {w, item}
end
local enqueued, new = 0, {}
for m, msg in ipairs(msgs) do
  local claim = unique_claim(KEYS[first_key + m - 1], msg[1], ARGV[1])
  if claim == 'new' then new[#new + 1] = msg[2] end
  if claim ~= 'duplicate' then enqueued = enqueued + 1 end
end
put_back(dest, new, false)
return enqueued
