#!lua
-- SCHEDULE: schedules entries in a delayed set; an id already waiting keeps its first schedule.
--
-- KEYS: delayed set, delayed payload hash.
-- ARGV: groups of four, `kind ms id value`; kind `in` = ms from the server's now, `at` = ms
--       since the epoch.
-- When an entry becomes the earliest in the set, `PUBLISH <delayed set> ''` wakes the readers of
-- the destination so they shorten their wait. Returns how many were scheduled (ids already
-- waiting do not count).
-- Refused under maxmemory (no allow-oom flag): a publish fails with OOM instead of growing a
-- full Redis.
if #ARGV % 4 ~= 0 then
  return redis.error_reply('ERR schedule.lua takes groups of four arguments, got ' .. #ARGV)
end
for i = 1, #ARGV, 4 do
  if (ARGV[i] ~= 'in' and ARGV[i] ~= 'at') or not tonumber(ARGV[i + 1]) then
    return redis.error_reply('ERR schedule.lua: malformed entry at argument ' .. i)
  end
end
local bad = wrong_types({{KEYS[1], 'zset'}, {KEYS[2], 'hash'}})
if bad then return redis.error_reply(bad) end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local earliest = tonumber(first[2])
local wake = false
local added = 0
for i = 1, #ARGV, 4 do
  local due = tonumber(ARGV[i + 1])
  if ARGV[i] == 'in' then due = now + due end
  if redis.call('HSETNX', KEYS[2], ARGV[i + 2], ARGV[i + 3]) == 1 then
    redis.call('ZADD', KEYS[1], due, ARGV[i + 2])
    added = added + 1
    if not earliest or due < earliest then
      earliest = due
      wake = true
    end
  end
end
if wake then redis.call('PUBLISH', KEYS[1], '') end
return added
