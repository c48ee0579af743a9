#!lua
-- FLOW_SENT: marks children of a flow published ('u' -> 'p'), after their publish returned.
-- Called through `crate::flow::MarkSent`. A child over already (it ran before the mark) keeps
-- its outcome; a record gone (expired) is not made again. Prepended with guard.lua.
--
-- KEYS: the record. ARGV: the children's ids.
-- Returns how many it marked.
local bad = wrong_types({{KEYS[1], 'hash'}})
if bad then return redis.error_reply(bad) end
local n = 0
for i = 1, #ARGV do
  if redis.call('HGET', KEYS[1], 'c:' .. ARGV[i]) == 'u' then
    redis.call('HSET', KEYS[1], 'c:' .. ARGV[i], 'p')
    n = n + 1
  end
end
return n
