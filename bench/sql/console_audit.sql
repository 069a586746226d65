-- bench/console.py, after console_history.sql: Postgres's own audit of every change of state
-- (the triggers were off for the load): born pending, claimed, ended.
-- Parameters: none.
INSERT INTO task_history_audit (run_id, from_state, to_state, at)
SELECT t.id, s.from_state, s.to_state, s.at
FROM task_history AS t
CROSS JOIN LATERAL (VALUES
  (NULL, 'pending', t.created_at),
  ('pending', CASE WHEN t.state = 'pending' THEN NULL ELSE 'active' END, t.started_at),
  ('active', CASE WHEN t.state IN ('completed', 'failed', 'cancelled') THEN t.state END,
   t.finished_at)
) AS s (from_state, to_state, at)
WHERE s.to_state IS NOT NULL;
