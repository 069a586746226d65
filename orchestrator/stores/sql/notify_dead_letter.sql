-- The body of the trigger notify_dead_letter on task_history (`models.runs`), fired when a run
-- (NEW) ends failed with its retries exhausted, whichever path writes the end: one
-- notification for the operator (`orchestrator.notifications`), in the end's own transaction,
-- sent later by the leader's notifications loop. A run fails once, so it is written once.
-- Parameters: none.
INSERT INTO notification_outbox (kind, subject, title, body, link)
VALUES ('dead_letter', NEW.id,
        left('Dead letter: ' || NEW.task_id || ' exhausted its retries', 200),
        left(format('Run %s of %s failed after %s attempts: %s', NEW.id, NEW.task_id,
                    NEW.attempts, COALESCE(NEW.error ->> 'message', '')), 1000),
        '/admin/orchestrator/taskhistory/' || NEW.id || '/change/')
