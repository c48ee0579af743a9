#!lua flags=allow-oom
-- SETTLE_LIST: settles a batch of claimed list entries. Runs under maxmemory (allow-oom): it
-- removes as much as it adds, and acks free memory. Prepended with guard.lua,
-- delayed/schedule_retry.lua, frame.lua and list/levels.lua.
--
-- KEYS: queue, processing, dead-letter list, delayed set, delayed payload hash, the recovery
--       set (with recovery) or the settle-token set (without), then the queue's priority levels
--       above 0 (none without levels).
-- ARGV: a settle token ('' with recovery), then groups of five, `op claimed new arg member`:
--   a  ack: LREM processing -1 claimed
--   r  retry now: remove, then LPUSH new onto its own level (level 0 without levels)
--   d  retry later: remove, then schedule `new` (ZADD delayed, HSET hash); arg = `delay_ms:id`
--   x  dead: remove, then LPUSH dead new
-- `member` is the claim's member in the recovery set ('' without recovery). The claim is still
-- this worker's only while its member is in the set (a sweep may have handed the entry to
-- another worker); then the entry is removed from the processing list, and only when that finds
-- it do the follow-up writes happen, so nothing is duplicated.
-- Without recovery an entry is known only by its bytes, and two claims of identical bytes look
-- alike, so a settle sent twice (a client resends it when the connection drops before the
-- reply) must not run twice: its token is recorded in the token set (kept 10 minutes), and a
-- token already there makes the call a no-op.
-- Returns how many claims were still owned (-1: the token was settled already).
if #ARGV % 5 ~= 1 then
  return redis.error_reply('RSARGS settle.lua takes a token and groups of five arguments, got ' .. #ARGV)
end
local levels = levels_of(1, 7)
local bad = wrong_types(level_checks({{KEYS[1], 'list'}, {KEYS[2], 'list'}, {KEYS[3], 'list'},
  {KEYS[4], 'zset'}, {KEYS[5], 'hash'}, {KEYS[6], 'zset'}}, levels))
if bad then return redis.error_reply(bad) end
for i = 2, #ARGV, 5 do
  local op = ARGV[i]
  if (op ~= 'a' and op ~= 'r' and op ~= 'd' and op ~= 'x')
    or (op == 'd' and not string.match(ARGV[i + 3], '^%d+:')) then
    return redis.error_reply('RSARGS settle.lua: malformed entry at argument ' .. i)
  end
end
local token = ARGV[1]
if token ~= '' then
  if redis.call('ZSCORE', KEYS[6], token) then return -1 end
  local t = redis.call('TIME')
  local ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  redis.call('ZREMRANGEBYSCORE', KEYS[6], '-inf', ms - 600000)
  redis.call('ZADD', KEYS[6], ms, token)
end
local found = 0
for i = 2, #ARGV, 5 do
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
      push_level(levels, ARGV[i + 2], false)
    elseif op == 'x' then
      redis.call('LPUSH', KEYS[3], ARGV[i + 2])
    elseif op == 'd' then
      schedule_retry(KEYS[4], KEYS[5], ARGV[i + 3], ARGV[i + 2])
    end
  end
end
return found
