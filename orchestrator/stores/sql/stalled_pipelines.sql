-- Pipeline runs between stages that nobody moves any more (recovery.stages): active, with
-- stages and none of them running, and no sign of life for `after_s` seconds by the Postgres
-- clock (`lumastra_heartbeat_stale`, migration 0017), the longest-stalled first. These are the
-- runs the orphan query leaves alone (orphan_candidates.sql): between two stages nothing
-- heartbeats for them, so they are moved on here instead of ended. A parent whose stage awaits
-- children still running (a batch a later stage awaits, open and not done, `runs.children`) is
-- not stalled.
-- Parameters: after_s, limit.
SELECT id, task_id, input, owner_instance_id, identity, priority, stages, stage_results
  FROM task_history
 WHERE state = 'active'
   AND stages <> '{}'
   AND NOT jsonb_path_exists(stages, '$.* ? (@ == "active")')
   AND lumastra_heartbeat_stale(task_history, %(after_s)s)
   AND NOT EXISTS (SELECT 1 FROM run_batches AS batch
                    WHERE batch.parent_run_id = task_history.id AND batch.open > 0
                      AND batch.done_at IS NULL AND batch.awaited)
 ORDER BY lumastra_last_beat(task_history)
 LIMIT %(limit)s
