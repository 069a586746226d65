-- Move the deltas into the base counts, in one statement. The DELETE takes the deltas its
-- snapshot sees and nothing else: one committed later stays for the next fold, and one a
-- concurrent fold already took is skipped (its row is gone when the lock is granted), so
-- none is lost or counted twice. The caller holds the base table's lock (coverage.counts).
-- Parameters: none.
WITH moved AS (
    DELETE FROM coverage_stage_count_delta RETURNING stage, status, delta
)
INSERT INTO coverage_stage_count AS base (stage, status, n)
SELECT stage, status, sum(delta)
  FROM moved
 GROUP BY stage, status
ON CONFLICT (stage, status) DO UPDATE SET n = base.n + EXCLUDED.n
