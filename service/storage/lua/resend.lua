-- Claim one re-send of a gone job for the sweeper (service/releases/sweeper.py), which then
-- publishes its task again. Only a job that is still queued or running, that no run
-- holds (no lease), and that has not read its data may be re-sent, and only while its
-- re-send count is below the bound: checked and counted in one step, so two sweepers
-- never both send, and a job that a run started (or that ended) meanwhile is left to it.
-- A re-sent task may meet its original message too (it was only delayed): start.lua runs
-- the job once, the other message finds the lease (it waits) or the ended status (no-op).
-- With ARGV[3] 'undo', give back a claim whose task could not be published (the broker
-- was down), so the next pass claims it again.
-- KEYS: 1 release hash, 2 lease key. ARGV: 1 now (epoch s), 2 bound (max re-sends),
--       3 'claim' | 'undo'
-- Returns the re-send's number (1, 2, ...), 0 if the job is not gone (leave it),
-- -1 if the bound is reached (the sweeper refunds it); for 'undo', the count left.
if ARGV[3] == 'undo' then
  if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
  redis.call('HDEL', KEYS[1], 'resent_at')
  return redis.call('HINCRBY', KEYS[1], 'resends', -1)
end
local status = redis.call('HGET', KEYS[1], 'status')
if status ~= 'queued' and status ~= 'running' then return 0 end
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
if redis.call('HEXISTS', KEYS[1], 'data_read') == 1 then return 0 end
local sent = tonumber(redis.call('HGET', KEYS[1], 'resends') or '0')
if sent >= tonumber(ARGV[2]) then return -1 end
redis.call('HSET', KEYS[1], 'resends', sent + 1, 'resent_at', ARGV[1])
return sent + 1
