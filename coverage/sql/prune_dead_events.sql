-- One batch of history-retention over the catalog outbox's dead letters: up to %(batch)s
-- events dead-lettered before %(cutoff)s, in id order from id %(after)s on. Events still
-- due (`dead_at IS NULL`) are never deleted here: the dispatcher owes them.
-- Parameters: cutoff, after, batch.
-- Returns one row: (rows deleted, the last id deleted or NULL).
WITH doomed AS (
    SELECT id FROM event_outbox
     WHERE id > %(after)s AND dead_at < %(cutoff)s
     ORDER BY id
     LIMIT %(batch)s
       FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM event_outbox e USING doomed WHERE e.id = doomed.id RETURNING e.id
)
SELECT count(*), max(id) FROM gone
