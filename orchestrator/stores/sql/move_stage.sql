-- One stage of a live run moves to `target` (completed, failed or skipped) from a legal source
-- state (`sources`), with its result when it has one. Concurrent moves of one run queue on
-- the row lock, and each returns the stages as its own move left them: the last move of a
-- run sees every stage's end, which is how exactly one writer learns that the run is done.
-- No row comes back when the move is refused (the run ended, or the stage is elsewhere).
-- Parameters: run_id, stage, target, sources, live (run states), result (JSON text or NULL).
UPDATE task_history
   SET stages = jsonb_set(stages, ARRAY[%(stage)s], to_jsonb(%(target)s::text)),
       stage_results = CASE WHEN %(result)s::jsonb IS NULL THEN stage_results
                            ELSE jsonb_set(stage_results, ARRAY[%(stage)s], %(result)s::jsonb)
                       END,
       heartbeat_at = CASE WHEN state = 'active' THEN now() ELSE heartbeat_at END,
       updated_at = now()
 WHERE id = %(run_id)s
   AND state = ANY(%(live)s)
   AND stages ->> %(stage)s = ANY(%(sources)s)
RETURNING stages, stage_results
