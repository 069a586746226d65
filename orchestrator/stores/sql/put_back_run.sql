-- A claim's run goes back in line for its next attempt: active → pending (`runs.put_back` for a
-- claim whose worker was lost, the runner for a TransientError). Fenced by that claim: the run
-- is still active, still `owner`'s, still at the claim's attempt count, so a claim that came
-- meanwhile keeps the run. With `stale_s` (NULL: no condition), only while the run's heartbeat
-- is at least that many seconds old (`lumastra_heartbeat_stale`, migration 0017): a heartbeat
-- that landed since the claim was judged lost keeps it too.
-- The owner is cleared and the attempt count kept: the next claim counts the next attempt,
-- and the lost claim's late end, which names the attempt it counted, no longer matches
-- (end_run.sql). `error` says why (the lost attempt, its owner); `not_before` is the backoff.
-- `refund` 1 gives the claim's attempt back (a run stopped at its window's close did not fail:
-- the next claim counts the same attempt again). Only the claim's own handler asks it, once the
-- handler has returned and its watch let go, so no late write of that claim can follow; its
-- `not_before` is NULL (a pending run with no attempt and a not_before is a delayed start).
-- Parameters: run_id, owner, attempts, error (JSON text), not_before, stale_s (or NULL), refund.
UPDATE task_history
   SET state = 'pending',
       owner_instance_id = '',
       attempts = attempts - %(refund)s::int,
       not_before = %(not_before)s,
       error = %(error)s::jsonb,
       updated_at = now()
 WHERE id = %(run_id)s
   AND state = 'active'
   AND owner_instance_id = %(owner)s
   AND attempts = %(attempts)s
   AND (%(stale_s)s::float8 IS NULL OR lumastra_heartbeat_stale(task_history, %(stale_s)s::float8))
