-- One batch of history-retention: up to %(batch)s ended runs that finished before %(cutoff)s,
-- oldest first, from %(after)s (the previous batch's last finished_at) on, so a batch never
-- walks the index entries of the rows earlier batches deleted. Rows another transaction holds
-- are skipped (the next pass takes them); live runs never match (`finished_at` is set by the
-- terminal write only, and `state` is checked too).
-- Parameters: cutoff, after, batch, terminal (the terminal states).
-- Returns one row: (rows deleted, the last finished_at deleted or NULL).
WITH doomed AS (
    SELECT id, finished_at FROM task_history
     WHERE finished_at < %(cutoff)s AND finished_at >= %(after)s
       AND state = ANY(%(terminal)s)
     ORDER BY finished_at
     LIMIT %(batch)s
       FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM task_history t USING doomed WHERE t.id = doomed.id RETURNING doomed.finished_at
)
SELECT count(*), max(finished_at) FROM gone
