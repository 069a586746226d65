"""Every task body checks and ages its own database connections, without a round trip
(`runner.task_connections`, issue 22): Celery's Django fix-up, which would walk every
connection before and after each task as well, is told to leave them alone (lumastra/settings:
CELERY_DB_REUSE_MAX), so the tasks that are not the runner check theirs too."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from celery.fixups.django import DjangoWorkerFixup
from django.db import connections

from lumastra.celery import app
from orchestrator.runs import runner
from orchestrator.scheduler import dispatch


def test_the_fixup_walks_no_connection_around_a_task(monkeypatch: pytest.MonkeyPatch) -> None:
    walked: list[str] = []
    for conn in connections.all():
        monkeypatch.setattr(
            conn, "close_if_unusable_or_obsolete", lambda alias=conn.alias: walked.append(alias)
        )
    fixup = DjangoWorkerFixup(app)
    task = SimpleNamespace(request=SimpleNamespace(is_eager=False))

    for _ in range(100):
        fixup.on_task_prerun(sender=task)
        fixup.on_task_postrun(sender=task)

    assert walked == []


def test_the_schedule_dispatch_task_checks_its_connections(monkeypatch: pytest.MonkeyPatch) -> None:
    checked: list[bool] = []
    monkeypatch.setattr(runner, "check_connections", lambda: checked.append(True))

    def fired(task_id: str, **_: Any) -> Any:
        assert checked, "fired before its connections were checked"
        return SimpleNamespace(outcome=SimpleNamespace(value="fired"))

    monkeypatch.setattr(dispatch, "fire_static", fired)

    assert dispatch._dispatch("some-task") == "fired"


def test_connections_are_aged_after_a_body_that_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[str] = []
    monkeypatch.setattr(runner, "check_connections", lambda: events.append("checked"))
    monkeypatch.setattr(runner, "close_old_connections", lambda: events.append("aged"))

    with pytest.raises(RuntimeError), runner.task_connections():
        events.append("body")
        raise RuntimeError("the body failed")

    assert events == ["checked", "body", "aged"]
