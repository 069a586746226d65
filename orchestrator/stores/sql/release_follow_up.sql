-- The body of the trigger run_follow_up on task_history (`models.runs`), fired by the end of a
-- followed run (NEW), whichever path writes it: the follow-up waiting for that run becomes due now
-- and follows it (`trigger.follows`) instead of waiting for it (`runs.coalesce`); the due loop
-- publishes it. The lookup is the partial unique index task_history_follow_up_one's own (its
-- predicate spelled out, so the planner may use it).
-- Parameters: none.
UPDATE task_history
   SET not_before = now(), updated_at = now(),
       trigger = (trigger - 'waitsFor') || jsonb_build_object('follows', NEW.id)
 WHERE task_id = NEW.task_id AND identity = NEW.identity
   AND state = 'pending' AND trigger ? 'waitsFor' AND trigger ->> 'waitsFor' = NEW.id
