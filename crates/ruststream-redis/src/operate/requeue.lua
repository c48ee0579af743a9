#!lua
-- REQUEUE: moves dead letters back to their queue, each with its attempt count reset to 1 and its
-- `reason` header appended to a `dead-history` header. Prepended with guard.lua, frame.lua,
-- stream/bound.lua and list/levels.lua.
--
-- KEYS: dead-letter list, destination (a list, a stream or a sharded channel, whose slot
--       SPUBLISH obeys as a key's; for plain Pub/Sub the dead-letter list stands in, and the
--       channel is ARGV[2]), then a list's priority levels above 0 (each dead letter goes back
--       onto its own level, see levels.lua).
-- ARGV: `list`, `stream`, `pubsub` or `sharded`; the channel (Pub/Sub) or ''; the stream's bound
--       (see bound.lua; '' for the others, after its XADDs a stream is trimmed to it); then
--       either `oldest` and a
--       count (the oldest dead letters, at most 1,000 a call) or `values` and the exact values
--       to move (each removed with LREM; one no longer there is skipped).
-- A list gets the values with RPUSH (the consuming end: they are handled next, oldest first), a
-- stream an XADD of each one's fields, a channel a PUBLISH, a sharded channel an SPUBLISH.
-- Refused under maxmemory.
-- Returns how many were moved.
local kind, channel, spec, how = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local levels = levels_of(2, 3)
local checks = {{KEYS[1], 'list'}}
if kind == 'list' then checks[2] = {KEYS[2], 'list'} end
if kind == 'stream' then checks[2] = {KEYS[2], 'stream'} end
local bad = wrong_types(level_checks(checks, levels))
if bad then return redis.error_reply(bad) end
if how ~= 'oldest' and how ~= 'values' then
  return redis.error_reply('RSARGS requeue.lua: ARGV[4] must be oldest or values, got ' .. tostring(how))
end
local bound_bad = bound_error(spec or '')
if bound_bad then return redis.error_reply(bound_bad) end

-- `v` requeued: attempt 1, `reason` moved to the end of `dead-history`.
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
    else
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
  local n = math.min(tonumber(ARGV[5]) or 0, 1000)
  if n > 0 then
    -- Fields that fit one XADD are checked before anything is taken.
    local oldest = redis.call('LRANGE', KEYS[1], -n, -1)
    for i = #oldest, 1, -1 do taken[#taken + 1] = oldest[i] end
  end
else
  for i = 5, #ARGV do taken[#taken + 1] = ARGV[i] end
end
if kind == 'stream' then
  for _, v in ipairs(taken) do
    local fields = frame_fields(requeued(v))
    if #fields > MAX_UNPACK - 2 then
      return redis.error_reply('RSBADENTRY a dead letter has ' .. #fields ..
        ' stream fields, more than one XADD can take; purge it instead')
    end
  end
end
local moved = 0
for _, v in ipairs(taken) do
  if how == 'values' and redis.call('LREM', KEYS[1], -1, v) == 0 then
    v = nil
  end
  if v then
    local out = requeued(v)
    if kind == 'list' then
      push_level(levels, out, true)
    elseif kind == 'stream' then
      redis.call('XADD', KEYS[2], '*', unpack(frame_fields(out)))
    elseif kind == 'sharded' then
      redis.call('SPUBLISH', KEYS[2], out)
    else
      redis.call('PUBLISH', channel, out)
    end
    moved = moved + 1
  end
end
if how == 'oldest' and moved > 0 then redis.call('LTRIM', KEYS[1], 0, -moved - 1) end
if kind == 'stream' and moved > 0 then bound(KEYS[2], spec) end
return moved
