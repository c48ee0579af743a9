#!lua
-- needs: guard.lua
-- PUSH_TTL: LPUSH values, then PEXPIRE the list, atomically.
--
-- KEYS: list. ARGV: ttl ms, then the values. Returns the list's length.
-- Refused under maxmemory (no allow-oom flag): a publish fails with OOM instead of growing a
-- full Redis.
if not tonumber(ARGV[1]) then return redis.error_reply('RSARGS push_ttl.lua: the ttl is not a number') end
local bad = wrong_types({{KEYS[1], 'list'}})
if bad then return redis.error_reply(bad) end
local n = 0
for i = 2, #ARGV, 1000 do
  n = redis.call('LPUSH', KEYS[1], unpack(ARGV, i, math.min(i + 999, #ARGV)))
end
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return n
