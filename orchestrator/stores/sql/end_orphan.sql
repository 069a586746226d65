-- An orphan ends (`recovery.orphans`): active → failed or cancelling → cancelled (`target`
-- for `source`), by compare-and-set: the run is still in the state it was judged in, and its
-- heartbeat is still at least `stale_s` seconds old by the Postgres clock
-- (`lumastra_heartbeat_stale`, migration 0017), so a heartbeat that landed since keeps it.
-- A pipeline run's unfinished stages end with it (`lumastra_close_stages`).
-- Parameters: run_id, source, target, error (JSON text), stale_s.
UPDATE task_history
   SET state = %(target)s,
       error = %(error)s::jsonb,
       finished_at = now(),
       stages = lumastra_close_stages(stages),
       updated_at = now()
 WHERE id = %(run_id)s
   AND state = %(source)s
   AND lumastra_heartbeat_stale(task_history, %(stale_s)s::float8)
