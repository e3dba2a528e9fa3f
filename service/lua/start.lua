-- Mark a release running and take its lease. A queued release starts; a
-- running one is taken over only if its lease lapsed (the worker running it
-- died), so a redelivered task re-runs a job that stored nothing, and skips
-- one that is alive or ended. Returns 1 if the caller should run it.
-- KEYS: 1 release hash, 2 lease key. ARGV: 1 now (iso), 2 worker, 3 lease ttl (s)
local status = redis.call('HGET', KEYS[1], 'status')
if status == 'queued' or (status == 'running' and redis.call('EXISTS', KEYS[2]) == 0) then
  redis.call('HSET', KEYS[1], 'status', 'running', 'started_at', ARGV[1], 'worker', ARGV[2])
  redis.call('HINCRBY', KEYS[1], 'attempts', 1)
  redis.call('SET', KEYS[2], ARGV[2], 'EX', ARGV[3])
  return 1
end
return 0
