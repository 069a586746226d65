-- The body of the statement trigger files_changed on media_files (`coverage.models`): one event
-- per changed file and item it holds. A new size or mtime is `file.modified` (rewritten on
-- disk, `coverage.library`), but a first mtime (a row from before the library scan kept them)
-- is none; a new probe or hash is `file.content_changed`; anything else that moved,
-- `is_missing`, is `file.presence_changed`.
-- Parameters: none.
INSERT INTO event_outbox (kind, item_id)
SELECT CASE WHEN m.modified THEN 'file.modified'
            WHEN (n.probed_at, n.content_hash) IS DISTINCT FROM (o.probed_at, o.content_hash)
            THEN 'file.content_changed'
            ELSE 'file.presence_changed' END,
       fi.item_id
  FROM new_rows n
  JOIN old_rows o USING (id)
  JOIN media_file_items fi ON fi.file_id = n.id,
       LATERAL (SELECT n.size IS DISTINCT FROM o.size
                    OR (o.mtime IS NOT NULL AND n.mtime IS DISTINCT FROM o.mtime) AS modified) m
 WHERE m.modified
    OR (n.probed_at, n.content_hash, n.is_missing)
       IS DISTINCT FROM (o.probed_at, o.content_hash, o.is_missing);
