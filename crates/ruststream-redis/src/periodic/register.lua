-- REGISTER: writes a periodic job's definition into the registry and reads its last fired tick.
-- Prepended with guard.lua. No allow-oom flag: it adds, so Redis refuses it whole under
-- maxmemory (the app's start then fails and says so).
--
-- KEYS: the registry hash (name -> definition JSON), the last-tick hash (name -> epoch ms).
-- ARGV: the job's name, its definition.
-- Returns the last fired tick (a string of epoch ms), or nil when the job never fired.
local bad = wrong_types({{KEYS[1], 'hash'}, {KEYS[2], 'hash'}})
if bad then return redis.error_reply(bad) end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return redis.call('HGET', KEYS[2], ARGV[1])
