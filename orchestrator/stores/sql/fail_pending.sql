-- A pending run the reconciler gives up on (`recovery.pending`): past the pending deadline,
-- or recorded for an older processing_version. pending → failed by compare-and-set: still
-- pending, and pending for at least `older_than_s` seconds by the Postgres clock (a run put
-- back for a retry since it was read has a new `updated_at` and is left alone).
-- A pipeline run's stages end with it (`lumastra_close_stages`: never started → skipped).
-- Parameters: run_id, error (JSON text), older_than_s.
UPDATE task_history
   SET state = 'failed',
       error = %(error)s::jsonb,
       finished_at = now(),
       stages = lumastra_close_stages(stages),
       updated_at = now()
 WHERE id = %(run_id)s
   AND state = 'pending'
   AND GREATEST(updated_at, not_before) < now() - %(older_than_s)s::float8 * interval '1 second'
