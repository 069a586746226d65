-- Count the rows again and make that the base, dropping the deltas: one statement, so the
-- count and the deltas dropped are of the same snapshot (a change committed after it keeps its
-- delta, which is not in the count). The caller holds the base table's lock (coverage.counts).
-- Parameters: none.
WITH counted AS (
    SELECT stage, status, count(*) AS n FROM media_item_stage_state GROUP BY stage, status
), dropped AS (
    DELETE FROM coverage_stage_count_delta
), gone AS (
    DELETE FROM coverage_stage_count AS base
     WHERE NOT EXISTS (
           SELECT FROM counted WHERE counted.stage = base.stage AND counted.status = base.status)
)
INSERT INTO coverage_stage_count AS base (stage, status, n)
SELECT stage, status, n FROM counted
ON CONFLICT (stage, status) DO UPDATE SET n = EXCLUDED.n
