-- The covering task's processing_version moved past the one that completed these rows:
-- they are done again. Parameters: stage, version, now.
UPDATE media_item_stage_state
   SET status = 'obsolete', next_eligible_at = %(now)s, updated_at = %(now)s
 WHERE stage = %(stage)s
   AND status = 'completed'
   AND processing_version < %(version)s
