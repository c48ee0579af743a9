#!lua flags=allow-oom
-- SETTLE_LIST: settles a batch of claimed list entries. Runs under maxmemory (allow-oom): it
-- removes as much as it adds, and acks free memory. Prepended with guard.lua and
-- delayed/schedule_retry.lua.
--
-- KEYS: queue, processing, dead-letter list, delayed set, delayed payload hash, and with
--       recovery the recovery set.
-- ARGV: groups of five, `op claimed new arg member`:
--   a  ack: LREM processing -1 claimed
--   r  retry now: remove, then LPUSH queue new
--   d  retry later: remove, then schedule `new` (ZADD delayed, HSET hash); arg = `delay_ms:id`
--   x  dead: remove, then LPUSH dead new
-- `member` is the claim's member in the recovery set ('' without recovery). The claim is still
-- this worker's only while its member is in the set (a sweep may have handed the entry to
-- another worker); then the entry is removed from the processing list, and only when that finds
-- it do the follow-up writes happen, so nothing is duplicated.
-- Returns how many claims were still owned.
if #ARGV % 5 ~= 0 then
  return redis.error_reply('ERR settle.lua takes groups of five arguments, got ' .. #ARGV)
end
local checks = {{KEYS[1], 'list'}, {KEYS[2], 'list'}, {KEYS[3], 'list'}, {KEYS[4], 'zset'},
  {KEYS[5], 'hash'}}
if KEYS[6] then checks[#checks + 1] = {KEYS[6], 'zset'} end
local bad = wrong_types(checks)
if bad then return redis.error_reply(bad) end
local found = 0
for i = 1, #ARGV, 5 do
  local op = ARGV[i]
  local owned
  if ARGV[i + 4] ~= '' then
    owned = redis.call('ZREM', KEYS[6], ARGV[i + 4]) == 1
      and redis.call('LREM', KEYS[2], '-1', ARGV[i + 1]) > 0
  else
    owned = redis.call('LREM', KEYS[2], '-1', ARGV[i + 1]) > 0
  end
  if owned then
    found = found + 1
    if op == 'r' then
      redis.call('LPUSH', KEYS[1], ARGV[i + 2])
    elseif op == 'x' then
      redis.call('LPUSH', KEYS[3], ARGV[i + 2])
    elseif op == 'd' then
      schedule_retry(KEYS[4], KEYS[5], ARGV[i + 3], ARGV[i + 2])
    end
  end
end
return found
