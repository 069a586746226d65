"""Finding runs by what they were about (issue 42): equality on top-level input fields and tags
over the API, the console's search box and the filter's index; cancel and retry by filter, with
a dry run; tags given at start, kept by a retry, refused when malformed."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection
from django.test import Client

from orchestrator.api import tokens
from orchestrator.models import TaskHistory
from orchestrator.routing import queue_name
from orchestrator.runs import bulk, search
from orchestrator.runs.batch import start_runs
from orchestrator.runs.batches import StartRequest
from orchestrator.runs.handle import StartRefused
from orchestrator.runs.start import start_run
from orchestrator.states import RunState
from orchestrator.triggers import TriggerKind
from tasks import registry
from tests.support.messages import empty_queues
from tests.support.users import PASSWORD, account, operator

pytestmark = pytest.mark.django_db(transaction=True)

TASK = "test-library-scan"  # no worker takes its queue
LIBRARIES = 50
RUNS = 200  # 4 per library


@pytest.fixture(autouse=True)
def _empty_queue() -> Iterator[None]:
    yield
    from django.conf import settings

    empty_queues(queue_name(registry.get()[TASK], settings.CONFIG.per_task_queues))


@pytest.fixture
def runs() -> dict[int, list[str]]:
    """RUNS pending runs over LIBRARIES libraries (half of each one's given its id as text), the
    fifth library's tagged `nightly`; run ids by library."""
    requests = [
        StartRequest(
            TASK,
            {"library_id": n % LIBRARIES if n // LIBRARIES % 2 else str(n % LIBRARIES)},
            tags=("nightly",) if n % LIBRARIES == 5 else (),
        )
        for n in range(RUNS)
    ]
    by_library: dict[int, list[str]] = {}
    for n, outcome in enumerate(start_runs(requests)):
        assert outcome.run_id is not None
        by_library.setdefault(n % LIBRARIES, []).append(outcome.run_id)
    return by_library


_HEADERS: dict[str, str] = {}


@pytest.fixture(autouse=True)
def _operator_token() -> None:
    token = tokens.issue(operator("searcher"), "search")[1]
    _HEADERS["Authorization"] = f"Bearer {token}"


def _api() -> tuple[Client, dict[str, str]]:
    return Client(), dict(_HEADERS)


def _listed(query: str) -> tuple[int, Any]:
    client, headers = _api()
    response = client.get(f"/api/v1/runs?limit=200&{query}", headers=headers)
    return response.status_code, response.json()


def _ids(query: str) -> set[str]:
    status, body = _listed(query)
    assert status == 200, body
    return {item["run_id"] for item in body["items"]}


def test_an_input_field_finds_exactly_its_runs_whether_its_value_is_a_number_or_text(
    runs: dict[int, list[str]],
) -> None:
    assert _ids("input.library_id=7") == set(runs[7])
    assert len(runs[7]) == RUNS // LIBRARIES
    assert _ids(f"input.library_id=7&task={TASK}&state=pending") == set(runs[7])
    assert _ids("input.library_id=7&state=failed") == set()
    assert _ids("input.library_id=7&input.full=false") == set(runs[7])
    assert _ids("input.library_id=7&input.full=true") == set()
    assert _ids("input.library_id=70") == set()


def test_tags_find_their_runs_and_are_shown(runs: dict[int, list[str]]) -> None:
    assert _ids("tag=nightly") == set(runs[5])
    assert _ids("tag=nightly&tag=weekly") == set()
    assert _ids("tag=nightly&input.library_id=6") == set()
    body = _listed("tag=nightly")[1]
    assert {tuple(item["tags"]) for item in body["items"]} == {("nightly",)}


@pytest.mark.parametrize(
    "query",
    [
        "input.library%20id=7",  # not a field's name
        "input.=7",
        "&".join(f"input.f{n}=1" for n in range(11)),  # more fields than MAX_INPUT_FIELDS
        f"input.library_id={'7' * 1001}",
        "tag=two%20words",
        "since=yesterday",
    ],
)
def test_a_filter_that_cannot_be_run_is_a_422(query: str) -> None:
    status, body = _listed(query)
    assert status == 422, body


def test_the_filter_is_served_by_the_gin_indexes(runs: dict[int, list[str]]) -> None:
    queries = {
        "task_history_input": search.matching(search.RunFilter(input={"library_id": (7, "7")})),
        "task_history_tags": search.matching(search.RunFilter(tags=("nightly",))),
    }
    with connection.cursor() as cursor:
        # A table this small is cheaper to scan: the planner is told not to, to show the index
        # answers the filter's shape.
        cursor.execute("SET enable_seqscan = off")
        try:
            for index, found in queries.items():
                sql, params = found.values("id").query.sql_with_params()
                cursor.execute(f"EXPLAIN {sql}", params)
                assert index in "\n".join(row[0] for row in cursor.fetchall())
        finally:
            cursor.execute("SET enable_seqscan = on")


def test_tags_at_start_are_checked_and_a_retry_keeps_them() -> None:
    handle = start_run(
        TASK, {"library_id": 1}, trigger=TriggerKind.API, tags=["nightly", "lib:1", "nightly"]
    )
    assert TaskHistory.objects.get(id=handle.run_id).tags == ["nightly", "lib:1"]
    for bad in (["two words"], ["x" * 65], [f"t{n}" for n in range(11)], [""]):
        with pytest.raises(StartRefused):
            start_run(TASK, {"library_id": 1}, trigger=TriggerKind.API, tags=bad)

    client, headers = _api()
    refused = client.post(
        "/api/v1/runs",
        {"task": TASK, "input": {"library_id": 1}, "tags": ["no spaces please"]},
        content_type="application/json",
        headers=headers,
    )
    assert refused.status_code == 422
    cancel = bulk.cancel(search.RunFilter(tags=("lib:1",)), actor="ops")
    assert [acted.outcome for acted in cancel.items] == ["cancelled"]
    retried = bulk.retry(search.RunFilter(tags=("lib:1",)), actor="ops")
    (acted,) = retried.items
    assert TaskHistory.objects.get(id=acted.new_run_id).tags == ["nightly", "lib:1"]


def _bulk(action: str, body: dict[str, Any]) -> tuple[int, Any]:
    client, headers = _api()
    response = client.post(
        f"/api/v1/runs:{action}", json.dumps(body), content_type="application/json", headers=headers
    )
    return response.status_code, response.json()


def test_cancel_and_retry_by_filter_answer_a_dry_run_then_act_on_exactly_those_runs(
    runs: dict[int, list[str]],
) -> None:
    library = {"filter": {"task": TASK, "input": {"library_id": 7}}}
    # Exact in a body: 7 is not "7", and the library's runs are given both ways.
    numbered = {
        run_id for run_id in runs[7] if TaskHistory.objects.get(id=run_id).input["library_id"] == 7
    }

    status, dry = _bulk("cancel", {**library, "dry_run": True})
    assert (status, dry["matched"], dry["items"], dry["dry_run"]) == (200, len(numbered), [], True)
    assert TaskHistory.objects.filter(state=RunState.CANCELLED).count() == 0

    status, done = _bulk("cancel", library)
    assert status == 200 and done["more"] is False
    assert {item["run_id"]: item["outcome"] for item in done["items"]} == dict.fromkeys(
        numbered, "cancelled"
    )
    assert (
        set(TaskHistory.objects.filter(state=RunState.CANCELLED).values_list("id", flat=True))
        == numbered
    )

    status, again = _bulk("cancel", library)
    assert (again["matched"], again["items"]) == (0, [])
    status, retried = _bulk("retry", library)
    assert {item["run_id"] for item in retried["items"]} == numbered
    assert all(item["outcome"] == "retried" and item["new_run_id"] for item in retried["items"])
    # A run an operator retry names is not retried again: a second call finds nothing.
    assert _bulk("retry", {**library, "dry_run": True})[1]["matched"] == 0
    assert len(numbered) == 2


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"filter": {}}, ["body", "body", "filter"]),
        ({"filter": {"input": {"library id": 1}}}, ["body", "body", "filter", "input"]),
        ({"filter": {"input": {"library_id": [1, 2]}}}, ["body", "body", "filter", "input"]),
    ],
)
def test_a_bulk_action_needs_a_filter_it_can_run(body: dict[str, Any], field: list[str]) -> None:
    status, answer = _bulk("cancel", body)
    assert status == 422
    assert [error["loc"] for error in answer["errors"]] == [field]


