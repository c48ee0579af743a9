#!lua
-- PUBLISH_UNIQUE: LPUSHes to a list, or XADDs to a stream, the messages whose id no other
-- publish holds a window for (unique_claim), each marking its id for its own window. Prepended
-- with guard.lua, bound.lua and unique/claim.lua.
--
-- KEYS: the destination, then one unique key per message.
-- ARGV: the publish's token, `list` or `stream`, the list's ttl ms (`0`: none) or the stream's
--       bound (bound.lua's spec), `1` when the list is a priority level above 0 (whose readers
--       wait for a `PUBLISH` on its name when it gets an entry while empty) else `0`, then per
--       message its window ms and, for a list, its frame; for a stream, its field count and
--       fields.
-- Returns how many of the messages this publish enqueued (a resent publish counts what its first
-- run enqueued). Refused under maxmemory (no allow-oom flag), like every publish.
local kind = ARGV[2]
if kind ~= 'list' and kind ~= 'stream' then
  return redis.error_reply('RSARGS publish_unique.lua: unknown kind ' .. tostring(kind))
end
local checks = {{KEYS[1], kind}}
for k = 2, #KEYS do checks[#checks + 1] = {KEYS[k], 'string'} end
local bad = wrong_types(checks)
if bad then return redis.error_reply(bad) end
if kind == 'list' and not tonumber(ARGV[3]) then
  return redis.error_reply('RSARGS publish_unique.lua: the ttl is not a number')
end
if kind == 'stream' then
  local e = bound_error(ARGV[3])
  if e then return redis.error_reply(e) end
end
-- Every message's place in ARGV, read before the first write: {window, first, last}.
local msgs = {}
local i = 5
for _ = 2, #KEYS do
  local w = tonumber(ARGV[i])
  if not w or w < 1 then
    return redis.error_reply('RSARGS publish_unique.lua: malformed window at argument ' .. i)
  end
  if kind == 'list' then
    msgs[#msgs + 1] = {w, i + 1, i + 1}
    i = i + 2
  else
    local n = tonumber(ARGV[i + 1])
    if not n or n < 2 or n % 2 ~= 0 then
      return redis.error_reply('RSARGS publish_unique.lua: malformed field count at argument ' .. (i + 1))
    end
    msgs[#msgs + 1] = {w, i + 2, i + 1 + n}
    i = i + 2 + n
  end
end
if i ~= #ARGV + 1 then
  return redis.error_reply('RSARGS publish_unique.lua: ' .. #ARGV .. ' arguments for ' .. (#KEYS - 1) .. ' messages')
end
local was_empty = kind == 'list' and redis.call('LLEN', KEYS[1]) == 0
local enqueued, pushed = 0, 0
for m, msg in ipairs(msgs) do
  local claim = unique_claim(KEYS[m + 1], msg[1], ARGV[1])
  if claim == 'new' then
    if kind == 'list' then
      redis.call('LPUSH', KEYS[1], ARGV[msg[2]])
    else
      redis.call('XADD', KEYS[1], '*', unpack(ARGV, msg[2], msg[3]))
    end
    pushed = pushed + 1
  end
  if claim ~= 'duplicate' then enqueued = enqueued + 1 end
end
if pushed > 0 then
  if kind == 'list' and tonumber(ARGV[3]) > 0 then redis.call('PEXPIRE', KEYS[1], ARGV[3]) end
  if kind == 'list' and ARGV[4] == '1' and was_empty then redis.call('PUBLISH', KEYS[1], '') end
  if kind == 'stream' then bound(KEYS[1], ARGV[3]) end
end
return enqueued
