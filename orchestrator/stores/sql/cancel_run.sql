-- cancelling → cancelled. The error is written only when one is given (a worker lost while
-- cancelling); otherwise the run keeps the error it had. Zero rows updated means refused.
-- Parameters: run_id, error (JSON text or NULL), finished_at.
UPDATE task_history
   SET state = 'cancelled',
       error = COALESCE(%(error)s::jsonb, error),
       finished_at = %(finished_at)s,
       updated_at = now()
 WHERE id = %(run_id)s
   AND state = 'cancelling'