def test_a_viewer_may_search_but_not_act() -> None:
    from orchestrator.api.access import Access

    token = tokens.issue(account("search-viewer", Access.VIEW), "search")[1]
    headers = {"Authorization": f"Bearer {token}"}
    client = Client()
    assert client.get("/api/v1/runs?input.library_id=7", headers=headers).status_code == 200
    refused = client.post(
        "/api/v1/runs:cancel",
        json.dumps({"filter": {"task": TASK}}),
        content_type="application/json",
        headers=headers,
    )
    assert refused.status_code == 403


def test_the_consoles_search_box_takes_input_fields_and_tags(runs: dict[int, list[str]]) -> None:
    client = Client()
    operator("box-ops")
    assert client.login(username="box-ops", password=PASSWORD)
    page = client.get("/admin/orchestrator/taskhistory/", {"q": "library_id=5 #nightly"})
    shown = {run_id for ids in runs.values() for run_id in ids if run_id in page.content.decode()}
    assert shown == set(runs[5])
    refused = client.get("/admin/orchestrator/taskhistory/", {"q": "library_id=5 #two%20words"})
    assert "Search:" in refused.content.decode()


def test_values_json_has_no_number_for_are_text_in_a_query_and_refused_in_a_body() -> None:
    for value in ("NaN", "Infinity", "-Infinity", "1e400"):
        assert _listed(f"input.library_id={value}") == (200, {"items": [], "next_cursor": None})
    client, headers = _api()
    refused = client.post(
        "/api/v1/runs:cancel",
        '{"filter": {"input": {"library_id": NaN}}}',
        content_type="application/json",
        headers=headers,
    )
    assert refused.status_code == 422
    assert [e["loc"] for e in refused.json()["errors"]] == [["body", "body", "filter", "input"]]
    assert _listed("input.library_id=7&input.library_id=8")[0] == 422  # one value a field


