#!lua flags=allow-oom
-- needs: guard.lua
-- DELAYED: an operator's change to a delayed set. Runs under
-- maxmemory (it moves or frees).
--
-- KEYS: delayed set, delayed payload hash.
-- ARGV: `promote` or `cancel`; then `earliest` and a count (at most 1,000), or `ids` and the
--       message ids. For promote, `earliest` takes the earliest entries not yet due.
-- promote: the entries become due now (ZADD XX with the server's time), and
--          `PUBLISH <delayed set> ''` wakes the readers so they move them at once.
-- cancel:  the entries leave the set and their payloads the hash (ZREM, HDEL).
-- Either way the entries leave the sleeping and parked sets (delayed/schedule_retry.lua): they
-- are no longer asleep or parked.
-- Returns how many entries were changed.
local bad = wrong_types({{KEYS[1], 'zset'}, {KEYS[2], 'hash'}, {KEYS[1] .. '.sleeping', 'zset'},
  {KEYS[1] .. '.parked', 'zset'}})
if bad then return redis.error_reply(bad) end
if ARGV[1] ~= 'promote' and ARGV[1] ~= 'cancel' then
  return redis.error_reply('RSARGS delayed.lua: ARGV[1] must be promote or cancel')
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ids = {}
if ARGV[2] == 'earliest' then
  local n = math.min(tonumber(ARGV[3]) or 0, 1000)
  if n > 0 and ARGV[1] == 'promote' then
    ids = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf', 'LIMIT', 0, n)
  elseif n > 0 then
    ids = redis.call('ZRANGE', KEYS[1], 0, n - 1)
  end
else
  for i = 3, #ARGV do ids[#ids + 1] = ARGV[i] end
end
local changed = 0
for _, index in ipairs({'.sleeping', '.parked'}) do
  if #ids > 0 and redis.call('EXISTS', KEYS[1] .. index) == 1 then
    redis.call('ZREM', KEYS[1] .. index, unpack(ids))
  end
end
if ARGV[1] == 'promote' then
  for _, id in ipairs(ids) do
    changed = changed + redis.call('ZADD', KEYS[1], 'XX', 'CH', now, id)
  end
  if changed > 0 then redis.call('PUBLISH', KEYS[1], '') end
else
  for _, id in ipairs(ids) do
    local gone = redis.call('ZREM', KEYS[1], id)
    redis.call('HDEL', KEYS[2], id)
    changed = changed + gone
  end
end
return changed
