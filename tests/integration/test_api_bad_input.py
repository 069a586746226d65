"""Bad input never reaches Postgres and never answers 500: each case is a 4xx in the one JSON
error shape, and writes nothing.

Postgres refuses NUL in text and JSONB, and lone surrogates cannot be encoded as UTF-8; both
are refused at the edge with a 422 naming the field. Run ids in paths have one format
(`run_<ULID>`); any other id names no run and is a 404 without a query.
"""

from __future__ import annotations

import base64
import contextlib
import json
import threading
from collections.abc import Iterator
from types import MappingProxyType
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client

from orchestrator.api import tokens
from orchestrator.models import TaskHistory
from orchestrator.runs.cancel import NotCancellable, request_cancel
from orchestrator.runs.handle import InvalidInput, StartRefused
from orchestrator.runs.start import start_run
from orchestrator.states import LIVE_RUN_STATES
from orchestrator.triggers import TriggerKind

pytestmark = pytest.mark.django_db(transaction=True)

RUNS = "/api/v1/runs"
# Only test_priority's own worker consumes this task's queue: runs started here stay pending.
PARKED = {"task": "test-record-order", "input": {"label": "api"}}
NUL = "\x00"
SURROGATE = "\udc80"


@pytest.fixture
def api() -> Client:
    user = User.objects.create_user("ops", is_staff=True, is_superuser=True)
    return Client(headers={"Authorization": f"Bearer {tokens.issue(user, 'tests')[1]}"})


@pytest.fixture
def no_writes() -> Iterator[None]:
    before = TaskHistory.objects.count()
    yield
    assert TaskHistory.objects.count() == before


def post(client: Client, path: str, body: object) -> Any:
    # json.dumps escapes both as \u0000 and \udc80: valid JSON that decodes back to them.
    return client.post(path, json.dumps(body), content_type="application/json")


def assert_invalid(response: Any, loc: list[Any]) -> None:
    assert response.status_code == 422, response.content
    assert response["Content-Type"] == "application/json; charset=utf-8"
    errors = response.json()["errors"]
    assert [e["loc"] for e in errors] == [loc]
    # pydantic's own check meets a lone surrogate first where a field has length bounds.
    assert errors[0]["type"] in ("unstorable_text", "string_unicode")


# --- strings Postgres cannot store ----------------------------------------------------------


def _start_with(bad: str, where: str) -> tuple[dict[str, Any], list[Any]]:
    """A start request with `bad` in one place, and the error location that names it."""
    at = ["body", "run"]
    return {
        "idempotency-key": ({**PARKED, "idempotency_key": f"k{bad}"}, [*at, "idempotency_key"]),
        "task": ({**PARKED, "task": f"test{bad}"}, [*at, "task"]),
        "input-value": ({**PARKED, "input": {"label": f"a{bad}"}}, [*at, "input", "label"]),
        "input-key": ({**PARKED, "input": {f"l{bad}": "x"}}, [*at, "input", f"l{bad}"]),
        "input-nested": (
            {"task": "slow-progress", "input": {"steps": 1, "x": [{"y": bad}]}},
            [*at, "input", "x", 0, "y"],
        ),
    }[where]


@pytest.mark.parametrize("bad", [NUL, SURROGATE], ids=["nul", "surrogate"])
@pytest.mark.parametrize(
    "where", ["idempotency-key", "task", "input-value", "input-key", "input-nested"]
)
def test_unstorable_text_in_a_start_is_a_422_naming_the_field(
    api: Client, no_writes: None, bad: str, where: str
) -> None:
    body, loc = _start_with(bad, where)

    assert_invalid(post(api, RUNS, body), loc)


@pytest.mark.parametrize("bad", ["%00", "%ED%B2%80"], ids=["nul", "surrogate-bytes"])
def test_unstorable_text_in_the_task_filter_is_a_422(api: Client, bad: str) -> None:
    response = api.get(f"{RUNS}?task=test{bad}")

    if bad == "%00":
        assert_invalid(response, ["query", "task"])
    else:
        # Django decodes invalid UTF-8 in a query to U+FFFD: storable, and matches no run.
        assert response.status_code == 200
        assert response.json() == {"items": [], "next_cursor": None}


