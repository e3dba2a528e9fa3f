-- Change a dataset's document for one of its versions (uploaded, made current, retired)
-- and record it in the dataset's audit stream, in one step: a compare-and-set on the
-- document (the caller read ARGV[1] and built ARGV[2] from it; another change in
-- between answers 'conflict' and the caller reads again), so concurrent version
-- changes never lose one another, and the event is written exactly when the document
-- changes. A call re-sent after a lost reply finds its own document and answers 'ok'.
-- The version's retirement is also the ledger hash's field 'retired:v<version>', set here
-- in the same step as the document (and cleared when a version is made current, which
-- the caller allows only for an active one): reserve.lua reads it, so a release reserved
-- after the retirement is refused even if its API read the document before it.
-- KEYS: 1 dataset document, 2 events stream, 3 idempotency hash, 4 ledger hash
-- ARGV: 1 document as read, 2 new document, 3 actions, one event each, comma-separated
--       (uploaded | current | retired: 'uploaded,current' for one uploaded current),
--       4 version, 5 actor, 6 now (iso), 7 request fingerprint ('' without an
--       Idempotency-Key), 8 idempotency ttl (s)
-- Returns {outcome, version}: 'ok' (this call), 'conflict' (the document changed),
-- 'idempotent' (the version the key uploaded) or 'idem_mismatch'.
-- a re-send of this very call (its document is stored) first: else its own key would
-- read as another upload's
local current = redis.call('GET', KEYS[1])
if current == ARGV[2] then return {'ok', ARGV[4]} end
if ARGV[7] ~= '' then
  local prev = redis.call('HGET', KEYS[3], 'version')
  if prev then
    if redis.call('HGET', KEYS[3], 'fp') ~= ARGV[7] then return {'idem_mismatch', prev} end
    return {'idempotent', prev}
  end
end
if current ~= ARGV[1] then return {'conflict', ''} end
redis.call('SET', KEYS[1], ARGV[2])
for action in string.gmatch(ARGV[3], '[^,]+') do
  if action == 'retired' then redis.call('HSET', KEYS[4], 'retired:v' .. ARGV[4], '1') end
  if action == 'current' then redis.call('HDEL', KEYS[4], 'retired:v' .. ARGV[4]) end
  redis.call('XADD', KEYS[2], '*', 'kind', 'version', 'action', action, 'version', ARGV[4],
             'release_id', '', 'actor', ARGV[5], 'at', ARGV[6])
end
if ARGV[7] ~= '' then
  redis.call('HSET', KEYS[3], 'version', ARGV[4], 'fp', ARGV[7])
  redis.call('EXPIRE', KEYS[3], ARGV[8])
end
return {'ok', ARGV[4]}
