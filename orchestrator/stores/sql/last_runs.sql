-- Each task's newest run (by creation), whatever its state: one probe of
-- task_history_task_created (task_id, created_at DESC) per task id, so the cost grows with the
-- number of tasks, not of runs. A task that never ran has no row.
--
-- The task is matched by a range of one value, not `=`, on purpose: with `=` the planner
-- drops task_id from the ORDER BY (it is fixed) and, guessing a task's runs are spread evenly
-- through time, walks task_history_created (created_at DESC) filtering on task_id. For a task
-- that ran long ago or never, that reads the whole table (measured at 1M rows: 265 ms, against
-- 0.1 ms here). `DISTINCT ON (task_id) … ORDER BY task_id, created_at DESC` reads the whole
-- index too.
-- Parameters: task_ids (the registered task ids).
SELECT t.task_id, r.id, r.state, r.created_at, r.started_at, r.finished_at
  FROM unnest(%(task_ids)s::text[]) AS t(task_id)
 CROSS JOIN LATERAL (
       SELECT h.id, h.state, h.created_at, h.started_at, h.finished_at
         FROM task_history h
        WHERE h.task_id >= t.task_id AND h.task_id <= t.task_id
        ORDER BY h.task_id, h.created_at DESC
        LIMIT 1
       ) AS r
