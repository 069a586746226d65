-- The body of the trigger run_batch_count on task_history (`models.runs`), fired by the end of a
-- run that belongs to a batch (NEW), whichever path writes the end: the batch counts it, once
-- (a run's state leaves the live states once, so a duplicate end, a drain replay or a repair
-- cannot count it twice). The batch is done when its last run ended, or, for children that fail
-- their parent, when the first one ended otherwise than completed; the leader's release acts on
-- it (`runs.children`), woken by a notification on `lumastra_batch_done` (sent at the commit)
-- rather than at its next poll. The batch's row lock orders concurrent ends: exactly one sees
-- open = 1. `done` is the trigger's one variable.
-- Parameters: none.
UPDATE run_batches
   SET open = open - 1,
       counts = jsonb_set(counts, ARRAY[NEW.state::text],
                          to_jsonb(COALESCE((counts ->> NEW.state::text)::int, 0) + 1)),
       done_at = CASE WHEN done_at IS NOT NULL THEN done_at
                      WHEN open = 1 THEN now()
                      WHEN on_failure = 'fail_parent' AND NEW.state <> 'completed' THEN now()
                 END
 WHERE id = NEW.batch_id
RETURNING done_at IS NOT NULL AND released_at IS NULL INTO done;
IF done THEN
    PERFORM pg_notify('lumastra_batch_done', NEW.batch_id);
END IF
