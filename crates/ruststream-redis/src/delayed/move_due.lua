#!lua flags=allow-oom
-- MOVE_DUE: moves due entries of a delayed set to their destination, earliest due first in line.
-- Runs under maxmemory (allow-oom): it moves entries, freeing as much as it adds. Prepended with
-- guard.lua, frame.lua, stream/bound.lua and list/levels.lua.
--
-- KEYS: delayed set, delayed payload hash, destination (list or stream), dead-letter list (the
--       destination stands in when there is none), then a list's priority levels above 0: each
--       frame goes to its own level (see levels.lua).
-- ARGV: most entries to move, `list` or `stream`, and for a stream its bound (see bound.lua):
--       after the XADDs the stream is trimmed to it.
-- A list gets the frames with RPUSH (the consuming end, since they are due), latest first so the
-- earliest is taken first; a stream gets an XADD of each frame's fields, earliest first. One
-- HMGET, one variadic RPUSH (per level), HDEL and ZREM per call.
-- An entry that cannot be moved (a frame with more headers than one XADD can take) goes to the
-- dead-letter list with a `reason` header (or is dropped without one) and never blocks the rest.
-- Returns {moved, now_ms, next_due_ms or -1, dead, lateness_ms...} on the server's clock.
local stream = ARGV[2] == 'stream'
local spec = stream and ARGV[3] or ''
local bound_bad = bound_error(spec)
if bound_bad then return redis.error_reply(bound_bad) end
local levels = levels_of(3, 5)
local checks = {{KEYS[1], 'zset'}, {KEYS[2], 'hash'}, {KEYS[3], stream and 'stream' or 'list'}}
if KEYS[4] ~= KEYS[3] then checks[#checks + 1] = {KEYS[4], 'list'} end
local bad = wrong_types(level_checks(checks, levels))
if bad then return redis.error_reply(bad) end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'WITHSCORES', 'LIMIT', 0,
  math.min(tonumber(ARGV[1]), 1000))
local out = {0, now, -1, 0}
if #due > 0 then
  local ids = {}
  for i = 1, #due, 2 do ids[#ids + 1] = due[i] end
  local vals = redis.call('HMGET', KEYS[2], unpack(ids))
  local from, to, step = #ids, 1, -1
  if stream then from, to, step = 1, #ids, 1 end
  local push = {}
  for l = 1, #levels do push[l] = {} end
  for j = from, to, step do
    local v = vals[j]
    if v then
      local fields = stream and frame_fields(v)
      if fields and #fields > MAX_UNPACK - 2 then
        if KEYS[4] ~= KEYS[3] then
          redis.call('LPUSH', KEYS[4], with_header(v, 'reason',
            'too-many-headers: ' .. #fields .. ' stream fields, more than one XADD can take'))
        end
        out[4] = out[4] + 1
      else
        if stream then
          redis.call('XADD', KEYS[3], '*', unpack(fields))
        else
          local l = level_of(v, levels)
          push[l][#push[l] + 1] = v
        end
        out[#out + 1] = now - tonumber(due[2 * j])
      end
    end
  end
  out[1] = #out - 4
  for l = 1, #levels do
    if #push[l] > 0 then push_onto(levels, l, push[l], true) end
  end
  if stream and out[1] > 0 then bound(KEYS[3], spec) end
  redis.call('HDEL', KEYS[2], unpack(ids))
  redis.call('ZREM', KEYS[1], unpack(ids))
end
local nxt = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if nxt[2] then out[3] = tonumber(nxt[2]) end
return out
