-- Set caps, of the dataset or of one key's allocation, atomically: never
-- below what is committed + reserved at that level, and an allocation never
-- above the dataset's cap. Records the change in the audit stream.
-- KEYS: 1 ledger hash, 2 events stream
-- ARGV: 1 kind ('cap' | 'allocation'), 2 actor, 3 now (iso), 4 key id ('' for cap),
--       5 n, then n pairs (measure, units)
local kind, key = ARGV[1], ARGV[4]
local prefix = ''
if kind == 'allocation' then prefix = 'alloc:' .. key .. ':' end
local function num(field) return tonumber(redis.call('HGET', KEYS[1], field) or '0') end
local n = tonumber(ARGV[5])
for i = 0, n - 1 do
  local m, c = ARGV[6 + 2 * i], tonumber(ARGV[7 + 2 * i])
  local held = num(prefix .. 'committed:' .. m) + num(prefix .. 'reserved:' .. m)
  if c < held then return {'below_spent', m, held} end
  if kind == 'allocation' and c > num('cap:' .. m) then
    return {'above_dataset', m, num('cap:' .. m)}
  end
end
local event = {'kind', kind, 'release_id', '', 'actor', ARGV[2], 'at', ARGV[3], 'key_id', key}
for i = 0, n - 1 do
  local m, u = ARGV[6 + 2 * i], ARGV[7 + 2 * i]
  redis.call('HSET', KEYS[1], prefix .. 'cap:' .. m, u)
  table.insert(event, 'm:' .. m)
  table.insert(event, u)
end
redis.call('XADD', KEYS[2], '*', unpack(event))
return {'ok', '', 0}
