-- MARKS: a claimed batch's settle marks (list/claim.lua's sweep, list/settle.lua): the string
-- `<set>:<member>:s`, one byte an entry of the batch list `<set>:<member>`, '1' once the entry
-- was settled or swept (any other byte, or past the end: not yet). Read and written whole, one
-- GET and one SET a batch touched: a batch is at most one claim's size, and the string goes in
-- and out of Lua with one string.byte and one string.char. Prepended after guard.lua.

local MARKED = 49 -- '1'

-- The marks of a batch of `size` entries whose marks key is `key`, as a table of bytes (1: the
-- first entry), every entry of the batch in it.
local function marks_read(key, size)
  local s = redis.call('GET', key) or ''
  if #s < size then s = s .. string.rep('0', size - #s) end
  if size <= 4000 then return {string.byte(s, 1, size)} end
  local m = {}
  for j = 1, size, 4000 do
    local part = {string.byte(s, j, math.min(j + 3999, size))}
    for k = 1, #part do m[j + k - 1] = part[k] end
  end
  return m
end

-- Writes the marks `m` of a batch of `size` entries (as marks_read gave them, some set to
-- MARKED since) to `key`, with the ttl `ttl` ms (none when not positive). Writes nothing and
-- returns true when every entry is marked: the batch is done.
local function marks_write(key, m, size, ttl)
  local parts = {}
  for j = 1, size, 4000 do
    parts[#parts + 1] = string.char(unpack(m, j, math.min(j + 3999, size)))
  end
  local s = table.concat(parts)
  if not string.find(s, '[^1]') then return true end
  if ttl > 0 then
    redis.call('SET', key, s, 'PX', string.format('%d', ttl))
  else
    redis.call('SET', key, s)
  end
  return false
end
