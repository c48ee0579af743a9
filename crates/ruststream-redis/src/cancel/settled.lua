-- CANCELLED: a part of both settle scripts (`crate::settle::PARTS`); needs frame.lua before it.
-- `cancelled_in(record)` gives the test of whether a frame is of a message the cancel record
-- `record` (`K.cancels`, a hash keyed by message id: `crate::cancel`) holds. The record is looked
-- up once (`EXISTS`); when it does not exist (no cancel pending: the common case) the test sends
-- no command, else one `HEXISTS` a frame. A raw value (no frame, no id) is never cancelled.
local function cancelled_in(record)
  if redis.call('EXISTS', record) == 0 then
    return function() return false end
  end
  return function(v)
    local l = frame_layout(v)
    return l ~= nil and redis.call('HEXISTS', record, string.sub(v, l.id[1], l.id[2])) == 1
  end
end
