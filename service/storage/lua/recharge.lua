-- Charge a dataset's interval columns what the additive rule would have charged, at most
-- once (service.policy.recharge): releases charged an exact increment before issue #27
-- paid less than their standalone bound, which is what an adaptive analyst's designs can
-- take. The marker field 'recharged:interval' makes it once only, whatever the number of
-- processes that computed the same amounts; one 'policy' event records what was added.
-- KEYS: 1 ledger hash, 2 events stream
-- ARGV: 1 actor, 2 now (iso), 3 n, then n pairs (measure, units to add to committed)
if redis.call('HSETNX', KEYS[1], 'recharged:interval', '1') == 0 then return {'done'} end
local n = tonumber(ARGV[3])
if n == 0 then return {'nothing'} end
local event = {'kind', 'policy', 'release_id', '', 'actor', ARGV[1], 'at', ARGV[2],
               'action', 'recharged'}
for i = 0, n - 1 do
  local m, u = ARGV[4 + 2 * i], ARGV[5 + 2 * i]
  redis.call('HINCRBY', KEYS[1], 'committed:' .. m, u)
  table.insert(event, 'm:' .. m)
  table.insert(event, u)
end
redis.call('XADD', KEYS[2], '*', unpack(event))
return {'recharged'}
