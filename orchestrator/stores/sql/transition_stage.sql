-- One stage of a run moves, only from a legal source state and only while the run is live
-- (an ended run's stages are final, as in Valkey, where its live hash is gone).
-- Parameters (positional): stage, target, updated_at, run_id, live states, stage, sources.
UPDATE task_history
   SET stages = jsonb_set(stages, ARRAY[%s], to_jsonb(%s::text)), updated_at = %s
 WHERE id = %s AND state = ANY(%s) AND stages ->> %s = ANY(%s)
