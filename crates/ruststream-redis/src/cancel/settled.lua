-- needs: frame.lua
-- CANCELLED: a part of both settle scripts.
-- `cancelled_in(record)` gives the test of whether a frame is of a message the cancel record
-- `record` (`K.cancels`, a hash keyed by message id: `crate::cancel`) holds. The record is looked
-- up once, at the first test (`EXISTS`); when it does not exist (no cancel pending: the common
-- case) the test sends no more commands, else one `HEXISTS` a frame. A raw value (no frame, no
-- id) is never cancelled.
local function cancelled_in(record)
  local exists
  return function(v)
    if exists == nil then exists = redis.call('EXISTS', record) == 1 end
    if not exists then return false end
    local l = frame_layout(v)
    return l ~= nil and redis.call('HEXISTS', record, string.sub(v, l.id[1], l.id[2])) == 1
  end
end
