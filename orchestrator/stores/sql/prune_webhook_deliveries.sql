-- One batch of history-retention over the webhook delivery history: up to %(batch)s
-- deliveries created before %(cutoff)s that are done (delivered, or dead: a dead delivery
-- past retention is no longer worth redelivering), in id order from id %(after)s on.
-- Pending deliveries are never deleted, however old: the webhook loop still owes them.
-- Parameters: cutoff, after, batch.
-- Returns one row: (rows deleted, the last id deleted or NULL).
WITH doomed AS (
    SELECT id FROM webhook_delivery
     WHERE id > %(after)s AND created_at < %(cutoff)s AND status IN ('delivered', 'dead')
     ORDER BY id
     LIMIT %(batch)s
       FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM webhook_delivery d USING doomed WHERE d.id = doomed.id RETURNING d.id
)
SELECT count(*), max(id) FROM gone
