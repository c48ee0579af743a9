#!lua flags=allow-oom
-- SETTLE_LIST: settles a batch of claimed list entries. Runs under maxmemory (allow-oom): it
-- removes as much as it adds, and acks free memory. Prepended with guard.lua,
-- delayed/schedule_retry.lua, frame.lua, stream/bound.lua, back.lua and dead/trim.lua. Called through
-- `crate::list::settle::SettleList`.
--
-- KEYS: processing, dead-letter list, delayed set, delayed payload hash, the recovery set (with
--       recovery) or the settle-token set (without), the cancel record (K.cancels), then the
--       destination's keys (back.lua: the queue's levels).
-- ARGV: a settle token ('' with recovery), the destination (back.lua), then groups of five,
--       `claimed member op new arg` (`crate::settle::Op` writes the last three):
--   a  ack: LREM processing -1 claimed
--   r  retry now: remove, then put `new` back onto the queue (back.lua: onto its own level)
--   d  retry later: remove, then schedule `new` (ZADD delayed, HSET hash); arg = `delay_ms:id`
--   x  dead: remove, then LPUSH dead new (with its `dead-at`); arg = the dead-letter list's
--      bound (dead/trim.lua), to which the list is trimmed after the last push
-- With recovery (the token is ''), `member` is the member of the claim's batch in the recovery
-- set (list/claim.lua), '' for the same batch as the entry before. The claim is still this
-- worker's only while its batch's member is in the set (a sweep may have handed the entry to
-- another worker: one ZSCORE a batch, and a TYPE of its list before the first write) and its
-- value in the batch list `<set>:<member>` (LREM 1: a settle sent twice finds it gone, and no
-- two equal values share a batch); then the entry is
-- removed from the processing list, and only when that finds it do the follow-up writes happen,
-- so nothing is duplicated. A batch whose list the settle emptied (Redis deleted it: EXISTS)
-- leaves the set.
-- Without recovery an entry is known only by its bytes, and two claims of identical bytes look
-- alike, so a settle sent twice (a client resends it when the connection drops before the
-- reply) must not run twice: its token is recorded in the token set (kept 10 minutes, and the
-- set expires 10 minutes after the last settle), and a
-- token already there makes the call a no-op.
-- An entry whose id is in the cancel record (a cancel ran before this settle: it won the race,
-- see crate::cancel) is only removed, whatever the op: settled as cancelled. One EXISTS per
-- call; only while the record exists, one HEXISTS per owned entry.
-- Returns {how many claims were still owned (-1: the token was settled already), how many dead
-- letters the bound trimmed}.
local dest, derr = dest_of(7, 2)
if not dest then return redis.error_reply(derr) end
local first = dest.arg_end
if (#ARGV - first + 1) % 5 ~= 0 then
  return redis.error_reply('RSARGS settle.lua takes a token, a destination and groups of five arguments, got ' .. #ARGV)
end
local bad = wrong_types(dest_checks(dest, {{KEYS[1], 'list'}, {KEYS[2], 'list'},
  {KEYS[3], 'zset'}, {KEYS[4], 'hash'}, {KEYS[5], 'zset'}, {KEYS[6], 'hash'}}))
if bad then return redis.error_reply(bad) end
for i = first, #ARGV, 5 do
  local op = ARGV[i + 2]
  if (op ~= 'a' and op ~= 'r' and op ~= 'd' and op ~= 'x')
    or (op == 'd' and not string.match(ARGV[i + 4], '^%d+:'))
    or (op == 'x' and not dead_bound(ARGV[i + 4])) then
    return redis.error_reply('RSARGS settle.lua: malformed entry at argument ' .. i)
  end
end
if ARGV[1] == '' and ARGV[first + 1] == '' then
  return redis.error_reply('RSARGS settle.lua: with recovery the first entry names its batch')
end
local token = ARGV[1]
-- With recovery: each batch's list (false: its member is gone, and so is the claim), and the
-- batches owned in order; the lists' types are checked before the first write.
local lists, touched = {}, {}
if token == '' then
  local member
  local batch_checks = {}
  for i = first, #ARGV, 5 do
    if ARGV[i + 1] ~= '' then member = ARGV[i + 1] end
    if lists[member] == nil then
      local list = redis.call('ZSCORE', KEYS[5], member) and KEYS[5] .. ':' .. member
      lists[member] = list
      if list then
        touched[#touched + 1] = member
        batch_checks[#batch_checks + 1] = {list, 'list'}
      end
    end
  end
  local bad_batch = wrong_types(batch_checks)
  if bad_batch then return redis.error_reply(bad_batch) end
end
if token ~= '' then
  if redis.call('ZSCORE', KEYS[5], token) then return {-1, 0} end
  local t = redis.call('TIME')
  local ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', ms - 600000)
  redis.call('ZADD', KEYS[5], ms, token)
  redis.call('PEXPIRE', KEYS[5], 600000)
end
local found = 0
local retried = {}
local bound, now
-- Whether the claimed value `v` is of a cancelled message.
local cancelled = cancelled_in(KEYS[6])
-- With recovery: the batch of the entry at hand.
local member
for i = first, #ARGV, 5 do
  local op, new = ARGV[i + 2], ARGV[i + 3]
  local owned
  if token == '' then
    if ARGV[i + 1] ~= '' then member = ARGV[i + 1] end
    local list = lists[member]
    owned = list and redis.call('LREM', list, 1, ARGV[i]) > 0
      and redis.call('LREM', KEYS[1], '-1', ARGV[i]) > 0
  else
    owned = redis.call('LREM', KEYS[1], '-1', ARGV[i]) > 0
  end
  if owned then
    found = found + 1
    if cancelled(ARGV[i]) then
      op = 'a'
    end
    if op == 'r' then
      retried[#retried + 1] = dest_item(dest, new)
    elseif op == 'x' then
      bound, now = dead_bound(ARGV[i + 4]), now or dead_now()
      redis.call('LPUSH', KEYS[2], dead_letter(new, now))
    elseif op == 'd' then
      schedule_retry(KEYS[3], KEYS[4], ARGV[i + 4], new)
    end
  end
end
for _, m in ipairs(touched) do
  if redis.call('EXISTS', lists[m]) == 0 then redis.call('ZREM', KEYS[5], m) end
end
put_back(dest, retried, false)
local trimmed = 0
if bound then trimmed = dead_trim(KEYS[2], bound, now) end
return {found, trimmed}
