#!lua flags=allow-oom
-- needs: guard.lua list/marks.lua
-- LEASE: keeps a live worker's claims alive: moves each batch member's score in the recovery set
-- to now, so only a dead worker's claims are ever idle longer than min_idle. A member no longer
-- in the set (settled, or swept by another worker) is not added back (ZADD XX). With a ttl, the
-- set's is renewed, and so are the batch list (`<set>:<member>`, twice the set's: list/claim.lua)
-- and its marks (`<set>:<member>:s`, list/settle.lua) of every member in the set, this worker's
-- or not: a dead worker's member waits in the set for
-- a sweep, which runs only when a claim does, and a worker whose handlers hold every permit
-- claims nothing while its leases keep the set alive; its batch list must not expire before it.
-- Runs under maxmemory (allow-oom): it adds nothing.
--
-- KEYS: recovery set. ARGV: recovery-set ttl ms (0 = none), then the members.
-- Returns how many scores moved.
if not tonumber(ARGV[1]) then return redis.error_reply('RSARGS lease.lua: the ttl is not a number') end
local bad = wrong_types({{KEYS[1], 'zset'}})
if bad then return redis.error_reply(bad) end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local moved = 0
local batch = {}
-- The score as a string, made once: a number handed to a command is formatted as a float each time.
local score = string.format('%d', now)
for i = 2, #ARGV do
  batch[#batch + 1] = score
  batch[#batch + 1] = ARGV[i]
  if #batch == 1000 or i == #ARGV then
    moved = moved + redis.call('ZADD', KEYS[1], 'XX', 'CH', unpack(batch))
    batch = {}
  end
end
if tonumber(ARGV[1]) > 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
  local batch_ttl = string.format('%d', tonumber(ARGV[1]) * 2)
  for _, m in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
    local list, marks = batch_keys(KEYS[1], m)
    redis.call('PEXPIRE', list, batch_ttl)
    redis.call('PEXPIRE', marks, batch_ttl)
  end
end
return moved
