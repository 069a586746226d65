-- The delayed starts whose time has come, released (`runs.due`): pending, never attempted, their
-- `not_before` reached. Releasing clears `not_before`, so the next look does not release them
-- again, and sets `updated_at`, so the reconciler's pending check and deadline count from the
-- release, not from the start. Soonest first; SKIP LOCKED, so two releasers never take one run
-- and neither waits on a cancel that holds the row.
-- A keyed-concurrency run's key comes with it: it is published when its key's turn comes; and
-- the trace its start began, which its message joins.
-- Parameters: limit.
UPDATE task_history AS run
   SET not_before = NULL, updated_at = now()
  FROM (SELECT id
          FROM task_history
         WHERE state = 'pending' AND attempts = 0 AND not_before IS NOT NULL
           AND not_before <= now()
         ORDER BY not_before
         LIMIT %(limit)s
           FOR UPDATE SKIP LOCKED) AS due
 WHERE run.id = due.id
RETURNING run.id, run.task_id, run.identity, run.priority, run.processing_version,
          run.trigger ->> 'concurrencyKey', run.trigger ->> 'traceparent'
