-- Atomically: answer a retried (Idempotency-Key) or replayed request with the
-- stored release, or check every measure's cap (and the actor's allocation,
-- if it has one) and hold the cost.
-- KEYS: 1 ledger hash, 2 events stream, 3 release hash, 4 reservation hash,
--       5 replay key, 6 idempotency hash, 7 pending zset, 8 all-releases zset,
--       9 outbox zset, 10 dataset's releases zset, 11 actor's releases zset,
--       12 dataset's pending zset
-- A new release enters every list index here, and the outbox: it stays there until
-- its task is published, so a release whose API died before enqueueing is enqueued
-- by the sweeper or the next retry instead of being refunded (an accepted release runs).
-- ARGV: 1 release id, 2 fingerprint (of the request, for the idempotency hash),
--       3 actor key id, 4 now (iso), 5 now (epoch s), 6 request json, 7 idempotency ttl,
--       8 use idem (0/1), 9 use replay (0/1), 10 mode, 11 n measures, then n pairs
--       (measure, units as integer string), then the notion lock ('' | 'dp' | 'noiseless')
-- Notion lock (noiseless spec §11.3): a dataset admitting both DP and noiseless releases,
-- without the operator's allow_mixed_noiseless_dp, is locked to the notion of its first
-- reserved release, here in the same script that checks the caps, so two concurrent
-- first releases of either kind can never both be held: the loser is {'notion_locked',
-- lock} and nothing changes. The lock is the ledger hash's 'notion_lock' field.
-- Modes:
--   'new'     a release whose cost the API computed: reserve it, status 'queued';
--   'pricing' a release whose cost needs a cold heavy precomputation: hold nothing, create
--             it in status 'pricing' (indexed, in the outbox: its pricing job is sent);
--   'priced'  the pricing job reserves that release (its idempotency key was recorded at
--             creation): once only, whatever the number of runs. A release no longer in
--             'pricing' answers {'ended', id, status} and nothing changes, so a redelivered
--             or doubled job never reserves twice.
-- Indexes are added with NX: a priced release keeps its place (its creation time).
local rid, fp, actor, mode = ARGV[1], ARGV[2], ARGV[3], ARGV[10]
-- a create re-sent (by redis-py after a lost reply, or after a failover): it happened,
-- change nothing (release ids are new per request, so the release is this call's)
if mode == 'pricing' and redis.call('EXISTS', KEYS[3]) == 1 then return {'pricing', rid} end
if mode == 'new' and redis.call('EXISTS', KEYS[3]) == 1 then return {'reserved', rid} end
if mode == 'priced' then
  local status = redis.call('HGET', KEYS[3], 'status')
  if status ~= 'pricing' then return {'ended', rid, status or ''} end
end
if ARGV[8] == '1' then
  local prev = redis.call('HGET', KEYS[6], 'id')
  if prev then
    if redis.call('HGET', KEYS[6], 'fp') ~= fp then return {'idem_mismatch', prev} end
    return {'idempotent', prev}
  end
end
if ARGV[9] == '1' then
  local prev = redis.call('GET', KEYS[5])
  if prev then
    if ARGV[8] == '1' then
      redis.call('HSET', KEYS[6], 'id', prev, 'fp', fp)
      redis.call('EXPIRE', KEYS[6], ARGV[7])
    end
    return {'replay', prev}
  end
end
if redis.call('HGET', KEYS[1], 'retired') == '1' then return {'retired', ''} end
-- a retired version (version.lua sets 'retired:v<k>' in the same step that retires it in
-- the dataset's document) takes no new release, whatever the API read before: refused
-- {'version_retired', k} and nothing changes. Releases reserved before stay and run.
local version = cjson.decode(ARGV[6]).dataset_version
if type(version) == 'number' then version = string.format('%d', version) else version = nil end
if version and redis.call('HGET', KEYS[1], 'retired:v' .. version) == '1' then
  return {'version_retired', version}
end

local function num(field) return tonumber(redis.call('HGET', KEYS[1], field) or '0') end
local n = tonumber(ARGV[11])
local lock = ARGV[12 + 2 * n] or ''
if lock ~= '' then
  local held = redis.call('HGET', KEYS[1], 'notion_lock')
  if held and held ~= lock then return {'notion_locked', held} end
end
-- A measure the dataset's caps do not name is not admitted (no default caps): refused
-- {'not_admitted', m}. An actor whose allocation is 'listed' (admin.lua marks every
-- allocation it writes) may spend only the measures it lists: any other is refused
-- {'exhausted', m, c, 0, 'allocation', 'unlisted'}; a 'legacy' allocation (from before
-- that rule, marked by the policy migration) limits only the measures it lists.
local a = 'alloc:' .. actor .. ':'
local rule = redis.call('HGET', KEYS[1], a .. 'scope')
local scoped = {}
for i = 0, n - 1 do
  local m, c = ARGV[12 + 2 * i], tonumber(ARGV[13 + 2 * i])
  if redis.call('HEXISTS', KEYS[1], 'cap:' .. m) == 0 then return {'not_admitted', m} end
  local remaining = num('cap:' .. m) - num('committed:' .. m) - num('reserved:' .. m)
  if c > remaining then return {'exhausted', m, c, remaining, 'dataset'} end
  if redis.call('HEXISTS', KEYS[1], a .. 'cap:' .. m) == 1 then
    local left = num(a .. 'cap:' .. m) - num(a .. 'committed:' .. m) - num(a .. 'reserved:' .. m)
    if c > left then return {'exhausted', m, c, left, 'allocation'} end
    scoped[m] = true
  elseif rule == 'listed' and c > 0 then
    return {'exhausted', m, c, 0, 'allocation', 'unlisted'}
  end
end

if mode == 'pricing' then
  redis.call('HSET', KEYS[3], 'status', 'pricing', 'request', ARGV[6], 'created_at', ARGV[4],
             'actor', actor)
else
  local event = {'kind', 'reserve', 'release_id', rid, 'actor', actor, 'at', ARGV[4]}
  redis.call('HSET', KEYS[4], 'actor', actor)
  -- the audit stream says which dataset version the release uses (and settle.lua, from
  -- the reservation, which one its commit or refund was of)
  if version then
    table.insert(event, 'version')
    table.insert(event, version)
    redis.call('HSET', KEYS[4], 'version', version)
  end
  for i = 0, n - 1 do
    local m, u = ARGV[12 + 2 * i], ARGV[13 + 2 * i]
    redis.call('HINCRBY', KEYS[1], 'reserved:' .. m, u)
    redis.call('HSET', KEYS[4], 'm:' .. m, u)
    if scoped[m] then
      redis.call('HINCRBY', KEYS[1], 'alloc:' .. actor .. ':reserved:' .. m, u)
      redis.call('HSET', KEYS[4], 'a:' .. m, u)
    end
    table.insert(event, 'm:' .. m)
    table.insert(event, u)
  end
  redis.call('HSET', KEYS[3], 'status', 'queued', 'request', ARGV[6], 'replay_key', KEYS[5],
             'actor', actor)
  if mode == 'new' then redis.call('HSET', KEYS[3], 'created_at', ARGV[4]) end
  if ARGV[9] == '1' then redis.call('SET', KEYS[5], rid) end
  if lock ~= '' and redis.call('HSETNX', KEYS[1], 'notion_lock', lock) == 1 then
    table.insert(event, 'notion_lock')
    table.insert(event, lock)
  end
  redis.call('XADD', KEYS[2], '*', unpack(event))
end
redis.call('ZADD', KEYS[7], 'NX', ARGV[5], rid)
redis.call('ZADD', KEYS[8], 'NX', ARGV[5], rid)
redis.call('ZADD', KEYS[9], ARGV[5], rid)
redis.call('ZADD', KEYS[10], 'NX', ARGV[5], rid)
redis.call('ZADD', KEYS[11], 'NX', ARGV[5], rid)
redis.call('ZADD', KEYS[12], 'NX', ARGV[5], rid)
if ARGV[8] == '1' then
  redis.call('HSET', KEYS[6], 'id', rid, 'fp', fp)
  redis.call('EXPIRE', KEYS[6], ARGV[7])
end
if mode == 'pricing' then return {'pricing', rid} end
return {'reserved', rid}
