-- A debounced task's first start (`runs.coalesce`): its run INSERTed as insert_run.sql does, in
-- one statement with no transaction of its own; unless a concurrent first start's waiting run
-- of the identity won the partial unique index task_history_debounce_one meanwhile: then that
-- run takes this start's input, tags and time as debounce_run.sql gives them, and `inserted` is
-- false (this start joined it; its admission is given back).
-- Parameters: id, task_id, state, stages, trigger, input (JSON text), error (JSON text or NULL),
-- priority, identity, processing_version, not_before, now, finished_at, tags (as insert_run.sql's),
-- period_s, max_wait_s.
INSERT INTO task_history
    (id, task_id, state, stages, trigger, input, result, error, priority, identity,
     processing_version, owner_instance_id, attempts, cost_breakdown, stage_results, steps, heartbeat_at,
     not_before, created_at, started_at, finished_at, updated_at, tags)
VALUES
    (%(id)s, %(task_id)s, %(state)s, %(stages)s, %(trigger)s, %(input)s, NULL, %(error)s,
     %(priority)s, %(identity)s, %(processing_version)s, '', 0, '{}', '{}', '{}', NULL,
     %(not_before)s, %(now)s, NULL, %(finished_at)s, %(now)s, %(tags)s::varchar[])
    ON CONFLICT (task_id, identity)
 WHERE state = 'pending' AND attempts = 0 AND not_before IS NOT NULL AND trigger ? 'debounce'
    DO UPDATE SET
       input = EXCLUDED.input,
       tags = EXCLUDED.tags,
       processing_version = EXCLUDED.processing_version,
       not_before = GREATEST(LEAST(now() + make_interval(secs => %(period_s)s),
                                   task_history.created_at + make_interval(secs => %(max_wait_s)s)),
                             (task_history.trigger ->> 'notBefore')::timestamptz),
       trigger = jsonb_set(task_history.trigger, '{debounced}',
                           to_jsonb(COALESCE((task_history.trigger ->> 'debounced')::int, 0) + 1)),
       updated_at = now()
RETURNING id, priority, xmax = 0 AS inserted
