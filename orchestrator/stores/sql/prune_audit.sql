-- One batch of history-retention over the state changes (`task_history_audit`): up to
-- %(batch)s rows recorded before %(cutoff)s, in id order (ids grow with time, and the primary
-- key is the only index that orders them) from id %(after)s on.
-- Parameters: cutoff, after, batch.
-- Returns one row: (rows deleted, the last id deleted or NULL).
WITH doomed AS (
    SELECT id FROM task_history_audit
     WHERE id > %(after)s AND at < %(cutoff)s
     ORDER BY id
     LIMIT %(batch)s
       FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM task_history_audit a USING doomed WHERE a.id = doomed.id RETURNING a.id
)
SELECT count(*), max(id) FROM gone
