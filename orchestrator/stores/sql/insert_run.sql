-- A new run's row, every column named: the one statement `start_run` sends to Postgres on its
-- common path (no ORM, no savepoint; the caller's transaction commits it). A run is born
-- `pending` (with `not_before` when it is a delayed start: `runs.due` releases it then), or
-- `cancelled` with its error and `finished_at` when backpressure dropped the start.
-- `created_at` and `updated_at` are the application's clock, as Django's auto_now fields were.
-- Parameters: id, task_id, state, stages, trigger, input (JSON text), error (JSON text or
-- NULL), priority, identity, processing_version, not_before (or NULL), now, finished_at (or NULL),
-- tags (a list).
INSERT INTO task_history
    (id, task_id, state, stages, trigger, input, result, error, priority, identity,
     processing_version, owner_instance_id, attempts, cost_breakdown, stage_results, steps, heartbeat_at,
     not_before, created_at, started_at, finished_at, updated_at, tags)
VALUES
    (%(id)s, %(task_id)s, %(state)s, %(stages)s, %(trigger)s, %(input)s, NULL, %(error)s,
     %(priority)s, %(identity)s, %(processing_version)s, '', 0, '{}', '{}', '{}', NULL,
     %(not_before)s, %(now)s, NULL, %(finished_at)s, %(now)s, %(tags)s::varchar[])
