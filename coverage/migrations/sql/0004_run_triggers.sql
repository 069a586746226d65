-- Run ↔ row: a coverage run's own writes to task_history move its items' rows, in the same
-- transaction, so a crash cannot leave a run and its rows disagreeing. The
-- engine knows nothing of this: a run is a coverage run by its idempotency key,
-- `coverage:<stage>:<item>` (per item) or `coverage:<stage>` (a batch), and only the task
-- that covers the stage (`coverage_stage.task_id`) moves rows of it.
-- Parameters: none.

-- The backoff of a row's n-th transient failure in a row: 5 min, doubling, at most 6 h.
CREATE OR REPLACE FUNCTION coverage_backoff(failures integer) RETURNS interval
LANGUAGE sql IMMUTABLE AS $$
  SELECT least(interval '5 minutes' * power(2, least(greatest(failures, 1) - 1, 12)),
               interval '6 hours')
$$;

-- A run was recorded: the rows of the items its input names become `running`, owned by it
-- (rows that do not exist yet are made).
CREATE OR REPLACE FUNCTION coverage_run_started() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
  stage_id text := split_part(NEW.trigger->>'idempotencyKey', ':', 2);
BEGIN
  IF NOT EXISTS (SELECT 1 FROM coverage_stage WHERE id = stage_id AND task_id = NEW.task_id) THEN
    RETURN NULL;
  END IF;
  INSERT INTO media_item_stage_state AS s (item_id, stage, status, run_id, started_at, updated_at)
  SELECT i.id, stage_id, 'running', NEW.id, now(), now()
    FROM media_items i
   WHERE i.id IN (SELECT (NEW.input->>'item_id')::bigint
                  WHERE jsonb_typeof(NEW.input->'item_id') = 'number'
                  UNION ALL
                  SELECT e::bigint
                    FROM jsonb_array_elements_text(
                           CASE WHEN jsonb_typeof(NEW.input->'item_ids') = 'array'
                                THEN NEW.input->'item_ids' ELSE '[]'::jsonb END) AS e)
  ON CONFLICT (stage, item_id) DO UPDATE
     SET status = 'running', reason = '', run_id = EXCLUDED.run_id,
         started_at = EXCLUDED.started_at, finished_at = NULL, updated_at = EXCLUDED.updated_at;
  RETURN NULL;
END
$$;

-- A run ended: the rows it owns take its outcome. completed → `completed` by the run's
-- processing_version (or `skipped_*` when its result is `tasks.coverage.skipped(...)`);
-- cancelled → `pending`; failed → `failed_permanent` for permanent and validation errors,
-- else `failed_transient` with the backoff. Never raises on a result it does not understand:
-- a trigger error would refuse the run's terminal write.
CREATE OR REPLACE FUNCTION coverage_run_ended() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
  skip jsonb := CASE WHEN NEW.state = 'completed' AND jsonb_typeof(NEW.result) = 'object'
                          AND jsonb_typeof(NEW.result->'skipped') = 'object'
                     THEN NEW.result->'skipped' END;
  outcome text := CASE
    WHEN skip IS NOT NULL AND jsonb_typeof(skip->'retry_after_s') = 'number'
      THEN 'skipped_transient'
    WHEN skip IS NOT NULL THEN 'skipped_permanent'
    WHEN NEW.state = 'completed' THEN 'completed'
    WHEN NEW.state = 'cancelled' THEN 'pending'
    WHEN NEW.error->>'kind' IN ('permanent', 'validation') THEN 'failed_permanent'
    ELSE 'failed_transient' END;
BEGIN
  UPDATE media_item_stage_state SET
    status = outcome,
    reason = CASE WHEN skip IS NULL THEN ''
                  ELSE left(coalesce(skip->>'reason', 'skipped'), 200) END,
    processing_version = CASE WHEN outcome = 'completed' THEN NEW.processing_version
                              ELSE processing_version END,
    failures = CASE WHEN outcome = 'failed_transient' THEN failures + 1
                    WHEN outcome = 'completed' THEN 0 ELSE failures END,
    next_eligible_at = CASE outcome
      WHEN 'failed_transient' THEN now() + coverage_backoff(failures + 1)
      WHEN 'skipped_transient'
        THEN now() + make_interval(secs => least((skip->>'retry_after_s')::float8, 31536000))
      ELSE next_eligible_at END,
    last_error = CASE WHEN outcome LIKE 'failed_%'
                      THEN left(coalesce(NEW.error->>'kind', '?') || ': '
                                || coalesce(NEW.error->>'message', ''), 2000)
                      ELSE '' END,
    finished_at = now(),
    updated_at = now()
  WHERE run_id = NEW.id AND status = 'running';
  RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS coverage_run_started ON task_history;
CREATE TRIGGER coverage_run_started AFTER INSERT ON task_history FOR EACH ROW
  WHEN (NEW.state = 'pending' AND NEW.trigger->>'idempotencyKey' LIKE 'coverage:%')
  EXECUTE FUNCTION coverage_run_started();

DROP TRIGGER IF EXISTS coverage_run_ended ON task_history;
CREATE TRIGGER coverage_run_ended AFTER UPDATE OF state ON task_history FOR EACH ROW
  WHEN (OLD.state IS DISTINCT FROM NEW.state
        AND NEW.state IN ('completed', 'failed', 'cancelled')
        AND NEW.trigger->>'idempotencyKey' LIKE 'coverage:%')
  EXECUTE FUNCTION coverage_run_ended();
