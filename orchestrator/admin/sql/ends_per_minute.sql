-- The runs that ended completed or failed since a moment (the overview's last hour), counted
-- per minute of their end. One range scan of task_history_finished (finished_at), each run's
-- state read from its row: the cost grows with the runs that ended in the window, not with
-- the table. Cancelled runs (dropped, shed, an operator's cancel) are not counted: they say
-- what someone stopped, not how the work went. A minute in which nothing ended has no row.
-- Parameters: since.
SELECT date_trunc('minute', finished_at) AS minute,
       count(*) FILTER (WHERE state = 'completed') AS completed,
       count(*) FILTER (WHERE state = 'failed') AS failed
  FROM task_history
 WHERE finished_at >= %(since)s
   AND state IN ('completed', 'failed')
 GROUP BY 1
