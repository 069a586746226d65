-- A content-changing event for items whose run is going: the run's end sends their rows back
-- to `pending` (migration 0006) instead of `completed`. Parameters: stage, items, now.
UPDATE media_item_stage_state
   SET rerun_requested = true, updated_at = %(now)s
 WHERE stage = %(stage)s
   AND item_id = ANY(%(items)s)
   AND status = 'running'
