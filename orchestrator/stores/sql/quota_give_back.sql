-- Give back the unit quota_take.sql took, for a start refused, dropped or deduplicated after the
-- quota admitted it (hooks.quotas, `abandoned`). Never below zero.
-- Parameters: task_id, day.
UPDATE task_quota_usage SET started = started - 1
 WHERE task_id = %(task_id)s AND day = %(day)s AND started > 0
