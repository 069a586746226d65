-- The one query of a reconciler tick (recovery.orphans). Stale: active or cancelling runs whose
-- heartbeat is older than the threshold, oldest heartbeat first. Pending: runs pending (since
-- created or put back for a retry, and past any retry time) for longer than the check delay, one
-- page in (created_at, id) order after the caller's cursor, so a big backlog is covered page by
-- page.
-- Parameters: stale_states, stale_after_s, pending_after_s, limit, after_created, after_id.
(SELECT id, task_id, state, owner_instance_id, identity, priority, processing_version,
        created_at,
        EXTRACT(EPOCH FROM now() - lumastra_last_beat(task_history))::float8,
        attempts, stages <> '{}'
   FROM task_history
  WHERE state = ANY(%(stale_states)s)
    AND lumastra_heartbeat_stale(task_history, %(stale_after_s)s)
    -- A pipeline run between stages has nothing to heartbeat: recovery.stages moves it on.
    AND NOT (state = 'active' AND stages <> '{}'
             AND NOT jsonb_path_exists(stages, '$.* ? (@ == "active")'))
  ORDER BY lumastra_last_beat(task_history)
  LIMIT %(limit)s)
UNION ALL
(SELECT id, task_id, state, owner_instance_id, identity, priority, processing_version,
        created_at,
        EXTRACT(EPOCH FROM now() - GREATEST(updated_at, not_before))::float8,
        attempts, stages <> '{}'
   FROM task_history
  WHERE state = 'pending'
    AND GREATEST(updated_at, not_before) < now() - %(pending_after_s)s * interval '1 second'
    AND (created_at, id) > (%(after_created)s, %(after_id)s)
  ORDER BY created_at, id
  LIMIT %(limit)s)
