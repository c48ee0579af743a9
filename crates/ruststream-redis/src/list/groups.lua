-- needs: back.lua claim/gates.lua
-- GROUPS: the source part of a grouped list's claim (list/groups.rs): in place of the levels'
-- take (list/take.lua), round robin over the non-empty groups. A group's entries wait in its
-- sub-queue `<ring>:<group>`; the ring (a list) holds the name of each non-empty group once, and
-- each step of a claim moves its consuming end to the other (LMOVE ring ring RIGHT LEFT: that
-- group's turn, then it is served last), takes one entry from that group's sub-queue, and takes
-- the group out of the ring when its sub-queue is empty (LREM 1: it is at the head). The ring
-- turns across claims, so every reader of every instance shares one round robin.
--
-- The queue's key itself is the inbox: whatever is pushed onto it (a raw LPUSH, and every way
-- back: a retry, a sweep, a due delayed message, a requeued dead letter, a unique publish) is
-- sorted by each claim, up to GROUPS_SORT entries oldest first, onto its group's sub-queue
-- (back.lua's groups destination, which keeps the ring right), before it takes.
--
-- Registered as the gate `groups` (claim/gates.lua) because a gate's keys and arguments are how a
-- part gets its own; it admits everything and brings `source` (take, len) instead, which
-- list/claim.lua uses in place of the levels'. A group paused by the operator (a field of the
-- hash `<ring>.paused`) and a group whose head the gates' entry filter refuses (a per-group rate
-- limit: the limit keyed by `rs.group`) are passed over, the others served.
-- With a per-group cap (`.group_max_in_flight(n)`), a group with `n` entries in the processing
-- list is passed over too: the counts are read from the processing list at each claim (LRANGE,
-- each frame's `rs.group` header), so whatever ends a claim (an ack, a retry, a dead letter, a
-- sweep, a timeout's settle) frees its group's place without knowing of it, as the whole-queue
-- cap (claim/cap.lua) counts the processing list's length. A claim held back by it reports the
-- held entries with the cap's wait (CAP_RECHECK).
-- Keys: the queue (the inbox), the ring, the paused groups' hash, and with a per-group cap the
-- processing list. Args: the per-group cap, or none.

-- Most inbox entries one claim sorts into their groups.
local GROUPS_SORT = 1000
-- Most turns of the ring one claim makes: bounds a claim's work however many groups wait.
local GROUPS_STEPS = 1000
-- The ms a reader the per-group cap held back waits before it claims again (claim/cap.rs's
-- RECHECK).
local CAP_RECHECK = 20

GATES.groups = function(keys, args)
  local queue, ring, paused, processing = keys[1], keys[2], keys[3], keys[4]
  local cap = tonumber(args[1])
  local dest = groups_dest(queue, ring, 0)

  -- Each group's entries in the processing list (nil without a per-group cap).
  local function in_flight()
    if not cap then return nil end
    local counts = {}
    for _, v in ipairs(redis.call('LRANGE', processing, 0, -1)) do
      local g = header_of(v, 'rs.group') or ''
      counts[g] = (counts[g] or 0) + 1
    end
    return counts
  end

  -- Up to `n` entries, one per turn of the ring; `accept` is the gates' entry filter or nil.
  -- Returns the entries, how many the filter refused and its shortest wait (ms).
  local function take(n, accept)
    local sorted = redis.call('RPOP', queue, GROUPS_SORT)
    if sorted then put_back(dest, sorted, false) end
    local out, refused, wait = {}, 0, 0
    local any_paused = redis.call('EXISTS', paused) == 1
    local counts = in_flight()
    local len = redis.call('LLEN', ring)
    local passed = {}
    local misses, steps = 0, 0
    while #out < n and len > 0 and misses < len and steps < GROUPS_STEPS do
      steps = steps + 1
      local g = redis.call('LMOVE', ring, ring, 'RIGHT', 'LEFT')
      local key = ring .. ':' .. g
      local v = nil
      if passed[g] or (any_paused and redis.call('HEXISTS', paused, g) == 1) then
        passed[g] = true
      elseif counts and (counts[g] or 0) >= cap then
        passed[g] = true
        if refused == 0 or CAP_RECHECK < wait then wait = CAP_RECHECK end
        refused = refused + 1
      elseif redis.call('TYPE', key).ok ~= 'list' then
        -- Empty (expired, or emptied by hand), or not a list of ours: out of the ring.
        redis.call('LREM', ring, 1, g)
        len = len - 1
      elseif accept then
        local head = redis.call('LINDEX', key, -1)
        local ok, w = accept(head)
        if ok then
          v = redis.call('RPOP', key)
        else
          passed[g] = true
          if refused == 0 or w < wait then wait = w end
          refused = refused + 1
        end
      else
        v = redis.call('RPOP', key)
      end
      if v then
        out[#out + 1] = v
        misses = 0
        if counts then counts[g] = (counts[g] or 0) + 1 end
        if redis.call('LLEN', key) == 0 then
          redis.call('LREM', ring, 1, g)
          len = len - 1
        end
      else
        misses = misses + 1
      end
    end
    return out, refused, wait
  end

  -- How many entries wait, counted up to `most` (the inbox and the first groups of the ring).
  local function waiting(most)
    local c = redis.call('LLEN', queue)
    if c >= most then return most end
    for _, g in ipairs(redis.call('LRANGE', ring, 0, most - 1)) do
      if c >= most then break end
      if redis.call('TYPE', ring .. ':' .. g).ok == 'list' then
        c = c + redis.call('LLEN', ring .. ':' .. g)
      end
    end
    return math.min(c, most)
  end

  local checks = {{queue, 'list'}, {ring, 'list'}, {paused, 'hash'}}
  if cap then checks[#checks + 1] = {processing, 'list'} end
  return {
    checks = checks,
    admit = function(want) return want, 0 end,
    source = {take = take, len = waiting},
  }
end
