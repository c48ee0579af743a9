#!lua
-- needs: guard.lua
-- FLOW_SENT: marks children of a flow published ('u' -> 'p'), after their publish returned.
-- Called through `crate::flow::MarkSent`. A child over already (it ran before the mark) keeps
-- its outcome; a record gone (expired) is not made again. Once no child of the record is 'u',
-- the flow is published whole: its plan is deleted and it leaves the publishing set, so no
-- reader repairs it.
--
-- KEYS: the record, the parent queue's publishing set (see `flow/start.lua`).
-- ARGV: the children's ids.
-- Returns how many it marked.
local bad = wrong_types({{KEYS[1], 'hash'}, {KEYS[2], 'zset'}})
if bad then return redis.error_reply(bad) end
local n = 0
for i = 1, #ARGV do
  if redis.call('HGET', KEYS[1], 'c:' .. ARGV[i]) == 'u' then
    redis.call('HSET', KEYS[1], 'c:' .. ARGV[i], 'p')
    n = n + 1
  end
end
local fields = {}
for id in string.gmatch(redis.call('HGET', KEYS[1], 'ids') or '', '[^\n]+') do
  fields[#fields + 1] = 'c:' .. id
end
local states = #fields > 0 and redis.call('HMGET', KEYS[1], unpack(fields)) or {}
for i = 1, #states do
  if states[i] == 'u' then return n end
end
redis.call('HDEL', KEYS[1], 'plan')
redis.call('ZREM', KEYS[2], KEYS[1])
return n
