-- Whether a live run's heartbeat is at least `stale_s` seconds old by the Postgres clock
-- (`lumastra_heartbeat_stale`, migration 0017); no row for a run Postgres does not have.
-- Parameters: run_id, stale_s.
SELECT lumastra_heartbeat_stale(task_history, %(stale_s)s::float8)
  FROM task_history
 WHERE id = %(run_id)s
