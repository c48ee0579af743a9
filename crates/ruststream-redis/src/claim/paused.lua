-- needs: claim/gates.lua
-- PAUSED: the gate of an operator's pause (`K.paused`, see pause.rs). While the key exists it
-- lets nothing through, so once `pause` has returned no claim in any instance takes an entry.
-- Keys: the pause key. Args: none.
GATES.paused = function(keys)
  return {
    admit = function(n)
      if redis.call('EXISTS', keys[1]) == 1 then return 0, 0 end
      return n, 0
    end,
  }
end
