#!lua flags=allow-oom
-- CLAIM: the one claim of a list queue, simple or reliable, built from parts: where entries come
-- from (list/take.lua: the queue's priority levels, highest first; a partition is a queue of its
-- own), the gates that hold the claim back (claim/gates.lua: paused, rate limit, ...), and what
-- it records (nothing for a simple list; the processing list; with recovery, the batch record).
-- Runs under maxmemory (allow-oom): it moves entries, so a full Redis can still drain its
-- queues. Prepended with guard.lua, frame.lua, stream/bound.lua, back.lua, list/batch.lua,
-- claim/gates.lua, the gates' parts (claim/paused.lua, limit.lua) and list/take.lua. Called through `crate::claim::Claim`.
--
-- A grouped list's source part (list/groups.lua, registered as a gate) takes in place of the
-- levels; its queue key is then the inbox the sweep puts entries back onto.
-- Entries a gate sifts out after the take (a cancelled message, claim/cancels.lua) are gone and
-- neither recorded nor returned.
-- KEYS: the levels, lowest first (level 0 is the queue; ARGV[8] of them), the processing list
--       (record 'list' or 'claims'), the recovery set and the batch hash (record 'claims'), then
--       each gate's keys.
-- ARGV: most entries to claim, record ('' = none: a simple list's pop, 'list', 'claims'),
--       reader id, first claim sequence number, min_idle ms, recovery-set ttl ms (0 = none),
--       most entries to recover, number of levels, then the gates (claim/gates.lua).
--
-- With recovery, it first sweeps: each entry not marked settled of a batch scored older than
-- now - min_idle goes from the processing list back to the queue with its attempt raised by one
-- (back.lua: onto its own level, behind what waits), at most ARGV[7] entries a run: a batch
-- swept whole leaves the set with its record, one swept in part has the swept entries marked
-- (as settled: they are no longer its worker's) and stays stale for the next run; a member of
-- the old form (`<reader id>:<seq>.<run>:<value>`, one per entry, recorded
-- before batches) is swept as it was. Then the claimed entries are recorded as one batch
-- (list/batch.lua): one member `<reader id>:<first seq>.<run>` scored by the server's clock,
-- and its values and settle marks in the batch hash. An entry's record is its batch and its
-- place in it, so two claims of identical bytes are two records, and a sweep moves back only
-- what its own batch holds unsettled (the processing list holds one copy per unsettled record,
-- and copies of identical bytes are interchangeable). `<run>` is the server's TIME
-- (seconds.microseconds) of this run: a client sends a call again when its reply was lost
-- (fred does, on a new connection), and the second run must not record its claims under the
-- first run's member (the first run's entries would then never be swept back). When the
-- recovery set does not exist (it expired with recovery_ttl, or the queue ran without recovery
-- before) while the processing list holds entries, nobody holds a claim on them: they go back
-- to the queue as well, and the batch hash (whose records nothing points to) is deleted.
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
local batches = zset and KEYS[nlevels + 3] or nil
local gates, err = gates_of(nlevels + 1 + (processing and 1 or 0) + (zset and 2 or 0), 9)
if not gates then return redis.error_reply(err) end
local checks = {}
for _, k in ipairs(levels) do checks[#checks + 1] = {k, 'list'} end
if processing then checks[#checks + 1] = {processing, 'list'} end
if zset then
  checks[#checks + 1] = {zset, 'zset'}
  checks[#checks + 1] = {batches, 'hash'}
end
local bad = wrong_types(gate_checks(checks, gates))
if bad then return redis.error_reply(bad) end
local out = {0, '', 0, 0, ''}
local now = 0
if zset then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  out[2] = t[1] .. '.' .. t[2]
  local most = tonumber(ARGV[7])
  local swept = {}
  -- Moves one copy of `v` from the processing list back, if there is one.
  local function sweep(v)
    if redis.call('LREM', processing, '-1', v) > 0 then swept[#swept + 1] = bump(v) end
  end
  if redis.call('EXISTS', zset) == 0 then
    local orphans = redis.call('RPOP', processing, most)
    if orphans then
      for _, v in ipairs(orphans) do swept[#swept + 1] = bump(v) end
    end
    redis.call('DEL', batches)
  end
  local stale = redis.call('ZRANGEBYSCORE', zset, '-inf', now - tonumber(ARGV[5]),
    'LIMIT', 0, most)
  local budget = most
  for _, m in ipairs(stale) do
    if budget <= 0 then break end
    if batch_id(m) then
      local rec = redis.call('HMGET', batches, m, m .. '.s')
      local values = rec[1] and batch_unpack(rec[1]) or {}
      local marks = rec[2] or string.rep('0', #values)
      local marked, done = {}, true
      for i, v in ipairs(values) do
        if string.byte(marks, i) ~= 49 then
          if budget <= 0 then
            done = false
            break
          end
          budget = budget - 1
          marked[#marked + 1] = i - 1
          sweep(v)
        end
      end
      if done then
        redis.call('ZREM', zset, m)
        redis.call('HDEL', batches, m, m .. '.s')
      else
        redis.call('HSET', batches, m .. '.s', batch_marked(marks, marked))
      end
    else
      redis.call('ZREM', zset, m)
      budget = budget - 1
      local p = string.find(m, ':', 1, true)
      local q = p and string.find(m, ':', p + 1, true)
      if q then sweep(string.sub(m, q + 1)) end
    end
  end
  out[1] = put_back(list_dest(levels), swept, false)
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
for i = 1, m do out[#out + 1] = taken[i] end
if not processing then return out end
for i = 6, m + 5, 1000 do
  redis.call('LPUSH', processing, unpack(out, i, math.min(i + 999, m + 5)))
end
if zset then
  -- Two runs of one claim (a resend) in one microsecond would share an id: the later one
  -- takes the next free microsecond, and says so in its reply.
  local s, us = string.match(out[2], '^(%d+)%.(%d+)$')
  local id = rid .. ':' .. ARGV[4] .. '.' .. out[2]
  while redis.call('HEXISTS', batches, id) == 1 do
    us = tonumber(us) + 1
    out[2] = s .. '.' .. us
    id = rid .. ':' .. ARGV[4] .. '.' .. out[2]
  end
  redis.call('ZADD', zset, now, id)
  redis.call('HSET', batches, id, batch_pack(out, 6, m + 5), id .. '.s', string.rep('0', m))
  if tonumber(ARGV[6]) > 0 then
    redis.call('PEXPIRE', zset, ARGV[6])
    redis.call('PEXPIRE', batches, ARGV[6])
  end
end
return out
