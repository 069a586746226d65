-- One task's rolled-up spend of one UTC day (hooks.costs): what a capped start also counts, for a
-- Valkey that lost the day's hash after a rollup. No row: nothing rolled up for that day.
-- Parameters: task_id, day.
SELECT cost FROM task_quota_usage WHERE task_id = %(task_id)s AND day = %(day)s
