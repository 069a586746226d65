-- Candidates whose eligibility no longer holds are not processed: `skipped_permanent`,
-- reason `ineligible` (the heal pass and the catalog's events undo it once it holds again).
-- Parameters: ids, now.
UPDATE media_item_stage_state
   SET status = 'skipped_permanent', reason = 'ineligible', updated_at = %(now)s
 WHERE id = ANY(%(ids)s)
