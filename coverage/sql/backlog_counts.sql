-- Rows per stage and status (the backlog page, the API, /metrics): the base counts as of the
-- last fold plus the deltas appended since (coverage.counts); both tables are small.
-- Parameters: none.
SELECT stage, status, sum(n)::bigint
  FROM (SELECT stage, status, n FROM coverage_stage_count
        UNION ALL
        SELECT stage, status, delta FROM coverage_stage_count_delta) AS counts
 GROUP BY stage, status
