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
-- `crate::sweep_clock`): each claim scored older than now - min_idle leaves the set,
-- and its entry goes from the processing list back to the queue with its attempt raised by one
-- (back.lua: onto its own level, behind what waits). Then every claim is recorded in the set as
-- `<reader id>:<seq>.<run>:<value>` scored by the server's clock, so two claims of identical
-- bytes are two members. `<run>` is the server's TIME (seconds.microseconds) of this run: a
-- client sends a call again when its reply was lost (fred does, on a new connection), and the
-- second run must not record its claims under the first run's members (the first run's entries
-- would then never be swept back). When the recovery set does not exist (it expired with
-- recovery_ttl, or the queue ran without recovery before) while the processing list holds
-- entries, nobody holds a claim on them: they go back to the queue as well.
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
      end
    end
    local stale = redis.call('ZRANGEBYSCORE', zset, '-inf', now - tonumber(ARGV[5]),
      'LIMIT', 0, most)
    for _, m in ipairs(stale) do
      redis.call('ZREM', zset, m)
      local p = string.find(m, ':', 1, true)
      local q = p and string.find(m, ':', p + 1, true)
      if q and redis.call('LREM', processing, '-1', string.sub(m, q + 1)) > 0 then
        swept[#swept + 1] = bump(string.sub(m, q + 1))
      end
    end
    out[1] = put_back(list_dest(levels), swept, false)
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
for i = 1, m do out[#out + 1] = taken[i] end
if not processing then return out end
for i = 6, m + 5, 1000 do
  redis.call('LPUSH', processing, unpack(out, i, math.min(i + 999, m + 5)))
end
if zset then
  -- Numbers are made strings here, once for the score and with '%d' for the sequence: Lua's
  -- own number-to-string (and Redis's, for a number handed to a command) formats a float, which
  -- cost more than the ZADD itself, per entry.
  local seq = tonumber(ARGV[4])
  local score, run = string.format('%d', now), '.' .. out[2] .. ':'
  local members = {}
  for i = 6, m + 5 do
    members[#members + 1] = score
    members[#members + 1] = rid .. ':' .. string.format('%d', seq + i - 6) .. run .. out[i]
  end
  for i = 1, #members, 1000 do
    redis.call('ZADD', zset, unpack(members, i, math.min(i + 999, #members)))
  end
  if tonumber(ARGV[6]) > 0 then redis.call('PEXPIRE', zset, ARGV[6]) end
end
return out