@pytest.mark.parametrize(
    ("method", "suffix"), [("get", ""), ("post", "/cancel"), ("post", "/retry")]
)
@pytest.mark.parametrize(
    "run_id",
    ["%00", "run_%00", "run_%ED%B2%80", "run_01ARZ3NDEKTSV4RRFFQ69G5FA%00", "run_x"],
    ids=["nul", "prefix-nul", "surrogate-bytes", "ulid-nul", "short"],
)
def test_a_malformed_run_id_in_the_path_is_a_404(
    api: Client, no_writes: None, method: str, suffix: str, run_id: str
) -> None:
    response = getattr(api, method)(f"{RUNS}/{run_id}{suffix}")

    assert response.status_code == 404
    assert response.json()["detail"].startswith("no run ")


def test_a_well_formed_unknown_run_id_is_still_a_404(api: Client) -> None:
    response = api.get(f"{RUNS}/run_01ARZ3NDEKTSV4RRFFQ69G5FAV")

    assert response.status_code == 404
    assert response.json() == {"detail": "no run 'run_01ARZ3NDEKTSV4RRFFQ69G5FAV'"}


def _cursor(document: object) -> str:
    raw = document if isinstance(document, str) else json.dumps(document)
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


@pytest.mark.parametrize(
    "document",
    [
        ["2024-01-01T00:00:00+00:00", "run_\x00"],
        ["2024-01-01T00:00:00+00:00", "run_\udc80"],
        ["yesterday", "run_01ARZ3NDEKTSV4RRFFQ69G5FAV"],
        ["2024-01-01T00:00:00+00:00", "not-a-run-id"],
        ["2024-01-01T00:00:00+00:00", 7],
        "[" * 100_000 + "]" * 100_000,
        '{"a": ' * 5_000 + "1" + "}" * 5_000,
    ],
    ids=["nul-id", "surrogate-id", "bad-time", "bad-id", "int-id", "deep-list", "deep-object"],
)
def test_a_forged_cursor_is_a_422(api: Client, document: object) -> None:
    response = api.get(f"{RUNS}?cursor={_cursor(document)}")

    assert response.status_code == 422
    assert [e["loc"] for e in response.json()["errors"]] == [["query", "cursor"]]


def test_a_genuine_cursor_still_pages(api: Client) -> None:
    for _ in range(3):
        assert post(api, RUNS, PARKED).status_code == 202

    first = api.get(f"{RUNS}?limit=2").json()
    second = api.get(f"{RUNS}?limit=2&cursor={first['next_cursor']}").json()

    assert len(first["items"]) == 2 and len(second["items"]) == 1
    assert second["next_cursor"] is None


def test_start_run_from_python_refuses_unstorable_text_before_the_database() -> None:
    trigger = {"kind": TriggerKind.MANUAL.value}

    with pytest.raises(InvalidInput) as invalid:
        start_run("test-record-order", {"label": "a\x00"}, trigger=trigger)
    assert invalid.value.errors[0]["loc"] == ["label"]
    assert invalid.value.errors[0]["type"] == "unstorable_text"
    with pytest.raises(StartRefused, match="idempotency key"):
        start_run("test-record-order", {"label": "a"}, trigger=trigger, idempotency_key="\udc80")
    with pytest.raises(StartRefused, match="trigger"):
        start_run("test-record-order", {"label": "a"}, trigger={**trigger, "actor": "\x00"})
    assert TaskHistory.objects.count() == 0


def test_start_run_finds_unstorable_text_however_held_and_stores_what_only_looks_bad() -> None:
    """A start's input is let through by the JSON encoder's text and walked only when that text
    is not plainly storable: text that merely spells a NUL's escape is stored; a NUL under a
    mapping of another type, or in a key, is still found and named."""
    trigger = {"kind": TriggerKind.MANUAL.value}
    looks_bad = "a\\u0000b"  # a backslash and five characters, no NUL

    handle = start_run("test-record-order", {"label": looks_bad}, trigger=trigger)
    with pytest.raises(InvalidInput) as proxied:
        start_run("test-record-order", MappingProxyType({"label": "a\x00"}), trigger=trigger)
    with pytest.raises(InvalidInput) as keyed:
        start_run("test-record-order", {"label": "a", "b\ud800": 1}, trigger=trigger)

    assert TaskHistory.objects.get(id=handle.run_id).input["label"] == looks_bad
    assert proxied.value.errors[0]["loc"] == ["label"]
    assert keyed.value.errors[0]["loc"] == ["b\ud800"]


