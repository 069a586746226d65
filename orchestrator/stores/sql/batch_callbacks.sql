-- The runs a released batch's callbacks became (`runs.children`), in the release's transaction.
-- Parameters: id, callbacks (JSON text).
UPDATE run_batches SET callbacks = %(callbacks)s::jsonb WHERE id = %(id)s
