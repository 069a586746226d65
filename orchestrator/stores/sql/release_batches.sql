-- The batches done since the last look, marked released (`runs.children.release`): the mark and
-- what the release starts (a batch's callbacks) commit together, so each batch is acted on once.
-- SKIP LOCKED, so two releasers never take one batch. Oldest first.
-- Parameters: limit.
UPDATE run_batches AS batch
   SET released_at = now()
  FROM (SELECT id
          FROM run_batches
         WHERE done_at IS NOT NULL AND released_at IS NULL
         ORDER BY done_at
         LIMIT %(limit)s
           FOR UPDATE SKIP LOCKED) AS done
 WHERE batch.id = done.id
RETURNING batch.id, batch.parent_run_id, batch.parent_stage, batch.on_failure, batch.counts,
          batch.on_complete, batch.on_success, batch.total
