"""Schema-driven fuzzing of the HTTP API: the OpenAPI schema the API serves is the contract.

schemathesis generates requests for every operation from `/api/v1/openapi.json`, both ones
that fit the schema and ones that break it, and sends them to the real Django app in-process
(WSGI) with a valid token. Any 5xx fails, and so does any answer the schema does not
declare: an undeclared status, a body that does not match its schema, a wrong content type.
Examples are bounded and derandomised, so the test is quick and the same on every run.
"""

from __future__ import annotations

from typing import Any

import pytest
import schemathesis
from django.contrib.auth.models import User
from django.test import Client
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

from lumastra.wsgi import application
from orchestrator.api import tokens

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def token() -> str:
    # A superuser: whatever permissions the API comes to require, this token holds them.
    user = User.objects.create_user("fuzz", is_staff=True, is_superuser=True)
    return tokens.issue(user, "fuzz")[1]


# Loaded when the module is collected: the schema endpoint reads no database. The run events
# stream never ends by design (WSGI would consume it forever): test_run_events.py covers it.
schema = schemathesis.openapi.from_wsgi("/api/v1/openapi.json", application).exclude(
    path="/api/v1/events"
)


@schema.parametrize()
@settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)
def test_every_operation_answers_as_its_schema_says(case: Any, token: str) -> None:
    headers = {"Authorization": f"Bearer {token}"}
    response = case.call(headers=headers)

    excluded = []
    if _refused_only(response, {("query", "cursor")}) or _refused_only(response, SEMANTIC):
        # A cursor is opaque: the schema can only call it a string, so a schema-valid one
        # that no page ever handed out is rightly refused. Nor can a schema name the time
        # zones a machine knows, say that a window must not open and close at once, or name
        # the folders of this machine's media roots.
        excluded.append(positive_data_acceptance)
    case.validate_response(response, headers=headers, excluded_checks=excluded)


# Fields a schema-valid request may still have refused for what the schema cannot say.
SEMANTIC = {
    ("body", "body", "tz"),
    ("body", "body", "window"),
    ("body", "body", "path"),
    ("body", "body", "filter"),
    ("body", "body", "filter", "input"),
}


def _refused_only(response: Any, fields: set[tuple[str, ...]]) -> bool:
    if response.status_code != 422:
        return False
    refused = {tuple(e["loc"]) for e in response.json().get("errors", [])}
    return bool(refused) and refused <= fields


