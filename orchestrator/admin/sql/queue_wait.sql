-- Per resource class, how long the runs that started since a moment (the overview's last
-- hour) waited in the queue: from when they could start (their creation, or their not_before
-- when later: a retry's backoff, a released follow-up; or the time a delayed or debounced start
-- was due, which the trigger keeps once the release has cleared not_before) to their start
-- (started_at: the claim of their last attempt), as the 95th percentile (interpolated) and
-- how many runs it is of. A wait below zero (the writers' clocks apart) counts as zero.
-- The runs that started and ended are found by one range scan of task_history_finished, those
-- still running by task_history_state_created; a run's class is its task's in the registry
-- (`classes`, in the order of `task_ids`), and a run of a task no longer registered is left out.
-- Parameters: since, task_ids, classes.
WITH started AS (
    SELECT task_id, started_at, created_at,
           GREATEST(not_before, (trigger ->> 'notBefore')::timestamptz) AS not_before
      FROM task_history
     WHERE finished_at >= %(since)s
       AND started_at >= %(since)s
    UNION ALL
    SELECT task_id, started_at, created_at,
           GREATEST(not_before, (trigger ->> 'notBefore')::timestamptz) AS not_before
      FROM task_history
     WHERE state IN ('active', 'cancelling')
       AND started_at >= %(since)s
)
SELECT c.resource_class,
       count(*) AS started,
       percentile_cont(0.95) WITHIN GROUP (
           ORDER BY GREATEST(started_at - GREATEST(created_at, not_before), interval '0')
       ) AS p95
  FROM started
  JOIN unnest(%(task_ids)s::text[], %(classes)s::text[]) AS c (task_id, resource_class)
 USING (task_id)
 GROUP BY c.resource_class
