-- The pipeline runs under way of some tasks (recovery.pauses): a resume publishes the stages
-- its pause held, the most urgent run first, then the oldest. The same columns as
-- stalled_pipelines.sql, so both feed `runs.pipeline.advance_stalled`.
-- Parameters: task_ids.
SELECT id, task_id, input, owner_instance_id, identity, priority, stages, stage_results
  FROM task_history
 WHERE state = 'active'
   AND task_id = ANY(%(task_ids)s)
   AND stages <> '{}'
 ORDER BY priority, created_at, id
