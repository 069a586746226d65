-- bench/console.py: n runs in task_history over the last 60 days, as a system in use holds
-- them.
-- Parameters: chosen by the script from the registry and the enums.
--   n                 the number of runs
--   tasks             text[]: task ids, repeated by weight (a run picks one at random)
--   kinds             text[]: trigger kinds, repeated by weight
--   errors            text[]: error kinds of failed runs, repeated by weight
--   priority_by_kind  jsonb {"schedule": 5, ...}: the priority that follows from the trigger
--   live              the newest runs that may still be pending, active or cancelling
-- Ids are ULID-like (`run_` + 12 hex digits of the creation's epoch ms + 14 of the sequence),
-- so they sort by creation like the real ones. The caller turns the row triggers off
-- (session_replication_role = replica), then names the retried runs (console_retries.sql) and
-- writes the audit rows (console_audit.sql).
INSERT INTO task_history (
  id, task_id, state, stages, stage_results, steps, trigger, input, result, error, priority,
  identity, processing_version, owner_instance_id, attempts, cost_breakdown, progress,
  heartbeat_at, not_before, created_at, started_at, finished_at, updated_at
)
SELECT
  'run_' || lpad(upper(to_hex((extract(epoch FROM created) * 1000)::bigint)), 12, '0')
         || lpad(upper(to_hex(g)), 14, '0'),
  task_id,
  state,
  '{}'::jsonb,
  '{}'::jsonb,
  CASE WHEN r_extra < 0.10 AND state IN ('completed', 'failed') THEN jsonb_build_object(
    task_id, jsonb_build_object(
      'warnings', CASE WHEN r_extra < 0.03 THEN jsonb_build_array('3 files unreadable') ELSE '[]' END,
      'counters', jsonb_build_object('items', (r_extra * 10000)::int),
      'cost', jsonb_build_object('api_calls', (r_extra * 400)::int)))
  ELSE '{}'::jsonb END,
  jsonb_build_object('kind', kind, 'idempotencyKey', 'bench:' || g)
    || CASE WHEN kind IN ('admin', 'operator-retry') THEN '{"actor": "ops"}'::jsonb ELSE '{}' END,
  jsonb_build_object('item_id', g %% 100000),
  CASE WHEN state = 'completed' THEN jsonb_build_object('ok', true, 'items', g %% 97) END,
  CASE
    WHEN state = 'failed' THEN jsonb_build_object(
      'kind', error_kind,
      'message', CASE error_kind
        WHEN 'transient' THEN 'ConnectionError: upstream reset the connection'
        WHEN 'timeout' THEN 'soft timeout passed after 300 s'
        WHEN 'orphaned' THEN 'its worker stopped heartbeating'
        ELSE 'ValueError: unexpected record ' || g END
        || CASE WHEN exhausted THEN ' (attempts exhausted: 3 of 3)' ELSE '' END)
      || CASE WHEN exhausted THEN '{"exhausted": true}'::jsonb ELSE '{}' END
    WHEN state = 'cancelled' THEN '{"kind": "cancelled", "message": "cancelled by ops"}'::jsonb
  END,
  (%(priority_by_kind)s::jsonb ->> kind)::smallint,
  task_id || ':' || (g %% 100000),
  1,
  CASE WHEN state = 'pending' THEN '' ELSE 'worker-' || (g %% 7) || ':' || (1000 + g %% 50) END,
  CASE WHEN exhausted THEN 3 WHEN state = 'pending' THEN 0 WHEN r_extra > 0.97 THEN 2 ELSE 1 END,
  CASE WHEN r_extra < 0.08 THEN jsonb_build_object('api_calls', (r_extra * 400)::int)
       ELSE '{}'::jsonb END,
  CASE WHEN state IN ('active', 'cancelling') OR (r_extra < 0.20 AND state <> 'pending')
    THEN jsonb_build_object('done', (r_extra * 500)::int, 'total', 500, 'message', 'files',
                            'rate', 12.5, 'eta_s', 10.0, 'at', created + took)
  END,
  CASE WHEN state <> 'pending' THEN created + took END,
  NULL,
  created,
  CASE WHEN state <> 'pending' THEN created + interval '40 milliseconds' END,
  CASE WHEN state IN ('completed', 'failed', 'cancelled') THEN created + took END,
  created + took
FROM (
  SELECT b.*,
         b.state = 'failed' AND b.error_kind = 'transient' AND b.r_extra < 0.6 AS exhausted
  FROM (
    SELECT a.*,
           CASE
             WHEN g <= %(live)s AND r_state < 0.40 THEN 'pending'
             WHEN g <= %(live)s AND r_state < 0.70 THEN 'active'
             WHEN g <= %(live)s AND r_state < 0.72 THEN 'cancelling'
             WHEN r_state < 0.85 THEN 'completed'
             WHEN r_state < 0.975 THEN 'failed'
             ELSE 'cancelled'
           END AS state
    FROM (
      SELECT g,
             now() - (g - random()) * (interval '60 days' / %(n)s) AS created,
             random() AS r_state,
             random() AS r_extra,
             -- 10 ms to 11 s, most of them short
             exp(random() * 7) * interval '10 milliseconds' AS took,
             (%(tasks)s::text[])[1 + floor(random() * cardinality(%(tasks)s::text[]))::int]
               AS task_id,
             (%(kinds)s::text[])[1 + floor(random() * cardinality(%(kinds)s::text[]))::int]
               AS kind,
             (%(errors)s::text[])[1 + floor(random() * cardinality(%(errors)s::text[]))::int]
               AS error_kind
      FROM generate_series(1, %(n)s) AS g
    ) AS a
  ) AS b
) AS c;
