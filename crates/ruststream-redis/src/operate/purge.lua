#!lua flags=allow-oom
-- needs: guard.lua
-- PURGE: deletes dead letters. Runs under maxmemory (it frees).
--
-- KEYS: dead-letter list.
-- ARGV: `oldest` and a count (-1: all), or `values` and the exact values to delete (LREM each).
-- Returns how many were deleted.
local bad = wrong_types({{KEYS[1], 'list'}})
if bad then return redis.error_reply(bad) end
if ARGV[1] == 'oldest' then
  local len = redis.call('LLEN', KEYS[1])
  local n = tonumber(ARGV[2]) or 0
  if n < 0 or n >= len then
    redis.call('DEL', KEYS[1])
    return len
  end
  if n > 0 then redis.call('LTRIM', KEYS[1], 0, -n - 1) end
  return n
end
local gone = 0
for i = 2, #ARGV do gone = gone + redis.call('LREM', KEYS[1], -1, ARGV[i]) end
return gone
