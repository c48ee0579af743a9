-- MARKS: a claimed batch's settle marks (list/claim.lua's sweep, list/settle.lua): the string
-- `<set>:<member>:s`, one byte an entry of the batch list `<set>:<member>`, '1' once the entry
-- was settled or swept (any other byte, or past the end: not yet). Read and written whole, one
-- GET and one SET a batch touched: a batch is at most one claim's size, and the string goes in
-- and out of Lua with one string.byte and one string.char. A part of list/claim.lua,
-- list/settle.lua and list/lease.lua; its bytes_of serves the settle's arguments
-- too, its batch_keys names a batch's keys for all three.

-- The names of batch `member`'s list and marks in the recovery set `set`.
local function batch_keys(set, member)
  local list = set .. ':' .. member
  return list, list .. ':s'
end

local MARKED = 49 -- '1'
local UNMARKED = 48 -- '0'
-- The marks' ttl (ms) when their batch list is gone: long enough for a settle sent again.
local LOST_BATCH_TTL = 600000

-- The reply of the read `cmd` of the batch key `key`, and an error message naming the key when
-- it holds another type (the caller returns it before its first write).
local function batch_read(cmd, key, ...)
  local r = redis.pcall(cmd, key, ...)
  if type(r) == 'table' and r.err then
    return nil, 'WRONGTYPE key ' .. key .. ' holds a type RustStream does not keep there (' ..
      r.err .. '): rename or delete that key'
  end
  return r, nil
end

-- The bytes of the string `s` as a table (1: the first), read with string.byte a part at a
-- time (Lua's C stack bounds how many values one call returns).
local function bytes_of(s)
  local n = #s
  if n <= 4000 then return {string.byte(s, 1, n)} end
  local t = {}
  for j = 1, n, 4000 do
    local part = {string.byte(s, j, math.min(j + 3999, n))}
    for k = 1, #part do t[j + k - 1] = part[k] end
  end
  return t
end

-- The marks `s` (GET's reply: false when none) of a batch of `size` entries, as a table of
-- bytes (1: the first entry), every entry of the batch in it.
local function marks_of(s, size)
  s = s or ''
  if #s < size then s = s .. string.rep('0', size - #s) end
  return bytes_of(s)
end

-- Writes the first `n` marks of `m` (as marks_of gave them, some set to MARKED since; `n` past
-- the batch's `size` when an index past its list's end was marked) to `key`. Its ttl is the
-- list's, `ttl` (PTTL's reply): none for -1, LOST_BATCH_TTL when the list is gone (-2). Writes
-- nothing and returns true when the batch is done: its list holds entries and every one of them
-- is marked.
local function marks_write(key, m, size, n, ttl)
  for i = size + 1, n do
    if not m[i] then m[i] = UNMARKED end
  end
  local parts = {}
  for j = 1, n, 4000 do
    parts[#parts + 1] = string.char(unpack(m, j, math.min(j + 3999, n)))
  end
  local s = table.concat(parts)
  local open = string.find(s, '[^1]')
  if size > 0 and (not open or open > size) then return true end
  if ttl == -2 then
    redis.call('SET', key, s, 'PX', LOST_BATCH_TTL)
  elseif ttl >= 0 then
    redis.call('SET', key, s, 'PX', string.format('%d', math.max(ttl, 1)))
  else
    redis.call('SET', key, s)
  end
  return false
end
