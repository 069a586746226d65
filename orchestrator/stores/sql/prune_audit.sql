-- One batch of history-retention over the state changes (`task_history_audit`): up to
-- %(batch)s rows recorded before %(cutoff)s whose run is gone, in id order (ids grow with time,
-- and the primary key is the only index that orders them) from id %(after)s on. A deleted run's
-- changes went with it (prune_runs.sql); these are the rest, and a run still kept (its task's
-- retention is longer or keeps its last runs, or it is still live) keeps its changes.
-- Parameters: cutoff, after, batch.
-- Returns one row: (rows deleted, the last id deleted or NULL).
WITH doomed AS (
    SELECT id FROM task_history_audit AS change
     WHERE id > %(after)s AND at < %(cutoff)s
       AND NOT EXISTS (SELECT 1 FROM task_history AS run WHERE run.id = change.run_id)
     ORDER BY id
     LIMIT %(batch)s
       FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM task_history_audit a USING doomed WHERE a.id = doomed.id RETURNING a.id
)
SELECT count(*), max(id) FROM gone
