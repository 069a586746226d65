-- What a first delivery needs of the run it has just claimed in Valkey, read without writing:
-- the Postgres half of a short run's claim is folded into its end (issue 22). The run must be
-- pending and due, as claim_run.sql would require; no row means the claim would be refused,
-- and the caller reads the row to see why.
-- `attempts` comes back counting the attempt this claim starts, as claim_run.sql returns it:
-- the end names it (end_run.sql takes the claim with it), and so does the claim the watch
-- writes if the run is still going after `runs.watch.CLAIM_AFTER_S` (claim_run.sql).
-- Parameters: run_id.
SELECT input, identity, priority, attempts + 1, stages, stage_results
  FROM task_history
 WHERE id = %(run_id)s
   AND state = 'pending'
   AND (not_before IS NULL OR not_before <= now())
