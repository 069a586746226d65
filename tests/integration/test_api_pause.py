"""The pause API (issue 27) against the permission matrix (no token, view, operate), its error
answers (404 unknown task or class, 409 already paused or not paused, 422 naming the field,
nothing written on any of them), a refused start's 503 `paused` through `POST /runs`, and the
pauses on /metrics and on the Tasks page (operators get the buttons, viewers do not)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from django.test import Client

from orchestrator.api import tokens
from orchestrator.api.access import Access
from orchestrator.models import TaskHistory, TaskPause
from orchestrator.runs.start import start_run
from orchestrator.stores import keys, valkey
from orchestrator.triggers import TriggerKind
from tests.support.metrics import scrape
from tests.support.users import PASSWORD, account

pytestmark = pytest.mark.django_db(transaction=True)

API = "/api/v1"
TASK = "test-record-order"  # class maintenance; nothing consumes its queue here
ROUTES = [
    f"{API}/tasks/{TASK}/pause",
    f"{API}/tasks/{TASK}/resume",
    f"{API}/classes/maintenance/pause",
    f"{API}/classes/maintenance/resume",
]
BODY = {"reason": "upstream outage"}


@pytest.fixture(autouse=True)
def _clean() -> Iterator[None]:
    valkey.client().delete(keys.pauses())
    yield
    valkey.client().delete(keys.pauses())


def _client(*grants: Access, name: str = "u") -> Client:
    user = account(name, *grants)
    return Client(headers={"Authorization": f"Bearer {tokens.issue(user, 'tests')[1]}"})


def _post(client: Client, path: str, body: object = None) -> tuple[int, dict[str, object]]:
    response = client.post(path, json.dumps(body if body is not None else BODY), "application/json")
    return response.status_code, response.json()


@pytest.mark.parametrize("path", ROUTES)
def test_no_token_and_a_viewer_are_refused_and_nothing_is_written(path: str) -> None:
    assert _post(Client(), path)[0] == 401
    assert _post(_client(Access.VIEW), path)[0] == 403
    assert not TaskPause.objects.exists()
    assert valkey.client().hlen(keys.pauses()) == 0


def test_an_operator_pauses_and_resumes_and_a_viewer_lists() -> None:
    operator = _client(Access.VIEW, Access.OPERATE, name="ops")
    viewer = _client(Access.VIEW, name="viewer")
    assert Client().get(f"{API}/pauses").status_code == 401
    status, paused = _post(operator, ROUTES[0], {**BODY, "refuse_starts": True})
    assert status == 200
    assert paused["paused_by"] == "ops" and paused["refuse_starts"] is True
    assert paused["reason"] == BODY["reason"] and paused["scope"] == "task"
    listed = viewer.get(f"{API}/pauses")
    assert listed.status_code == 200 and [p["name"] for p in listed.json()] == [TASK]
    # Paused with "refuse": a start through the API is a 503 with the refusal's code.
    before = TaskHistory.objects.count()
    refused = operator.post(
        f"{API}/runs", {"task": TASK, "input": {"label": "x"}}, "application/json"
    )
    assert refused.status_code == 503 and refused.json()["code"] == "paused"
    assert TaskHistory.objects.count() == before
    # Twice: 409 with a code.
    assert _post(operator, ROUTES[0]) == (409, _post(operator, ROUTES[0])[1])
    assert _post(operator, ROUTES[0])[1]["code"] == "already_paused"
    status, resumed = _post(operator, ROUTES[1])
    assert status == 200 and resumed["resumed_by"] == "ops" and resumed["released"] == 0
    status, again = _post(operator, ROUTES[1])
    assert status == 409 and again["code"] == "not_paused"
    # A class: starts still taken; the run's message still waits in its queue (no worker
    # parked it), so the resume leaves it there rather than publish it twice.
    assert _post(operator, ROUTES[2])[0] == 200
    assert (
        operator.post(
            f"{API}/runs", {"task": TASK, "input": {"label": "y"}}, "application/json"
        ).status_code
        == 202
    )
    status, resumed = _post(operator, ROUTES[3])
    assert status == 200 and resumed["released"] == 0


@pytest.mark.parametrize(
    ("path", "body", "status", "field"),
    [
        (f"{API}/tasks/no-such-task/pause", BODY, 404, None),
        (f"{API}/classes/no-such-class/pause", BODY, 404, None),
        (f"{API}/tasks/no-such-task/resume", None, 404, None),
        (ROUTES[0], {}, 422, "reason"),
        (ROUTES[0], {"reason": ""}, 422, "reason"),
        (ROUTES[0], {"reason": "x" * 501}, 422, "reason"),
        (ROUTES[0], {"reason": "a\u0000b"}, 422, "reason"),
        (ROUTES[0], {**BODY, "refuse_starts": "maybe"}, 422, "refuse_starts"),
        (ROUTES[0], {**BODY, "extra": 1}, 422, "extra"),
    ],
)
def test_bad_input_is_refused_with_the_error_shape_and_nothing_written(
    path: str, body: object, status: int, field: str | None
) -> None:
    operator = _client(Access.VIEW, Access.OPERATE)
    answer, error = _post(operator, path, body)
    assert answer == status and isinstance(error["detail"], str)
    if field is not None:
        assert field in [e["loc"][-1] for e in error["errors"]]  # type: ignore[union-attr]
    assert not TaskPause.objects.exists()


def test_metrics_and_the_tasks_page_show_the_pause() -> None:
    operator = _client(Access.VIEW, Access.OPERATE, name="ops")
    _post(operator, ROUTES[2], {"reason": "disk full"})
    start_run(TASK, {"label": "held"}, trigger=TriggerKind.MANUAL)
    samples = scrape()
    labels = (("name", "maintenance"), ("refuse_starts", "false"), ("scope", "class"))
    assert samples[("lumastra_paused", labels)] == 1
    assert samples[("lumastra_paused_runs", (("task", TASK),))] == 1

    page = "/admin/orchestrator/taskhistory/tasks/"
    ops, viewer = Client(), Client()
    assert ops.login(username="ops", password=PASSWORD)
    account("viewer", Access.VIEW)
    assert viewer.login(username="viewer", password=PASSWORD)
    shown = ops.get(page).content.decode()
    assert "class maintenance paused" in shown and "disk full" in shown and "by ops" in shown
    assert 'value="Resume class"' in shown
    seen = viewer.get(page).content.decode()
    assert "class maintenance paused" in seen and "Resume class" not in seen
    assert "Pause task" not in seen
    # The operator's button resumes it, logged under their name.
    done = ops.post(
        "/admin/orchestrator/taskhistory/tasks/pauses/resume/",
        {"scope": "class", "name": "maintenance"},
    )
    assert done.status_code == 302
    assert TaskPause.objects.get().resumed_by == "ops"
