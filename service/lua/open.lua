-- Register a dataset and open its ledger, at most once: the document, its place
-- in the dataset index, its caps and the audit event that records them. A call
-- re-sent after a lost reply finds the document and changes nothing.
-- KEYS: 1 ledger hash, 2 events stream, 3 dataset document (the ledger hash when
--       there is no document: a ledger alone, in tests), 4 dataset index (zset)
-- ARGV: 1 dataset id, 2 document json ('' for none), 3 index score (epoch s), 4 actor,
--       5 now (iso), 6 n, then n pairs (measure, units)
if redis.call('EXISTS', KEYS[3]) == 1 then return 0 end
if ARGV[2] ~= '' then
  redis.call('SET', KEYS[3], ARGV[2])
  redis.call('ZADD', KEYS[4], ARGV[3], ARGV[1])
end
local event = {'kind', 'cap', 'release_id', '', 'actor', ARGV[4], 'at', ARGV[5]}
local n = tonumber(ARGV[6])
for i = 0, n - 1 do
  local m, u = ARGV[7 + 2 * i], ARGV[8 + 2 * i]
  redis.call('HSET', KEYS[1], 'cap:' .. m, u)
  table.insert(event, 'm:' .. m)
  table.insert(event, u)
end
redis.call('XADD', KEYS[2], '*', unpack(event))
return 1
