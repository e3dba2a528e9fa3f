-- Mark a queued release running; returns 0 if it already ran or ended.
-- KEYS: 1 release hash. ARGV: 1 now (iso), 2 worker name
if redis.call('HGET', KEYS[1], 'status') ~= 'queued' then return 0 end
redis.call('HSET', KEYS[1], 'status', 'running', 'started_at', ARGV[1], 'worker', ARGV[2])
return 1
