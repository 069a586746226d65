-- Every run spawned under a run, at any depth (`ctx.spawn`), still pending or running: what its
-- cancel reaches (`runs.cancel.cancel_descendants`). Each level is one look-up of the partial
-- index task_history_parent.
-- Parameters: run_id.
WITH RECURSIVE tree(id) AS (
    SELECT id FROM task_history WHERE parent_run_id = %(run_id)s
    UNION ALL
    SELECT child.id FROM task_history AS child JOIN tree ON child.parent_run_id = tree.id
)
SELECT run.id
  FROM task_history AS run
  JOIN tree USING (id)
 WHERE run.state IN ('pending', 'active')
 ORDER BY run.id
