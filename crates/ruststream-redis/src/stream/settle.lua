#!lua flags=allow-oom
-- needs: guard.lua delayed/schedule_retry.lua cancel/settled.lua back.lua dead/trim.lua
-- SETTLE_STREAM: settles a batch of stream entries of one consumer group. Runs under maxmemory
-- (allow-oom). Every argument, and the type of each key the call writes, is checked before the
-- first write. Called through `crate::stream::settle::SettleStream`.
--
-- KEYS: dead-letter list, delayed set, delayed payload hash, the stream's cancel record
--       (K.cancels), then the destination's key (back.lua: the stream itself).
-- ARGV: group, the destination (back.lua: the stream and its bound), then each entry as
--       `entry_id op [new [arg]]` (`crate::settle::Op` writes from op on); the op says what
--       follows it:
--   a  ack (nothing): XACK
--   r  retry now (new): XACK, then put the frame `new` back (back.lua: an XADD of its fields;
--      after the last one the stream is trimmed to its bound)
--   d  retry later (new, arg): XACK, then schedule the frame `new` after arg = `delay_ms:id`
--   x  dead (new, arg): XACK, then LPUSH dead new (with its `dead-at`); arg = the dead-letter
--      list's bound (dead/trim.lua), to which the list is trimmed after the last push
--   w  retry later of a message parked for a signal (new, arg, steps, field): as `d`, due now
--      when its step record `steps` holds the signal's field, else also in the parked set
--      (delayed/schedule_retry.lua)
--   s  retry later of a message in a durable sleep (new, arg): as `d`, and also in the
--      sleeping set (delayed/schedule_retry.lua)
--   A  ack of a message with steps (steps): XACK, then DEL steps, its step record
--   X  dead of a message with steps (new, arg, steps): as `x`, then DEL steps
--   K  ack of a message whose steps are kept (steps, keep): XACK, then PEXPIRE steps keep (ms):
--      the source's `keep_steps`
--   Y  dead of a message whose steps are kept (new, arg, steps, keep): as `x`, then PEXPIRE
--      steps keep
-- Follow-up writes happen only when XACK found the entry pending, and not for a cancelled
-- message (its frame's id in the cancel record, see crate::cancel): that one is only acked,
-- whatever the op. Returns {how many were found,
-- how many dead letters the bound trimmed}.
local dest, derr = dest_of(5, 2)
if not dest then return redis.error_reply(derr) end
if dest.kind ~= 'stream' then
  return redis.error_reply('RSARGS settle.lua: the destination must be the stream')
end
local stream = dest.keys[1]
local first = dest.arg_end
-- How many arguments an entry of each op takes.
local ARGS = {a = 2, r = 3, d = 4, x = 4, A = 3, X = 5, w = 6, K = 4, Y = 6, s = 4}
-- Whether `v` is a kept step record's ttl: a whole number of ms, at least 1.
local function kept(v)
  local ms = tonumber(v)
  return ms and ms >= 1 and ms == math.floor(ms)
end
-- `has` notes the ops other than ack the call holds.
local items, has, parks = {}, {}, {}
local nargs = #ARGV
local i = first
while i <= nargs do
  local op = ARGV[i + 1]
  local n = ARGS[op or '']
  local ok = n and i + n - 1 <= nargs and (op == 'a' or op == 'r' or op == 'A'
    or ((op == 'x' or op == 'X') and dead_bound(ARGV[i + 3]))
    or (op == 'K' and kept(ARGV[i + 3]))
    or (op == 'Y' and dead_bound(ARGV[i + 3]) and kept(ARGV[i + 5]))
    or ((op == 'd' or op == 'w' or op == 's') and string.match(ARGV[i + 3], '^%d+:')))
  if ok and op == 'r' then
    local why
    items[i], why = dest_item(dest, ARGV[i + 2])
    if not items[i] then
      return redis.error_reply('RSBADENTRY settle.lua: a retry at argument ' .. i .. ' cannot go back: ' .. why)
    end
  end
  if not ok then
    return redis.error_reply('RSARGS settle.lua: malformed entry at argument ' .. i)
  end
  if op == 'w' then parks[#parks + 1] = {ARGV[i + 4], 'hash'} end
  if op == 'X' or op == 'Y' then
    has.x = true
  elseif op == 'w' or op == 's' then
    has.d, has[op] = true, true
  elseif op ~= 'a' then
    has[op] = true
  end
  i = i + n
end
-- The keys' types, checked before the first write for the keys this call writes: the stream
-- always (XACK, and a retry's XADD), the delayed set and hash with a retry later, the cancel
-- record with any op but ack, the dead-letter list with a drop (without a dead-letter list the
-- stream stands in for it, and nothing is pushed there).
local checks = dest_checks(dest, parks)
if has.d then
  checks[#checks + 1] = {KEYS[2], 'zset'}
  checks[#checks + 1] = {KEYS[3], 'hash'}
end
if has.w then checks[#checks + 1] = {KEYS[2] .. '.parked', 'zset'} end
if has.s then checks[#checks + 1] = {KEYS[2] .. '.sleeping', 'zset'} end
if next(has) then checks[#checks + 1] = {KEYS[4], 'hash'} end
if has.x and KEYS[1] ~= stream then checks[#checks + 1] = {KEYS[1], 'list'} end
local bad = wrong_types(checks)
if bad then return redis.error_reply(bad) end
local found = 0
local retried = {}
local bound, now
-- Whether the frame `v` (a retry's or dead letter's) is of a cancelled message.
local cancelled = cancelled_in(KEYS[4])
i = first
while i <= nargs do
  local op = ARGV[i + 1]
  local n = ARGS[op]
  -- A step record goes with the entry (`A`, `X`) or is kept `keep` ms (`K`, `Y`): the op is
  -- then read as `a`, `x`.
  local steps, keep, wake, field, index
  if op == 'w' then
    wake, field, index, op = ARGV[i + 4], ARGV[i + 5], 'parked', 'd'
  elseif op == 's' then
    index, op = 'sleeping', 'd'
  elseif op == 'A' then
    steps, op = ARGV[i + 2], 'a'
  elseif op == 'X' then
    steps, op = ARGV[i + 4], 'x'
  elseif op == 'K' then
    steps, keep, op = ARGV[i + 2], ARGV[i + 3], 'a'
  elseif op == 'Y' then
    steps, keep, op = ARGV[i + 4], ARGV[i + 5], 'x'
  end
  if redis.call('XACK', stream, ARGV[1], ARGV[i]) > 0 then
    found = found + 1
    if keep then
      redis.call('PEXPIRE', steps, keep)
    elseif steps then
      redis.call('DEL', steps)
    end
    if op ~= 'a' and cancelled(ARGV[i + 2]) then
      op = 'a'
    end
    if op == 'r' then
      retried[#retried + 1] = items[i]
    elseif op == 'x' and KEYS[1] ~= stream then
      bound, now = dead_bound(ARGV[i + 3]), now or dead_now()
      redis.call('LPUSH', KEYS[1], dead_letter(ARGV[i + 2], now))
    elseif op == 'd' then
      schedule_retry(KEYS[2], KEYS[3], ARGV[i + 3], ARGV[i + 2], wake, field, index)
    end
  end
  i = i + n
end
put_back(dest, retried, false)
local trimmed = 0
if bound then trimmed = dead_trim(KEYS[1], bound, now) end
return {found, trimmed}
