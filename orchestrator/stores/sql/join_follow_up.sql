-- A start of a follow-up task gives its input to the follow-up that already waits for its
-- identity's running run (`runs.coalesce`, follow_run.sql): the last input (and tags) win and
-- `trigger.coalesced` counts the starts it took. The lookup is the partial unique index
-- task_history_follow_up_one's own; a follow-up its holder's end has released matches no more.
-- Parameters: task_id, identity, input (JSON text), processing_version, tags.
UPDATE task_history
   SET input = %(input)s::jsonb,
       tags = %(tags)s::varchar[],
       processing_version = %(processing_version)s,
       trigger = trigger || jsonb_build_object(
           'coalesced', COALESCE((trigger ->> 'coalesced')::int, 0) + 1),
       updated_at = now()
 WHERE task_id = %(task_id)s
   AND identity = %(identity)s
   AND state = 'pending'
   AND trigger ? 'waitsFor'
RETURNING id, priority
