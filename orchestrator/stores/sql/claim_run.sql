-- A worker takes a pending run: pending → active in one guarded statement, and the claimed
-- row's fields come back with it, so a first delivery needs no read before it (issue 9).
-- No row comes back when the run is not pending (cancelled, ended, claimed by someone else)
-- or not yet due (a retry waiting for `not_before`); the caller then reads the row to see why.
-- `attempts` comes back already counting this attempt.
-- Parameters: run_id, owner.
UPDATE task_history
   SET state = 'active',
       owner_instance_id = %(owner)s,
       started_at = now(),
       heartbeat_at = now(),
       updated_at = now(),
       attempts = attempts + 1
 WHERE id = %(run_id)s
   AND state = 'pending'
   AND (not_before IS NULL OR not_before <= now())
RETURNING input, identity, priority, attempts
