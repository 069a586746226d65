-- A run ends (completed or failed), only from a state DESIGN §4 allows (`sources`). The
-- result and error are replaced: a run that failed an attempt and then completed keeps no
-- error. Zero rows updated means refused; the caller reads the state to say why.
-- A pipeline run's stages end with it (`lumastra_close_stages`, migration 0010): those that
-- never started are `skipped`, one still running is `failed` (its late end is refused).
-- Parameters: run_id, target, sources, result (JSON text or NULL), error (JSON text or NULL),
-- finished_at.
UPDATE task_history
   SET state = %(target)s,
       result = %(result)s::jsonb,
       error = %(error)s::jsonb,
       finished_at = %(finished_at)s,
       stages = lumastra_close_stages(stages),
       updated_at = now()
 WHERE id = %(run_id)s
   AND state = ANY(%(sources)s)
