-- PUSH_TTL: LPUSH values, then PEXPIRE the list, atomically.
--
-- KEYS: list. ARGV: ttl ms, then the values. Returns the list's length.
local n = 0
for i = 2, #ARGV, 1000 do
  n = redis.call('LPUSH', KEYS[1], unpack(ARGV, i, math.min(i + 999, #ARGV)))
end
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return n
