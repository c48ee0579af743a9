-- needs: claim/gates.lua
-- CAP: the gate of a subscription's `.max_in_flight(n)` (see claim/cap.rs): at most `n` messages
-- of the queue are being handled at once, across every worker of every instance. It counts what
-- is in flight where the queue records it already, so it adds no key, and whatever ends a
-- claim frees it without knowing of it (a settle, a retry, a dead letter, the recovery sweep):
-- a reliable list's processing list (`LLEN`), shared by all its readers, or a group's pending
-- entries (the `XPENDING key group` summary). A claim takes at most `n` minus that. With
-- recovery, list/claim.lua sweeps stale claims back before it asks the gates, so a dead
-- worker's claims free the cap in the run that sweeps them.
-- Keys: the processing list, or the stream. Args: n, the ms
-- after which a reader held back asks again (nothing announces a settle), the measure ('list'
-- or 'group'), the group (measure 'group').
GATES.cap = function(keys, args)
  local n, recheck, measure = tonumber(args[1]), tonumber(args[2]), args[3]
  local function in_flight()
    if measure == 'list' then return redis.call('LLEN', keys[1]) end
    return redis.call('XPENDING', keys[1], args[4])[1]
  end
  return {
    checks = {{keys[1], measure == 'list' and 'list' or 'stream'}},
    admit = function(want)
      local free = math.max(0, n - in_flight())
      if free >= want then return want, 0 end
      return free, recheck
    end,
  }
end
