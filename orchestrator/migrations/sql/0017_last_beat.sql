-- A live run's last sign of life, by the Postgres clock: its heartbeat; until the first one
-- lands, its start (the claim stamps both, so an active run has a heartbeat); for a run cancelled
-- before it ever started, the cancel request (`updated_at`). A plain SQL expression, so the
-- planner inlines it into the query that calls it (migration 0017 says who does).
-- Parameters: none.
CREATE OR REPLACE FUNCTION lumastra_last_beat(run task_history) RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT COALESCE(run.heartbeat_at, run.started_at, run.updated_at)
$$;
