#!lua flags=allow-oom
-- needs: guard.lua back.lua
-- FLOW_DONE: records how one child of a flow ended, and enqueues the parent when that ends the
-- flow. Called through `crate::flow::ChildDone` by the dispatch loop before the child is
-- settled: a crash between the two runs the child again, and this script run again (or sent
-- again after a lost reply) changes nothing, since only a child not over yet ('u' or 'p') is
-- recorded, and only the run that records the flow's end enqueues the parent. Runs under
-- maxmemory (allow-oom): it belongs to a settle.
--
-- KEYS: the record, then the parent's destination's keys (back.lua).
-- ARGV: the child's id, its outcome ('a' acked, 'x' dead, 'd' dropped), its result or dead
--       reason ('' for none), the record's ttl in ms once the parent is enqueued (the result
--       ttl), then the parent's destination (back.lua).
-- The flow ends when its last child is over, or, under the policy 'fail', when a child is
-- dead: the parent is then enqueued with the header `rs.flow.failed: child-failed: <id>`, and
-- the dispatch loop dead-letters it with that reason.
-- Returns 0 when nothing changed (the record is gone, or the child was recorded already), 1
-- when the child was recorded, 2 when that enqueued the parent.
local dest, derr = dest_of(2, 5)
if not dest then return redis.error_reply(derr) end
local id, outcome, value, ttl = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
if (outcome ~= 'a' and outcome ~= 'x' and outcome ~= 'd') or not ttl or ttl < 1 then
  return redis.error_reply('RSARGS flow/done.lua: malformed outcome or ttl')
end
local bad = wrong_types(dest_checks(dest, {{KEYS[1], 'hash'}}))
if bad then return redis.error_reply(bad) end
local now = redis.call('HGET', KEYS[1], 'c:' .. id)
if now ~= 'u' and now ~= 'p' then return 0 end
local left = (tonumber(redis.call('HGET', KEYS[1], 'left')) or 1) - 1
local pending = redis.call('HGET', KEYS[1], 'state') == 'pending'
local failed = outcome == 'x' and redis.call('HGET', KEYS[1], 'policy') == 'fail'
local item
if pending and (failed or left <= 0) then
  local parent = redis.call('HGET', KEYS[1], 'parent') or ''
  if failed then parent = with_header(parent, 'rs.flow.failed', 'child-failed: ' .. id) end
  local ierr
  item, ierr = dest_item(dest, parent)
  if not item then return redis.error_reply('RSARGS flow/done.lua: the parent ' .. ierr) end
end
redis.call('HSET', KEYS[1], 'c:' .. id, outcome, 'left', left)
if value ~= '' then redis.call('HSET', KEYS[1], 'r:' .. id, value) end
if not item then return 1 end
redis.call('HSET', KEYS[1], 'state', failed and 'failed' or 'enqueued')
put_back(dest, {item}, false)
redis.call('PEXPIRE', KEYS[1], ttl)
return 2
