"""The HTTP API under /api/v1/: every happy path, and every refusal writing nothing.

"Nothing" is checked in all three stores: no task_history row, no Valkey run key, and no
message handed to the broker (Celery's `after_task_publish` signal, sent by the publisher).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Iterator
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from celery.signals import after_task_publish
from django.conf import settings
from django.contrib.auth.models import User
from django.core.handlers.asgi import ASGIHandler
from django.core.management import CommandError, call_command
from django.test import Client
from django.utils import timezone

from orchestrator.api import tokens
from orchestrator.models import ApiToken, TaskHistory
from orchestrator.runs.start import new_run_id
from orchestrator.stores import keys, valkey
from tasks import registry
from tests.support.fixtures import wait_for
from tests.support.users import operator

pytestmark = pytest.mark.django_db(transaction=True)

RUNS = "/api/v1/runs"
TASKS = "/api/v1/tasks"
# Only test_priority's own worker consumes this task's queue, so a run started here stays
# pending even when the shared worker is up, whatever order the suite runs in.
PARKED = {"task": "test-record-order", "input": {"label": "api"}}


class Writes:
    """What a request wrote to Postgres, Valkey and the broker while the fixture was up."""

    def __init__(self) -> None:
        self.published: list[dict[str, Any]] = []
        self.start()

    def start(self) -> None:
        """Count from here: what exists now is not a write under test."""
        self.published.clear()
        self._rows = TaskHistory.objects.count()
        self._run_keys = self._valkey_run_keys()

    @staticmethod
    def _valkey_run_keys() -> set[str]:
        # By run id: a worker finishing an earlier run renames its hash active → terminal.
        client = valkey.client()
        hashes = (keys.run_active("*"), keys.run_terminal("*"))
        runs = {key.rsplit(":", 1)[1] for p in hashes for key in client.scan_iter(p)}
        return runs | set(client.scan_iter(keys.identity("*", "*")))

    def record(self, sender: str, headers: dict[str, Any], routing_key: str, **_: Any) -> None:
        self.published.append({"task": sender, "id": headers["id"], "queue": routing_key})

    def assert_nothing(self) -> None:
        assert TaskHistory.objects.count() == self._rows
        # Only "nothing new": a worker may release an earlier run's identity key meanwhile.
        assert self._valkey_run_keys() - self._run_keys == set()
        assert self.published == []


@pytest.fixture
def writes() -> Iterator[Writes]:
    recorder = Writes()
    after_task_publish.connect(recorder.record, weak=False)
    try:
        yield recorder
    finally:
        after_task_publish.disconnect(recorder.record)


@pytest.fixture
def staff() -> User:
    return operator("ops")


@pytest.fixture
def token(staff: User) -> str:
    return tokens.issue(staff, "tests")[1]


@pytest.fixture
def api(token: str) -> Client:
    return Client(headers={"Authorization": f"Bearer {token}"})


def post(client: Client, body: object, **extra: Any) -> Any:
    data = body if isinstance(body, str | bytes) else json.dumps(body)
    return client.post(RUNS, data, content_type="application/json", **extra)


# --- starting runs -----------------------------------------------------------------------


def test_post_starts_a_pending_run_as_the_token_owner(api: Client, writes: Writes) -> None:
    response = post(api, PARKED)

    assert response.status_code == 202
    body = response.json()
    assert body["task"] == "test-record-order"
    assert body["state"] == "pending"
    assert body["priority"] == 2  # the API trigger's default
    assert body["deduplicated"] is False
    assert body["job_id"].endswith(f"#{body['run_id']}")
    row = TaskHistory.objects.get(id=body["run_id"])
    assert row.trigger == {"kind": "api", "actor": "ops"}
    assert row.input == {"label": "api", "seconds": 0.0}  # normalised by the input model
    assert valkey.client().hget(keys.run_active(row.id), "state") == "pending"
    assert writes.published == [
        {"task": "test-record-order", "id": body["job_id"], "queue": "task.t.test-record-order"}
    ]


def test_explicit_priority_and_validated_input_are_recorded(api: Client) -> None:
    response = post(api, {"task": "slow-progress", "input": {"steps": 3}, "priority": 7})

    assert response.status_code == 202
    row = TaskHistory.objects.get(id=response.json()["run_id"])
    assert row.priority == 7
    assert row.input == {"steps": 3, "step_seconds": 0.5}  # defaults filled in by the model


def test_idempotency_key_returns_the_live_run_with_200(api: Client, writes: Writes) -> None:
    first = post(api, {**PARKED, "idempotency_key": "nightly-1"})
    again = post(api, {**PARKED, "idempotency_key": "nightly-1"})

    assert first.status_code == 202
    assert again.status_code == 200
    assert again.json()["deduplicated"] is True
    assert again.json()["run_id"] == first.json()["run_id"]
    assert again.json()["state"] == "pending"
    assert TaskHistory.objects.count() == 1
    assert len(writes.published) == 1


@pytest.mark.parametrize("blank", ["", "  ", "\t\n"])
def test_an_empty_or_blank_idempotency_key_is_no_key(
    api: Client, writes: Writes, blank: str
) -> None:
    first = post(api, {**PARKED, "idempotency_key": blank})
    second = post(api, {**PARKED, "idempotency_key": blank})

    assert (first.status_code, second.status_code) == (202, 202)
    assert first.json()["deduplicated"] is second.json()["deduplicated"] is False
    assert first.json()["run_id"] != second.json()["run_id"]
    rows = TaskHistory.objects.filter(task_id=PARKED["task"])
    assert [r.trigger for r in rows] == [{"kind": "api", "actor": "ops"}] * 2
    assert len(writes.published) == 2


def test_staff_session_starts_runs_with_a_csrf_token(staff: User, writes: Writes) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(staff)

    refused = post(client, {"task": "test-noop"})
    assert refused.status_code == 403
    assert "CSRF" in refused.json()["detail"]
    writes.assert_nothing()

    secret = "a" * 32  # an unmasked CSRF secret: the cookie and the header must agree
    client.cookies[settings.CSRF_COOKIE_NAME] = secret
    started = post(client, {"task": "test-noop"}, HTTP_X_CSRFTOKEN=secret)
    assert started.status_code == 202
    assert TaskHistory.objects.get(id=started.json()["run_id"]).trigger["actor"] == "ops"


@pytest.mark.worker
def test_run_started_over_http_completes_on_a_real_worker(
    api: Client, celery_worker: object
) -> None:
    started = post(api, {"task": "slow-progress", "input": {"steps": 2, "step_seconds": 0}})
    url = f"{RUNS}/{started.json()['run_id']}"

    def finished() -> dict[str, Any] | None:
        # Postgres has the end first, the live hash follows it (`runs.terminal`): both.
        run = api.get(url).json()
        ended = ("completed", "failed")
        return run if run["state"] in ended and (run["live"] or {}).get("state") in ended else None

    run = wait_for(finished, timeout=60)
    assert run["state"] == "completed"
    assert run["result"] == {"steps": 2}
    assert run["attempts"] == 1
    assert run["live"]["state"] == "completed"
    assert run["live"]["owner"]
    live_progress = run["live"]["progress"]
    assert (live_progress["done"], live_progress["total"], live_progress["item"]) == (
        2,
        2,
        "step 2",
    )
    assert live_progress["eta_s"] == 0.0 or live_progress["eta_s"] is None
    # The terminal write kept the last report on the row too.
    assert run["progress"]["done"] == 2
    assert TaskHistory.objects.get(id=run["run_id"]).progress["item"] == "step 2"


# --- reading runs ------------------------------------------------------------------------


def test_get_run_joins_the_row_and_the_live_hash(api: Client) -> None:
    run_id = post(api, PARKED).json()["run_id"]

    response = api.get(f"{RUNS}/{run_id}")

    assert response.status_code == 200
    run = response.json()
    assert run["run_id"] == run_id
    assert run["task"] == "test-record-order"
    assert run["state"] == "pending"
    assert run["input"] == {"label": "api", "seconds": 0.0}
    assert run["trigger"] == {"kind": "api", "actor": "ops"}
    assert run["result"] is None and run["error"] is None
    assert run["live"]["state"] == "pending"
    assert run["live"]["progress"] is None
    assert run["live"]["updated_at"] is not None


def test_get_run_without_a_live_hash_has_null_live(api: Client) -> None:
    run_id = post(api, PARKED).json()["run_id"]
    valkey.client().delete(keys.run_active(run_id))

    assert api.get(f"{RUNS}/{run_id}").json()["live"] is None


def test_get_unknown_run_is_a_json_404(api: Client) -> None:
    response = api.get(f"{RUNS}/run_doesnotexist")

    assert response.status_code == 404
    assert response.json() == {"detail": "no run 'run_doesnotexist'"}


def _seed(task_id: str, state: str, kind: str, created_at: Any) -> str:
    """A history row as a past run left it (the API only reads these)."""
    run = TaskHistory.objects.create(
        id=new_run_id(),
        task_id=task_id,
        state=state,
        trigger={"kind": kind},
        priority=5,
        identity="seeded",
    )
    # auto_now_add ignores a given value; ties on created_at are wanted here.
    TaskHistory.objects.filter(id=run.id).update(created_at=created_at)
    return run.id


def test_list_filters_by_task_state_and_trigger_kind(api: Client) -> None:
    now = timezone.now()
    completed = _seed("test-noop", "completed", "schedule", now - timedelta(minutes=3))
    failed = _seed("test-fail", "failed", "api", now - timedelta(minutes=2))
    pending = _seed("test-noop", "pending", "api", now - timedelta(minutes=1))

    def ids(query: str) -> list[str]:
        response = api.get(f"{RUNS}?{query}")
        assert response.status_code == 200
        return [run["run_id"] for run in response.json()["items"]]

    assert ids("") == [pending, failed, completed]
    assert ids("task=test-noop") == [pending, completed]
    assert ids("state=failed") == [failed]
    assert ids("trigger_kind=api") == [pending, failed]
    assert ids("task=test-noop&trigger_kind=api&state=pending") == [pending]
    assert ids("task=no-such-task") == []


def test_list_pages_by_cursor_without_gaps_or_repeats(api: Client) -> None:
    now = timezone.now()
    # Three runs share one created_at, so the run id must break ties.
    moments = [now - timedelta(seconds=s) for s in (1, 2, 2, 2, 3, 4, 5)]
    seeded = [_seed("test-noop", "completed", "api", m) for m in moments]
    expected = sorted(seeded, key=lambda i: (TaskHistory.objects.get(id=i).created_at, i))[::-1]

    seen: list[str] = []
    cursor = ""
    pages = 0
    while True:
        page = api.get(f"{RUNS}?limit=2{cursor}").json()
        pages += 1
        seen += [run["run_id"] for run in page["items"]]
        if page["next_cursor"] is None:
            break
        cursor = f"&cursor={page['next_cursor']}"

    assert seen == expected
    assert pages == 4


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("state=exploded", "state"),
        ("trigger_kind=carrier-pigeon", "trigger_kind"),
        ("limit=0", "limit"),
        ("limit=201", "limit"),
        ("cursor=not-a-cursor", "cursor"),
    ],
)
def test_list_rejects_invalid_filters_with_422(api: Client, query: str, field: str) -> None:
    response = api.get(f"{RUNS}?{query}")

    assert response.status_code == 422
    body = response.json()
    assert body["detail"] == "the request is invalid"
    assert [e["loc"] for e in body["errors"]] == [["query", field]]


# --- the registry and the schema ---------------------------------------------------------


def test_tasks_lists_the_registry(api: Client) -> None:
    response = api.get(TASKS)

    assert response.status_code == 200
    listed = {task["id"]: task for task in response.json()}
    assert set(listed) == set(registry.get())
    noop = listed["test-noop"]
    assert noop["resource_class"] == "io"
    assert noop["queue"] == "task.t.test-noop"
    assert noop["task_priority"] is None
    assert noop["processing_version"] == 1
    assert noop["timeout"] == {"soft_s": 1500.0, "hard_s": 1800.0}
    assert noop["schedule"] is None
    assert listed["test-versioned"]["processing_version"] == 2
    assert listed["history-retention"]["schedule"] == {
        "kind": "every",
        "every_s": 86400.0,
        "cron": None,
    }
    hash_folder = listed["hash-folder"]
    assert hash_folder["description"] == "SHA-256 of every file under a folder"
    assert hash_folder["input_schema"]["required"] == ["path"]
    assert set(hash_folder["input_schema"]["properties"]) == {"path", "max_files"}


def test_openapi_schema_and_docs_are_served() -> None:
    client = Client()

    schema = client.get("/api/v1/openapi.json")
    docs = client.get("/api/v1/docs")

    assert schema.status_code == 200
    paths = schema.json()["paths"]
    assert {"/api/v1/runs", "/api/v1/runs/{run_id}", "/api/v1/tasks"} <= set(paths)
    assert set(paths["/api/v1/runs"]) == {"get", "post"}
    schemes = schema.json()["components"]["securitySchemes"]
    assert schemes["BearerToken"] == {"type": "http", "scheme": "bearer"}
    assert docs.status_code == 200


# --- refusals: each writes nothing -------------------------------------------------------


def test_malformed_json_is_a_400(api: Client, writes: Writes) -> None:
    response = post(api, '{"task": "test-noop",')

    assert response.status_code == 400
    assert response.json()["detail"].startswith("Cannot parse request body")
    writes.assert_nothing()


def test_unknown_task_is_a_404(api: Client, writes: Writes) -> None:
    response = post(api, {"task": "no-such-task"})

    assert response.status_code == 404
    assert response.json() == {"detail": "unknown task 'no-such-task'"}
    writes.assert_nothing()


@pytest.mark.parametrize(
    ("task", "task_input", "loc"),
    [
        ("test-fail", {"how": "explode"}, ["body", "run", "input", "how"]),
        ("test-fail", {}, ["body", "run", "input", "how"]),
        ("test-noop", {"unexpected": 1}, ["body", "run", "input", "unexpected"]),
        ("slow-progress", {"steps": 0}, ["body", "run", "input", "steps"]),
    ],
)
def test_input_invalid_for_the_task_is_a_422_with_field_errors(
    api: Client, writes: Writes, task: str, task_input: dict[str, Any], loc: list[str]
) -> None:
    response = post(api, {"task": task, "input": task_input})

    assert response.status_code == 422
    body = response.json()
    assert body["detail"] == f"input is invalid for task {task!r}"
    assert [e["loc"] for e in body["errors"]] == [loc]
    assert all(e["msg"] and e["type"] for e in body["errors"])
    writes.assert_nothing()


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        ({"task": "test-noop", "priority": 4}, ["body", "run", "priority"]),
        ({"task": "test-noop", "priority": "urgent"}, ["body", "run", "priority"]),
        ({"task": "test-noop", "idempotency_key": "k" * 201}, ["body", "run", "idempotency_key"]),
        ({"task": "test-noop", "input": [1, 2]}, ["body", "run", "input"]),
        ({"task": "test-noop", "surprise": True}, ["body", "run", "surprise"]),
        ({"input": {}}, ["body", "run", "task"]),
        ([], ["body", "run"]),
    ],
)
def test_invalid_request_fields_are_a_422(
    api: Client, writes: Writes, body: object, loc: list[str]
) -> None:
    response = post(api, body)

    assert response.status_code == 422
    assert response.json()["detail"] == "the request is invalid"
    assert [e["loc"] for e in response.json()["errors"]] == [loc]
    writes.assert_nothing()


def _padded_body(size: int) -> bytes:
    """A valid request, padded with JSON whitespace to exactly `size` bytes."""
    body = json.dumps({"task": "test-noop"}).encode()
    return body + b" " * (size - len(body))


def test_body_over_the_limit_is_a_413(api: Client, writes: Writes) -> None:
    limit = settings.CONFIG.api_max_body_bytes
    at_limit, over = _padded_body(limit), _padded_body(limit + 1)
    assert (len(at_limit), len(over)) == (limit, limit + 1)

    response = post(api, over)

    assert response.status_code == 413
    assert response.json() == {"detail": f"request body exceeds the limit of {limit} bytes"}
    writes.assert_nothing()
    # The same request one byte shorter is accepted: the limit is exact.
    assert post(api, at_limit).status_code == 202


def _asgi_post(path: str, chunks: list[bytes], token: str) -> tuple[int, dict[str, Any]]:
    """POST through Django's real ASGI handler as a chunked body: no Content-Length at all."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"testserver"),
            (b"content-type", b"application/json"),
            (b"transfer-encoding", b"chunked"),
            (b"authorization", f"Bearer {token}".encode()),
        ],
        "client": ("127.0.0.1", 50000),
        "server": ("testserver", 80),
    }
    incoming = [
        {"type": "http.request", "body": chunk, "more_body": i < len(chunks) - 1}
        for i, chunk in enumerate(chunks)
    ]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if incoming:
            return incoming.pop(0)
        # The client stays connected; Django cancels this wait once it has responded.
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async_to_sync(ASGIHandler())(scope, receive, send)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return status, json.loads(body)


