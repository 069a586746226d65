"""Child runs and batches (issue 40, `runs.children`): the batches' table, a run's parent and
batch, the trigger that counts a batch's ends, and task_history's two indexes built concurrently
(a plain CREATE INDEX would hold off every run's writes for the whole build)."""

import django.contrib.postgres.fields
import pgtrigger.compiler
import pgtrigger.migrations
from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ('orchestrator', '0030_follow_up_uses_its_index'),
    ]

    operations = [
        migrations.CreateModel(
            name='RunBatch',
            fields=[
                ('id', models.CharField(max_length=40, primary_key=True, serialize=False)),
                ('parent_run_id', models.CharField(blank=True, max_length=40, null=True)),
                ('parent_stage', models.CharField(blank=True, default='', max_length=64)),
                ('on_failure', models.CharField(choices=[('fail_parent', 'Fail Parent'), ('continue', 'Continue')], default='continue', max_length=16)),
                ('awaited', models.BooleanField(default=False)),
                ('total', models.PositiveIntegerField()),
                ('open', models.PositiveIntegerField()),
                ('counts', models.JSONField(blank=True, default=dict)),
                ('reused_from', django.contrib.postgres.fields.ArrayField(base_field=models.CharField(max_length=40), blank=True, default=list, size=None)),
                ('on_complete', models.JSONField(blank=True, null=True)),
                ('on_success', models.JSONField(blank=True, null=True)),
                ('callbacks', models.JSONField(blank=True, default=dict)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('done_at', models.DateTimeField(blank=True, null=True)),
                ('released_at', models.DateTimeField(blank=True, null=True)),
            ],
            options={
                'db_table': 'run_batches',
            },
        ),
        migrations.AddField(
            model_name='taskhistory',
            name='batch_id',
            field=models.CharField(blank=True, max_length=40, null=True),
        ),
        migrations.AddField(
            model_name='taskhistory',
            name='parent_run_id',
            field=models.CharField(blank=True, max_length=40, null=True),
        ),
        AddIndexConcurrently(
            model_name='taskhistory',
            index=models.Index(condition=models.Q(('parent_run_id__isnull', False)), fields=['parent_run_id'], name='task_history_parent'),
        ),
        AddIndexConcurrently(
            model_name='taskhistory',
            index=models.Index(condition=models.Q(('batch_id__isnull', False)), fields=['batch_id', 'state'], name='task_history_batch'),
        ),
        pgtrigger.migrations.AddTrigger(
            model_name='taskhistory',
            trigger=pgtrigger.compiler.Trigger(name='run_batch_count', sql=pgtrigger.compiler.UpsertTriggerSql(condition="WHEN (NEW.batch_id IS NOT NULL AND OLD.state NOT IN ('completed', 'failed', 'cancelled') AND NEW.state IN ('completed', 'failed', 'cancelled'))", declare='DECLARE done boolean;', func="-- The body of the trigger run_batch_count on task_history (`models.runs`), fired by the end of a\n-- run that belongs to a batch (NEW), whichever path writes the end: the batch counts it, once\n-- (a run's state leaves the live states once, so a duplicate end, a drain replay or a repair\n-- cannot count it twice). The batch is done when its last run ended, or, for children that fail\n-- their parent, when the first one ended otherwise than completed; the leader's release acts on\n-- it (`runs.children`), woken by a notification on `lumastra_batch_done` (sent at the commit)\n-- rather than at its next poll. The batch's row lock orders concurrent ends: exactly one sees\n-- open = 1. `done` is the trigger's one variable.\n-- Parameters: none.\nUPDATE run_batches\n   SET open = open - 1,\n       counts = jsonb_set(counts, ARRAY[NEW.state::text],\n                          to_jsonb(COALESCE((counts ->> NEW.state::text)::int, 0) + 1)),\n       done_at = CASE WHEN done_at IS NOT NULL THEN done_at\n                      WHEN open = 1 THEN now()\n                      WHEN on_failure = 'fail_parent' AND NEW.state <> 'completed' THEN now()\n                 END\n WHERE id = NEW.batch_id\nRETURNING done_at IS NOT NULL AND released_at IS NULL INTO done;\nIF done THEN\n    PERFORM pg_notify('lumastra_batch_done', NEW.batch_id);\nEND IF\n;\nRETURN NULL;", hash='02304821466080f3c877b93d2c5b8fd44957f75d', operation='UPDATE OF "state"', pgid='pgtrigger_run_batch_count_cc9e2', table='task_history', when='AFTER')),
        ),
        migrations.AddIndex(
            model_name='runbatch',
            index=models.Index(condition=models.Q(('parent_run_id__isnull', False)), fields=['parent_run_id', 'parent_stage'], name='run_batches_parent'),
        ),
        migrations.AddIndex(
            model_name='runbatch',
            index=models.Index(condition=models.Q(('open__gt', 0)), fields=['parent_run_id'], name='run_batches_open'),
        ),
        migrations.AddIndex(
            model_name='runbatch',
            index=models.Index(condition=models.Q(('done_at__isnull', False), ('released_at__isnull', True)), fields=['done_at'], name='run_batches_to_release'),
        ),
    ]
