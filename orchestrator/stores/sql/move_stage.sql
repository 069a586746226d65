-- One stage of a live run moves to `target` (completed, failed, skipped, or back to waiting
-- for its next attempt) from a legal source state (`sources`), with its result when it has
-- one, its step record's new fields (`step`, merged into the record) and the cost this attempt
-- spent (`cost`, added to the run's cost_breakdown). Concurrent moves of one run queue on the
-- row lock, and each returns the stages as its own move left them: the last move of a run
-- sees every stage's end, which is how exactly one writer learns that the run is done.
-- No row comes back when the move is refused (the run ended, or the stage is elsewhere).
-- `claimer` (NULL: any) fences a stage's own end to its latest claim (the step record's
-- `owner`): a stage retried after its claimer was lost refuses the old claim's late end.
-- `stale_s` (NULL: no condition) moves it only while the run's heartbeat is at least that many
-- seconds old by the Postgres clock (`lumastra_heartbeat_stale`, migration 0017: the
-- reconciler's retry of a stage whose claimer is gone).
-- Parameters: run_id, stage, target, sources, live (run states), result, step, cost (JSON
-- text or NULL each), claimer, stale_s.
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
   AND (%(claimer)s::text IS NULL OR steps -> %(stage)s ->> 'owner' = %(claimer)s::text)
   AND (%(stale_s)s::float8 IS NULL OR lumastra_heartbeat_stale(task_history, %(stale_s)s::float8))
RETURNING stages, stage_results
