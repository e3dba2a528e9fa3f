-- Change caps, of the dataset and of any number of keys' allocations, all or nothing:
-- every change is checked first (never below what is committed + reserved at that
-- level; an allocation never above the dataset's cap, as this same call leaves it),
-- and only if all pass is any written and recorded in the audit stream, one event
-- per change. A PATCH refused for one allocation therefore changes no cap.
-- An allocation written here is 'listed' (field alloc:<key>:scope): its key may spend the
-- measures it lists and none of the others (reserve.lua), a legacy one included.
-- KEYS: 1 ledger hash, 2 events stream
-- ARGV: 1 actor, 2 now (iso), 3 number of changes, then per change:
--       kind ('cap' | 'allocation'), key id ('' for cap), n, then n pairs (measure, units)
local function num(field) return tonumber(redis.call('HGET', KEYS[1], field) or '0') end
local changes = {}
local new_caps = {}
local pos = 4
for _ = 1, tonumber(ARGV[3]) do
  local change = {kind = ARGV[pos], key = ARGV[pos + 1], pairs = {}}
  local n = tonumber(ARGV[pos + 2])
  pos = pos + 3
  for _ = 1, n do
    table.insert(change.pairs, {ARGV[pos], ARGV[pos + 1]})
    pos = pos + 2
  end
  if change.kind == 'cap' then
    for _, p in ipairs(change.pairs) do new_caps[p[1]] = tonumber(p[2]) end
  end
  table.insert(changes, change)
end
local function cap(m)
  if new_caps[m] ~= nil then return new_caps[m] end
  return num('cap:' .. m)
end
for _, change in ipairs(changes) do
  local prefix = ''
  if change.kind == 'allocation' then prefix = 'alloc:' .. change.key .. ':' end
  for _, p in ipairs(change.pairs) do
    local m, c = p[1], tonumber(p[2])
    local held = num(prefix .. 'committed:' .. m) + num(prefix .. 'reserved:' .. m)
    if c < held then return {'below_spent', m, held, change.key} end
    if change.kind == 'allocation' and c > cap(m) then
      return {'above_dataset', m, cap(m), change.key}
    end
  end
end
for _, change in ipairs(changes) do
  local prefix = ''
  if change.kind == 'allocation' then prefix = 'alloc:' .. change.key .. ':' end
  local event = {'kind', change.kind, 'release_id', '', 'actor', ARGV[1], 'at', ARGV[2],
                 'key_id', change.key}
  for _, p in ipairs(change.pairs) do
    redis.call('HSET', KEYS[1], prefix .. 'cap:' .. p[1], p[2])
    table.insert(event, 'm:' .. p[1])
    table.insert(event, p[2])
  end
  if change.kind == 'allocation' and #change.pairs > 0 then
    redis.call('HSET', KEYS[1], prefix .. 'scope', 'listed')
  end
  redis.call('XADD', KEYS[2], '*', unpack(event))
end
return {'ok', '', 0, ''}
