-- The providers of external ids, for the admin's filter: a walk of external_ids_provider_value
-- that jumps from one provider to the next (one index probe per provider) instead of a DISTINCT
-- that reads every id (90 ms at 660,000 ids).
-- Parameters: none.
WITH RECURSIVE providers (provider) AS (
    (SELECT provider FROM external_ids ORDER BY provider LIMIT 1)
  UNION ALL
    SELECT (SELECT e.provider FROM external_ids AS e
             WHERE e.provider > p.provider ORDER BY e.provider LIMIT 1)
      FROM providers AS p
     WHERE p.provider IS NOT NULL
)
SELECT provider FROM providers WHERE provider IS NOT NULL
