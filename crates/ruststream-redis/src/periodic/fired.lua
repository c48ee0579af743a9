-- needs: guard.lua periodic/forget.lua
-- FIRED: records that a periodic job's tick was published, keeping the later of the stored tick
-- and this one, so a late instance or a resent call never moves it back; marks the job seen
-- (forgetting the jobs not seen for their bound: forget.lua).
--
-- KEYS: the registry hash, the last-tick hash (name -> epoch ms), the seen hash (name ->
--       keep-until epoch ms).
-- ARGV: the job's name, the tick (epoch ms), how long it is kept after it was last seen (ms).
-- Returns 1 when the stored tick moved, 0 when a later or equal one was there.
local tick, keep = tonumber(ARGV[2]), tonumber(ARGV[3])
if not tick or not keep or keep < 1 then
  return redis.error_reply('RSARGS fired.lua: the tick and the keep time (arguments 2 and 3) must be numbers of ms')
end
local bad = wrong_types({{KEYS[1], 'hash'}, {KEYS[2], 'hash'}, {KEYS[3], 'hash'}})
if bad then return redis.error_reply(bad) end
periodic_forget(KEYS[1], KEYS[2], KEYS[3], ARGV[1], periodic_now(), keep)
local stored = tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '')
if stored and stored >= tick then return 0 end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
return 1
