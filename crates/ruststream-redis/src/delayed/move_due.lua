#!lua flags=allow-oom
-- needs: guard.lua back.lua dead/trim.lua
-- MOVE_DUE: moves due entries of a delayed set to their destination, earliest due first in line.
-- Runs under maxmemory (allow-oom): it moves entries, freeing as much as it adds. Called through
-- `crate::delayed::MoveDue`.
--
-- KEYS: delayed set, delayed payload hash, dead-letter list (the destination's first key stands
--       in when there is none), the destination's publishing set of flows (`flow/start.lua`),
--       then the destination's keys (back.lua: a list's levels, each frame going onto its own;
--       a stream).
-- ARGV: most entries to move, the flow repair's grace in ms, the destination (back.lua), then
--       the dead-letter list's bound (dead/trim.lua; '' when there is no dead-letter list).
-- A list gets the frames at its consuming end (RPUSH, since they are due), latest first so the
-- earliest is taken first; a stream gets an XADD of each frame's fields, earliest first, then
-- one trim to its bound. One HMGET, one variadic RPUSH (per level), HDEL and ZREM per call.
-- An entry that cannot be moved (a frame with more headers than one XADD can take) goes to the
-- dead-letter list with a `reason` header (or is dropped without one) and never blocks the rest;
-- the list is then trimmed to its bound.
-- It also takes up to 8 flows of the publishing set started (or last taken) more than the grace
-- ago, for the caller to repair (`flow/repair.rs`): each one's score is set to now, so the other
-- readers leave it for another grace.
-- Returns {moved, now_ms, next_due_ms or -1, dead, dead letters trimmed, {flows to repair},
-- lateness_ms...} on the server's clock.
local dest, derr = dest_of(5, 3)
if not dest then return redis.error_reply(derr) end
if dest.kind ~= 'list' and dest.kind ~= 'stream' then
  return redis.error_reply('RSARGS move_due.lua: a delayed set moves onto a list or a stream')
end
local has_dead = KEYS[3] ~= dest.keys[1]
local bound = dead_bound(ARGV[dest.arg_end])
if has_dead and not bound then
  return redis.error_reply('RSARGS move_due.lua: a dead-letter bound at argument ' .. dest.arg_end .. ' is malformed')
end
local grace = tonumber(ARGV[2])
if not grace or grace < 1 then
  return redis.error_reply('RSARGS move_due.lua: a grace of at least 1 ms at argument 2')
end
local checks = dest_checks(dest, {{KEYS[1], 'zset'}, {KEYS[2], 'hash'}, {KEYS[4], 'zset'}})
if has_dead then checks[#checks + 1] = {KEYS[3], 'list'} end
local bad = wrong_types(checks)
if bad then return redis.error_reply(bad) end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'WITHSCORES', 'LIMIT', 0,
  math.min(tonumber(ARGV[1]), 1000))
local stale = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now - grace, 'LIMIT', 0, 8)
for i = 1, #stale do redis.call('ZADD', KEYS[4], 'XX', now, stale[i]) end
local out = {0, now, -1, 0, 0, stale}
if #due > 0 then
  local ids = {}
  for i = 1, #due, 2 do ids[#ids + 1] = due[i] end
  local vals = redis.call('HMGET', KEYS[2], unpack(ids))
  local from, to, step = #ids, 1, -1
  if dest.kind == 'stream' then from, to, step = 1, #ids, 1 end
  local items = {}
  for j = from, to, step do
    local v = vals[j]
    if v then
      local item, why = dest_item(dest, v)
      if item then
        items[#items + 1] = item
        out[#out + 1] = now - tonumber(due[2 * j])
      else
        if has_dead then
          redis.call('LPUSH', KEYS[3], dead_letter(with_header(v, 'reason', why), now))
        end
        out[4] = out[4] + 1
      end
    end
  end
  out[1] = put_back(dest, items, true)
  redis.call('HDEL', KEYS[2], unpack(ids))
  redis.call('ZREM', KEYS[1], unpack(ids))
  if has_dead and out[4] > 0 then out[5] = dead_trim(KEYS[3], bound, now) end
end
local nxt = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if nxt[2] then out[3] = tonumber(nxt[2]) end
return out
