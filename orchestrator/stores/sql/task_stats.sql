-- Per task, the runs that ended since a moment (the Tasks page: the last 24 h): how many
-- completed, failed and were cancelled, and the median and 95th percentile (interpolated) of
-- the time from start to end of those that completed or failed. One range scan of
-- task_history_finished (finished_at) for every task at once; a task with no run ended in
-- the window has no row. Cancelled runs (dropped, shed, an operator's cancel) are counted,
-- not timed: how long they ran says when someone stopped them, not how long the work takes.
-- Parameters: since, task_ids (the registered task ids).
SELECT task_id,
       count(*) FILTER (WHERE state = 'completed') AS completed,
       count(*) FILTER (WHERE state = 'failed') AS failed,
       count(*) FILTER (WHERE state = 'cancelled') AS cancelled,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY finished_at - started_at)
           FILTER (WHERE state IN ('completed', 'failed') AND started_at IS NOT NULL) AS p50,
       percentile_cont(0.95) WITHIN GROUP (ORDER BY finished_at - started_at)
           FILTER (WHERE state IN ('completed', 'failed') AND started_at IS NOT NULL) AS p95
  FROM task_history
 WHERE finished_at >= %(since)s
   AND task_id = ANY(%(task_ids)s::text[])
 GROUP BY task_id
