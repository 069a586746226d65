-- A start of a follow-up task (`while_active="follow_up"`) that met the running run of its
-- identity (the holder) records one follow-up (`runs.coalesce`): a new pending run that waits for
-- the holder's end (`trigger.waitsFor`, its `not_before` the far time `waits`, so nothing
-- publishes it) and that the run_follow_up trigger on task_history makes due in the same
-- transaction as that end. A follow-up already waiting for the identity takes this start's input
-- instead (the last wins; `trigger.coalesced` counts the starts it took): the partial unique
-- index task_history_follow_up_one is the conflict's target.
-- The holder is marked `trigger.followed`, so only the end of a followed run looks for its
-- follow-up. That UPDATE's row lock orders this start against the holder's end: an end under way
-- is waited for, and a holder that ended meanwhile gets its follow-up due at once
-- (`trigger.follows`). A holder still pending matches nothing: the start joins it instead.
-- Parameters: holder, id, task_id, stages, trigger (JSON text), input (JSON text), priority,
-- identity, processing_version, waits, now, tags.
WITH holder AS (
    UPDATE task_history
       SET trigger = trigger || '{"followed": true}'
     WHERE id = %(holder)s AND state <> 'pending'
 RETURNING id, state IN ('completed', 'failed', 'cancelled') AS ended
)
INSERT INTO task_history
    (id, task_id, state, stages, trigger, input, result, error, priority, identity,
     processing_version, owner_instance_id, attempts, cost_breakdown, stage_results, steps, heartbeat_at,
     not_before, created_at, started_at, finished_at, updated_at, tags)
SELECT %(id)s, %(task_id)s, 'pending', %(stages)s, %(trigger)s::jsonb
           || jsonb_build_object(CASE WHEN holder.ended THEN 'follows' ELSE 'waitsFor' END, holder.id),
       %(input)s, NULL, NULL, %(priority)s, %(identity)s, %(processing_version)s, '', 0, '{}', '{}',
       '{}', NULL, CASE WHEN holder.ended THEN %(now)s ELSE %(waits)s END, %(now)s, NULL, NULL, %(now)s,
       %(tags)s::varchar[]
  FROM holder
    ON CONFLICT (task_id, identity) WHERE state = 'pending' AND trigger ? 'waitsFor'
    DO UPDATE SET
       input = EXCLUDED.input,
       processing_version = EXCLUDED.processing_version,
       trigger = task_history.trigger || jsonb_build_object(
           'coalesced', COALESCE((task_history.trigger ->> 'coalesced')::int, 0) + 1),
       updated_at = EXCLUDED.updated_at
RETURNING id, priority
