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
            trigger=pgtrigger.compiler.Trigger(name='files_changed', sql=pgtrigger.compiler.UpsertTriggerSql(func="INSERT INTO event_outbox (kind, item_id) SELECT CASE WHEN (n.size, n.mtime) IS DISTINCT FROM (o.size, o.mtime) THEN 'file.modified' WHEN (n.probed_at, n.content_hash) IS DISTINCT FROM (o.probed_at, o.content_hash) THEN 'file.content_changed' ELSE 'file.presence_changed' END, fi.item_id FROM new_rows n JOIN old_rows o USING (id) JOIN media_file_items fi ON fi.file_id = n.id WHERE (n.size, n.mtime, n.probed_at, n.content_hash, n.is_missing) IS DISTINCT FROM (o.size, o.mtime, o.probed_at, o.content_hash, o.is_missing); RETURN NULL;", hash='aa0390dfe49a3a672327d24780758d3e53f92df0', level='STATEMENT', operation='UPDATE', pgid='pgtrigger_files_changed_1e98a', referencing='REFERENCING OLD TABLE AS old_rows  NEW TABLE AS new_rows ', table='media_files', when='AFTER')),
        ),
    ]
