-- Rows `running` since before `before` whose run is no longer live (it ended without its
-- trigger moving them, or is gone): `failed_transient` with a fresh backoff. A run still
-- pending behind a backlog is live, and its row is left alone. Returns each row's stage.
-- Parameters: before, now.
UPDATE media_item_stage_state s
   SET status = 'failed_transient',
       failures = s.failures + 1,
       next_eligible_at = %(now)s + coverage_backoff(s.failures + 1),
       last_error = 'wedged: run ' || s.run_id || ' is no longer live',
       finished_at = %(now)s,
       updated_at = %(now)s
 WHERE s.status = 'running'
   AND s.started_at < %(before)s
   AND NOT EXISTS (SELECT 1 FROM task_history h
                    WHERE h.id = s.run_id AND h.state IN ('pending', 'active', 'cancelling'))
RETURNING s.stage
