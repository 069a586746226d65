-- bench/retention.py: n ended runs in task_history over the last 60 days, as retention finds
-- them: of 100, 85 completed, 12 failed, 3 cancelled; a third of the failed ones dead
-- letters; each a few seconds long, with a small input, result or error.
-- Parameters: chosen by the script.
--   n      the number of runs
--   tasks  text[]: task ids, repeated by weight (a run picks one at random)
-- Ids are ULID-like (`run_` + 12 hex digits of the creation's epoch ms + 14 of the sequence),
-- so they sort by creation like the real ones, and the rows are written oldest first, so the
-- audit rows written from them apart (console_audit.sql, the row triggers off for the load:
-- session_replication_role = replica) get ids that grow with time, as the real ones do.
INSERT INTO task_history (
  id, task_id, state, stages, stage_results, steps, trigger, input, result, error, priority,
  identity, processing_version, owner_instance_id, attempts, cost_breakdown, created_at,
  started_at, finished_at, updated_at
)
SELECT
  'run_' || lpad(upper(to_hex((extract(epoch FROM created) * 1000)::bigint)), 12, '0')
         || lpad(upper(to_hex(g)), 14, '0'),
  task_id, state, '{}', '{}', '{}',
  jsonb_build_object('kind', 'schedule'),
  jsonb_build_object('item_id', g %% 100000),
  CASE WHEN state = 'completed' THEN jsonb_build_object('ok', true, 'items', g %% 97) END,
  CASE WHEN state = 'failed' THEN jsonb_build_object(
         'kind', 'transient', 'message', 'ConnectionError: upstream reset the connection')
         || CASE WHEN g %% 3 = 0 THEN '{"exhausted": true}'::jsonb ELSE '{}' END
       WHEN state = 'cancelled' THEN '{"kind": "cancelled", "message": "cancelled by ops"}'
  END,
  5, task_id || ':' || (g %% 100000), 1, 'worker-' || (g %% 7), 1, '{}',
  created, created + interval '40 milliseconds', created + took, created + took
FROM (
  SELECT g, created, took,
         (%(tasks)s::text[])[1 + floor(r_task * cardinality(%(tasks)s::text[]))::int] AS task_id,
         CASE WHEN r_state < 0.85 THEN 'completed' WHEN r_state < 0.97 THEN 'failed'
              ELSE 'cancelled' END AS state
  FROM (
    SELECT g, now() - (%(n)s - g + random()) * (interval '60 days' / %(n)s) AS created,
           random() * interval '5 seconds' AS took, random() AS r_task, random() AS r_state
    FROM generate_series(1, %(n)s) AS g
  ) AS a
) AS b
