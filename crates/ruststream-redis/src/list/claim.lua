#!lua flags=allow-oom
-- needs: guard.lua frame.lua back.lua list/marks.lua claim/gates.lua claim/paused.lua
-- needs: claim/limit.lua claim/cap.lua claim/cancels.lua list/take.lua list/groups.lua
-- CLAIM: the one claim of a list queue, simple or reliable, built from parts: where entries come
-- from (list/take.lua: the queue's priority levels, highest first; a partition is a queue of its
-- own), the gates that hold the claim back (claim/gates.lua: paused, rate limit, ...), and what
-- it records (nothing for a simple list; the processing list; with recovery, the recovery set).
-- Runs under maxmemory (allow-oom): it moves entries, so a full Redis can still drain its
-- queues. Called
-- through `crate::claim::Claim`.
--
-- A grouped list's source part (list/groups.lua, registered as a gate) takes in place of the
-- levels; its queue key is then the inbox the sweep puts entries back onto.
-- Entries a gate sifts out after the take (a cancelled message, claim/cancels.lua) are gone and
-- neither recorded nor returned.
-- KEYS: the levels, lowest first (level 0 is the queue; ARGV[8] of them), the processing list
--       (record 'list' or 'claims'), the recovery set (record 'claims'), then each gate's keys.
-- ARGV: most entries to claim, record ('' = none: a simple list's pop, 'list', 'claims'),
--       reader id, first claim sequence number, min_idle ms, recovery-set ttl ms (0 = none),
--       most claims to recover, number of levels, the sweep's deadline (server time in ms;
--       '' = none), then the gates (claim/gates.lua).
--
-- With recovery, it first sweeps, unless the server's TIME is past the sweep's deadline (the
-- call reached Redis late, and the leases of live workers may have aged meanwhile:
-- `crate::sweep_clock`). Then the claimed entries are recorded as one claim a batch: a member
-- `<reader id>:<seq>.<run>` of the recovery set, scored by the server's clock, and the batch list
-- `<set>:<member>` holding the batch's values as they were taken (RPUSH), in the reply's order.
-- A settle marks its entries by their index in the batch list (list/marks.lua: the marks
-- `<set>:<member>:s`), so two equal values of one batch are two claims, each settled once.
-- `<run>` is the server's TIME (seconds.microseconds) of this run: a client sends a call again
-- when its reply was lost (fred does, on a new connection), and the second run must not record
-- its claims under the first run's members (the first run's entries would then never be swept
-- back). The batch list has twice the set's ttl, so it outlives its member for as long as the
-- member can be swept (recovery_ttl is longer than min_idle; list/lease.lua renews every batch
-- list of the set).
-- The sweep: for each member scored older than now - min_idle, its batch list and marks are read
-- (a key of another type fails the call before its first write); each unmarked value still in
-- the processing list (LREM -1) goes back to the queue with its attempt raised by one (back.lua:
-- onto its own level, behind what waits). At most ARGV[7] unmarked values a run: a batch with
-- more is swept in part, the values swept marked and its member kept for the next run; a batch
-- whose every value is marked leaves the set with its list and marks. A member of the per-entry
-- form, one a claimed entry (`<reader id>:<seq>.<run>:<value>`, as older workers record), is
-- swept as such: its value follows the second ':'.
-- When the recovery set does not exist (it expired with recovery_ttl, or the queue ran without
-- recovery before) while the processing list holds entries, nobody holds a claim on them: they
-- go back to the queue as well, and while ARGV[7] of them went back the claim takes nothing
-- (more may wait; the next run finds the set still missing and goes on). A claim past its
-- sweep's deadline takes nothing while such orphans wait, for the same reason.
-- Returns {recovered, run ('' without recovery), entries the gates held back, ms until they let
-- the next pass, the gate that let nothing through ('' none), value...}, values oldest of each
-- level first.
local want = tonumber(ARGV[1])
local record, rid = ARGV[2], ARGV[3]
local nlevels = tonumber(ARGV[8])
local levels = {}
for i = 1, nlevels do levels[i] = KEYS[i] end
local processing = record ~= '' and KEYS[nlevels + 1] or nil
local zset = record == 'claims' and KEYS[nlevels + 2] or nil
local gates, err = gates_of(nlevels + 1 + (processing and 1 or 0) + (zset and 1 or 0), 10)
if not gates then return redis.error_reply(err) end
local checks = {}
for _, k in ipairs(levels) do checks[#checks + 1] = {k, 'list'} end
if processing then checks[#checks + 1] = {processing, 'list'} end
if zset then checks[#checks + 1] = {zset, 'zset'} end
local bad = wrong_types(gate_checks(checks, gates))
if bad then return redis.error_reply(bad) end
local out = {0, '', 0, 0, ''}
local now = 0
if zset then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  out[2] = t[1] .. '.' .. t[2]
  local by = tonumber(ARGV[9])
  if not by or now <= by then
    local most = tonumber(ARGV[7])
    local swept = {}
    if redis.call('EXISTS', zset) == 0 then
      local orphans = redis.call('RPOP', processing, most)
      if orphans then
        for _, v in ipairs(orphans) do swept[#swept + 1] = bump(v) end
        if #orphans == most then want = 0 end
      end
    end
    local stale = redis.call('ZRANGEBYSCORE', zset, '-inf', now - tonumber(ARGV[5]),
      'LIMIT', 0, most)
    -- Reads first: what each stale member gives back, up to the run's bound.
    local plan, left = {}, most - #swept
    for _, m in ipairs(stale) do
      if left <= 0 then break end
      local p = string.find(m, ':', 1, true)
      local q = p and string.find(m, ':', p + 1, true)
      if q then
        plan[#plan + 1] = {old = m, take = {{'', string.sub(m, q + 1)}}}
        left = left - 1
      else
        local list, marks_key = batch_keys(zset, m)
        local b = {member = m, list = list, marks = marks_key, take = {}}
        local values, lerr = batch_read('LRANGE', list, 0, -1)
        if lerr then return redis.error_reply(lerr) end
        local marks, merr = batch_read('GET', b.marks)
        if merr then return redis.error_reply(merr) end
        b.size = #values
        b.m = marks_of(marks, b.size)
        b.ttl = redis.call('PTTL', list)
        for k, v in ipairs(values) do
          if left > 0 and b.m[k] ~= MARKED then
            b.take[#b.take + 1] = {k, v}
            b.m[k] = MARKED
            left = left - 1
          end
        end
        plan[#plan + 1] = b
      end
    end
    for _, b in ipairs(plan) do
      for _, t in ipairs(b.take) do
        if redis.call('LREM', processing, '-1', t[2]) > 0 then swept[#swept + 1] = bump(t[2]) end
      end
      if b.old then
        redis.call('ZREM', zset, b.old)
      elseif b.size == 0 or marks_write(b.marks, b.m, b.size, b.size, b.ttl) then
        redis.call('DEL', b.list, b.marks)
        redis.call('ZREM', zset, b.member)
      end
    end
    out[1] = put_back(list_dest(levels), swept, false)
  elseif redis.call('EXISTS', zset) == 0 and redis.call('LLEN', processing) > 0 then
    -- Orphans wait for a sweep that comes in time: a claim now would make the set again, and
    -- a set that exists hides them from every later sweep.
    want = 0
  end
end
if want < 1 then return out end

-- The gates: how many may be taken, then the take, then what the gates charge for it.
local n, closed, wait = gates_admit(gates, want)
out[5] = closed
local taken, refused, fwait = {}, 0, 0
local source = gates_source(gates)
if n > 0 and source then
  taken, refused, fwait = source.take(n, gates_filter(gates))
elseif n > 0 then
  taken, refused, fwait = take_levels(levels, n, gates_filter(gates))
end
taken = gates_sift(gates, taken)
local cwait = gates_charge(gates, #taken)
local held = refused
if n < want and source then
  held = math.max(held, source.len(want - #taken))
elseif n < want then
  held = math.max(held, levels_len(levels, want - #taken))
end
if held > 0 then
  out[3] = held
  out[4] = math.max(wait, cwait, fwait)
end
local m = #taken
if m == 0 then return out end
local first = #out + 1
for i = 1, m do out[first + i - 1] = taken[i] end
if not processing then return out end
local last = first + m - 1
for i = first, last, 1000 do
  redis.call('LPUSH', processing, unpack(out, i, math.min(i + 999, last)))
end
if zset then
  -- Numbers are made strings here, once for the score and with '%d' for the sequence: Lua's
  -- own number-to-string (and Redis's, for a number handed to a command) formats a float, which
  -- cost more than the ZADD itself.
  local ttl = tonumber(ARGV[6])
  local member = rid .. ':' .. string.format('%d', tonumber(ARGV[4])) .. '.' .. out[2]
  local batch = batch_keys(zset, member)
  for i = first, last, 1000 do
    redis.call('RPUSH', batch, unpack(out, i, math.min(i + 999, last)))
  end
  redis.call('ZADD', zset, string.format('%d', now), member)
  if ttl > 0 then
    redis.call('PEXPIRE', batch, string.format('%d', ttl * 2))
    redis.call('PEXPIRE', zset, ttl)
  end
end
return out
