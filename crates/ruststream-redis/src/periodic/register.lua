-- needs: guard.lua periodic/forget.lua
-- REGISTER: writes a periodic job's definition into the registry, marks it seen (forgetting the
-- jobs not seen for their bound: forget.lua) and reads its last fired tick. No allow-oom flag:
-- it adds, so Redis refuses it whole under
-- maxmemory (the app's start then fails and says so).
--
-- KEYS: the registry hash (name -> definition JSON), the last-tick hash (name -> epoch ms), the
--       seen hash (name -> keep-until epoch ms).
-- ARGV: the job's name, its definition, how long it is kept after it was last seen (ms).
-- Returns the last fired tick (a string of epoch ms), or nil when the job never fired.
local keep = tonumber(ARGV[3])
if not keep or keep < 1 then
  return redis.error_reply('RSARGS register.lua: the keep time at argument 3 must be a positive number of ms')
end
local bad = wrong_types({{KEYS[1], 'hash'}, {KEYS[2], 'hash'}, {KEYS[3], 'hash'}})
if bad then return redis.error_reply(bad) end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
periodic_forget(KEYS[1], KEYS[2], KEYS[3], ARGV[1], periodic_now(), keep)
return redis.call('HGET', KEYS[2], ARGV[1])
