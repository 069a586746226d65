-- bench/retention.py, after the pass: the ended runs still there that the cutoffs taken before
-- the pass condemn, counted apart from prune_runs.sql's walk (the newest runs of a task by a
-- window over the whole table instead of its kept boundary), so a pruner that leaves runs
-- behind shows here. Must be 0.
-- Parameters: cutoff, terminal, tasks, completed_before, failed_before (prune_runs.sql's, from
-- `runs_params`), and keep_last (each task's, at the same positions as tasks).
SELECT count(*) FROM (
    SELECT run.state, run.finished_at, own.task_id AS own_task, own.completed_before,
           own.failed_before, own.keep_last,
           row_number() OVER (PARTITION BY run.task_id
                              ORDER BY run.created_at DESC, run.id DESC) AS newest
      FROM task_history AS run
      LEFT JOIN unnest(%(tasks)s::text[], %(completed_before)s::timestamptz[],
                       %(failed_before)s::timestamptz[], %(keep_last)s::int[])
           AS own (task_id, completed_before, failed_before, keep_last)
        ON own.task_id = run.task_id
     WHERE run.state = ANY(%(terminal)s)
) AS ended
WHERE finished_at < CASE WHEN own_task IS NULL THEN %(cutoff)s
                         WHEN state = 'completed' THEN completed_before
                         ELSE failed_before END
  AND (own_task IS NULL OR newest > coalesce(keep_last, 0))
