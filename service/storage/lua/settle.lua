-- Atomically end a reservation:
--   'commit' stores the output and moves the held cost to committed;
--   'fail'   moves the held cost to committed and marks the release failed: the job
--            failed (or its worker died) after it read the data, so it is charged;
--   'abort'  refunds it and marks the release failed (failed before reading the data,
--            or never started);
--   'cancel' refunds it and marks the release cancelled, only if not yet running (a
--            release still 'pricing' holds nothing: it is cancelled, nothing refunded).
-- A release that already ended is left alone, so a redelivered task can
-- neither store a second result nor charge twice. A worker settles only while
-- its run holds the lease (ARGV[6] is its run token): a run that stalled past its
-- lease while another took the job over commits nothing, and refunds nothing.
-- The sweeper passes '!' (only if no run holds a lease), the API '' (no check).
-- KEYS: 1 ledger hash, 2 events stream, 3 release hash, 4 reservation hash,
--       5 pending zset, 6 replay key, 7 lease key, 8 outbox zset, 9 dataset's pending
--       zset, 10 failed zset, 11 dataset's failed zset
-- ARGV: 1 release id, 2 action, 3 payload json (output or error), 4 actor, 5 now (iso),
--       6 lease holder ('' | '!' | run token), 7 output table version ('' for none),
--       8 now (epoch s), 9 digest of the request the caller stored in the document store
--       (the first 16 hex digits of its SHA-1; '' for none), 10 attempt whose result file
--       is the output ('': the output is ARGV[3] itself, kept in the hash)
-- With ARGV[9], the hash's 'request' is dropped for the digest ('doc') only if it still has
-- that digest (a request rewritten meanwhile stays); its 'replay_key' pointer (only this
-- script reads it, before this point) goes too: a finished release's hash keeps values of
-- at most 64 bytes, the listpack encoding (service.storage.release_documents).
--       last: this call's id (service.storage.durable.Step adds it; the same on every re-send)
-- Returns 1 if settled (by this call, or by this same call sent before: a re-send after
-- a lost reply or a failover must not read as 'ended', or the worker would discard the
-- output it committed), 0 if it had already ended, -1 if running (cancel only),
-- -2 if the lease condition failed (nothing changed).
local rid, action, holder = ARGV[1], ARGV[2], ARGV[6]
local call_id = ARGV[#ARGV]
if redis.call('HGET', KEYS[3], 'settled_by') == call_id then return 1 end
local status = redis.call('HGET', KEYS[3], 'status')
-- a release still being priced holds nothing yet: it can only be cancelled
if status == 'pricing' and action ~= 'cancel' then return 0 end
if status ~= 'queued' and status ~= 'running' and status ~= 'pricing' then return 0 end
if action == 'cancel' and status == 'running' then return -1 end
local lease = redis.call('GET', KEYS[7])
if holder == '!' then
  if lease then return -2 end
elseif holder ~= '' and lease ~= holder then
  return -2
end
local charge = (action == 'commit' or action == 'fail')
local owner = redis.call('HGET', KEYS[4], 'actor') or ''
local kind = action
if action == 'fail' then kind = 'commit' end
local event = {'kind', kind, 'release_id', rid, 'actor', ARGV[4], 'at', ARGV[5]}
local version = redis.call('HGET', KEYS[4], 'version')
if version then
  table.insert(event, 'version')
  table.insert(event, version)
end
if charge then
  table.insert(event, 'outcome')
  table.insert(event, (action == 'commit') and 'succeeded' or 'failed')
end
local held = redis.call('HGETALL', KEYS[4])
for i = 1, #held, 2 do
  local field, u = held[i], held[i + 1]
  local scope, m = string.sub(field, 1, 2), string.sub(field, 3)
  local prefix = nil
  if scope == 'm:' then
    prefix = ''
    table.insert(event, field)
    table.insert(event, u)
  elseif scope == 'a:' then
    prefix = 'alloc:' .. owner .. ':'
  end
  -- a hold of 0 units moves nothing; and '-0' is no integer to HINCRBY, which would fail
  -- the whole settle
  if prefix and u ~= '0' then
    redis.call('HINCRBY', KEYS[1], prefix .. 'reserved:' .. m, '-' .. u)
    if charge then redis.call('HINCRBY', KEYS[1], prefix .. 'committed:' .. m, u) end
  end
end
-- a charge is final: mark it (a failed release may be charged or refunded)
if charge then redis.call('HSET', KEYS[3], 'charged', '1') end
redis.call('DEL', KEYS[4], KEYS[7])
redis.call('ZREM', KEYS[5], rid)
redis.call('ZREM', KEYS[8], rid)
redis.call('ZREM', KEYS[9], rid)
if action == 'commit' then
  redis.call('HSET', KEYS[3], 'status', 'succeeded', 'finished_at', ARGV[5])
  if ARGV[10] ~= '' then
    redis.call('HSET', KEYS[3], 'result', ARGV[10])
  else
    redis.call('HSET', KEYS[3], 'output', ARGV[3])
  end
  if ARGV[7] ~= '' then redis.call('HSET', KEYS[3], 'table', ARGV[7]) end
else
  local final = (action == 'cancel') and 'cancelled' or 'failed'
  redis.call('HSET', KEYS[3], 'status', final, 'error', ARGV[3], 'finished_at', ARGV[5])
  if final == 'failed' then
    redis.call('ZADD', KEYS[10], ARGV[8], rid)
    redis.call('ZADD', KEYS[11], ARGV[8], rid)
  end
  -- a refunded request may be asked again; a charged one stays its answer
  if not charge and redis.call('GET', KEYS[6]) == rid then redis.call('DEL', KEYS[6]) end
end
if ARGV[9] ~= '' then
  local req = redis.call('HGET', KEYS[3], 'request')
  if req and string.sub(redis.sha1hex(req), 1, 16) == ARGV[9] then
    redis.call('HDEL', KEYS[3], 'request')
    redis.call('HSET', KEYS[3], 'doc', ARGV[9])
  end
end
redis.call('HDEL', KEYS[3], 'replay_key')
redis.call('HSET', KEYS[3], 'settled_by', call_id)
if ARGV[9] ~= '' and redis.call('HEXISTS', KEYS[3], 'request') == 0 then
  -- a hash once holding a long value stays hashtable-encoded: written again, it is a
  -- listpack (every value now <= 64 bytes), a third of the memory
  local all = redis.call('HGETALL', KEYS[3])
  redis.call('DEL', KEYS[3])
  redis.call('HSET', KEYS[3], unpack(all))
end
redis.call('XADD', KEYS[2], '*', unpack(event))
return 1
