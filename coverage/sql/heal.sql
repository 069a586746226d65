-- The next `limit` skipped rows of a stage after `after` (by id) whose reason may be undone
-- (`reasons`): those whose eligibility holds again become `pending`. Returns the highest row
-- id looked at (NULL: the walk reached the end), how many were looked at and healed.
-- Parameters: stage, after, reasons, limit, now.
WITH batch AS (
  SELECT s.id, (${eligible}) AS eligible
    FROM media_item_stage_state s
    JOIN media_items mi ON mi.id = s.item_id
   WHERE s.stage = %(stage)s
     AND s.status = 'skipped_permanent'
     AND s.id > %(after)s
     AND s.reason = ANY(%(reasons)s)
   ORDER BY s.id
   LIMIT %(limit)s
), healed AS (
  UPDATE media_item_stage_state s
     SET status = 'pending', reason = '', next_eligible_at = %(now)s, updated_at = %(now)s
    FROM batch b
   WHERE s.id = b.id AND b.eligible
     -- Read again under the row's lock: a run started for it meanwhile keeps it.
     AND s.status = 'skipped_permanent' AND s.reason = ANY(%(reasons)s)
  RETURNING 1
)
SELECT (SELECT max(id) FROM batch), (SELECT count(*) FROM batch), (SELECT count(*) FROM healed)
