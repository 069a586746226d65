-- Each stage's oldest row due now (pending, obsolete, failed or skipped for now, its moment
-- come): its `next_eligible_at`. One probe of stage_state_due per stage.
-- Parameters: stages, now.
SELECT st.stage,
       (SELECT s.next_eligible_at
          FROM media_item_stage_state s
         WHERE s.stage = st.stage
           AND s.status IN ('pending', 'obsolete', 'failed_transient', 'skipped_transient')
           AND s.next_eligible_at <= %(now)s
         ORDER BY s.next_eligible_at
         LIMIT 1)
  FROM unnest(%(stages)s::text[]) AS st(stage)
