-- A catalog event the stage is invalidated by: the listed items' rows in `statuses` whose
-- eligibility holds become `pending`, due now. Rows running are never in `statuses`.
-- Parameters: stage, items, statuses, now.
UPDATE media_item_stage_state s
   SET status = 'pending', reason = '', failures = 0, next_eligible_at = %(now)s,
       updated_at = %(now)s
  FROM media_items mi
 WHERE s.stage = %(stage)s
   AND s.item_id = ANY(%(items)s)
   AND s.status = ANY(%(statuses)s)
   AND mi.id = s.item_id
   AND (${eligible})
