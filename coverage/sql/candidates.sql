-- A stage's due rows, oldest `next_eligible_at` first, locked for this tick (SKIP LOCKED: a
-- row another transaction holds waits for the next tick), each with its eligibility. A
-- season's row waits while an episode was added or removed since `settled_before`.
-- Parameters: stage, now, settled_before, limit.
SELECT s.id, s.item_id, (${eligible}) AS eligible
  FROM media_item_stage_state s
  JOIN media_items mi ON mi.id = s.item_id
 WHERE s.stage = %(stage)s
   AND s.status IN ('pending', 'obsolete', 'failed_transient', 'skipped_transient')
   AND s.next_eligible_at <= %(now)s
   AND (mi.kind <> 'season' OR mi.children_changed_at IS NULL
        OR mi.children_changed_at <= %(settled_before)s)
 ORDER BY s.next_eligible_at, s.id
 LIMIT %(limit)s
   FOR UPDATE OF s SKIP LOCKED
