-- Rows for the items of a stage's kinds that have none yet: `pending` where the stage's
-- eligibility holds, else `skipped_permanent` (`ineligible`). Either the items after a
-- watermark (`after`, the sweep's self-heal, `limit` at most) or the items listed (`items`,
-- the dispatcher's new items; `after` 0). Returns the highest item id looked at and the rows
-- made. Parameters: stage, kinds, after, items (NULL: all after `after`), limit, now.
WITH items AS (
  SELECT mi.id, (${eligible}) AS eligible
    FROM media_items mi
   WHERE mi.id IN (
           -- Kind by kind along media_items_kind_id: past the watermark of a stage whose
           -- kinds are rare, a walk of every item in id order would read all the others.
           SELECT next.id
             FROM unnest(%(kinds)s::text[]) AS k(kind)
            CROSS JOIN LATERAL (
                    SELECT id FROM media_items
                     WHERE kind = k.kind
                       AND id > %(after)s
                       AND (%(items)s::bigint[] IS NULL OR id = ANY(%(items)s::bigint[]))
                     ORDER BY id
                     LIMIT %(limit)s) AS next
            ORDER BY next.id
            LIMIT %(limit)s)
   ORDER BY mi.id
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
