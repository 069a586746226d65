-- Take one unit of a capped task's daily run quota, inside start_run's transaction (hooks.quotas),
-- so a start its caller rolls back gives the unit back. One statement takes a unit or refuses:
-- the conditional DO UPDATE returns no row when the day's count has reached the cap.
-- Parameters: task_id, day, cap.
INSERT INTO task_quota_usage AS u (task_id, day, started, completed, failed)
VALUES (%(task_id)s, %(day)s, 1, 0, 0)
ON CONFLICT (task_id, day) DO UPDATE SET started = u.started + 1
 WHERE u.started < %(cap)s::int
RETURNING started
