-- Record a dataset's legacy policy explicitly, at most once (service.policy.migrate): its
-- document gains the notions and the record-level permission it had implicitly, every
-- allocation already in its ledger is marked 'legacy' (its unlisted measures stay
-- unlimited, as they were; one written later is 'listed'), and one 'policy' event records
-- it. A compare-and-set on the document: one read by the caller that changed meanwhile
-- answers 'conflict' and nothing changes (the caller reads it again).
-- KEYS: 1 dataset document, 2 ledger hash, 3 events stream
-- ARGV: 1 the document as read, 2 the migrated document, 3 actor, 4 now (iso),
--       5 notions (comma-separated), 6 record level ('1' | '0')
local raw = redis.call('GET', KEYS[1])
if not raw then return {'missing', ''} end
if raw ~= ARGV[1] then return {'conflict', ''} end
local legacy = {}
local fields = redis.call('HKEYS', KEYS[2])
for _, f in ipairs(fields) do
  local key = string.match(f, '^alloc:([^:]+):cap:')
  if key and not legacy[key] and redis.call('HEXISTS', KEYS[2], 'alloc:' .. key .. ':scope') == 0 then
    legacy[key] = true
  end
end
local keys = {}
for key, _ in pairs(legacy) do table.insert(keys, key) end
table.sort(keys)
for _, key in ipairs(keys) do
  redis.call('HSET', KEYS[2], 'alloc:' .. key .. ':scope', 'legacy')
end
redis.call('SET', KEYS[1], ARGV[2])
redis.call('XADD', KEYS[3], '*', 'kind', 'policy', 'release_id', '', 'actor', ARGV[3],
           'at', ARGV[4], 'action', 'migrated', 'notions', ARGV[5], 'record_level', ARGV[6],
           'legacy_allocations', table.concat(keys, ','))
return {'migrated', table.concat(keys, ',')}
