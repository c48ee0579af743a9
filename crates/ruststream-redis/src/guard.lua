-- Checks a script makes before its first write, so that it does all it was asked or nothing:
-- Redis does not roll back the writes of a script that fails halfway.

-- Most values one `unpack` may hand to a command: Lua's C stack holds 8000, and a command's
-- name and keys take a few.
local MAX_UNPACK = 7900

-- An error message when `key` holds a type other than `want` (a missing key is fine), else nil.
local function wrong_type(key, want)
  local t = redis.call('TYPE', key)
  if type(t) == 'table' then t = t['ok'] end
  if t ~= 'none' and t ~= want then
    return 'WRONGTYPE key ' .. key .. ' holds a ' .. t .. ' where RustStream keeps a ' .. want ..
      ': rename or delete that key'
  end
  return nil
end

-- The first error of `checks`, a list of {key, wanted type}; nil when every key holds.
local function wrong_types(checks)
  for _, c in ipairs(checks) do
    local e = wrong_type(c[1], c[2])
    if e then return e end
  end
  return nil
end
