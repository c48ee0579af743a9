-- needs: claim/gates.lua frame.lua
-- CANCELS: the gate of cancelled messages (see crate::cancel): an entry a cancel recorded in the
-- queue's cancel record (K.cancels, by its frame's id) is taken but not delivered: the claim
-- drops it, so it is settled as cancelled (removed, to no dead-letter list) before anyone
-- handles it. One EXISTS per claim; only while the record exists, one HEXISTS per entry taken.
-- A raw value (not a frame) has no id to cancel by. Keys: the cancel record. Args: none.
GATES.cancels = function(keys)
  return {
    checks = {{keys[1], 'hash'}},
    admit = function(n) return n, 0 end,
    sift = function(taken)
      if #taken == 0 or redis.call('EXISTS', keys[1]) == 0 then return taken, 0 end
      local kept = {}
      for _, v in ipairs(taken) do
        local l = frame_layout(v)
        if not (l and redis.call('HEXISTS', keys[1], string.sub(v, l.id[1], l.id[2])) == 1) then
          kept[#kept + 1] = v
        end
      end
      return kept, #taken - #kept
    end,
  }
end
