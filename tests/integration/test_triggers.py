"""Inbound triggers (`POST /api/v1/triggers/{name}`) on real Postgres and Valkey: a signed
request starts the trigger's task with trigger `{"kind": "webhook", "name": …}`; a forged,
tampered, stale, replayed or unsigned-for request is refused with no run written; an
operator's bearer token is the other way in; one signed run completes on a real worker.

`test-parked-hook` starts `test-record-order`, whose queue nothing consumes here, so its runs
stay pending; `test-noop-hook` starts `test-noop`, which the shared worker runs
(tests/support/task_defs.py).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.http import HttpResponse
from django.test import Client

from coverage.models import MediaItemStageState
from coverage.stages import find, sync
from lumastra.webhooks import HEADER, sign
from orchestrator.api import tokens
from orchestrator.api.access import Access
from orchestrator.models import TaskHistory
from orchestrator.states import RunState
from orchestrator.stores import keys, valkey
from tasks.definition import Priority
from tests.support.catalog import movie
from tests.support.fixtures import wait_for
from tests.support.users import account, operator

pytestmark = pytest.mark.django_db

SECRET = "trsec-for-tests"
PARKED = "test-parked-hook"
NOOP = "test-noop-hook"
DEMO = "download-finished"  # the demo pack's (tasks/definitions/catalog_media.py)


@pytest.fixture(autouse=True)
def _secrets() -> Iterator[None]:
    config = settings.CONFIG
    settings.CONFIG = dataclasses.replace(
        config,
        trigger_secrets={PARKED: SECRET, NOOP: SECRET, DEMO: SECRET},
        trigger_tolerance_s=300,
    )
    yield
    settings.CONFIG = config


def _post(
    name: str,
    body: dict[str, Any] | bytes,
    *,
    secret: str | None = SECRET,
    at: int | None = None,
    signed_body: bytes | None = None,
    client: Client | None = None,
    **headers: str,
) -> HttpResponse:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    if secret is not None:
        headers[HEADER] = sign(raw if signed_body is None else signed_body, secret, at)
    return (client or Client()).post(
        f"/api/v1/triggers/{name}", raw, content_type="application/json", headers=headers
    )


def _runs() -> int:
    return TaskHistory.objects.count()


def test_a_signed_request_starts_the_triggers_task_with_a_webhook_trigger() -> None:
    response = _post(PARKED, {"label": "download-1", "ignored": True})

    assert response.status_code == 202, response.content
    started = response.json()
    row = TaskHistory.objects.get(id=started["run_id"])
    assert (row.task_id, row.state, row.input) == (
        "test-record-order",
        RunState.PENDING,
        {"label": "download-1", "seconds": 0.0},
    )
    assert row.trigger == {"kind": "webhook", "name": PARKED}
    # The webhook kind's own default priority: the task sets none, the trigger none.
    assert row.priority == started["priority"] == Priority.EVENT


@pytest.mark.parametrize(
    ("how", "secret", "at", "signed_body"),
    [
        ("forged", "another-secret", None, None),
        ("tampered", SECRET, None, b'{"label": "what was signed"}'),
        ("stale", SECRET, -600, None),
        ("from the future", SECRET, 600, None),
    ],
)
def test_a_bad_signature_is_refused_with_nothing_written(
    how: str, secret: str, at: int | None, signed_body: bytes | None
) -> None:
    timestamp = None if at is None else int(time.time()) + at
    before = _runs()

    response = _post(PARKED, {"label": how}, secret=secret, at=timestamp, signed_body=signed_body)

    assert response.status_code == 401, how
    refusal = response.json()
    assert refusal["code"] == "bad_signature"
    expected = "past the tolerance" if at else "does not match the body and secret"
    assert expected in refusal["detail"] and HEADER in refusal["detail"]
    assert _runs() == before
    assert not list(valkey.client().scan_iter(match=keys.trigger_signature("*", "*")))


def test_a_malformed_signature_is_refused() -> None:
    before = _runs()
    raw = json.dumps({"label": "x"}).encode()

    response = Client().post(
        f"/api/v1/triggers/{PARKED}", raw, content_type="application/json", headers={HEADER: "v1"}
    )

    assert response.status_code == 401
    assert "malformed" in response.json()["detail"]
    assert _runs() == before


def test_a_replayed_request_is_refused_with_nothing_more_written() -> None:
    raw = json.dumps({"label": "once"}).encode()
    header = sign(raw, SECRET)
    before = _runs()

    first = Client().post(
        f"/api/v1/triggers/{PARKED}", raw, content_type="application/json", headers={HEADER: header}
    )
    again = Client().post(
        f"/api/v1/triggers/{PARKED}", raw, content_type="application/json", headers={HEADER: header}
    )

    assert first.status_code == 202
    assert again.status_code == 409
    assert again.json()["code"] == "replayed"
    assert _runs() == before + 1
    # Remembered until the timestamp leaves the tolerance, not forever.
    [key] = valkey.client().scan_iter(match=keys.trigger_signature(PARKED, "*"))
    assert 299_000 <= valkey.client().pttl(key) <= 301_000


def test_a_refused_start_forgets_the_signature_so_the_request_may_come_again() -> None:
    raw = json.dumps({"label": 5}).encode()  # the task's input wants a string
    header = sign(raw, SECRET)
    before = _runs()

    answers = [
        Client().post(
            f"/api/v1/triggers/{PARKED}",
            raw,
            content_type="application/json",
            headers={HEADER: header},
        )
        for _ in range(2)
    ]

    assert [a.status_code for a in answers] == [422, 422]  # not 409: nothing was started
    assert answers[0].json()["errors"][0]["loc"] == ["body", "input", "label"]
    assert _runs() == before


def test_a_body_the_trigger_cannot_map_is_a_422_naming_the_trigger() -> None:
    before = _runs()

    response = _post(PARKED, {"name": "no label"})

    assert response.status_code == 422
    assert f"the body does not fit trigger {PARKED!r}" in response.json()["detail"]
    assert "'label'" in response.json()["detail"]
    assert _runs() == before


def test_a_body_that_is_not_an_object_is_a_422() -> None:
    before = _runs()

    response = _post(PARKED, b"[1, 2]")

    assert response.status_code == 422
    assert _runs() == before


def test_a_trigger_without_a_secret_refuses_every_signature() -> None:
    settings.CONFIG = dataclasses.replace(settings.CONFIG, trigger_secrets={})
    before = _runs()

    response = _post(PARKED, {"label": "no secret"})

    assert response.status_code == 401
    assert "has no secret" in response.json()["detail"]
    assert _runs() == before


def test_an_unknown_trigger_is_a_404_signed_or_by_token() -> None:
    token = tokens.issue(operator())[1]
    by_token = Client(headers={"Authorization": f"Bearer {token}"})

    signed = _post("no-such-hook", {"label": "x"})
    with_token = _post("no-such-hook", {"label": "x"}, secret=None, client=by_token)

    assert (signed.status_code, with_token.status_code) == (404, 404)
    assert signed.json()["detail"] == "unknown trigger 'no-such-hook'"
    assert _runs() == 0


def test_an_operators_token_starts_it_and_the_run_names_the_operator() -> None:
    token = tokens.issue(operator("integrator"))[1]
    client = Client(headers={"Authorization": f"Bearer {token}"})

    response = _post(PARKED, {"label": "by token"}, secret=None, client=client)

    assert response.status_code == 202
    row = TaskHistory.objects.get(id=response.json()["run_id"])
    assert row.trigger == {"kind": "webhook", "name": PARKED, "actor": "integrator"}


@pytest.mark.parametrize(
    ("grants", "status"), [(None, 401), ((Access.VIEW,), 403), ((Access.VIEW, Access.OPERATE), 202)]
)
def test_without_a_signature_the_token_needs_the_operate_permission(
    grants: tuple[Access, ...] | None, status: int
) -> None:
    client = Client()
    if grants is not None:
        token = tokens.issue(account("caller", *grants))[1]
        client = Client(headers={"Authorization": f"Bearer {token}"})
    before = _runs()

    response = _post(PARKED, {"label": "matrix"}, secret=None, client=client)

    assert response.status_code == status
    assert _runs() == before + (1 if status == 202 else 0)


def test_a_signature_is_judged_alone_even_beside_a_valid_token() -> None:
    token = tokens.issue(operator())[1]
    client = Client(headers={"Authorization": f"Bearer {token}"})

    response = _post(PARKED, {"label": "both"}, secret="forged", client=client)

    assert response.status_code == 401
    assert _runs() == 0


def test_an_idempotency_key_joins_the_live_run_it_started() -> None:
    key = {"Idempotency-Key": "download-42"}

    # Two timestamps fixed apart: a clock that turned a second between the two requests made
    # "now" and "now - 1" the same second, one signature, and the second a replay (409).
    now = int(time.time())
    first = _post(PARKED, {"label": "a"}, at=now, **key)
    # Signed anew (another timestamp): a new request, with the same key.
    again = _post(PARKED, {"label": "a"}, at=now - 1, **key)

    assert (first.status_code, again.status_code) == (202, 200)
    assert again.json()["run_id"] == first.json()["run_id"]
    assert again.json()["deduplicated"] is True
    assert _runs() == 1


def test_forged_signatures_spend_the_addresss_sign_in_budget() -> None:
    settings.CONFIG = dataclasses.replace(settings.CONFIG, auth_failure_limit=2)

    answers = [_post(PARKED, {"label": f"guess {n}"}, secret="guess").status_code for n in range(2)]
    genuine = _post(PARKED, {"label": "genuine"})

    assert answers == [401, 401]
    assert genuine.status_code == 429
    assert genuine.json()["code"] == "too_many_failed_sign_ins"
    assert _runs() == 0


def test_an_oversized_body_is_refused_before_it_is_read() -> None:
    body = {"label": "x" * settings.CONFIG.api_max_body_bytes}

    response = _post(PARKED, body)

    assert response.status_code == 413
    assert _runs() == 0


def test_the_demo_trigger_probes_the_item_as_its_coverage_run() -> None:
    probe = find("probe")
    assert probe is not None
    sync([probe])
    item = movie("downloaded")

    first = _post(DEMO, {"item_id": item.pk, "client": "a download client"})
    # The client retries the event (signed anew): the live run is joined, not doubled.
    again = _post(DEMO, {"item_id": item.pk}, at=int(time.time()) - 1)

    assert (first.status_code, again.status_code) == (202, 200)
    assert again.json()["run_id"] == first.json()["run_id"]
    row = TaskHistory.objects.get(id=first.json()["run_id"])
    assert (row.task_id, row.input) == ("media-probe", {"stage": "probe", "item_id": item.pk})
    assert row.trigger == {
        "kind": "webhook",
        "name": DEMO,
        "idempotencyKey": f"coverage:probe:{item.pk}",
    }
    coverage = MediaItemStageState.objects.get(stage="probe", item_id=item.pk)
    assert (coverage.status, coverage.run_id) == ("running", row.id)


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_a_signed_run_completes_on_a_real_worker(celery_worker: object) -> None:
    response = _post(NOOP, {"event": "download.finished"})

    assert response.status_code == 202
    run_id = response.json()["run_id"]
    row = wait_for(
        lambda: TaskHistory.objects.filter(id=run_id, state=RunState.COMPLETED).first(), 30
    )
    assert row.trigger == {"kind": "webhook", "name": NOOP}
    assert row.priority == Priority.SCHEDULED  # the trigger's own priority
    assert row.result == {"ok": True}
