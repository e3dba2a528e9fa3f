-- Atomically end a reservation: 'commit' stores the output and moves the
-- held cost to committed; 'abort' refunds it and marks the release failed.
-- A release that already ended is left alone, so a redelivered task can
-- neither store a second result nor charge twice.
-- KEYS: 1 ledger hash, 2 events stream, 3 release hash, 4 reservation hash,
--       5 pending zset, 6 replay key
-- ARGV: 1 release id, 2 'commit' | 'abort', 3 payload json (output or error),
--       4 actor, 5 now (iso)
local rid, action = ARGV[1], ARGV[2]
local status = redis.call('HGET', KEYS[3], 'status')
if status ~= 'queued' and status ~= 'running' then return 0 end
local event = {'kind', action, 'release_id', rid, 'actor', ARGV[4], 'at', ARGV[5]}
local held = redis.call('HGETALL', KEYS[4])
for i = 1, #held, 2 do
  local m, u = held[i], held[i + 1]
  redis.call('HINCRBY', KEYS[1], 'reserved:' .. m, '-' .. u)
  if action == 'commit' then redis.call('HINCRBY', KEYS[1], 'committed:' .. m, u) end
  table.insert(event, 'm:' .. m)
  table.insert(event, u)
end
redis.call('DEL', KEYS[4])
redis.call('ZREM', KEYS[5], rid)
if action == 'commit' then
  redis.call('HSET', KEYS[3], 'status', 'succeeded', 'output', ARGV[3], 'finished_at', ARGV[5])
else
  redis.call('HSET', KEYS[3], 'status', 'failed', 'error', ARGV[3], 'finished_at', ARGV[5])
  if redis.call('GET', KEYS[6]) == rid then redis.call('DEL', KEYS[6]) end
end
redis.call('XADD', KEYS[2], '*', unpack(event))
return 1
