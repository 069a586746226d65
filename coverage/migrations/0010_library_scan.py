# The library scan (coverage.library): each file's mtime, and a file rewritten on disk (a new
# size or mtime) as its own event, `file.modified`, in the trigger's one transaction.

import pgtrigger.compiler
import pgtrigger.migrations
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('coverage', '0009_media_file_probe'),
    ]

    operations = [
        pgtrigger.migrations.RemoveTrigger(
            model_name='mediafile',
            name='files_changed',
        ),
        migrations.AddField(
            model_name='mediafile',
            name='mtime',
            field=models.DateTimeField(blank=True, null=True),
        ),
        pgtrigger.migrations.AddTrigger(
            model_name='mediafile',
            trigger=pgtrigger.compiler.Trigger(name='files_changed', sql=pgtrigger.compiler.UpsertTriggerSql(func="-- The body of the statement trigger files_changed on media_files (`coverage.models`): one event\n-- per changed file and item it holds. A new size or mtime is `file.modified` (rewritten on\n-- disk, `coverage.library`), but a first mtime (a row from before the library scan kept them)\n-- is none; a new probe or hash is `file.content_changed`; anything else that moved,\n-- `is_missing`, is `file.presence_changed`.\n-- Parameters: none.\nINSERT INTO event_outbox (kind, item_id)\nSELECT CASE WHEN m.modified THEN 'file.modified'\n            WHEN (n.probed_at, n.content_hash) IS DISTINCT FROM (o.probed_at, o.content_hash)\n            THEN 'file.content_changed'\n            ELSE 'file.presence_changed' END,\n       fi.item_id\n  FROM new_rows n\n  JOIN old_rows o USING (id)\n  JOIN media_file_items fi ON fi.file_id = n.id,\n       LATERAL (SELECT n.size IS DISTINCT FROM o.size\n                    OR (o.mtime IS NOT NULL AND n.mtime IS DISTINCT FROM o.mtime) AS modified) m\n WHERE m.modified\n    OR (n.probed_at, n.content_hash, n.is_missing)\n       IS DISTINCT FROM (o.probed_at, o.content_hash, o.is_missing);\n RETURN NULL;", hash='5f76ad215fa979da7102198cd89f2feb072546c6', level='STATEMENT', operation='UPDATE', pgid='pgtrigger_files_changed_1e98a', referencing='REFERENCING OLD TABLE AS old_rows  NEW TABLE AS new_rows ', table='media_files', when='AFTER')),
        ),
    ]
