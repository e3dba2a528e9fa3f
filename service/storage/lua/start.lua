-- Mark a release running and give the caller its lease, under a token of this run
-- only. A queued release starts; a running one is taken over only if its lease
-- lapsed (the worker running it died or stalled), so a redelivered task re-runs a
-- job that stored nothing, and skips one that is alive or ended. The lease names
-- the run, not the worker: two runs on one host never share it, and a stalled run
-- that wakes up finds the lease is no longer its own (lease.lua, settle.lua).
-- A started release leaves the outbox: its task was evidently sent.
-- A release may have several messages (a redelivery, the sweeper's re-send of a job it
-- found gone, its original arriving late from kombu's unacked set): the first to start it
-- runs it; the others find the lease (their task waits and looks again) or the ended
-- status (nothing to do), so it runs to one output.
-- KEYS: 1 release hash, 2 lease key, 3 outbox zset. ARGV: 1 now (iso), 2 worker, 3 lease ttl (s),
--       4 run token, 5 release id
-- Returns the run's attempt number (1, 2, ...) if the caller should run it, else 0.
-- the same call re-sent (after a lost reply or a failover) finds its own token: same answer
if redis.call('GET', KEYS[2]) == ARGV[4] then
  return tonumber(redis.call('HGET', KEYS[1], 'attempts'))
end
local status = redis.call('HGET', KEYS[1], 'status')
if status == 'queued' or (status == 'running' and redis.call('EXISTS', KEYS[2]) == 0) then
  redis.call('HSET', KEYS[1], 'status', 'running', 'started_at', ARGV[1], 'worker', ARGV[2])
  local attempt = redis.call('HINCRBY', KEYS[1], 'attempts', 1)
  redis.call('SET', KEYS[2], ARGV[4], 'EX', ARGV[3])
  redis.call('ZREM', KEYS[3], ARGV[5])
  return attempt
end
return 0
