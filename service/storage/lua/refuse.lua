-- End a release that was still 'pricing' as 'refused': its pricing job computed the
-- cost and the reservation (or the request) was refused, or the cost could not be
-- computed. It held nothing, so nothing is refunded or charged; the audit stream
-- records the refusal and its code. A release that left 'pricing' is left alone.
-- KEYS: 1 release hash, 2 events stream, 3 pending zset, 4 dataset's pending zset,
--       5 outbox zset, 6 failed zset, 7 dataset's failed zset
-- ARGV: 1 release id, 2 error json, 3 actor, 4 now (iso), 5 now (epoch s), 6 error code
-- Returns 1 if refused here, 0 if the release was not pricing.
local rid = ARGV[1]
if redis.call('HGET', KEYS[1], 'status') ~= 'pricing' then return 0 end
redis.call('HSET', KEYS[1], 'status', 'refused', 'error', ARGV[2], 'finished_at', ARGV[4])
redis.call('ZREM', KEYS[3], rid)
redis.call('ZREM', KEYS[4], rid)
redis.call('ZREM', KEYS[5], rid)
redis.call('ZADD', KEYS[6], ARGV[5], rid)
redis.call('ZADD', KEYS[7], ARGV[5], rid)
redis.call('XADD', KEYS[2], '*', 'kind', 'refuse', 'release_id', rid, 'actor', ARGV[3],
           'at', ARGV[4], 'code', ARGV[6])
return 1
