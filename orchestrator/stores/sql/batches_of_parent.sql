-- A parent run's spawning stages (`runs.children.settled`): per stage, whether every child of
-- every batch it spawned has ended, and whether a `fail_parent` child ended otherwise than
-- completed.
-- Parameters: parent_run_id.
SELECT parent_stage,
       bool_and(open = 0),
       bool_or(on_failure = 'fail_parent' AND (counts - 'completed') <> '{}'::jsonb)
  FROM run_batches
 WHERE parent_run_id = %(parent_run_id)s
 GROUP BY parent_stage
