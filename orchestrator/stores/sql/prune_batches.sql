-- One batch of history-retention for batches of runs (`run_batches`): up to %(batch)s batches
-- released before %(cutoff)s whose runs are all gone (retention deleted them first), oldest first,
-- from %(after)s (the previous batch's last released_at) on. A batch never released (its runs
-- not all ended) is kept.
-- Parameters: cutoff, after, batch.
-- Returns one row: (rows deleted, the last released_at deleted or NULL).
WITH doomed AS (
    SELECT id, released_at FROM run_batches AS batch
     WHERE released_at < %(cutoff)s AND released_at >= %(after)s
       AND NOT EXISTS (SELECT 1 FROM task_history AS run WHERE run.batch_id = batch.id)
     ORDER BY released_at
     LIMIT %(batch)s
       FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM run_batches b USING doomed WHERE b.id = doomed.id RETURNING doomed.released_at
)
SELECT count(*), max(released_at) FROM gone
