-- bench/console.py, after console_history.sql: the daily counts the engine keeps of every
-- task's runs (task_quota_usage, orchestrator/hooks/quotas.py), as the loaded history would
-- have left them: starts per UTC day of creation, completed and failed ends per UTC day of
-- their end. The overview's 30-day chart reads them.
-- Parameters: none.
INSERT INTO task_quota_usage (task_id, day, started, completed, failed, cost)
SELECT task_id, day, sum(started), sum(completed), sum(failed), '{}'::jsonb
  FROM (SELECT task_id, (created_at AT TIME ZONE 'UTC')::date AS day,
               1 AS started, 0 AS completed, 0 AS failed
          FROM task_history
        UNION ALL
        SELECT task_id, (finished_at AT TIME ZONE 'UTC')::date,
               0, (state = 'completed')::int, (state = 'failed')::int
          FROM task_history
         WHERE state IN ('completed', 'failed')) AS counted
 GROUP BY task_id, day;