def _chunks(body: bytes, size: int = 16 * 1024) -> list[bytes]:
    return [body[i : i + size] for i in range(0, len(body), size)]


def test_chunked_body_without_content_length_over_the_limit_is_a_413(
    token: str, writes: Writes
) -> None:
    limit = settings.CONFIG.api_max_body_bytes

    status, body = _asgi_post(RUNS, _chunks(_padded_body(limit + 1)), token)

    assert status == 413
    assert body == {"detail": f"request body exceeds the limit of {limit} bytes"}
    writes.assert_nothing()
    status, body = _asgi_post(RUNS, _chunks(_padded_body(limit)), token)
    assert status == 202
    assert TaskHistory.objects.filter(id=body["run_id"]).exists()


def test_refusal_by_admission_is_its_status_with_a_code(api: Client, writes: Writes) -> None:
    quota_run = {"task": "test-quota", "input": {"how": "permanent"}}  # 3 runs a day
    for _ in range(3):
        assert post(api, quota_run).status_code == 202
    writes.start()

    response = post(api, quota_run)

    assert response.status_code == 429
    assert response.json()["code"] == "quota_exceeded"
    assert "quota of 3 runs" in response.json()["detail"]
    assert int(response["Retry-After"]) >= 1
    writes.assert_nothing()


