-- Register a dataset and open its ledger, at most once: the document, its place
-- in the dataset index, its caps and the audit event that records them. A call
-- re-sent after a lost reply finds the document and changes nothing; an upload
-- retried under the same Idempotency-Key finds the dataset registered by the first.
-- KEYS: 1 ledger hash, 2 events stream, 3 dataset document (the ledger hash when
--       there is no document: a ledger alone, in tests), 4 dataset index (zset),
--       5 idempotency hash
-- ARGV: 1 dataset id, 2 document json ('' for none), 3 index score (epoch s), 4 actor,
--       5 now (iso), 6 request fingerprint ('' without an Idempotency-Key),
--       7 idempotency ttl (s), 8 n, then n pairs (measure, units)
-- Returns {outcome, dataset id}: 'opened' (this call), 'exists' (an earlier call with
-- this id), 'idempotent' (the key's dataset) or 'idem_mismatch' (the key's, for other
-- metadata).
if ARGV[6] ~= '' then
  local prev = redis.call('HGET', KEYS[5], 'id')
  if prev then
    if redis.call('HGET', KEYS[5], 'fp') ~= ARGV[6] then return {'idem_mismatch', prev} end
    return {'idempotent', prev}
  end
end
if redis.call('EXISTS', KEYS[3]) == 1 then return {'exists', ARGV[1]} end
if ARGV[2] ~= '' then
  redis.call('SET', KEYS[3], ARGV[2])
  redis.call('ZADD', KEYS[4], ARGV[3], ARGV[1])
end
local event = {'kind', 'cap', 'release_id', '', 'actor', ARGV[4], 'at', ARGV[5]}
local n = tonumber(ARGV[8])
for i = 0, n - 1 do
  local m, u = ARGV[9 + 2 * i], ARGV[10 + 2 * i]
  redis.call('HSET', KEYS[1], 'cap:' .. m, u)
  table.insert(event, 'm:' .. m)
  table.insert(event, u)
end
redis.call('XADD', KEYS[2], '*', unpack(event))
-- a dataset opened now never held an exact-increment interval charge (issue #27): the
-- recharge migration (service.policy.recharge) has nothing to do for it
redis.call('HSET', KEYS[1], 'recharged:interval', '1')
if ARGV[6] ~= '' then
  redis.call('HSET', KEYS[5], 'id', ARGV[1], 'fp', ARGV[6])
  redis.call('EXPIRE', KEYS[5], ARGV[7])
end
return {'opened', ARGV[1]}
