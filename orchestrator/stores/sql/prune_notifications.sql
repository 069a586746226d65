-- One batch of history-retention over the notifications: up to %(batch)s notifications created
-- before %(cutoff)s that are done (sent, dead, or unsent: no target wanted them), in id order
-- from id %(after)s on. Pending ones are never deleted: the notification loop still owes them.
-- Parameters: cutoff, after, batch.
-- Returns one row: (rows deleted, the last id deleted or NULL).
WITH doomed AS (
    SELECT id FROM notification_outbox
     WHERE id > %(after)s AND created_at < %(cutoff)s AND status IN ('sent', 'dead', 'unsent')
     ORDER BY id
     LIMIT %(batch)s
       FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM notification_outbox n USING doomed WHERE n.id = doomed.id RETURNING n.id
)
SELECT count(*), max(id) FROM gone