# --- credentials -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path"), [("post", RUNS), ("get", RUNS), ("get", f"{RUNS}/run_x"), ("get", TASKS)]
)
def test_no_credentials_is_a_401_asking_for_a_bearer_token(
    writes: Writes, method: str, path: str
) -> None:
    client = Client()
    response = post(client, {"task": "test-noop"}) if method == "post" else client.get(path)

    assert response.status_code == 401
    assert response["WWW-Authenticate"] == "Bearer"
    assert "Bearer" in response.json()["detail"]
    writes.assert_nothing()


@pytest.mark.parametrize(
    "header",
    ["Bearer lmt_not-a-real-token", "Bearer ", "Token abc", "Basic b3BzOnB3"],
)
def test_bad_token_is_a_401_even_with_a_staff_session(
    staff: User, writes: Writes, header: str
) -> None:
    client = Client(headers={"Authorization": header})
    client.force_login(staff)

    response = post(client, {"task": "test-noop"})

    assert response.status_code == 401
    assert response["WWW-Authenticate"] == 'Bearer error="invalid_token"'
    writes.assert_nothing()


@pytest.mark.parametrize(
    "flags", [{"is_staff": False}, {"is_staff": True, "is_active": False}], ids=str
)
def test_token_of_a_user_who_is_not_active_staff_is_a_403(
    writes: Writes, flags: dict[str, bool]
) -> None:
    user = User.objects.create_user("viewer", **flags)
    client = Client(headers={"Authorization": f"Bearer {tokens.issue(user)[1]}"})

    response = post(client, {"task": "test-noop"})

    assert response.status_code == 403
    assert response.json() == {"detail": "the API is open to active staff accounts only"}
    writes.assert_nothing()


