#!lua flags=allow-oom
-- needs: guard.lua
-- TRIM_ACKED: trims a stream to what its consumer groups still need, never an entry pending or
-- unread in any group. Runs under maxmemory (allow-oom): it only frees memory.
--
-- KEYS: the stream.
-- ARGV: none.
-- A group needs its smallest pending id (XPENDING summary) when it has pending entries, and the
-- entries after its last-delivered-id; the lowest of these over every group (XINFO GROUPS) is
-- the threshold, and XTRIM MINID ~ drops only whole macro nodes entirely below it. The
-- last-delivered entry itself is kept (one acknowledged entry) so no id arithmetic is needed. A
-- stream without groups, or with a group that has read nothing (`0-0`), is left alone. One script,
-- so no read or claim can slip between computing the threshold and trimming.
-- Returns {entries trimmed, threshold or ''}.
local bad = wrong_types({{KEYS[1], 'stream'}})
if bad then return redis.error_reply(bad) end
if redis.call('EXISTS', KEYS[1]) == 0 then return {0, ''} end

-- Whether the decimal strings x < y, of any length (ids may exceed a Lua number's precision).
local function num_less(x, y)
  if #x ~= #y then return #x < #y end
  return x < y
end

-- Whether the stream id a < b.
local function id_less(a, b)
  local am, as = string.match(a, '^(%d+)-(%d+)$')
  local bm, bs = string.match(b, '^(%d+)-(%d+)$')
  if am ~= bm then return num_less(am, bm) end
  return num_less(as, bs)
end

local low
for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
  local info = {}
  for i = 1, #g, 2 do info[g[i]] = g[i + 1] end
  local need = info['last-delivered-id']
  if tonumber(info['pending']) > 0 then
    local first = redis.call('XPENDING', KEYS[1], info['name'])[2]
    if id_less(first, need) then need = first end
  end
  if not low or id_less(need, low) then low = need end
end
if not low or low == '0-0' then return {0, low or ''} end
return {redis.call('XTRIM', KEYS[1], 'MINID', '~', low), low}
