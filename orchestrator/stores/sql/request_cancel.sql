-- Someone asks a run to stop: → cancelling from one of `sources` (pending, active: the caller
-- may narrow them, e.g. backpressure cancels only runs no worker took). Returns the state the
-- run left, read under the row lock, so the caller knows whether a handler runs it (a run
-- not yet started is ended at once, `runs.cancel`). No row: refused.
-- Parameters: run_id, sources.
UPDATE task_history AS run
   SET state = 'cancelling',
       updated_at = now()
  FROM (SELECT id, state FROM task_history WHERE id = %(run_id)s FOR UPDATE) AS before
 WHERE run.id = before.id
   AND before.state = ANY(%(sources)s)
RETURNING before.state