def test_session_of_a_non_staff_user_is_a_403(writes: Writes) -> None:
    client = Client()
    client.force_login(User.objects.create_user("viewer"))

    assert post(client, {"task": "test-noop"}).status_code == 403
    assert client.get(TASKS).status_code == 403
    writes.assert_nothing()


def test_using_a_token_records_when(api: Client) -> None:
    assert ApiToken.objects.get().last_used_at is None

    before = timezone.now()
    assert api.get(TASKS).status_code == 200

    assert ApiToken.objects.get().last_used_at >= before


# --- the token command -------------------------------------------------------------------


def test_create_api_token_prints_the_token_once_and_stores_its_digest(staff: User) -> None:
    out, err = StringIO(), StringIO()

    call_command("create_api_token", "ops", "--name", "ci", stdout=out, stderr=err)

    token = out.getvalue().strip()
    assert token.startswith("lmt_") and len(token) > 40
    record = ApiToken.objects.get()
    assert record.user == staff
    assert record.name == "ci"
    assert record.digest == hashlib.sha256(token.encode()).hexdigest()
    assert token.startswith(record.prefix) and len(record.prefix) < len(token) // 3
    stored = [str(v) for v in ApiToken.objects.values().get().values()]
    assert token not in stored
    assert "cannot be shown again" in err.getvalue()
    client = Client(headers={"Authorization": f"Bearer {token}"})
    assert client.get(TASKS).status_code == 200


def test_create_api_token_warns_when_the_user_cannot_use_the_api() -> None:
    User.objects.create_user("viewer")
    err = StringIO()

    call_command("create_api_token", "viewer", stdout=StringIO(), stderr=err)

    assert "not active staff" in err.getvalue()


def test_create_api_token_for_an_unknown_user_is_a_command_error() -> None:
    with pytest.raises(CommandError, match="no user 'ghost'"):
        call_command("create_api_token", "ghost", stdout=StringIO(), stderr=StringIO())
    assert not ApiToken.objects.exists()
