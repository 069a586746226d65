-- Copy one task's spend of one UTC day from Valkey into task_quota_usage.cost (hooks.costs,
-- `rollup`). Kind by kind, never lowered: a second rollup, or a late one from a leader that lost
-- its seat, changes nothing. Rows that would not change are not rewritten.
-- Parameters: task_id, day, cost (JSON text: units by kind).
INSERT INTO task_quota_usage AS u (task_id, day, started, completed, failed, cost)
VALUES (%(task_id)s, %(day)s, 0, 0, 0, %(cost)s::jsonb)
ON CONFLICT (task_id, day) DO UPDATE SET cost = lumastra_greatest_costs(u.cost, EXCLUDED.cost)
 WHERE lumastra_greatest_costs(u.cost, EXCLUDED.cost) <> u.cost
