-- Live children whose parent ended failed or cancelled (`recovery.children`): a parent's cancel,
-- or a `fail_parent` failure, asks them at once; these are the ones it missed (a crash between,
-- a child spawned by a stage that ended as the cancel came, a parent failed by another stage).
-- Only open batches are looked at (the partial index run_batches_open), then their live runs.
-- Parameters: limit.
SELECT run.id, parent.id, parent.state
  FROM run_batches AS batch
  JOIN task_history AS parent ON parent.id = batch.parent_run_id
  JOIN task_history AS run ON run.batch_id = batch.id
 WHERE batch.open > 0 AND batch.parent_run_id IS NOT NULL
   AND parent.state IN ('failed', 'cancelled')
   AND run.state IN ('pending', 'active')
 ORDER BY run.id
 LIMIT %(limit)s
