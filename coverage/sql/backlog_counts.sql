-- Rows per stage and status (the backlog page and API). An index-only scan of
-- stage_state_status_id when the visibility map is current (autovacuum keeps it so).
SELECT stage, status, count(*)
  FROM media_item_stage_state
 GROUP BY stage, status
