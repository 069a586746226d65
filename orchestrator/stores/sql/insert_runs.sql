-- Many new runs' rows in one statement (`start_runs`): `insert_run.sql` for a batch, one array per
-- column, element i of each array being run i. A run whose idempotency key a live run took
-- meanwhile (the partial unique index task_history_live_idempotency_key) is not inserted and not
-- returned, so one such race costs that run, not the batch: the caller answers it as joined.
-- Parameters: ids, task_ids, states, stages, triggers, inputs (JSON text), errors (JSON text or
-- NULL), priorities, identities, processing_versions, not_befores, finished_ats (NULL or a
-- time, each), batch_ids, parent_run_ids (NULL or an id, each: a batch's runs, `runs.batch`),
-- tags (each run's as JSON text: an array of arrays cannot be ragged), now.
INSERT INTO task_history
    (id, task_id, state, stages, trigger, input, result, error, priority, identity,
     processing_version, owner_instance_id, attempts, cost_breakdown, stage_results, steps, heartbeat_at,
     not_before, created_at, started_at, finished_at, updated_at, batch_id, parent_run_id, tags)
SELECT run.id, run.task_id, run.state, run.stages::jsonb, run.trigger::jsonb, run.input::jsonb,
       NULL, run.error::jsonb, run.priority, run.identity, run.processing_version, '', 0, '{}',
       '{}', '{}', NULL, run.not_before, %(now)s, NULL, run.finished_at, %(now)s, run.batch_id,
       run.parent_run_id, ARRAY(SELECT jsonb_array_elements_text(run.tags::jsonb))
  FROM unnest(%(ids)s::text[], %(task_ids)s::text[], %(states)s::text[], %(stages)s::text[],
              %(triggers)s::text[], %(inputs)s::text[], %(errors)s::text[], %(priorities)s::int[],
              %(identities)s::text[], %(processing_versions)s::int[],
              %(not_befores)s::timestamptz[], %(finished_ats)s::timestamptz[],
              %(batch_ids)s::text[], %(parent_run_ids)s::text[], %(tags)s::text[])
       AS run(id, task_id, state, stages, trigger, input, error, priority, identity,
              processing_version, not_before, finished_at, batch_id, parent_run_id, tags)
ON CONFLICT DO NOTHING
RETURNING id
