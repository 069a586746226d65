-- bench/search.py: n runs in task_history over the last 30 days, each about one of `libraries`
-- libraries (`input.library_id`, a number) and an item, 1 in 10 tagged `nightly`; of 100, 85
-- completed, 12 failed, 3 cancelled; ids ULID-like and written oldest first.
-- Parameters: chosen by the script.
--   n          the number of runs
--   libraries  the number of libraries
--   tasks      text[]: task ids (a run picks one at random)
INSERT INTO task_history (
  id, task_id, state, stages, stage_results, steps, trigger, input, tags, result, error,
  priority, identity, processing_version, owner_instance_id, attempts, cost_breakdown,
  created_at, started_at, finished_at, updated_at
)
SELECT
  'run_' || lpad(upper(to_hex((extract(epoch FROM created) * 1000)::bigint)), 12, '0')
         || lpad(upper(to_hex(g)), 14, '0'),
  task_id, state, '{}', '{}', '{}',
  jsonb_build_object('kind', 'schedule'),
  jsonb_build_object('library_id', g %% %(libraries)s, 'item_id', g %% 100000, 'full', g %% 7 = 0),
  CASE WHEN g %% 10 = 0 THEN ARRAY['nightly'] ELSE '{}' END,
  CASE WHEN state = 'completed' THEN jsonb_build_object('ok', true) END,
  CASE WHEN state = 'failed' THEN '{"kind": "transient", "message": "upstream reset"}'::jsonb
       WHEN state = 'cancelled' THEN '{"kind": "cancelled", "message": "cancelled by ops"}'
  END,
  5, task_id || ':' || (g %% 100000), 1, 'worker-' || (g %% 7), 1, '{}',
  created, created + interval '40 milliseconds', created + interval '2 seconds',
  created + interval '2 seconds'
FROM (
  SELECT g, created,
         (%(tasks)s::text[])[1 + floor(r_task * cardinality(%(tasks)s::text[]))::int] AS task_id,
         CASE WHEN r_state < 0.85 THEN 'completed' WHEN r_state < 0.97 THEN 'failed'
              ELSE 'cancelled' END AS state
  FROM (
    SELECT g, now() - (%(n)s - g + random()) * (interval '30 days' / %(n)s) AS created,
           random() AS r_task, random() AS r_state
    FROM generate_series(1, %(n)s) AS g
  ) AS a
) AS b
