-- Claim one slot of one schedule: at most one fire per slot, whatever the Valkey lock did.
-- The upsert creates the schedule's row on its first fire; an existing row is moved to the
-- new slot only if its last slot is older, so a second claim of the same slot (a replica
-- whose bucket lock expired, a late beat message) returns no row and fires nothing.
-- Two concurrent claims serialize on the row: the second re-checks the WHERE after the
-- first commits.
-- Parameters: key, task_id, row_key, slot (epoch seconds of the slot's start), fired_at.
INSERT INTO scheduler_state
    (key, task_id, row_key, last_bucket, last_fired_at, last_run_id, last_error,
     sync_disabled, updated_at)
VALUES (%(key)s, %(task_id)s, %(row_key)s, %(slot)s, %(fired_at)s, '', '', false, now())
ON CONFLICT (key) DO UPDATE
    SET last_bucket = EXCLUDED.last_bucket,
        last_fired_at = EXCLUDED.last_fired_at,
        last_run_id = '',
        last_error = '',
        updated_at = now()
    WHERE scheduler_state.last_bucket IS NULL
       OR scheduler_state.last_bucket < EXCLUDED.last_bucket
RETURNING key
