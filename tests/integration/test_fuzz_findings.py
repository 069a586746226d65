"""What a probe of the running stack answered with a 500 (issue 24): text the code did not
expect where it enters. Each case is refused with a clear 4xx, or ignored as a bad filter is,
and nothing is written."""

from __future__ import annotations

import html
from typing import Any

import pytest
from django.test import Client

from orchestrator.models import TaskHistory
from orchestrator.runs.start import start_run
from orchestrator.triggers import TriggerKind

pytestmark = pytest.mark.django_db

START_URL = "/admin/orchestrator/taskhistory/start/"

# Every changelist filter the probe reached, the third-party one among them.
FILTERS = [
    "/admin/orchestrator/taskhistory/?state=",
    "/admin/orchestrator/taskhistory/?task=",
    "/admin/orchestrator/taskhistory/?trigger=",
    "/admin/orchestrator/webhookdelivery/?status=",
    "/admin/coverage/mediaitem/?kind=",
    "/admin/coverage/mediaitemstagestate/?stage=",
    "/admin/coverage/mediaitemstagestate/?status=",
    "/admin/coverage/eventoutbox/?kind=",
    "/admin/django_celery_beat/periodictask/?task=",
]


@pytest.mark.parametrize("url", FILTERS)
def test_a_nul_in_a_changelist_filter_is_a_400_naming_the_parameter(
    admin_client: Client, url: str
) -> None:
    response = admin_client.get(url + "%00")

    assert response.status_code == 400
    name = url.rsplit("?", 1)[1].rstrip("=")
    assert (
        response.content.decode() == f"the query parameter {name!r} must not contain NUL (U+0000)"
    )


def test_a_nul_in_a_path_or_a_form_field_is_a_400(admin_client: Client) -> None:
    assert admin_client.get("/admin/orchestrator/taskhistory/run%00/change/").status_code == 400
    refused = admin_client.post(START_URL, {"task": "test-noop", "idempotency_key": "a\x00b"})
    assert refused.status_code == 400
    assert "form field 'idempotency_key'" in refused.content.decode()
    assert not TaskHistory.objects.exists()


def test_the_api_answers_nul_at_its_own_edge_with_a_field_error(admin_client: Client) -> None:
    response = admin_client.get("/api/v1/runs?task=%00")

    assert response.status_code == 422
    assert response.json()["errors"][0]["loc"] == ["query", "task"]


def test_digits_int_refuses_are_not_a_number_to_a_filter(admin_client: Client) -> None:
    start_run("test-noop", {}, trigger=TriggerKind.API, priority=2)

    # "²".isdigit() is True and int("²") raises: the filter ignores it, as any bad value.
    response = admin_client.get("/admin/orchestrator/taskhistory/?priority=%C2%B2")
    assert response.status_code == 200
    assert admin_client.get("/admin/orchestrator/taskhistory/?priority=2").status_code == 200


@pytest.mark.parametrize(
    "url",
    [
        "/admin/orchestrator/taskhistory/dead-letters/",
        "/admin/coverage/eventoutbox/dead-letters/redeliver/",
    ],
)
def test_a_superscript_id_in_a_bulk_redeliver_is_skipped(admin_client: Client, url: str) -> None:
    response = admin_client.post(url, {"bulk": "redeliver", "selected": ["²", "¹²³"]})

    assert response.status_code == 302
    messages = [str(m) for m in admin_client.get(response["Location"]).context["messages"]]
    assert any(m.startswith("0 ") for m in messages), messages


@pytest.mark.parametrize("last_event_id", ["²", "¹²³"])
def test_a_superscript_last_event_id_is_a_422(admin_client: Client, last_event_id: str) -> None:
    handle = start_run("test-noop", {}, trigger=TriggerKind.API)
    for url in ("/api/v1/events", f"/api/v1/runs/{handle.run_id}/logs"):
        response = admin_client.get(url, HTTP_LAST_EVENT_ID=last_event_id)
        assert response.status_code == 422, url
        assert "Last-Event-ID" in response.json()["detail"]


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ('{"label": ' + "9" * 5001 + "}", "Enter valid JSON: a number has more than 4300 digits."),
        (
            '{"label": "\\ud800"}',
            "Enter valid JSON: label must not contain a lone surrogate (U+D800-U+DFFF).",
        ),
        (
            '{"\\ud800": 1}',
            "Enter valid JSON: \\ud800 key must not contain a lone surrogate (U+D800-U+DFFF).",
        ),
    ],
)
def test_json_python_or_postgres_cannot_take_is_a_start_form_error(
    admin_client: Any, text: str, error: str
) -> None:
    response = admin_client.post(START_URL, {"task": "test-record-order", "input": text})

    assert response.status_code == 200
    page = response.content.decode()
    assert error in page
    assert html.escape(text) in page  # shown back as typed
    assert not TaskHistory.objects.exists()


def test_a_json_body_in_utf_16_is_a_400_that_says_json_is_utf_8(admin_client: Client) -> None:
    body = '{"task": "test-noop", "input": {}}'.encode("utf-16")

    response = admin_client.post("/api/v1/runs", body, content_type="application/json")

    assert response.status_code == 400
    assert "JSON must be UTF-8 (RFC 8259)" in response.json()["detail"]
    assert not TaskHistory.objects.exists()
    same_in_utf_8 = admin_client.post(
        "/api/v1/runs", body.decode("utf-16").encode(), content_type="application/json"
    )
    assert same_in_utf_8.status_code == 202
