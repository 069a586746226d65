-- A worker takes one stage of a pipeline run: waiting → active, only while the run is active.
-- The row lock makes this the one claim of the stage; a second delivery of its message finds
-- the stage no longer waiting and gets no row. The heartbeat is stamped: a run between stages
-- is judged by when its last stage moved.
-- Returns what the stage needs: the run's input, its owner (the claim of the run, whose
-- heartbeats and fences the stage shares), identity, priority and the results so far.
-- Parameters: run_id, stage.
UPDATE task_history
   SET stages = jsonb_set(stages, ARRAY[%(stage)s], '"active"'),
       heartbeat_at = now(),
       updated_at = now()
 WHERE id = %(run_id)s
   AND state = 'active'
   AND stages ->> %(stage)s = 'waiting'
RETURNING input, owner_instance_id, identity, priority, stage_results
