-- Unique publishes (`.unique_for(window)`): a key per destination and message id marks the id
-- as published within its window. A part of the scripts that publish (unique/publish.lua,
-- delayed/schedule.lua).

-- What the publish `token` may do with the id whose unique key is `k`, for `window` ms:
-- 'new' when no publish of the id holds the window (the key now holds `token` and expires after
-- the window), 'resent' when the key holds `token` itself (this same publish ran before and its
-- reply was lost, so what it enqueued is there: do not enqueue it twice), 'duplicate' when
-- another publish holds the window.
local function unique_claim(k, window, token)
  if redis.call('SET', k, token, 'NX', 'PX', window) then return 'new' end
  if redis.call('GET', k) == token then return 'resent' end
  return 'duplicate'
end
