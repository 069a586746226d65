-- The one definition of "this live run's heartbeat is stale" (issue 22): its last sign of life
-- (`lumastra_last_beat`) is more than `stale_s` seconds old by the Postgres clock. A plain SQL
-- expression, so the planner inlines it into the query that calls it.
-- Parameters: none.
CREATE OR REPLACE FUNCTION lumastra_heartbeat_stale(run task_history, stale_s float8)
RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE AS $$
  SELECT lumastra_last_beat(run) < now() - stale_s * interval '1 second'
$$;
