-- Where a task's kept newest runs begin, for history-retention's `keep_last` (prune_runs.sql
-- spares the task's runs created at or after it): the (created_at, id) of the task
-- %(task)s's %(keep_last)s-th newest ended run, newest by creation, so the task's index
-- (`task_history_task_created`) finds it by reading that many of its runs. One task per
-- statement: with the task id a literal Postgres walks that index; given the ids as an array it
-- cannot tell a rare task from a common one, and walked every run's creation instead (303 ms
-- against 4 x 7-80 ms at 1M runs, bench/retention.py). No row: the task has fewer ended runs
-- (all kept). Read once per pass: a run that ends later is either newer than the boundary (the
-- pass keeps one run more than it must) or older (not among the newest either way).
-- Parameters: task, keep_last (at least 1), terminal (the terminal states).
-- Returns no row or one: (created_at, id).
SELECT run.created_at, run.id FROM task_history AS run
 WHERE run.task_id = %(task)s AND run.state = ANY(%(terminal)s)
 ORDER BY run.created_at DESC, run.id DESC
OFFSET %(keep_last)s - 1 LIMIT 1
