-- One stage of a live run moves to `target` (completed, failed, skipped, or back to waiting
-- for its next attempt) from a legal source state (`sources`), with its result when it has
-- one, its step record's new fields (`step`, merged into the record) and the cost this attempt
-- spent (`cost`, added to the run's cost_breakdown). Concurrent moves of one run queue on the
-- row lock, and each returns the stages as its own move left them: the last move of a run
-- sees every stage's end, which is how exactly one writer learns that the run is done.
-- No row comes back when the move is refused (the run ended, or the stage is elsewhere).
-- Parameters: run_id, stage, target, sources, live (run states), result, step, cost (JSON
-- text or NULL each).
UPDATE task_history
   SET stages = jsonb_set(stages, ARRAY[%(stage)s], to_jsonb(%(target)s::text)),
       stage_results = CASE WHEN %(result)s::jsonb IS NULL THEN stage_results
                            ELSE jsonb_set(stage_results, ARRAY[%(stage)s], %(result)s::jsonb)
                       END,
       steps = CASE WHEN %(step)s::jsonb IS NULL THEN steps
                    ELSE jsonb_set(steps, ARRAY[%(stage)s],
                                   COALESCE(steps -> %(stage)s, '{}'::jsonb) || %(step)s::jsonb)
               END,
       cost_breakdown = lumastra_add_costs(cost_breakdown, %(cost)s::jsonb),
       heartbeat_at = CASE WHEN state = 'active' THEN now() ELSE heartbeat_at END,
       updated_at = now()
 WHERE id = %(run_id)s
   AND state = ANY(%(live)s)
   AND stages ->> %(stage)s = ANY(%(sources)s)
RETURNING stages, stage_results
