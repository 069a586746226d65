-- A worker takes a pending run: pending → active in one guarded statement, and the claimed
-- row's fields come back with it, so a delivery needs no read before it (issue 9). A plain
-- run's first delivery reads them instead (read_claimable.sql) and this claim is written only
-- if the run is still going a second later (`runs.watch`), with the moment it was taken
-- (`started_at`; NULL: now); a shorter run's end takes the claim with it (end_run.sql).
-- No row comes back when the run is not pending (cancelled, ended, claimed by someone else)
-- or not yet due (a retry waiting for `not_before`); the caller then reads the row to see why.
-- `attempts` comes back already counting this attempt; `stages` and `stage_results` tell a
-- pipeline run where it starts (a resumed run has stages completed already).
-- The commit does not wait for its WAL flush (`durable.ASYNC_COMMIT`: a `SET LOCAL` sent
-- before this statement in the same round trip, for its own implicit transaction): no run
-- waits on a flush for its claim, which only a crash of Postgres itself can lose, and then
-- within wal_writer_delay (about 0.2 s); the run's next synchronous commit flushes it anyway.
-- A lost claim leaves the row `pending` while Valkey says its owner runs it; the owner claims
-- it again at its next heartbeat (`runs.terminal.write_live_claim`), and its end takes the
-- lost claim with it (end_run.sql, given the attempt count this claim returned).
-- A claim written for its owner by someone else (`runs.terminal.write_live_claim`) carries when
-- that owner was last heard of (`heard_at`), so Postgres judges its staleness as Valkey does.
-- A deferred claim names the attempt it read (`attempt`): it is written only if nobody claimed
-- the run meanwhile (a claim counts an attempt), so a run put back for another attempt is not
-- claimed again by the handler that lost it. NULL: any attempt count.
-- Parameters: run_id, owner, started_at (or NULL), heard_at (or NULL: now), attempt (or NULL).
UPDATE task_history
   SET state = 'active',
       owner_instance_id = %(owner)s,
       started_at = COALESCE(%(started_at)s::timestamptz, now()),
       heartbeat_at = COALESCE(%(heard_at)s::timestamptz, now()),
       updated_at = now(),
       attempts = attempts + 1
 WHERE id = %(run_id)s
   AND state = 'pending'
   AND (not_before IS NULL OR not_before <= now())
   AND (%(attempt)s::int IS NULL OR attempts = %(attempt)s::int - 1)
RETURNING input, identity, priority, attempts, stages, stage_results
