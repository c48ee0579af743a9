-- GATES: what holds a claim back, read from the script's arguments. A part
-- of the scripts that take entries (list/claim.lua, stream/read.lua), which also need the
-- gates' own parts (one per gate: claim/paused.lua, claim/limit.lua, claim/cap.lua,
-- claim/cancels.lua), each needing this one and registering itself in `GATES`.
--
-- A gate is one Lua part plus its option. Its part adds `GATES.<name> = function(keys, args)`,
-- returning a table with:
--   checks          the {key, type} pairs guard.lua's wrong_types checks before any write;
--   admit(n)        how many of `n` entries it lets this run take, and the ms until it lets
--                   more (0: it does not know, or nothing to wait for);
--   accept(v)       (optional, list claims only) whether the entry `v` may pass, and else the
--                   ms until it may, changing nothing: an entry it refuses stays where it is;
--   pass(v)         (with accept) records that `v` passed every gate;
--   charge(took)    (optional) records that `took` entries passed; returns the ms until the
--                   next may pass (0: at once or not known);
--   sift(taken)     (optional, list claims only) the entries taken that are still to be
--                   delivered, and how many it dropped (they are gone: a cancel's).
--   source          (optional, list claims only, one gate at most) where the claim takes from
--                   in place of the levels: `take(n, accept)` as take.lua's take_levels, and
--                   `len(most)` as its levels_len (list/groups.lua's round robin over groups).
-- In the caller's ARGV a gate is `name, number of its keys, number of its args, args..`, and
-- its keys follow one another in KEYS in the same order, so a script never lists a gate's
-- arguments itself (the Rust side builds them: `crate::claim::Gate`).

local GATES = {}

-- The gates named from KEYS[key_at] and ARGV[arg_at] on; nil and an error message for an
-- unknown gate or a short argument list.
local function gates_of(key_at, arg_at)
  local gates = {}
  local k, a = key_at, arg_at
  while a <= #ARGV do
    local name, nk, na = ARGV[a], tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
    local make = GATES[name]
    if not make or not nk or not na or a + 2 + na > #ARGV or k + nk - 1 > #KEYS then
      return nil, 'RSARGS claim gate ' .. tostring(name) .. ': unknown, or short of keys or arguments'
    end
    local keys, args = {}, {}
    for i = 0, nk - 1 do keys[#keys + 1] = KEYS[k + i] end
    for i = 0, na - 1 do args[#args + 1] = ARGV[a + 3 + i] end
    local g = make(keys, args)
    g.name = name
    gates[#gates + 1] = g
    k, a = k + nk, a + 3 + na
  end
  return gates
end

-- The source a gate brings in place of the levels' take (see the header), or nil.
local function gates_source(gates)
  for _, g in ipairs(gates) do
    if g.source then return g.source end
  end
  return nil
end

-- Adds every gate's type checks to `checks`.
local function gate_checks(checks, gates)
  for _, g in ipairs(gates) do
    for _, c in ipairs(g.checks or {}) do checks[#checks + 1] = c end
  end
  return checks
end

-- Runs the gates' admit over `n`: returns how many may be taken, the name of the first gate
-- that let none through ('' when some may), and the longest wait a gate that held some back
-- gave.
local function gates_admit(gates, n)
  local closed, wait = '', 0
  for _, g in ipairs(gates) do
    local m, w = g.admit(n)
    if m < n then wait = math.max(wait, w or 0) end
    n = m
    if n < 1 then
      closed = g.name
      break
    end
  end
  return n, closed, wait
end

-- The entry filter of the gates that have one (nil when none does): the entry passes when every
-- such gate accepts it; else its second value is the ms until it may.
local function gates_filter(gates)
  local filters = {}
  for _, g in ipairs(gates) do
    if g.accept then filters[#filters + 1] = g end
  end
  if #filters == 0 then return nil end
  return function(v)
    for _, g in ipairs(filters) do
      local ok, w = g.accept(v)
      if not ok then return false, w end
    end
    for _, g in ipairs(filters) do
      if g.pass then g.pass(v) end
    end
    return true, 0
  end
end

-- The entries of `taken` every gate's sift keeps, and how many the sifts dropped.
local function gates_sift(gates, taken)
  local dropped = 0
  for _, g in ipairs(gates) do
    if g.sift then
      local d
      taken, d = g.sift(taken)
      dropped = dropped + d
    end
  end
  return taken, dropped
end

-- Charges the gates for `took` entries; returns the longest wait a gate gave for the next one.
local function gates_charge(gates, took)
  local wait = 0
  for _, g in ipairs(gates) do
    if g.charge then wait = math.max(wait, g.charge(took) or 0) end
  end
  return wait
end
