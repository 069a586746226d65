-- A batch's row (`runs.batch`, `runs.children`), in the transaction that records its runs: `open`
-- of its `total` runs still to end (those recorded ended, `counts`, are not), done at once when
-- none is open. Its runs' ends are counted by the trigger run_batch_count (count_batch_end.sql).
-- A resume's batch keeps the completed runs of the batches it names (`reused_from`), counted in
-- `total` and `counts` (`runs.spawn.reuse`).
-- A batch whose children fail their parent is done at once when one was recorded ended (dropped).
-- Parameters: id, parent_run_id, parent_stage, on_failure, awaited, total, open, counts,
-- on_complete, on_success (JSON text or NULL each), reused_from (batch ids), done (a boolean).
INSERT INTO run_batches
    (id, parent_run_id, parent_stage, on_failure, awaited, total, open, counts, reused_from,
     on_complete, on_success, callbacks, created_at, done_at, released_at)
VALUES (%(id)s, %(parent_run_id)s, %(parent_stage)s, %(on_failure)s, %(awaited)s, %(total)s,
        %(open)s, %(counts)s::jsonb, %(reused_from)s::text[], %(on_complete)s::jsonb,
        %(on_success)s::jsonb, '{}', now(), CASE WHEN %(done)s THEN now() END, NULL)
