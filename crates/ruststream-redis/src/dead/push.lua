#!lua flags=allow-oom
-- needs: guard.lua dead/trim.lua
-- PUSH_DEAD: pushes dead letters of a subscription that has nothing to acknowledge (a simple
-- list, Pub/Sub) and trims the list to its bound. Runs under maxmemory (allow-oom): the entries
-- it stores were taken from Redis already, and it trims. Called through
-- `crate::dead::push::PushDead`.
--
-- KEYS: dead-letter list.
-- ARGV: the list's bound (dead/trim.lua), then the dead letters, oldest first.
-- Returns how many dead letters the bound trimmed.
local bound = dead_bound(ARGV[1])
if not bound then
  return redis.error_reply('RSARGS push.lua: a dead-letter bound at argument 1 is malformed')
end
local bad = wrong_types({{KEYS[1], 'list'}})
if bad then return redis.error_reply(bad) end
local now = dead_now()
for i = 2, #ARGV do redis.call('LPUSH', KEYS[1], dead_letter(ARGV[i], now)) end
return dead_trim(KEYS[1], bound, now)
