-- Rows for the items of a stage's kinds that have none yet: `pending` where the stage's
-- eligibility holds, else `skipped_permanent` (`ineligible`). Either the items after a
-- watermark (`after`, the sweep's self-heal, `limit` at most) or the items listed (`items`,
-- the dispatcher's new items; `after` 0). Returns the highest item id looked at and the rows
-- made. Parameters: stage, kinds, after, items (NULL: all after `after`), limit, now.
WITH items AS (
  SELECT mi.id, (${eligible}) AS eligible
    FROM media_items mi
   WHERE mi.id > %(after)s
     AND mi.kind = ANY(%(kinds)s)
     AND (%(items)s::bigint[] IS NULL OR mi.id = ANY(%(items)s::bigint[]))
   ORDER BY mi.id
   LIMIT %(limit)s
), made AS (
  INSERT INTO media_item_stage_state (item_id, stage, status, reason, next_eligible_at)
  SELECT id, %(stage)s,
         CASE WHEN eligible THEN 'pending' ELSE 'skipped_permanent' END,
         CASE WHEN eligible THEN '' ELSE 'ineligible' END,
         %(now)s
    FROM items
  ON CONFLICT (stage, item_id) DO NOTHING
  RETURNING 1
)
SELECT (SELECT max(id) FROM items), (SELECT count(*) FROM made)
