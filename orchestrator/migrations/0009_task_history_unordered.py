"""No default ordering on runs: it added ORDER BY created_at to lookups by id (issue 9)."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("orchestrator", "0008_run_permissions"),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="taskhistory",
            options={
                "permissions": [
                    (
                        "operate_taskhistory",
                        "Can start, cancel and retry runs and force-enable circuits",
                    )
                ],
                "verbose_name": "run",
            },
        ),
    ]
