-- Copy uncapped tasks' Valkey run counts into task_quota_usage (hooks.quotas, `rollup`), one
-- row per task and UTC day, all in one statement. Absolute values, never lowered: idempotent,
-- and a stale snapshot cannot undo a newer one. Rows that would not change are not rewritten
-- (no dead tuple every tick).
-- Parameters: task_ids, days, started, completed, failed (arrays of one length, a row each).
INSERT INTO task_quota_usage AS u (task_id, day, started, completed, failed)
SELECT * FROM unnest(%(task_ids)s::text[], %(days)s::date[], %(started)s::int[],
                     %(completed)s::int[], %(failed)s::int[])
ON CONFLICT (task_id, day) DO UPDATE
   SET started = GREATEST(u.started, EXCLUDED.started),
       completed = GREATEST(u.completed, EXCLUDED.completed),
       failed = GREATEST(u.failed, EXCLUDED.failed)
 WHERE EXCLUDED.started > u.started OR EXCLUDED.completed > u.completed
    OR EXCLUDED.failed > u.failed
