"""`hash-folder` reads only below the media roots: a path that escapes them is a 422 at start
(and `InvalidInput` from `start_run`), and a worker refuses one that escapes after the start."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.contrib.auth.models import User
from django.db import transaction
from django.test import Client

from orchestrator.api import tokens
from orchestrator.models import TaskHistory
from orchestrator.runs.handle import InvalidInput
from orchestrator.runs.start import start_run
from orchestrator.triggers import TriggerKind
from tests.support.fixtures import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

RUNS = "/api/v1/runs"


@pytest.fixture
def api() -> Client:
    user = User.objects.create_user("ops", is_staff=True, is_superuser=True)
    return Client(headers={"Authorization": f"Bearer {tokens.issue(user, 'tests')[1]}"})


@pytest.fixture
def media(settings: Any, tmp_path: Path) -> Path:
    root = tmp_path / "media"
    (root / "shows").mkdir(parents=True)
    settings.CONFIG = dataclasses.replace(settings.CONFIG, media_roots=(root,))
    return root


@pytest.fixture
def worker_media() -> Iterator[Path]:
    """A fresh folder below the first configured media root, which the shared worker (started
    with this process's environment) reads too."""
    folder = django_settings.CONFIG.media_roots[0] / f"test-{uuid.uuid4().hex}"
    folder.mkdir(parents=True)
    try:
        yield folder
    finally:
        if folder.is_symlink():
            folder.unlink()
        else:
            shutil.rmtree(folder)


def post(client: Client, body: object) -> Any:
    return client.post(RUNS, json.dumps(body), content_type="application/json")


def test_a_path_through_a_link_to_etc_is_a_422_and_writes_nothing(api: Client, media: Path) -> None:
    (media / "shows" / "etc").symlink_to("/etc")

    response = post(api, {"task": "hash-folder", "input": {"path": str(media / "shows/etc")}})

    assert response.status_code == 422, response.content
    body = response.json()
    assert body["detail"] == "input is invalid for task 'hash-folder'"
    assert body["errors"] == [
        {
            "loc": ["body", "run", "input", "path"],
            "msg": f"resolves outside the media roots ({media})",
            "type": "outside_media_roots",
        }
    ]
    assert not TaskHistory.objects.exists()


@pytest.mark.parametrize("path", ["{media}/../outside", "/etc", "shows", "{project}/.git"])
def test_start_run_refuses_a_path_outside_the_roots(media: Path, path: str) -> None:
    (media.parent / "outside").mkdir()
    path = path.format(media=media, project=django_settings.BASE_DIR)

    with pytest.raises(InvalidInput) as caught:
        start_run("hash-folder", {"path": path}, trigger=TriggerKind.MANUAL)

    assert [e["loc"] for e in caught.value.errors] == [["path"]]
    assert not TaskHistory.objects.exists()


def test_a_path_inside_a_root_is_stored_resolved(media: Path) -> None:
    (media / "latest").symlink_to(media / "shows")

    with transaction.atomic():
        started = start_run(
            "hash-folder", {"path": f"{media}/latest/../shows"}, trigger=TriggerKind.MANUAL
        )
        run = TaskHistory.objects.get(id=started.run_id)
        # Not committed: no worker takes a run whose folder lies outside its roots.
        transaction.set_rollback(True)

    assert run.input == {"path": str(media / "shows"), "max_files": 1_000}


@pytest.mark.worker
def test_the_worker_hashes_below_the_root_and_follows_no_link(
    celery_worker: subprocess.Popen[bytes], worker_media: Path
) -> None:
    (worker_media / "season-1").mkdir()
    (worker_media / "season-1" / "episode-01.ts").write_bytes(b"one")
    (worker_media / "etc").symlink_to("/etc")
    (worker_media / "passwd").symlink_to("/etc/passwd")

    handle = start_run("hash-folder", {"path": str(worker_media)}, trigger=TriggerKind.MANUAL)
    run = wait_for(lambda: TaskHistory.objects.filter(id=handle.run_id, state="completed").first())

    assert run.result == {
        "files": 1,
        "sha256": {"season-1/episode-01.ts": hashlib.sha256(b"one").hexdigest()},
        "skipped_links": 2,
        "too_deep": 0,
        "truncated": False,
    }


@pytest.mark.worker
def test_a_folder_replaced_by_a_link_after_the_start_fails_the_run_for_good(
    celery_worker: subprocess.Popen[bytes], worker_media: Path
) -> None:
    (worker_media / "episode-01.ts").write_bytes(b"one")

    # The message is published when this block commits: the worker meets the link.
    with transaction.atomic():
        handle = start_run("hash-folder", {"path": str(worker_media)}, trigger=TriggerKind.MANUAL)
        shutil.rmtree(worker_media)
        worker_media.symlink_to("/etc")
    run = wait_for(lambda: TaskHistory.objects.filter(id=handle.run_id, state="failed").first())

    assert run.error["kind"] == "validation"
    assert "resolves outside the media roots" in run.error["message"]
    assert run.attempts <= 1 and run.result is None
