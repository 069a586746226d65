-- A worker takes one stage of a pipeline run: waiting → active, only while the run is active.
-- The row lock makes this the one claim of the stage; a second delivery of its message finds
-- the stage no longer waiting and gets no row. The heartbeat is stamped: a run between stages
-- is judged by when its last stage moved. The stage's step record counts the attempt and keeps
-- the first attempt's start (orchestrator/runs/steps.py).
-- Returns what the stage needs: the run's input, its owner (the claim of the run, whose
-- heartbeats and fences the stage shares), identity, priority, the results so far and the
-- step record as this claim left it.
-- Parameters: run_id, stage, resource_class, owner (the claiming process's instance id).
UPDATE task_history
   SET stages = jsonb_set(stages, ARRAY[%(stage)s], '"active"'),
       steps = jsonb_set(steps, ARRAY[%(stage)s],
                         COALESCE(steps -> %(stage)s, '{}'::jsonb) || jsonb_build_object(
                             'status', 'running',
                             'resource_class', %(resource_class)s::text,
                             'owner', %(owner)s::text,
                             'attempts', COALESCE((steps -> %(stage)s ->> 'attempts')::int, 0) + 1,
                             'started_at', COALESCE(steps -> %(stage)s -> 'started_at',
                                                    to_jsonb(now())))),
       heartbeat_at = now(),
       updated_at = now()
 WHERE id = %(run_id)s
   AND state = 'active'
   AND stages ->> %(stage)s = 'waiting'
RETURNING input, owner_instance_id, identity, priority, stage_results, steps -> %(stage)s
