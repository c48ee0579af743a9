#!lua flags=allow-oom
-- SETTLE_STREAM: settles a batch of stream entries of one consumer group. Runs under maxmemory
-- (allow-oom). Every argument is checked before the first write. Prepended with guard.lua and
-- delayed/schedule_retry.lua and stream/bound.lua.
--
-- KEYS: stream, dead-letter list, delayed set, delayed payload hash.
-- ARGV: group, the stream's bound (see bound.lua), then per entry `op entry_id n v1..vn`:
--   a  ack: XACK (n = 0)
--   r  retry now: XACK, then XADD stream * v1..vn (the new entry's field/value pairs); after
--      the last XADD the stream is trimmed to its bound
--   d  retry later: XACK, then schedule frame v2 after v1 = `delay_ms:id` (n = 2)
--   x  dead: XACK, then LPUSH dead v1 (n = 1)
-- Follow-up writes happen only when XACK found the entry pending. Returns how many were found.
local bound_bad = bound_error(ARGV[2] or '')
if bound_bad then return redis.error_reply(bound_bad) end
local i = 3
while i <= #ARGV do
  local op, n = ARGV[i], tonumber(ARGV[i + 2])
  if not n or n < 0 or n > MAX_UNPACK - 3 or i + 2 + n > #ARGV
    or not ((op == 'a' and n == 0) or op == 'r' or (op == 'x' and n == 1)
      or (op == 'd' and n == 2 and string.match(ARGV[i + 3], '^%d+:'))) then
    return redis.error_reply('RSARGS settle.lua: malformed entry at argument ' .. i)
  end
  i = i + 3 + n
end
local checks = {{KEYS[1], 'stream'}, {KEYS[3], 'zset'}, {KEYS[4], 'hash'}}
-- Without a dead-letter list the stream stands in for it, and nothing is pushed there.
if KEYS[2] ~= KEYS[1] then checks[#checks + 1] = {KEYS[2], 'list'} end
local bad = wrong_types(checks)
if bad then return redis.error_reply(bad) end
local found = 0
local added = false
i = 3
while i <= #ARGV do
  local op = ARGV[i]
  local n = tonumber(ARGV[i + 2])
  if redis.call('XACK', KEYS[1], ARGV[1], ARGV[i + 1]) > 0 then
    found = found + 1
    if op == 'r' then
      redis.call('XADD', KEYS[1], '*', unpack(ARGV, i + 3, i + 2 + n))
      added = true
    elseif op == 'x' then
      redis.call('LPUSH', KEYS[2], ARGV[i + 3])
    elseif op == 'd' then
      schedule_retry(KEYS[3], KEYS[4], ARGV[i + 3], ARGV[i + 4])
    end
  end
  i = i + 3 + n
end
if added then bound(KEYS[1], ARGV[2]) end
return found
