-- cancelling → cancelled. The error is written only when one is given (a worker lost while
-- cancelling); otherwise the run keeps the error it had. Zero rows updated means refused.
-- A pipeline run's unfinished stages end (`lumastra_close_stages`, migration 0010).
-- Parameters: run_id, error (JSON text or NULL), finished_at.
UPDATE task_history
   SET state = 'cancelled',
       error = COALESCE(%(error)s::jsonb, error),
       finished_at = %(finished_at)s,
       stages = lumastra_close_stages(stages),
       updated_at = now()
 WHERE id = %(run_id)s
   AND state = 'cancelling'
