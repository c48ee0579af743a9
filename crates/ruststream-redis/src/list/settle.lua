#!lua flags=allow-oom
-- needs: guard.lua delayed/schedule_retry.lua cancel/settled.lua back.lua dead/trim.lua
-- needs: list/marks.lua
-- SETTLE_LIST: settles a batch of claimed list entries. Runs under maxmemory (allow-oom): it
-- removes as much as it adds, and acks free memory. Called through
-- `crate::list::settle::SettleList`.
--
-- KEYS: processing, dead-letter list, delayed set, delayed payload hash, the recovery set (with
--       recovery) or the settle-token set (without), the cancel record (K.cancels), then the
--       destination's keys (back.lua: the queue's levels).
-- ARGV: a settle token ('' with recovery), the destination (back.lua), then `ops`: one byte an
--       entry, its op (`crate::settle::Op`), which says what the entry sends:
--   a  ack (claimed): LREM processing -1 claimed
--   r  retry now (claimed, new): remove, then put `new` back onto the queue (back.lua: onto its
--      own level)
--   d  retry later (claimed, new, arg): remove, then schedule `new` (ZADD delayed, HSET hash);
--      arg = `delay_ms:id`
--   x  dead (claimed, new, arg): remove, then LPUSH dead new (with its `dead-at`); arg = the
--      dead-letter list's bound (dead/trim.lua), to which the list is trimmed after the last push
--   w  retry later of a message parked for a signal (claimed, new, arg, steps, field): as `d`,
--      due now when its step record `steps` holds the signal's field, else also in the parked
--      set (delayed/schedule_retry.lua)
--   s  retry later of a message in a durable sleep (claimed, new, arg): as `d`, and also in the
--      sleeping set (delayed/schedule_retry.lua)
--   A  ack of a message with steps (claimed, steps): as `a`, then DEL steps, its step record
--   X  dead of a message with steps (claimed, new, arg, steps): as `x`, then DEL steps
--   K  ack of a message whose steps are kept (claimed, steps, keep): as `a`, then PEXPIRE steps
--      keep (ms): the source's `keep_steps`
--   Y  dead of a message whose steps are kept (claimed, new, arg, steps, keep): as `x`, then
--      PEXPIRE steps keep
--      (a step record is deleted or kept only when the claim was still this worker's and found)
--       With recovery (the token is ''), `ops` is followed by `runs`: the entries (in their
--       batches' order) as runs of consecutive indices in one batch list, eight bytes a run:
--       the batch's number (from 1) among the members that follow, two bytes; the run's first
--       index, four bytes; its length, two bytes; all big-endian. Then the number of members,
--       then each member of a claimed batch in the recovery set (list/claim.lua). Then the
--       entries, in the order of `ops`: one argument a message for an ack, and the ops and
--       runs read with one string.byte each, not one an entry.
-- The claim is still this worker's only while its batch's member is in the set (a sweep may
-- have handed the entry to another worker) and its index is not marked in the batch's marks
-- `<set>:<member>:s` (list/marks.lua;
-- a settle sent twice finds it marked). All of it is read first, one ZSCORE, LLEN, PTTL and GET
-- a batch (a key of another type fails the call before its first write); then each owned entry
-- is removed from the processing list, and only when that finds it do the follow-up writes
-- happen, so nothing is duplicated. Each owned index is marked (one SET a batch, with the
-- list's ttl), and a batch whose every index is marked leaves the set with its list and marks.
-- The marks are read and set a run at a time, and a settle of acks only (`ops` all `a`: the
-- usual call) skips reading each entry's op and arguments: less Lua a message.
-- An index past the end of its batch list (the list is gone: not expected, a lease renews every
-- batch list) is owned while unmarked too, the processing list's LREM deciding, and marked all
-- the same, so a settle sent twice still runs once.
-- Without recovery an entry is known only by its bytes, and two claims of identical bytes look
-- alike, so a settle sent twice (a client resends it when the connection drops before the
-- reply) must not run twice: its token is recorded in the token set (kept 10 minutes, and the
-- set expires 10 minutes after the last settle), and a
-- token already there makes the call a no-op.
-- An entry whose id is in the cancel record (a cancel ran before this settle: it won the race,
-- see crate::cancel) is only removed, whatever the op: settled as cancelled. That is looked up
-- only for an owned entry that is not an ack: one EXISTS a call, then, while the record exists,
-- one HEXISTS an entry.
-- A key is checked for its type (guard.lua) before the first write only when the call writes
-- it: the processing list and the record always, the others when an entry's op needs them.
-- Returns {how many claims were still owned (-1: the token was settled already), how many dead
-- letters the bound trimmed}.
local dest, derr = dest_of(7, 2)
if not dest then return redis.error_reply(derr) end
local first = dest.arg_end
-- The op's bytes (string.byte), and how many arguments an entry of each op sends.
local ACK, RETRY, LATER, DEAD, ACK_STEPS, DEAD_STEPS, PARK = 97, 114, 100, 120, 65, 88, 119 -- a r d x A X w
local ACK_KEEP, DEAD_KEEP, SLEEP = 75, 89, 115 -- K Y s
local ARGS = {[ACK] = 1, [RETRY] = 2, [LATER] = 3, [DEAD] = 3, [ACK_STEPS] = 2, [DEAD_STEPS] = 4,
  [PARK] = 5, [ACK_KEEP] = 3, [DEAD_KEEP] = 5, [SLEEP] = 3}
-- Whether `v` is a kept step record's ttl: a whole number of ms, at least 1.
local function kept(v)
  local ms = tonumber(v)
  return ms and ms >= 1 and ms == math.floor(ms)
end
local call, processing, record, argv = redis.call, KEYS[1], KEYS[5], ARGV
local token = argv[1]
local nargs = #argv
local count = #(argv[first] or '')
if count == 0 then
  return redis.error_reply('RSARGS settle.lua: no entries to settle')
end
local ops = bytes_of(argv[first])
local pos = first + 1
local runs, nruns, members
if token == '' then
  local nm = tonumber(argv[pos + 1] or '')
  nruns = #(argv[pos] or '')
  if nruns == 0 or nruns % 8 ~= 0 or not nm or pos + 1 + nm > nargs then
    return redis.error_reply('RSARGS settle.lua: with recovery the entries come in runs of their batches')
  end
  runs = bytes_of(argv[pos])
  members = {}
  for j = 1, nm do members[j] = argv[pos + 1 + j] end
  pos = pos + 2 + nm
end
local bad = wrong_types({{processing, 'list'}, {record, 'zset'}})
if bad then return redis.error_reply(bad) end
-- A batch as the settle reads it when a run first names it: whether its member is still in the
-- set, and then its size, marks (a table of bytes) and the ttl of its list; each batch is
-- opened once and kept in `batches`, in the order first named.
local batches, by = {}, {}
local function open(member)
  local b = by[member]
  if b then return b end
  b = {member = member}
  b.list, b.marks = batch_keys(record, member)
  b.live = call('ZSCORE', record, member) and true
  if b.live then
    local size, lerr = batch_read('LLEN', b.list)
    if lerr then return nil, lerr end
    local marks, merr = batch_read('GET', b.marks)
    if merr then return nil, merr end
    b.size, b.m, b.top = size, marks_of(marks, size), size
    b.ttl = call('PTTL', b.list)
  end
  by[member] = b
  batches[#batches + 1] = b
  return b
end
-- Every entry is read before the first write: its op and arguments (`at[k]`: where entry k's
-- start; a settle of acks only, the usual call, has one argument an entry and needs no table for
-- it), `has` noting the ops other than ack.
local at, has, parks = {}, {}, {}
local acks = not string.find(argv[first], '[^a]')
local i = pos + count
if acks then
  if i - 1 > nargs then
    return redis.error_reply('RSARGS settle.lua: malformed entry at argument ' .. (nargs + 1))
  end
else
  i = pos
  for k = 1, count do
    local op = ops[k]
    local n = ARGS[op]
    if not n or i + n - 1 > nargs then
      return redis.error_reply('RSARGS settle.lua: malformed entry at argument ' .. i)
    end
    if op ~= ACK then
      if ((op == LATER or op == PARK or op == SLEEP) and not string.match(argv[i + 2], '^%d+:'))
        or ((op == DEAD or op == DEAD_STEPS or op == DEAD_KEEP) and not dead_bound(argv[i + 2]))
        or (op == ACK_KEEP and not kept(argv[i + 2]))
        or (op == DEAD_KEEP and not kept(argv[i + 4])) then
        return redis.error_reply('RSARGS settle.lua: malformed entry at argument ' .. i)
      end
      if op == PARK then parks[#parks + 1] = {argv[i + 3], 'hash'} end
      if op == PARK or op == SLEEP then has[op] = true end
      has[(op == DEAD_STEPS or op == DEAD_KEEP) and DEAD or (op == PARK or op == SLEEP) and LATER
        or op] = true
    end
    at[k] = i
    i = i + n
  end
end
if i ~= nargs + 1 then
  return redis.error_reply('RSARGS settle.lua: ' .. (nargs + 1 - i) .. ' arguments past the last entry')
end
-- With recovery, an entry is still this worker's claim while its batch is in the set and its
-- index is unmarked. The runs are read a run at a time: each owned index is marked in its
-- batch's marks (`top`: the highest index marked), and an entry not owned gets op 0 in `ops`.
if runs then
  local k = 0
  for r = 8, nruns, 8 do
    local number = runs[r - 7] * 256 + runs[r - 6]
    local x = ((runs[r - 5] * 256 + runs[r - 4]) * 256 + runs[r - 3]) * 256 + runs[r - 2] + 1
    local len = runs[r - 1] * 256 + runs[r]
    local member = members[number]
    if not member or len == 0 then
      return redis.error_reply('RSARGS settle.lua: a run at byte ' .. (r - 7) .. ' names no batch or no entry')
    end
    if k + len > count then
      return redis.error_reply('RSARGS settle.lua: the runs hold more entries than ops names')
    end
    local b, err = open(member)
    if not b then return redis.error_reply(err) end
    local live, m, top, changed = b.live, b.m, b.top, b.changed
    for y = x, x + len - 1 do
      k = k + 1
      if live and m[y] ~= MARKED then
        m[y] = MARKED
        changed = true
        if y > top then top = y end
      else
        ops[k] = 0
      end
    end
    b.top, b.changed = top, changed
  end
  if k ~= count then
    return redis.error_reply('RSARGS settle.lua: more entries than their runs hold')
  end
end
-- The keys only some ops write, checked when the call has such an op.
local checks = parks
if has[DEAD] then checks[#checks + 1] = {KEYS[2], 'list'} end
if has[LATER] then
  checks[#checks + 1] = {KEYS[3], 'zset'}
  checks[#checks + 1] = {KEYS[4], 'hash'}
end
if has[PARK] then checks[#checks + 1] = {KEYS[3] .. '.parked', 'zset'} end
if has[SLEEP] then checks[#checks + 1] = {KEYS[3] .. '.sleeping', 'zset'} end
if next(has) then checks[#checks + 1] = {KEYS[6], 'hash'} end
if has[RETRY] then dest_checks(dest, checks) end
bad = wrong_types(checks)
if bad then return redis.error_reply(bad) end
if token ~= '' then
  if call('ZSCORE', record, token) then return {-1, 0} end
  local t = call('TIME')
  local ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  call('ZREMRANGEBYSCORE', record, '-inf', ms - 600000)
  call('ZADD', record, ms, token)
  call('PEXPIRE', record, 600000)
end
local found = 0
local retried = {}
local bound, now
-- Whether the claimed value `v` is of a cancelled message.
local cancelled = cancelled_in(KEYS[6])
-- Acks only: an LREM each, and nothing after it (a loop of its own: the general one below, with
-- its op tests an entry, costs 0.6 % more a message in the bench).
if acks then
  for k = 1, count do
    if ops[k] ~= 0 and call('LREM', processing, '-1', argv[pos + k - 1]) > 0 then
      found = found + 1
    end
  end
end
for k = 1, acks and 0 or count do
  local op = ops[k]
  if op ~= 0 then
    local i = at[k]
    if call('LREM', processing, '-1', argv[i]) > 0 then
      found = found + 1
      if op == ACK_STEPS then
        call('DEL', argv[i + 1])
      elseif op == DEAD_STEPS then
        call('DEL', argv[i + 3])
      elseif op == ACK_KEEP then
        call('PEXPIRE', argv[i + 1], argv[i + 2])
      elseif op == DEAD_KEEP then
        call('PEXPIRE', argv[i + 3], argv[i + 4])
      end
      if op ~= ACK and op ~= ACK_STEPS and op ~= ACK_KEEP and not cancelled(argv[i]) then
        if op == RETRY then
          retried[#retried + 1] = dest_item(dest, argv[i + 1])
        elseif op == DEAD or op == DEAD_STEPS or op == DEAD_KEEP then
          bound, now = dead_bound(argv[i + 2]), now or dead_now()
          call('LPUSH', KEYS[2], dead_letter(argv[i + 1], now))
        elseif op == PARK then
          schedule_retry(KEYS[3], KEYS[4], argv[i + 2], argv[i + 1], argv[i + 3], argv[i + 4],
            'parked')
        elseif op == SLEEP then
          schedule_retry(KEYS[3], KEYS[4], argv[i + 2], argv[i + 1], nil, nil, 'sleeping')
        else
          schedule_retry(KEYS[3], KEYS[4], argv[i + 2], argv[i + 1])
        end
      end
    end
  end
end
-- Each owned index marked, found in the processing list or not: it is no longer the batch's to
-- sweep. A batch fully marked leaves the set.
for _, b in ipairs(batches) do
  if b.changed and marks_write(b.marks, b.m, b.size, b.top, b.ttl) then
    call('DEL', b.list, b.marks)
    call('ZREM', record, b.member)
  end
end
put_back(dest, retried, false)
local trimmed = 0
if bound then trimmed = dead_trim(KEYS[2], bound, now) end
return {found, trimmed}
