"""The operate permission on runs, and the two groups that hand out view and operate
(orchestrator/api/access.py).

The permissions are created here rather than left to the post-migrate signal, which runs
only after every migration: the groups need them now. Running it again changes nothing.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations

# As the migration saw them; orchestrator/api/access.py names the same groups for the code.
PERMISSIONS = {
    "view_taskhistory": "Can view run",
    "operate_taskhistory": "Can start, cancel and retry runs and force-enable circuits",
}
GROUPS = {
    "Lumastra viewers": ["view_taskhistory"],
    "Lumastra operators": ["view_taskhistory", "operate_taskhistory"],
}


def create_groups(apps: Any, schema_editor: Any) -> None:
    content_type_model = apps.get_model("contenttypes", "ContentType")
    permission_model = apps.get_model("auth", "Permission")
    group_model = apps.get_model("auth", "Group")
    runs, _ = content_type_model.objects.get_or_create(
        app_label="orchestrator", model="taskhistory"
    )
    permissions = {
        codename: permission_model.objects.get_or_create(
            content_type=runs, codename=codename, defaults={"name": name}
        )[0]
        for codename, name in PERMISSIONS.items()
    }
    for name, codenames in GROUPS.items():
        group, _ = group_model.objects.get_or_create(name=name)
        group.permissions.add(*(permissions[codename] for codename in codenames))


def remove_groups(apps: Any, schema_editor: Any) -> None:
    apps.get_model("auth", "Group").objects.filter(name__in=GROUPS).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
        ("orchestrator", "0007_finished_index"),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="taskhistory",
            options={
                "ordering": ["-created_at"],
                "permissions": [
                    (
                        "operate_taskhistory",
                        "Can start, cancel and retry runs and force-enable circuits",
                    )
                ],
                "verbose_name": "run",
            },
        ),
        migrations.RunPython(create_groups, remove_groups),
    ]
