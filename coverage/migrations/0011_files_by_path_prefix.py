# A folder's files by path prefix (coverage.library), built without holding writes off a large
# catalog: concurrently, so outside a transaction.

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("coverage", "0010_library_scan"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="mediafile",
            index=models.Index(
                fields=["path"], name="media_files_path_prefix", opclasses=["varchar_pattern_ops"]
            ),
        ),
    ]
