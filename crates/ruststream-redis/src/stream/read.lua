#!lua flags=allow-oom
-- needs: guard.lua frame.lua claim/gates.lua claim/paused.lua claim/limit.lua
-- needs: claim/cap.lua claim/cancels.lua
-- READ: a stream's claim, `XREADGROUP GROUP g c COUNT n STREAMS key >` behind the claim's gates
-- (claim/gates.lua: paused, a rate limit): reads as many new entries as the gates let through
-- and charges them for those it got, in one run, so no permit is taken and given back. Never
-- blocks (a script cannot): when the group has nothing new, it returns the stream's last id, and
-- the reader waits with `XREAD BLOCK` from it. A gate with an entry filter (a per-key limit) does
-- not apply: a group reads a stream in order. Runs under maxmemory (allow-oom): it adds only the
-- limiter's one small key. Cancels (see crate::cancel): an entry read whose `rs.id` is in the
-- stream's cancel record (KEYS[2]) is acked at once and not returned (one EXISTS per read; one
-- HEXISTS per entry only while the record exists). Called through `crate::claim::StreamRead`.
--
-- KEYS: stream, its cancel record (K.cancels), then each gate's keys.
-- ARGV: group, consumer, most entries to read, then the gates (claim/gates.lua).
-- Returns {held back by the gates (new entries of the group left unread), ms until they let the
-- next pass, the gate that let nothing through ('' none), the stream's last id when nothing was
-- read with the gates open (else ''), the XREADGROUP reply (its entries of cancelled messages
-- taken out: empty, not false, when they were all such)}.
local gates, err = gates_of(3, 4)
if not gates then return redis.error_reply(err) end
local bad = wrong_types(gate_checks({{KEYS[1], 'stream'}, {KEYS[2], 'hash'}}, gates))
if bad then return redis.error_reply(bad) end
-- Takes the entries of cancelled messages out of the XREADGROUP reply `reply`, acking them;
-- returns how many.
local function drop_cancelled(reply)
  if redis.call('EXISTS', KEYS[2]) == 0 then return 0 end
  local kept = {}
  for _, e in ipairs(reply[1][2]) do
    local mid
    if type(e[2]) == 'table' then
      for i = 1, #e[2] - 1, 2 do
        if e[2][i] == 'rs.id' then mid = e[2][i + 1] break end
      end
    end
    if mid and redis.call('HEXISTS', KEYS[2], mid) == 1 then
      redis.call('XACK', KEYS[1], ARGV[1], e[1])
    else
      kept[#kept + 1] = e
    end
  end
  local dropped = #reply[1][2] - #kept
  reply[1][2] = kept
  return dropped
end
local want = tonumber(ARGV[3])
if want < 1 then return {0, 0, '', '', false} end
local free, closed, wait = gates_admit(gates, want)
local reply = false
local got = 0
if free > 0 then
  reply = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', free, 'STREAMS', KEYS[1],
    '>')
  local dropped = 0
  if reply then
    got = #reply[1][2]
    dropped = drop_cancelled(reply)
  end
  local cwait = gates_charge(gates, got - dropped)
  if got == 0 then
    local top = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
    return {0, 0, '', top[1] and top[1][1] or '0-0', false}
  end
  -- The stream ran out, or the gates let all that was asked: they held nothing back.
  if got < free or free >= want then return {0, 0, '', '', reply} end
  wait = math.max(wait, cwait)
end
-- The gates held back what they did not let through: how many new entries wait for the group.
local held = 0
local groups = {}
if redis.call('EXISTS', KEYS[1]) == 1 then groups = redis.call('XINFO', 'GROUPS', KEYS[1]) end
for _, g in ipairs(groups) do
  local f = {}
  for i = 1, #g, 2 do f[g[i]] = g[i + 1] end
  if f['name'] == ARGV[1] and type(f['lag']) == 'number' then
    held = math.min(want - got, f['lag'])
  end
end
return {held, wait, closed, '', reply}
