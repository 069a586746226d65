-- The Postgres copy of one task's circuit (hooks.circuit): the whole Valkey hash, upserted after
-- each change, from which a Valkey that lost the hash rebuilds it. Ordered by the hash's version:
-- an upsert no newer than the row (a racing process's, sent late) changes nothing, so the copy
-- never goes backwards.
-- Parameters: task_id, state, consecutive, reopen_count, opened_at, half_open_at,
-- forced_until, forced_by, recent (JSON text), version, updated_at.
INSERT INTO task_circuit_state AS c
       (task_id, state, consecutive_failures, reopen_count, opened_at, half_open_at,
        forced_until, forced_by, recent_failures, version, updated_at)
VALUES (%(task_id)s, %(state)s, %(consecutive)s, %(reopen_count)s, %(opened_at)s,
        %(half_open_at)s, %(forced_until)s, %(forced_by)s, %(recent)s::jsonb, %(version)s,
        %(updated_at)s)
ON CONFLICT (task_id) DO UPDATE
   SET state = EXCLUDED.state, consecutive_failures = EXCLUDED.consecutive_failures,
       reopen_count = EXCLUDED.reopen_count, opened_at = EXCLUDED.opened_at,
       half_open_at = EXCLUDED.half_open_at, forced_until = EXCLUDED.forced_until,
       forced_by = EXCLUDED.forced_by, recent_failures = EXCLUDED.recent_failures,
       version = EXCLUDED.version, updated_at = EXCLUDED.updated_at
 WHERE c.version < EXCLUDED.version
