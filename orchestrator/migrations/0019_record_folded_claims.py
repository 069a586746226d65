"""A claim's end that took its claim with it (issue 22: a short run's claim is folded into its
end) is recorded as the two moves it made: pending → active → completed or failed, in the
audit trail and in the webhook events, so every claim shows in both."""

import pgtrigger.compiler
import pgtrigger.migrations
from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('orchestrator', '0018_drop_run_id_pattern_index'),
    ]

    operations = [
        pgtrigger.migrations.RemoveTrigger(
            model_name='taskhistory',
            name='audit_state_update',
        ),
        pgtrigger.migrations.RemoveTrigger(
            model_name='taskhistory',
            name='run_event_insert',
        ),
        pgtrigger.migrations.RemoveTrigger(
            model_name='taskhistory',
            name='run_event_update',
        ),
        pgtrigger.migrations.AddTrigger(
            model_name='taskhistory',
            trigger=pgtrigger.compiler.Trigger(name='audit_state_update', sql=pgtrigger.compiler.UpsertTriggerSql(condition='WHEN (OLD."state" IS DISTINCT FROM (NEW."state"))', func="\nIF TG_OP = 'UPDATE' AND OLD.state = 'pending' AND NEW.state IN ('completed', 'failed') AND NEW.owner_instance_id <> '' THEN\n  INSERT INTO task_history_audit (run_id, from_state, to_state, at) VALUES\n    (NEW.id, 'pending', 'active', LEAST(COALESCE(NEW.started_at, clock_timestamp()),\n                                        clock_timestamp())),\n    (NEW.id, 'active', NEW.state, clock_timestamp());\nELSE\n  INSERT INTO task_history_audit (run_id, from_state, to_state, at)\n  VALUES (NEW.id, OLD.state, NEW.state, clock_timestamp());\nEND IF;\nRETURN NULL;\n", hash='e12390148c6451cf161f9747d671e9bbd6dcc417', operation='UPDATE OF "state"', pgid='pgtrigger_audit_state_update_8117d', table='task_history', when='AFTER')),
        ),
        pgtrigger.migrations.AddTrigger(
            model_name='taskhistory',
            trigger=pgtrigger.compiler.Trigger(name='run_event_insert', sql=pgtrigger.compiler.UpsertTriggerSql(func='\nIF NOT EXISTS (SELECT 1 FROM webhook_endpoint WHERE enabled) THEN RETURN NULL; END IF;\nINSERT INTO run_event_outbox (id, envelope, created_at)\nSELECT m.id, jsonb_build_object(\n    \'specversion\', \'1.0\', \'id\', m.id, \'source\', \'/lumastra/runs\',\n    \'type\', \'org.lumastra.task.run.\' || m.state,\n    \'time\', to_char(clock_timestamp() AT TIME ZONE \'UTC\', \'YYYY-MM-DD"T"HH24:MI:SS.US"Z"\'),\n    \'subject\', NEW.id, \'datacontenttype\', \'application/json\',\n    \'data\', jsonb_build_object(\n        \'run_id\', NEW.id, \'task\', NEW.task_id, \'state\', m.state, \'priority\', NEW.priority,\n        \'trigger\', NEW.trigger, \'attempts\', NEW.attempts, \'created_at\', NEW.created_at,\n        \'started_at\', NEW.started_at,\n        \'finished_at\', CASE WHEN m.step = 1 THEN NULL ELSE NEW.finished_at END,\n        \'error\', CASE WHEN m.step = 1 THEN NULL ELSE NEW.error END)),\n    clock_timestamp()\n  FROM (SELECT step, state, \'evt_\' || replace(gen_random_uuid()::text, \'-\', \'\') AS id\n          FROM (VALUES (1, \'active\'), (2, NEW.state::text)) AS moves(step, state)\n         WHERE step = 2 OR (TG_OP = \'UPDATE\' AND OLD.state = \'pending\' AND NEW.state IN (\'completed\', \'failed\') AND NEW.owner_instance_id <> \'\')) AS m\n ORDER BY m.step;\nRETURN NULL;\n', hash='6b46754ce0b2d348864b578a08ef47e9e4ec606d', operation='INSERT', pgid='pgtrigger_run_event_insert_507c2', table='task_history', when='AFTER')),
        ),
        pgtrigger.migrations.AddTrigger(
            model_name='taskhistory',
            trigger=pgtrigger.compiler.Trigger(name='run_event_update', sql=pgtrigger.compiler.UpsertTriggerSql(condition='WHEN (OLD."state" IS DISTINCT FROM (NEW."state"))', func='\nIF NOT EXISTS (SELECT 1 FROM webhook_endpoint WHERE enabled) THEN RETURN NULL; END IF;\nINSERT INTO run_event_outbox (id, envelope, created_at)\nSELECT m.id, jsonb_build_object(\n    \'specversion\', \'1.0\', \'id\', m.id, \'source\', \'/lumastra/runs\',\n    \'type\', \'org.lumastra.task.run.\' || m.state,\n    \'time\', to_char(clock_timestamp() AT TIME ZONE \'UTC\', \'YYYY-MM-DD"T"HH24:MI:SS.US"Z"\'),\n    \'subject\', NEW.id, \'datacontenttype\', \'application/json\',\n    \'data\', jsonb_build_object(\n        \'run_id\', NEW.id, \'task\', NEW.task_id, \'state\', m.state, \'priority\', NEW.priority,\n        \'trigger\', NEW.trigger, \'attempts\', NEW.attempts, \'created_at\', NEW.created_at,\n        \'started_at\', NEW.started_at,\n        \'finished_at\', CASE WHEN m.step = 1 THEN NULL ELSE NEW.finished_at END,\n        \'error\', CASE WHEN m.step = 1 THEN NULL ELSE NEW.error END)),\n    clock_timestamp()\n  FROM (SELECT step, state, \'evt_\' || replace(gen_random_uuid()::text, \'-\', \'\') AS id\n          FROM (VALUES (1, \'active\'), (2, NEW.state::text)) AS moves(step, state)\n         WHERE step = 2 OR (TG_OP = \'UPDATE\' AND OLD.state = \'pending\' AND NEW.state IN (\'completed\', \'failed\') AND NEW.owner_instance_id <> \'\')) AS m\n ORDER BY m.step;\nRETURN NULL;\n', hash='431f10c962e94d27725a8bb9c48fc6a68a8c695d', operation='UPDATE OF "state"', pgid='pgtrigger_run_event_update_13d05', table='task_history', when='AFTER')),
        ),
    ]
