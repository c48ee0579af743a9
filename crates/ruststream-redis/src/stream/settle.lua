-- SETTLE_STREAM: settles a batch of stream entries of one consumer group. Prepended with
-- delayed/schedule_retry.lua.
--
-- KEYS: stream, dead-letter list, delayed set, delayed payload hash.
-- ARGV: group, then per entry `op entry_id n v1..vn`:
--   a  ack: XACK (n = 0)
--   r  retry now: XACK, then XADD stream * v1..vn (the new entry's field/value pairs)
--   d  retry later: XACK, then schedule frame v2 after v1 = `delay_ms:id` (n = 2)
--   x  dead: XACK, then LPUSH dead v1 (n = 1)
-- Follow-up writes happen only when XACK found the entry pending. Returns how many were found.
local found = 0
local i = 2
while i <= #ARGV do
  local op = ARGV[i]
  local n = tonumber(ARGV[i + 2])
  if redis.call('XACK', KEYS[1], ARGV[1], ARGV[i + 1]) > 0 then
    found = found + 1
    if op == 'r' then
      redis.call('XADD', KEYS[1], '*', unpack(ARGV, i + 3, i + 2 + n))
    elseif op == 'x' then
      redis.call('LPUSH', KEYS[2], ARGV[i + 3])
    elseif op == 'd' then
      schedule_retry(KEYS[3], KEYS[4], ARGV[i + 3], ARGV[i + 4])
    end
  end
  i = i + 3 + n
end
return found
