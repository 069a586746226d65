-- The state of one run, or no row: what a refused guarded UPDATE reports as `current`.
-- Parameters: run_id.
SELECT state FROM task_history WHERE id = %(run_id)s