# Beyond what every operation can answer (EVERY_OPERATION: 400, 401, 403, 413, 429).
OWN_ERRORS = {
    ("get", "/api/v1/runs"): {422},
    ("post", "/api/v1/runs"): {404, 409, 422, 503},
    ("post", "/api/v1/runs:batch"): {404, 409, 422},
    ("post", "/api/v1/runs:cancel"): {422},
    ("post", "/api/v1/runs:retry"): {422},
    ("get", "/api/v1/batches/{batch_id}"): {404},
    ("get", "/api/v1/coverage/outbox/dead-letters"): {422},
    ("post", "/api/v1/coverage/outbox/dead-letters/redeliver"): {422},
    ("get", "/api/v1/runs/{run_id}"): {404},
    ("get", "/api/v1/runs/{run_id}/report.md"): {404},
    ("get", "/api/v1/runs/{run_id}/logs"): {404, 422},
    ("get", "/api/v1/events"): {404, 422},
    ("post", "/api/v1/runs/{run_id}/cancel"): {404, 409, 422},
    ("post", "/api/v1/runs/{run_id}/retry"): {404, 409, 422, 503},
    ("get", "/api/v1/tasks"): set(),
    ("get", "/api/v1/tasks/{task_id}"): {404},
    ("post", "/api/v1/tasks/{task_id}/circuit/force-enable"): {404},
    ("get", "/api/v1/pauses"): set(),
    ("get", "/api/v1/windows"): set(),
    ("get", "/api/v1/limits"): set(),
    ("get", "/api/v1/providers"): set(),
    ("get", "/api/v1/items/{item_id}/trickplay.vtt"): {404, 409, 422},
    ("get", "/api/v1/items/{item_id}/trickplay/{name}"): {404, 422},
    ("put", "/api/v1/tasks/{task_id}/window"): {404, 422},
    ("delete", "/api/v1/tasks/{task_id}/window"): {404},
    ("put", "/api/v1/classes/{resource_class}/window"): {404, 422},
    ("delete", "/api/v1/classes/{resource_class}/window"): {404},
    ("post", "/api/v1/tasks/{task_id}/pause"): {404, 409, 422},
    ("post", "/api/v1/tasks/{task_id}/resume"): {404, 409},
    ("post", "/api/v1/classes/{resource_class}/pause"): {404, 409, 422},
    ("post", "/api/v1/classes/{resource_class}/resume"): {404, 409},
    ("post", "/api/v1/webhooks"): {404, 422},
    ("get", "/api/v1/webhooks"): set(),
    ("delete", "/api/v1/webhooks/{endpoint_id}"): {404, 422},
    ("get", "/api/v1/dead-letters"): {422},
    ("post", "/api/v1/dead-letters/requeue"): {422},
    ("get", "/api/v1/drain/poison"): set(),
    ("post", "/api/v1/drain/poison/replay"): {422},
    ("post", "/api/v1/drain/poison/discard"): {422},
    ("get", "/api/v1/schedules"): set(),
    ("get", "/api/v1/schedules/fires"): {404, 409, 422},
    ("post", "/api/v1/schedules/static/switch"): {404, 409, 422},
    ("post", "/api/v1/schedules/static/override"): {404, 409, 422},
    ("post", "/api/v1/schedules/static/reset"): {404, 409, 422},
    ("post", "/api/v1/schedules/dynamic/override"): {404, 422},
    ("post", "/api/v1/schedules/dynamic/reset"): {404, 422},
    ("post", "/api/v1/schedules/dynamic/switch"): {404, 422},
    ("post", "/api/v1/schedules/backfill"): {404, 409, 422},
    ("get", "/api/v1/cluster/nodes"): set(),
    ("get", "/api/v1/cluster/leaders"): set(),
    ("get", "/api/v1/coverage"): set(),
    ("get", "/api/v1/coverage/{stage}"): {404, 422},
    ("post", "/api/v1/coverage/{stage}/items/{item_id}/rescan"): {404, 409, 422, 503},
    ("post", "/api/v1/coverage/{stage}/heal"): {404},
    ("post", "/api/v1/catalog/rescan"): {409, 422},
    ("post", "/api/v1/triggers/{name}"): {404, 409, 422, 503},
    ("get", "/api/v1/features/test-feature/ping"): set(),
}


def test_every_operation_declares_its_errors_with_the_error_schema() -> None:
    spec = Client().get("/api/v1/openapi.json").json()
    operations = {(m, path): op for path, ops in spec["paths"].items() for m, op in ops.items()}

    assert set(operations) == set(OWN_ERRORS)
    for key, operation in operations.items():
        errors = {int(s): r for s, r in operation["responses"].items() if int(s) >= 400}
        assert set(errors) == {400, 401, 403, 413, 429, 503} | OWN_ERRORS[key], key
        for response in errors.values():
            schema = response["content"]["application/json"]["schema"]
            assert schema == {"$ref": "#/components/schemas/ErrorOut"}
    error = spec["components"]["schemas"]["ErrorOut"]
    assert error["required"] == ["detail"]
    assert set(error["properties"]) == {"detail", "code", "errors"}


def test_the_schema_says_what_is_refused_at_the_edge() -> None:
    spec = Client().get("/api/v1/openapi.json").json()
    start = spec["components"]["schemas"]["StartRunIn"]["properties"]

    assert start["task"]["pattern"] == "^[^\\u0000]*$"
    assert start["priority"]["anyOf"][0] == {"enum": [1, 2, 3, 5, 7], "type": "integer"}


def test_a_runs_log_is_documented_as_a_stream_and_as_json() -> None:
    spec = Client().get("/api/v1/openapi.json").json()
    ok = spec["paths"]["/api/v1/runs/{run_id}/logs"]["get"]["responses"]["200"]["content"]

    assert set(ok) == {"text/event-stream", "application/json"}
    assert ok["application/json"]["schema"]["items"] == {"$ref": "#/components/schemas/LogLine"}
    line = spec["components"]["schemas"]["LogLine"]
    assert set(line["properties"]) == {"seq", "ts", "level", "stage", "msg"}
