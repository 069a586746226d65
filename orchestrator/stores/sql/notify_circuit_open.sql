-- The body of the trigger notify_circuit_open on task_circuit_state (`models.admission`), fired
-- when a task's circuit copy (NEW) says open: one notification for the operator
-- (`orchestrator.notifications`) each time the circuit opens or opens again after a failed
-- probe (a new opened_at), in the copy's own transaction. The copy is written after each change
-- of the Valkey hash (`hooks.circuit_copy.persist`); a late, older copy changes no row.
-- Parameters: none.
IF TG_OP = 'UPDATE' AND OLD.state = 'open' AND OLD.opened_at IS NOT DISTINCT FROM NEW.opened_at
THEN
    RETURN NULL;
END IF;
INSERT INTO notification_outbox (kind, subject, title, body, link)
VALUES ('circuit_open', NEW.task_id,
        left('Circuit open: ' || NEW.task_id, 200),
        format('%s stopped admitting runs after %s failures in a row (opened %s times in a row);'
               ' it admits one probe run at %s UTC.',
               NEW.task_id, NEW.consecutive_failures, NEW.reopen_count,
               to_char(NEW.half_open_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS')),
        '/admin/orchestrator/taskhistory/tasks/')
