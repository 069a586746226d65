"""`manage.py bootstrap_demo`: the demo user and a few demo runs, then where to look.

Safe to run again: the user is created only when missing, and each demo run carries an
idempotency key, so a demo run still waiting or running is returned instead of started twice.
Once the previous batch has finished, a new invocation starts a fresh one to watch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management.base import BaseCommand, CommandError

from lumastra import config
from orchestrator.api import access
from orchestrator.runs.start import start_run
from orchestrator.triggers import TriggerKind

DEMO_USERNAME = "demo"
DEMO_PASSWORD = "lumastra-demo"  # noqa: S105 (a published demo credential, for local runs)

WEB = "http://127.0.0.1:8000"
URLS = (
    ("Admin", f"{WEB}/admin/"),
    ("API docs", f"{WEB}/api/v1/docs"),
    ("Flower", "http://127.0.0.1:5555"),
)


@dataclass(frozen=True)
class DemoRun:
    task_id: str
    input: dict[str, Any]


# What the default media root holds for `hash-folder` to read: a few small files, two deep.
SAMPLE_MEDIA = {
    "README.txt": b"Sample media for the Lumastra demo; hash-folder reads below this folder.\n",
    "shows/pilot/episode-01.ts": bytes(range(256)) * 512,
    "music/theme.flac": bytes(reversed(range(256))) * 256,
}


def demo_media() -> Path:
    """The folder the demo's `hash-folder` run reads: the first media root. The default root,
    under the project, is created with sample files; an operator's root is only read."""
    roots = settings.CONFIG.media_roots
    if not roots:
        raise CommandError("LUMASTRA_MEDIA_ROOTS is empty: hash-folder has nothing it may read")
    folder: Path = roots[0]
    if folder in config.load({}).media_roots:
        for name, content in SAMPLE_MEDIA.items():
            sample = folder / name
            if not sample.exists():
                sample.parent.mkdir(parents=True, exist_ok=True)
                sample.write_bytes(content)
    return folder


def demo_runs() -> tuple[DemoRun, ...]:
    return (
        DemoRun("hash-folder", {"path": str(demo_media())}),
        DemoRun("slow-progress", {"steps": 20, "step_seconds": 0.5}),
        DemoRun("history-retention", {}),
        # Each stage waits a second, so its stages can be watched moving in the admin.
        DemoRun("demo-pipeline", {"path": str(demo_media()), "stage_sleep_s": 1.0}),
    )


class Command(BaseCommand):
    help = "Create the demo user (if missing) and start the demo runs."

    def handle(self, *args: Any, **options: Any) -> None:
        self._ensure_user()
        self.stdout.write("demo runs:")
        for demo in demo_runs():
            handle = start_run(
                demo.task_id,
                demo.input,
                trigger={"kind": TriggerKind.SYSTEM.value, "source": "bootstrap_demo"},
                idempotency_key=f"demo-{demo.task_id}",
            )
            verb = "still live" if handle.deduplicated else "started"
            self.stdout.write(f"  {verb:10} {handle.task_id:18} {handle.run_id}")
        self.stdout.write("")
        self.stdout.write("once every role is up:")
        for name, url in URLS:
            self.stdout.write(f"  {name + ':':10} {url}")
        self.stdout.write(f"  {'Login:':10} {DEMO_USERNAME} / {DEMO_PASSWORD}")

    def _ensure_user(self) -> None:
        users = get_user_model().objects
        user = users.filter(username=DEMO_USERNAME).first()
        if user is not None:
            self.stdout.write(f"demo user {DEMO_USERNAME!r} exists; left as it is")
        else:
            user = users.create_superuser(
                username=DEMO_USERNAME, email="demo@example.invalid", password=DEMO_PASSWORD
            )
            self.stdout.write(f"created demo superuser {DEMO_USERNAME!r}")
        # In both groups too, so the console shows what each grants (the superuser has all).
        user.groups.add(*Group.objects.filter(name__in=(access.VIEWERS, access.OPERATORS)))
