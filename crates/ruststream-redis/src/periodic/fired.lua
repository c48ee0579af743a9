-- FIRED: records that a periodic job's tick was published, keeping the later of the stored tick
-- and this one, so a late instance or a resent call never moves it back. Prepended with
-- guard.lua.
--
-- KEYS: the last-tick hash (name -> epoch ms).
-- ARGV: the job's name, the tick (epoch ms).
-- Returns 1 when the stored tick moved, 0 when a later or equal one was there.
local bad = wrong_types({{KEYS[1], 'hash'}})
if bad then return redis.error_reply(bad) end
local tick = tonumber(ARGV[2])
local stored = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '')
if stored and stored >= tick then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return 1