# --- integers are integers ----------------------------------------------------------------


@pytest.mark.parametrize("priority", [True, False, 5.0, "5"])
def test_priority_must_be_a_json_integer(api: Client, no_writes: None, priority: object) -> None:
    response = post(api, RUNS, {**PARKED, "priority": priority})

    assert response.status_code == 422
    assert [e["loc"] for e in response.json()["errors"]] == [["body", "run", "priority"]]


# --- routing: unknown paths and methods answer JSON -----------------------------------------


@pytest.mark.parametrize("method", ["get", "post"])
@pytest.mark.parametrize(
    "path", ["/api/v1/nope", "/api/v1/runs/run_x/explode", "/api/v1/runs/", "/api/v2/runs"]
)
def test_an_unrouted_api_path_is_a_json_404(method: str, path: str) -> None:
    # With CSRF enforced, as a browser session gets it: a write is still a 404, not a 403.
    response = getattr(Client(enforce_csrf_checks=True), method)(path)

    assert response.status_code == 404
    assert response["Content-Type"].startswith("application/json")
    assert response.json() == {"detail": f"no API endpoint at {path}"}


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("delete", RUNS, "GET, POST"),
        ("put", f"{RUNS}/run_01ARZ3NDEKTSV4RRFFQ69G5FAV", "GET"),
        ("get", f"{RUNS}/run_01ARZ3NDEKTSV4RRFFQ69G5FAV/cancel", "POST"),
        ("patch", "/api/v1/tasks", "GET"),
    ],
)
def test_a_method_the_path_does_not_take_is_a_json_405(
    no_writes: None, method: str, path: str, allowed: str
) -> None:
    response = getattr(Client(enforce_csrf_checks=True), method)(path)

    assert response.status_code == 405
    assert response["Allow"] == allowed
    assert response.json() == {"detail": f"{method.upper()} is not allowed here; use {allowed}"}


# --- one idempotency key, many callers, runs that end at once -------------------------------


def test_concurrent_starts_with_one_key_whose_runs_end_at_once_never_fail() -> None:
    """Starters race one key while a canceller ends each run as soon as it is visible: a start
    that lost the unique index to a run that ended before it looked gets the winner or a new
    run, never the IntegrityError."""
    key, starters, rounds = "storm", 20, 3
    trigger = {"kind": TriggerKind.API.value}
    answers: list[str] = []
    failures: list[BaseException] = []
    done = threading.Event()

    def start(barrier: threading.Barrier) -> None:
        try:
            barrier.wait()
            handle = start_run(
                "test-record-order", {"label": "x"}, trigger=trigger, idempotency_key=key
            )
            answers.append(handle.run_id)
        except BaseException as exc:  # any failure is the finding
            failures.append(exc)
        finally:
            connection.close()

    def cancel_as_soon_as_seen() -> None:
        try:
            live = [s.value for s in LIVE_RUN_STATES]
            while not done.is_set():
                for run_id in TaskHistory.objects.filter(state__in=live).values_list(
                    "id", flat=True
                ):
                    with contextlib.suppress(NotCancellable):  # it ended meanwhile
                        request_cancel(run_id, actor="storm")
        finally:
            connection.close()

    canceller = threading.Thread(target=cancel_as_soon_as_seen)
    canceller.start()
    try:
        for _ in range(rounds):
            barrier = threading.Barrier(starters)
            threads = [threading.Thread(target=start, args=(barrier,)) for _ in range(starters)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
    finally:
        done.set()
        canceller.join()

    assert failures == []
    assert len(answers) == starters * rounds
    # Every answer names a recorded run; runs ended mid-storm, so more than one was started.
    recorded = set(TaskHistory.objects.values_list("id", flat=True))
    assert set(answers) <= recorded
    assert len(recorded) > 1