def test_a_retry_by_filter_never_retries_a_run_twice_and_reports_each_refusal() -> None:
    from orchestrator.runs.rerun import NotRetryable, rerun

    ids = [
        start_run(TASK, {"library_id": 3}, trigger=TriggerKind.API, tags=["twice"]).run_id
        for _ in range(3)
    ]
    bulk.cancel(search.RunFilter(tags=("twice",)), actor="ops")
    # One retried by hand first; one whose task this deploy no longer has.
    first = rerun(ids[0], actor="ops").run_id
    TaskHistory.objects.filter(id=ids[2]).update(task_id="test-gone")
    with pytest.raises(NotRetryable, match=f"retried already, as {first}"):
        rerun(ids[0], actor="ops", once=True)

    done = bulk.retry(search.RunFilter(tags=("twice",)), actor="ops")
    outcomes = {acted.run_id: acted.outcome for acted in done.items}
    assert outcomes == {ids[1]: "retried", ids[2]: "refused"}
    assert "test-gone" in next(a.detail for a in done.items if a.run_id == ids[2])


def test_a_debounced_run_takes_the_last_starts_tags_with_its_input() -> None:
    for n, tag in enumerate(("first", "last")):
        start_run("test-debounced", {"key": "k", "n": n}, trigger=TriggerKind.API, tags=[tag])
    (run,) = TaskHistory.objects.filter(task_id="test-debounced")
    assert (run.input["n"], run.tags) == (1, ["last"])
