-- needs: claim/gates.lua frame.lua
-- RATE LIMIT: the limiter of a subscription's `.rate_limit(n, per)`, shared by every worker of
-- every instance, on the server's clock (TIME). A gate of the claim (`GATES.rate`): a part
-- of the scripts that take entries (list/claim.lua, stream/read.lua), and of claim/reserve.lua
-- and claim/refund.lua, which a
-- partitioned queue's readers call on the limiter's own slot.
--
-- A GCRA (generic cell rate algorithm): one number per limit, its theoretical arrival time `tat`
-- in microseconds. A message may pass at `now` when `tat + step - now <= per`, with
-- `step = per / n`; passing adds `step` to max(tat, now). So `n` may pass at once after a quiet
-- spell (the burst), and then one every `step`: in any window of length W at most
-- n + n * W / per pass. A `tat` at or before `now` is the same as none, so the state expires
-- `per` after the last pass and an idle limit costs no memory.
--
-- The whole-queue limit keeps `tat` in a string (`K.rate`); a per-key limit keeps one member per
-- key value in a sorted set (`K.rate.keys`), scored by its `tat`. Permits are charged only for
-- the messages taken in the same script run, so a run sent twice (a lost reply) charges only for
-- what each run took.

-- The server's clock in microseconds.
local function rate_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- `x` as an integer in text: redis.call turns a Lua number into text with 14 digits, too few
-- for microseconds since the epoch.
local function rate_num(x)
  return string.format('%.0f', x)
end

-- A limit from a script's arguments, starting at ARGV[first]: mode ('' none, 'all', 'key'), n,
-- per in microseconds, the header naming the key (mode 'key'); `key` is the limiter's key.
-- nil when there is no limit.
local function rate_spec(argv, first, key)
  local mode = argv[first]
  if mode == nil or mode == '' then return nil end
  local n, per = tonumber(argv[first + 1]), tonumber(argv[first + 2])
  local lim = {key = key, n = n, per = per, step = per / n, header = argv[first + 3]}
  lim.keyed = mode == 'key'
  return lim
end

-- The type check of the limiter's key: {key, wanted type}, or nil without a limit.
local function rate_check(lim)
  if not lim then return nil end
  return {lim.key, lim.keyed and 'zset' or 'string'}
end

-- How many of `want` may pass now under the state `tat` (nil = none), and the microseconds until
-- the next one may when none may.
local function rate_free(lim, tat, now, want)
  local base = math.max(tat or now, now)
  local free = math.floor((lim.per - (base - now)) / lim.step + 1e-9)
  if free >= 1 then return math.min(want, free), 0 end
  return 0, math.max(1, math.ceil(base + lim.step - lim.per - now))
end

-- The state after `took` passed under `tat` at `now`: rounded up, so rounding never lets one
-- more through.
local function rate_after(lim, tat, now, took)
  return math.ceil(math.max(tat or now, now) + took * lim.step)
end

-- The state of the whole-queue limit (a number or nil).
local function rate_get(lim)
  local v = redis.call('GET', lim.key)
  return v and tonumber(v) or nil
end

-- Charges `took` passes to the whole-queue limit; its key expires when it would be no limit.
local function rate_charge(lim, tat, now, took)
  if took < 1 then return end
  local after = rate_after(lim, tat, now, took)
  redis.call('SET', lim.key, rate_num(after), 'PX',
    math.max(1, math.ceil((after - now) / 1000)))
end

-- Milliseconds (rounded up) of `us` microseconds, for a reply.
local function rate_ms(us)
  return math.ceil(us / 1000)
end

-- The value of the header `name` of the list value `v`; '' for a raw value or a frame without it.
local function rate_key_of(v, name)
  local layout = frame_layout(v)
  if not layout then return '' end
  for _, h in ipairs(layout.headers) do
    if string.sub(v, h[1], h[2]) == name then return string.sub(v, h[3], h[4]) end
  end
  return ''
end

-- The gate of a rate limit (see claim/gates.lua). Keys: the limiter's key. Args: mode ('all',
-- 'key'), n, per in microseconds, the header naming the key (mode 'key').
GATES.rate = function(keys, args)
  local lim = rate_spec(args, 1, keys[1])
  local g = {checks = {rate_check(lim)}}
  local now, tat
  if not lim.keyed then
    g.admit = function(n)
      now, tat = rate_now(), rate_get(lim)
      local free, wait = rate_free(lim, tat, now, n)
      return free, rate_ms(wait)
    end
    g.charge = function(took)
      rate_charge(lim, tat, now, took)
      local _, wait = rate_free(lim, rate_after(lim, tat, now, took), now, 1)
      return rate_ms(wait)
    end
    return g
  end
  -- Per key: each key's state read once and charged in a table, written once at the end.
  local state = {}
  local function of(v)
    local k = rate_key_of(v, lim.header)
    local s = state[k]
    if not s then
      local score = redis.call('ZSCORE', lim.key, k)
      s = {tat = score and tonumber(score) or nil, took = 0}
      state[k] = s
    end
    return s
  end
  g.admit = function(n)
    now = rate_now()
    redis.call('ZREMRANGEBYSCORE', lim.key, '-inf', rate_num(now))
    return n, 0
  end
  g.accept = function(v)
    local s = of(v)
    local free, w = rate_free(lim, rate_after(lim, s.tat, now, s.took), now, 1)
    return free > 0, rate_ms(w)
  end
  g.pass = function(v)
    local s = of(v)
    s.took = s.took + 1
  end
  g.charge = function(took)
    if took < 1 then return 0 end
    local members = {}
    for k, s in pairs(state) do
      if s.took > 0 then
        members[#members + 1] = rate_num(rate_after(lim, s.tat, now, s.took))
        members[#members + 1] = k
      end
    end
    for i = 1, #members, 1000 do
      redis.call('ZADD', lim.key, unpack(members, i, math.min(i + 999, #members)))
    end
    redis.call('PEXPIRE', lim.key, math.ceil(lim.per / 1000) + 1)
    return 0
  end
  return g
end

-- Reserves up to ARGV-given `want` passes of the whole-queue limit `lim` for a claim that runs
-- elsewhere (a partitioned queue: the limiter lives in a slot of its own): charges them now and
-- returns how many, and the ms until the next may pass when none may.
local function rate_reserve(lim, want)
  local now, tat = rate_now(), rate_get(lim)
  local free, wait = rate_free(lim, tat, now, want)
  rate_charge(lim, tat, now, free)
  return free, rate_ms(wait)
end

-- Gives back `unused` passes a reservation took but did not use: the limit's state moves back
-- by their steps, never before now (a state at or before now is no state).
local function rate_refund(lim, unused)
  if unused < 1 then return end
  local now, tat = rate_now(), rate_get(lim)
  if not tat then return end
  local back = tat - unused * lim.step
  if back <= now then
    redis.call('DEL', lim.key)
  else
    redis.call('SET', lim.key, rate_num(math.ceil(back)), 'PX',
      math.max(1, math.ceil((back - now) / 1000)))
  end
end
