-- The children a parent's stage spawned (`ctx.children`), by id (the order they were spawned in,
-- but a resume's new children come after those it kept): each one's id, task, input, state,
-- result (NULL when its JSON is over `cap` bytes), error, and whether its result was left out for
-- its size. A resume's batch has the completed children of the batches it reuses too.
-- Parameters: parent_run_id, stage, cap.
SELECT run.id, run.task_id, run.input, run.state,
       CASE WHEN octet_length(run.result::text) > %(cap)s THEN NULL ELSE run.result END,
       run.error,
       COALESCE(octet_length(run.result::text) > %(cap)s, false)
  FROM run_batches AS batch
  JOIN task_history AS run
    ON run.batch_id = batch.id
    OR (run.batch_id = ANY(batch.reused_from) AND run.state = 'completed')
 WHERE batch.parent_run_id = %(parent_run_id)s AND batch.parent_stage = %(stage)s
 ORDER BY run.id
