#!lua flags=allow-oom
-- CLAIM: the one claim of a list queue, simple or reliable, built from parts: where entries come
-- from (list/take.lua: the queue's priority levels, highest first; a partition is a queue of its
-- own), the gates that hold the claim back (claim/gates.lua: paused, rate limit, ...), and what
-- it records (nothing for a simple list; the processing list; with recovery, the recovery set).
-- Runs under maxmemory (allow-oom): it moves entries, so a full Redis can still drain its
-- queues. Prepended with guard.lua, frame.lua, stream/bound.lua, back.lua, claim/gates.lua, the gates'
-- parts (claim/paused.lua, limit.lua) and list/take.lua. Called through `crate::claim::Claim`.
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
-- `<set>:<member>` holding the batch's values as they were taken (RPUSH), each removed by its
-- settle (list/settle.lua). Two equal values never share a batch: the second goes into a batch
-- of its own (member `<seq + 1>`, and so on), so a settle sent twice cannot take another claim's
-- entry of the same bytes. `<run>` is the server's TIME (seconds.microseconds) of this run: a
-- client sends a call again when its reply was lost (fred does, on a new connection), and the
-- second run must not record its claims under the first run's members (the first run's entries
-- would then never be swept back). The batch list has twice the set's ttl, so it outlives its
-- member for as long as the member can be swept (recovery_ttl is longer than min_idle).
-- The sweep: each member scored older than now - min_idle leaves the set, with its batch list;
-- each value of the list still in the processing list (LREM -1) goes back to the queue with its
-- attempt raised by one (back.lua: onto its own level, behind what waits). At most ARGV[7]
-- values a run: a batch longer than what is left of that is swept in part (LTRIM), its member
-- kept for the next run. A member of the earlier form, one a claimed entry
-- (`<reader id>:<seq>.<run>:<value>`), is swept as such: its value follows the second ':'.
-- When the recovery set does not exist (it expired with recovery_ttl, or the queue ran without
-- recovery before) while the processing list holds entries, nobody holds a claim on them: they
-- go back to the queue as well, and while ARGV[7] of them went back the claim takes nothing
-- (more may wait; the next run finds the set still missing and goes on). A claim past its
-- sweep's deadline takes nothing while such orphans wait, for the same reason.
-- Every stale batch list's type is checked before the sweep's first write.
-- Returns {recovered, run ('' without recovery), entries the gates held back, ms until they let
-- the next pass, the gate that let nothing through ('' none), the values' batches, value...},
-- values oldest of each level first; the batches are empty when one batch holds every value,
-- else each value's batch (0: `<seq>`, 1: `<seq + 1>`, ...).
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
local out = {0, '', 0, 0, '', {}}
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
    -- Each stale member's form, and its batch list's type checked before the sweep writes.
    local olds, batch_checks = {}, {}
    for i, m in ipairs(stale) do
      local p = string.find(m, ':', 1, true)
      olds[i] = p and string.find(m, ':', p + 1, true)
      if not olds[i] then batch_checks[#batch_checks + 1] = {zset .. ':' .. m, 'list'} end
    end
    local bad_batch = wrong_types(batch_checks)
    if bad_batch then return redis.error_reply(bad_batch) end
    local left = most - #swept
    for i, m in ipairs(stale) do
      if left <= 0 then break end
      local q = olds[i]
      local values
      if q then
        redis.call('ZREM', zset, m)
        values = {string.sub(m, q + 1)}
      else
        local batch = zset .. ':' .. m
        if redis.call('LLEN', batch) <= left then
          values = redis.call('LRANGE', batch, 0, -1)
          redis.call('DEL', batch)
          redis.call('ZREM', zset, m)
        else
          values = redis.call('LRANGE', batch, 0, left - 1)
          redis.call('LTRIM', batch, left, -1)
        end
      end
      left = left - #values
      for _, v in ipairs(values) do
        if redis.call('LREM', processing, '-1', v) > 0 then swept[#swept + 1] = bump(v) end
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
  local seq, ttl = tonumber(ARGV[4]), tonumber(ARGV[6])
  local score, run = string.format('%d', now), '.' .. out[2]
  -- Each value's batch: how many equal values came before it in this claim.
  local seen, batches, split = {}, {}, false
  for i = first, last do
    local k = seen[out[i]] or 0
    seen[out[i]] = k + 1
    batches[i - first + 1] = k
    if k > 0 then split = true end
  end
  local lists = {out}
  if split then
    lists = {}
    for i = first, last do
      local k = batches[i - first + 1] + 1
      lists[k] = lists[k] or {}
      lists[k][#lists[k] + 1] = out[i]
    end
    out[6] = batches
  end
  local batch_ttl = string.format('%d', ttl * 2)
  for k, values in ipairs(lists) do
    local member = rid .. ':' .. string.format('%d', seq + k - 1) .. run
    local batch = zset .. ':' .. member
    local from, to = first, last
    if split then from, to = 1, #values end
    for i = from, to, 1000 do
      redis.call('RPUSH', batch, unpack(values, i, math.min(i + 999, to)))
    end
    redis.call('ZADD', zset, score, member)
    if ttl > 0 then redis.call('PEXPIRE', batch, batch_ttl) end
  end
  if ttl > 0 then redis.call('PEXPIRE', zset, ttl) end
end
return out
