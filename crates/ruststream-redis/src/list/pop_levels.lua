#!lua flags=allow-oom
-- POP_LEVELS: a simple list with priority levels pops up to ARGV[1] entries from the consuming (right)
-- end of its highest non-empty level first, then the next, as `RPOP key n` does on one list.
-- Runs under maxmemory (allow-oom): it only removes. Prepended with guard.lua, frame.lua and
-- list/levels.lua.
--
-- KEYS: the queue (level 0), then its levels above 0. ARGV: most entries to pop.
-- Returns the values, oldest of each level first, highest level first.
local levels = levels_of(1, 2)
local bad = wrong_types(level_checks({{KEYS[1], 'list'}}, levels))
if bad then return redis.error_reply(bad) end
local n = tonumber(ARGV[1]) or 0
local out = {}
for l = #levels, 1, -1 do
  if #out >= n then break end
  local popped = redis.call('RPOP', levels[l], n - #out)
  if popped then
    for _, v in ipairs(popped) do out[#out + 1] = v end
  end
end
return out
