-- One batch of history-retention: up to %(batch)s ended runs past their task's retention,
-- oldest end first, from %(after)s (the previous batch's last finished_at) on, so a batch never
-- walks the index entries of the rows earlier batches deleted, with their state changes
-- (`task_history_audit`: a run's audit goes with it). Rows another transaction holds are
-- skipped (the next pass takes them); live runs never match (`finished_at` is set by the
-- terminal write only, and `state` is checked too).
-- A run is past retention when it finished before %(cutoff)s (the global retention), or, for
-- a task named in %(tasks)s (its own `Retention`), before the cutoff at the same position of
-- %(completed_before)s for a completed run or %(failed_before)s for a failed or cancelled
-- one, and was created before (%(kept_at)s, %(kept_id)s), where its kept newest runs begin
-- (prune_runs_kept.sql; NULL when it keeps none). One statement for every task at once:
-- the walk covers the ends before %(until)s, the latest of all the cutoffs, and each row is
-- judged by its task's (matched against the arrays row by row): one index walk per pass, not one
-- per task.
-- Parameters: cutoff, until, after, batch, terminal (the terminal states), and, one element
-- per task with retention: tasks, completed_before, failed_before, kept_at, kept_id.
-- Returns one row: (rows deleted, the last finished_at deleted or NULL).
WITH own AS (
    SELECT * FROM unnest(%(tasks)s::text[], %(completed_before)s::timestamptz[],
                         %(failed_before)s::timestamptz[], %(kept_at)s::timestamptz[],
                         %(kept_id)s::text[])
        AS own (task_id, completed_before, failed_before, kept_at, kept_id)
), doomed AS (
    SELECT run.id, run.finished_at FROM task_history AS run
      LEFT JOIN own ON own.task_id = run.task_id
     WHERE run.finished_at < %(until)s AND run.finished_at >= %(after)s
       AND run.state = ANY(%(terminal)s)
       AND run.finished_at < CASE WHEN own.task_id IS NULL THEN %(cutoff)s
                                  WHEN run.state = 'completed' THEN own.completed_before
                                  ELSE own.failed_before END
       AND (own.kept_at IS NULL OR (run.created_at, run.id) < (own.kept_at, own.kept_id))
     ORDER BY run.finished_at
     LIMIT %(batch)s
       FOR UPDATE OF run SKIP LOCKED
), gone AS (
    DELETE FROM task_history t USING doomed WHERE t.id = doomed.id
    RETURNING t.id, doomed.finished_at
), audit AS (
    DELETE FROM task_history_audit a USING gone WHERE a.run_id = gone.id
)
SELECT count(*), max(finished_at) FROM gone
