#!lua
-- needs: guard.lua unique/claim.lua
-- SCHEDULE: schedules entries in a delayed set; an id already waiting keeps its first schedule,
-- and an entry published with a unique window (`.unique_for(..)`) is scheduled only when no
-- other publish holds its id's window (unique/claim.lua). Called
-- through `crate::delayed::ScheduleLater`.
--
-- KEYS: delayed set, delayed payload hash, then one unique key per entry with a window, in order.
-- ARGV: the publish's token, then groups of five, `kind ms id value window`; kind `in` = ms from
--       the server's now, `at` = ms since the epoch; window `0` = none.
-- When an entry becomes the earliest in the set, `PUBLISH <delayed set> ''` wakes the readers of
-- the destination so they shorten their wait. Returns how many were scheduled (ids already
-- waiting and duplicates within a window do not count; a resent publish counts what its first
-- run scheduled).
-- Refused under maxmemory (no allow-oom flag): a publish fails with OOM instead of growing a
-- full Redis.
if #ARGV % 5 ~= 1 then
  return redis.error_reply('RSARGS schedule.lua takes a token and groups of five arguments, got ' .. #ARGV)
end
local windows = 0
for i = 2, #ARGV, 5 do
  if (ARGV[i] ~= 'in' and ARGV[i] ~= 'at') or not tonumber(ARGV[i + 1]) or not tonumber(ARGV[i + 4]) then
    return redis.error_reply('RSARGS schedule.lua: malformed entry at argument ' .. i)
  end
  if tonumber(ARGV[i + 4]) > 0 then windows = windows + 1 end
end
if windows ~= #KEYS - 2 then
  return redis.error_reply('RSARGS schedule.lua: ' .. windows .. ' windows for ' .. (#KEYS - 2) .. ' unique keys')
end
local checks = {{KEYS[1], 'zset'}, {KEYS[2], 'hash'}}
for k = 3, #KEYS do checks[#checks + 1] = {KEYS[k], 'string'} end
local bad = wrong_types(checks)
if bad then return redis.error_reply(bad) end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local earliest = tonumber(first[2])
local wake = false
local added = 0
local u = 2
for i = 2, #ARGV, 5 do
  local due = tonumber(ARGV[i + 1])
  if ARGV[i] == 'in' then due = now + due end
  local claim = 'new'
  if tonumber(ARGV[i + 4]) > 0 then
    u = u + 1
    claim = unique_claim(KEYS[u], ARGV[i + 4], ARGV[1])
  end
  if claim == 'resent' then added = added + 1 end
  if claim == 'new' and redis.call('HSETNX', KEYS[2], ARGV[i + 2], ARGV[i + 3]) == 1 then
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
