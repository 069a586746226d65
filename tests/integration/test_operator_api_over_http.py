"""Issue 27's routes through the real web role (`deploy/start-web.sh`: uvicorn, every
middleware, the role's own settings) and a real worker, over HTTP: a delayed start, a batch, a
pause that refuses starts, a signed inbound trigger (replayed and forged too), kill now, and the
console's pages as JSON. Each behaviour's own file tests it in depth in-process; this one shows
the deployed role serves them."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from lumastra.webhooks import HEADER, sign
from orchestrator.api import tokens
from orchestrator.api.access import Access
from orchestrator.models import TaskHistory
from orchestrator.runs import due
from tests.support.fixtures import wait_for, worker_process
from tests.support.messages import empty_queues
from tests.support.servers import web_process
from tests.support.users import account, operator

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

TASK = "test-starts"  # no shared worker takes its queue
QUEUE = "task.t.test-starts"
TRIGGER = "test-noop-hook"
SECRET = "trsec-over-http"


@pytest.fixture(scope="module")
def web(django_db_setup: None) -> Iterator[str]:
    # After the test database exists: the role is pointed at it, not at the one it copies.
    env = {f"LUMASTRA_TRIGGER_SECRET_{TRIGGER.upper().replace('-', '_')}": SECRET}
    with web_process("web-issue27", **env) as url:
        yield url


@pytest.fixture(autouse=True)
def _empty_queue() -> Iterator[None]:
    yield
    empty_queues(QUEUE)


def _call(
    url: str,
    method: str = "GET",
    body: object = None,
    token: str | None = None,
    headers: dict[str, str] | None = None,
    raw: bytes | None = None,
) -> tuple[int, Any]:
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    for name, value in (headers or {}).items():
        request.add_header(name, value)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"null")


def _token(user: object) -> str:
    return tokens.issue(user, "http")[1]  # type: ignore[arg-type]


def test_a_delayed_start_and_a_batch_over_http(web: str) -> None:
    ops = _token(operator("http-ops"))

    status, started = _call(f"{web}/api/v1/runs", "POST", {"task": TASK, "delay_s": 1}, ops)
    assert status == 202, started
    status, shown = _call(f"{web}/api/v1/runs/{started['run_id']}", token=ops)
    due_at = datetime.fromisoformat(shown["not_before"])
    status, batch = _call(
        f"{web}/api/v1/runs:batch",
        "POST",
        {"runs": [{"task": TASK}, {"task": "nope"}, {"task": TASK, "priority": 1}]},
        ops,
    )
    assert status == 200, batch
    assert [i["result"] for i in batch["items"]] == ["started", "refused", "started"]

    wait_for(lambda: datetime.now(UTC) > due_at, timeout=10)
    assert due.release() == 1
    ids = [started["run_id"]] + [i["run_id"] for i in batch["items"] if i["run_id"]]
    with worker_process([QUEUE], name="http-starts"):
        wait_for(
            lambda: TaskHistory.objects.filter(id__in=ids, state="completed").count() == 3,
            timeout=30,
        )
    assert TaskHistory.objects.get(id=started["run_id"]).started_at >= due_at


def test_a_pause_that_refuses_starts_then_a_resume_over_http(web: str) -> None:
    ops = _token(operator("http-ops"))
    viewer = _token(account("http-viewer", Access.VIEW))
    pause = {"reason": "backup window", "refuse_starts": True}

    assert _call(f"{web}/api/v1/tasks/{TASK}/pause", "POST", pause, viewer)[0] == 403
    assert _call(f"{web}/api/v1/tasks/{TASK}/pause", "POST", pause, ops)[0] == 200
    status, refused = _call(f"{web}/api/v1/runs", "POST", {"task": TASK}, ops)
    assert (status, refused["code"]) == (503, "paused")
    assert _call(f"{web}/api/v1/tasks/{TASK}/resume", "POST", {}, ops)[0] == 200
    assert _call(f"{web}/api/v1/runs", "POST", {"task": TASK}, ops)[0] == 202


def test_a_signed_trigger_is_taken_once_and_a_forged_one_never(web: str) -> None:
    raw = json.dumps({"label": "over http"}).encode()
    url = f"{web}/api/v1/triggers/{TRIGGER}"
    before = TaskHistory.objects.count()

    forged = _call(url, "POST", raw=raw, headers={HEADER: sign(raw, "not-the-secret")})
    signed = sign(raw, SECRET)
    taken = _call(url, "POST", raw=raw, headers={HEADER: signed})
    replayed = _call(url, "POST", raw=raw, headers={HEADER: signed})

    assert forged[0] == 401
    assert taken[0] == 202, taken
    assert (replayed[0], replayed[1]["code"]) == (409, "replayed")
    assert TaskHistory.objects.count() == before + 1
    row = TaskHistory.objects.get(id=taken[1]["run_id"])
    assert row.trigger == {"kind": "webhook", "name": TRIGGER}


def test_kill_now_and_the_console_pages_as_json(web: str) -> None:
    ops = _token(operator("http-ops"))
    viewer = _token(account("http-viewer", Access.VIEW))
    status, started = _call(f"{web}/api/v1/runs", "POST", {"task": TASK}, ops)

    status, cancelled = _call(
        f"{web}/api/v1/runs/{started['run_id']}/cancel", "POST", {"kill": True}, ops
    )
    assert (status, cancelled["state"]) == (200, "cancelled")  # it had not started
    for page in (
        "dead-letters",
        "drain/poison",
        "schedules",
        "cluster/nodes",
        "cluster/leaders",
        "pauses",
        "coverage/outbox/dead-letters",
    ):
        assert _call(f"{web}/api/v1/{page}")[0] == 401, page
        assert _call(f"{web}/api/v1/{page}", token=viewer)[0] == 200, page
