-- Version 2 of the run ↔ row triggers (0004 says what they are for). What changed:
-- - a run binds only the rows its key names: `coverage:<stage>:<item>` with input `item_id`
--   equal to <item>, or `coverage:<stage>` with input `item_ids` (a forged input cannot take
--   over another item's row);
-- - a run that completes under an older processing_version than the sweep last saw for its
--   stage leaves its row `obsolete`, not `completed`;
-- - a row whose item changed while its run was going (`rerun_requested`, set by the
--   dispatcher) goes back to `pending` when the run completes;
-- - a cancelled run's row waits one backoff step before the sweep takes it again;
-- - `retry_after_s` is clamped to 0 s .. 1 year, whatever number the handler gave.
-- Parameters: none.

CREATE OR REPLACE FUNCTION coverage_run_started() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
  key text := NEW.trigger->>'idempotencyKey';
  stage_id text := split_part(key, ':', 2);
  item_part text := split_part(key, ':', 3);
BEGIN
  IF NOT EXISTS (SELECT 1 FROM coverage_stage WHERE id = stage_id AND task_id = NEW.task_id) THEN
    RETURN NULL;
  END IF;
  INSERT INTO media_item_stage_state AS s (item_id, stage, status, run_id, started_at, updated_at)
  SELECT i.id, stage_id, 'running', NEW.id, now(), now()
    FROM media_items i
   WHERE i.id IN (SELECT (NEW.input->>'item_id')::bigint
                   WHERE item_part <> ''
                     AND jsonb_typeof(NEW.input->'item_id') = 'number'
                     AND NEW.input->>'item_id' = item_part
                  UNION ALL
                  SELECT e::bigint
                    FROM jsonb_array_elements_text(
                           CASE WHEN item_part = '' AND jsonb_typeof(NEW.input->'item_ids') = 'array'
                                THEN NEW.input->'item_ids' ELSE '[]'::jsonb END) AS e
                   WHERE e ~ '^[0-9]{1,18}$')
  ON CONFLICT (stage, item_id) DO UPDATE
     SET status = 'running', reason = '', run_id = EXCLUDED.run_id, rerun_requested = false,
         started_at = EXCLUDED.started_at, finished_at = NULL, updated_at = EXCLUDED.updated_at;
  RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION coverage_run_ended() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
  skip jsonb := CASE WHEN NEW.state = 'completed' AND jsonb_typeof(NEW.result) = 'object'
                          AND jsonb_typeof(NEW.result->'skipped') = 'object'
                     THEN NEW.result->'skipped' END;
  retry_after float8 := CASE WHEN jsonb_typeof(skip->'retry_after_s') = 'number'
                             THEN greatest(0, least((skip->>'retry_after_s')::numeric, 31536000))
                        END;
  current_version integer := (SELECT processing_version FROM coverage_stage
                               WHERE id = split_part(NEW.trigger->>'idempotencyKey', ':', 2));
  outcome text := CASE
    WHEN retry_after IS NOT NULL THEN 'skipped_transient'
    WHEN skip IS NOT NULL THEN 'skipped_permanent'
    WHEN NEW.state = 'completed' AND NEW.processing_version < coalesce(current_version, 0)
      THEN 'obsolete'
    WHEN NEW.state = 'completed' THEN 'completed'
    WHEN NEW.state = 'cancelled' THEN 'pending'
    WHEN NEW.error->>'kind' IN ('permanent', 'validation') THEN 'failed_permanent'
    ELSE 'failed_transient' END;
BEGIN
  UPDATE media_item_stage_state SET
    status = CASE WHEN rerun_requested AND outcome IN ('completed', 'skipped_permanent')
                  THEN 'pending' ELSE outcome END,
    reason = CASE WHEN skip IS NULL OR rerun_requested THEN ''
                  ELSE left(coalesce(skip->>'reason', 'skipped'), 200) END,
    processing_version = CASE WHEN outcome = 'completed' THEN NEW.processing_version
                              ELSE processing_version END,
    failures = CASE WHEN outcome = 'failed_transient' THEN failures + 1
                    WHEN outcome = 'completed' THEN 0 ELSE failures END,
    next_eligible_at = CASE
      WHEN rerun_requested AND outcome IN ('completed', 'skipped_permanent') THEN now()
      WHEN outcome = 'failed_transient' THEN now() + coverage_backoff(failures + 1)
      WHEN outcome = 'skipped_transient' THEN now() + make_interval(secs => retry_after)
      WHEN outcome = 'pending' THEN now() + coverage_backoff(1)
      WHEN outcome = 'obsolete' THEN now()
      ELSE next_eligible_at END,
    last_error = CASE WHEN outcome LIKE 'failed_%'
                      THEN left(coalesce(NEW.error->>'kind', '?') || ': '
                                || coalesce(NEW.error->>'message', ''), 2000)
                      ELSE '' END,
    rerun_requested = false,
    finished_at = now(),
    updated_at = now()
  WHERE run_id = NEW.id AND status = 'running';
  RETURN NULL;
END
$$;
