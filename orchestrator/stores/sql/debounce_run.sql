-- A debounced start joins the run an earlier start of its identity recorded and that still
-- waits (`runs.coalesce`): pending, never attempted, not released yet (`not_before` set; the
-- due loop clears it as it releases, release_due.sql), of a debounced start (`trigger ?
-- 'debounce'`). The last start's input (and tags) win; the run is due `period_s` from now, never later
-- than `max_wait_s` after its first start; `trigger.debounced` counts the starts it took. The
-- lookup is the partial unique index task_history_debounce_one's own. A run the due loop holds
-- (releasing it) is waited for, then no longer matches: this start becomes a run of its own.
-- A first start that asked for a later time than its debounce keeps it (`trigger.notBefore`).
-- The run takes this deploy's processing version with this deploy's input.
-- Parameters: task_id, identity, input (JSON text), processing_version, period_s, max_wait_s,
-- tags.
UPDATE task_history
   SET input = %(input)s::jsonb,
       tags = %(tags)s::varchar[],
       processing_version = %(processing_version)s,
       not_before = GREATEST(LEAST(now() + make_interval(secs => %(period_s)s),
                                   created_at + make_interval(secs => %(max_wait_s)s)),
                             (trigger ->> 'notBefore')::timestamptz),
       trigger = jsonb_set(trigger, '{debounced}',
                           to_jsonb(COALESCE((trigger ->> 'debounced')::int, 0) + 1)),
       updated_at = now()
 WHERE task_id = %(task_id)s
   AND identity = %(identity)s
   AND state = 'pending'
   AND attempts = 0
   AND not_before IS NOT NULL
   AND trigger ? 'debounce'
RETURNING id, priority
