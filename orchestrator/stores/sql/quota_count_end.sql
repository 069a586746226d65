-- Count a capped task's run that ended completed or failed in its day's row (hooks.quotas):
-- a capped task's counts are exact, in Postgres; an uncapped task's go to Valkey instead and
-- reach this table by the rollup (quota_rollup.sql).
-- Parameters: task_id, day, completed, failed (1 or 0 each).
INSERT INTO task_quota_usage AS u (task_id, day, started, completed, failed)
VALUES (%(task_id)s, %(day)s, 0, %(completed)s, %(failed)s)
ON CONFLICT (task_id, day) DO UPDATE
   SET completed = u.completed + %(completed)s, failed = u.failed + %(failed)s
