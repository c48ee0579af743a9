#!lua flags=allow-oom
-- SETTLE_LIST: settles a batch of claimed list entries. Runs under maxmemory (allow-oom): it
-- removes as much as it adds, and acks free memory. Prepended with guard.lua,
-- delayed/schedule_retry.lua, frame.lua, stream/bound.lua, back.lua, dead/trim.lua and
-- list/marks.lua. Called through `crate::list::settle::SettleList`.
--
-- KEYS: processing, dead-letter list, delayed set, delayed payload hash, the recovery set (with
--       recovery) or the settle-token set (without), the cancel record (K.cancels), then the
--       destination's keys (back.lua: the queue's levels).
-- ARGV: a settle token ('' with recovery), the destination (back.lua), then groups of five,
--       `claimed batch op new arg` (`crate::settle::Op` writes the last three):
--   a  ack: LREM processing -1 claimed
--   r  retry now: remove, then put `new` back onto the queue (back.lua: onto its own level)
--   d  retry later: remove, then schedule `new` (ZADD delayed, HSET hash); arg = `delay_ms:id`
--   x  dead: remove, then LPUSH dead new (with its `dead-at`); arg = the dead-letter list's
--      bound (dead/trim.lua), to which the list is trimmed after the last push
-- With recovery (the token is ''), `batch` is the entry's index in its batch list (four bytes,
-- big-endian), then the member of the claim's batch in the recovery set (list/claim.lua), left
-- out for the same batch as the entry before; without, ''. The claim is still this worker's
-- only while its batch's member is in the set (a sweep may have handed the entry to another
-- worker) and its index is not marked in the batch's marks `<set>:<member>:s` (list/marks.lua;
-- a settle sent twice finds it marked). All of it is read first, one ZSCORE, LLEN, PTTL and GET
-- a batch (a key of another type fails the call before its first write); then each owned entry
-- is removed from the processing list, and only when that finds it do the follow-up writes
-- happen, so nothing is duplicated. Each owned index is marked (one SET a batch, with the
-- list's ttl), and a batch whose every index is marked leaves the set with its list and marks.
-- An index past the end of its batch list (the list is gone: not expected, a lease renews every
-- batch list) is owned while unmarked too, the processing list's LREM deciding, and marked all
-- the same, so a settle sent twice still runs once.
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
if ARGV[1] == '' and #(ARGV[first + 1] or '') <= 4 then
  return redis.error_reply('RSARGS settle.lua: with recovery the first entry names its batch')
end
local token = ARGV[1]
-- With recovery: each batch touched, in order, and whether each entry (by its first argument)
-- is still this worker's claim by its batch's marks; a batch's keys are read when it is first
-- named, before any write.
local batches, mine = {}, {}
if token == '' then
  local by, b = {}, nil
  for i = first, #ARGV, 5 do
    local f = ARGV[i + 1]
    local c1, c2, c3, c4 = string.byte(f, 1, 4)
    if not c4 then
      return redis.error_reply('RSARGS settle.lua: the batch at argument ' .. (i + 1) .. ' has no index')
    end
    if #f > 4 then
      local member = string.sub(f, 5)
      b = by[member]
      if not b then
        b = {member = member, list = KEYS[5] .. ':' .. member}
        b.marks = b.list .. ':s'
        b.live = redis.call('ZSCORE', KEYS[5], member) and true
        if b.live then
          local size, lerr = batch_read('LLEN', b.list)
          if lerr then return redis.error_reply(lerr) end
          local marks, merr = batch_read('GET', b.marks)
          if merr then return redis.error_reply(merr) end
          b.size, b.m, b.top = size, marks_of(marks, size), size
          b.ttl = redis.call('PTTL', b.list)
        end
        by[member] = b
        batches[#batches + 1] = b
      end
    end
    if b.live then
      local at = ((c1 * 256 + c2) * 256 + c3) * 256 + c4 + 1
      if b.m[at] ~= MARKED then
        mine[i] = true
        b.m[at] = MARKED
        b.changed = true
        if at > b.top then b.top = at end
      end
    end
  end
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
for i = first, #ARGV, 5 do
  local op, new = ARGV[i + 2], ARGV[i + 3]
  local owned
  if token == '' then
    owned = mine[i] and redis.call('LREM', KEYS[1], '-1', ARGV[i]) > 0
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
-- Each owned index marked, found in the processing list or not: it is no longer the batch's to
-- sweep. A batch fully marked leaves the set.
for _, b in ipairs(batches) do
  if b.changed and marks_write(b.marks, b.m, b.size, b.top, b.ttl) then
    redis.call('DEL', b.list, b.marks)
    redis.call('ZREM', KEYS[5], b.member)
  end
end
put_back(dest, retried, false)
local trimmed = 0
if bound then trimmed = dead_trim(KEYS[2], bound, now) end
return {found, trimmed}
