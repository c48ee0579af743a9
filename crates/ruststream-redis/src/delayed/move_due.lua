-- MOVE_DUE: moves due entries of a delayed set to their destination, earliest due first in line.
-- Prepended with frame.lua.
--
-- KEYS: delayed set, delayed payload hash, destination (list or stream).
-- ARGV: most entries to move, `list` or `stream`.
-- A list gets the frames with RPUSH (the consuming end, since they are due), latest first so the
-- earliest is taken first; a stream gets an XADD of each frame's fields, earliest first. One
-- HMGET, one variadic RPUSH, HDEL and ZREM per call.
-- Returns {moved, now_ms, next_due_ms or -1, lateness_ms...} on the server's clock.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'WITHSCORES', 'LIMIT', 0, tonumber(ARGV[1]))
local out = {0, now, -1}
if #due > 0 then
  local ids = {}
  for i = 1, #due, 2 do ids[#ids + 1] = due[i] end
  local vals = redis.call('HMGET', KEYS[2], unpack(ids))
  local stream = ARGV[2] == 'stream'
  local from, to, step = #ids, 1, -1
  if stream then from, to, step = 1, #ids, 1 end
  local push = {}
  for j = from, to, step do
    local v = vals[j]
    if v then
      if stream then
        redis.call('XADD', KEYS[3], '*', unpack(frame_fields(v)))
      else
        push[#push + 1] = v
      end
      out[#out + 1] = now - tonumber(due[2 * j])
    end
  end
  out[1] = #out - 3
  if #push > 0 then redis.call('RPUSH', KEYS[3], unpack(push)) end
  redis.call('HDEL', KEYS[2], unpack(ids))
  redis.call('ZREM', KEYS[1], unpack(ids))
end
local nxt = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if nxt[2] then out[3] = tonumber(nxt[2]) end
return out
