"""A run's page in the admin and its actions, and the runs list's live columns and filters."""

from __future__ import annotations

import dataclasses
import json
from datetime import timedelta

import pytest
from django.conf import settings
from django.contrib.admin.models import LogEntry
from django.test import Client
from django.utils import timezone

from orchestrator.api.access import Access
from orchestrator.models import TaskHistory
from orchestrator.runs.start import start_run
from orchestrator.states import RunState
from orchestrator.stores import keys, valkey
from orchestrator.triggers import TriggerKind
from tests.support.catalog import empty_queues
from tests.support.users import PASSWORD, account, operator

pytestmark = pytest.mark.django_db(transaction=True)

# No worker consumes it in this suite (the shared worker serves test-noop): runs stay put.
PARKED = "test-record-order"

RUNS = "/admin/orchestrator/taskhistory/"
INPUTS = {"test-record-order": {"label": "x"}, "test-fail": {"how": "permanent"}}


@pytest.fixture(autouse=True)
def _no_leftover_messages() -> None:
    # Runs started here wait for no worker: their messages must not reach a later test's.
    empty_queues()


def _client(user_name: str, *grants: Access) -> Client:
    user = account(user_name, *grants)
    client = Client()
    assert client.login(username=user.username, password=PASSWORD)
    return client


def _operator() -> Client:
    user = operator("detail-ops")
    client = Client()
    assert client.login(username=user.username, password=PASSWORD)
    return client


def _ended(task: str, state: RunState, **fields: object) -> str:
    run_id = start_run(task, INPUTS.get(task, {}), trigger=TriggerKind.API).run_id
    TaskHistory.objects.filter(id=run_id).update(
        state=RunState.ACTIVE, started_at=timezone.now() - timedelta(seconds=3)
    )
    TaskHistory.objects.filter(id=run_id).update(state=state, finished_at=timezone.now(), **fields)
    return run_id


def _failed_pipeline() -> str:
    """A test-pipe run that failed in `left` after `probe` completed."""
    run_id = start_run("test-pipe", {}, trigger=TriggerKind.API).run_id
    TaskHistory.objects.filter(id=run_id).update(state=RunState.ACTIVE, started_at=timezone.now())
    TaskHistory.objects.filter(id=run_id).update(
        state=RunState.FAILED,
        finished_at=timezone.now(),
        stages={
            "probe": "completed",
            "left": "failed",
            "right": "completed",
            "final": "skipped",
            "after-right": "completed",
        },
        stage_results={"probe": {"stage": "probe"}, "right": {}, "after-right": {}},
        error={"kind": "permanent", "message": "stage left: asked to fail", "stage": "left"},
    )
    return run_id


def test_the_page_shows_the_timeline_input_result_and_report_link() -> None:
    run_id = _ended("test-record-order", RunState.COMPLETED, result={"answer": 42})

    page = _client("viewer", Access.VIEW).get(f"{RUNS}{run_id}/change/")

    assert page.status_code == 200
    html = page.content.decode()
    assert "created pending" in html
    assert "pending → active" in html and "active → completed" in html
    assert "&quot;answer&quot;: 42" in html and "&quot;label&quot;: &quot;x&quot;" in html
    assert f"/api/v1/runs/{run_id}/report.md" in html
    assert f'data-logs-url="/api/v1/runs/{run_id}/logs"' in html
    assert 'data-live="false"' in html


def test_a_viewer_sees_no_actions_and_may_not_post_one() -> None:
    run_id = _ended("test-fail", RunState.FAILED, error={"kind": "permanent", "message": "no"})
    viewer = _client("viewer", Access.VIEW)

    html = viewer.get(f"{RUNS}{run_id}/change/").content.decode()
    refused = viewer.post(f"{RUNS}{run_id}/act/retry/")

    assert "/act/" not in html
    assert refused.status_code == 403
    assert TaskHistory.objects.count() == 1


def test_an_operator_sees_the_actions_the_state_allows() -> None:
    client = _operator()
    pending = start_run(PARKED, {"label": "x"}, trigger=TriggerKind.API).run_id
    failed = _ended("test-fail", RunState.FAILED, error={"kind": "permanent", "message": "no"})

    pending_html = client.get(f"{RUNS}{pending}/change/").content.decode()
    failed_html = client.get(f"{RUNS}{failed}/change/").content.decode()

    assert f"/{pending}/act/cancel/" in pending_html
    assert "/act/retry/" not in pending_html and "/act/kill/" not in pending_html
    assert f"/{failed}/act/retry/" in failed_html
    assert "/act/cancel/" not in failed_html and "/act/resume/" not in failed_html
    assert "permanent" in failed_html and "no" in failed_html


def test_cancel_from_the_page_goes_through_the_orchestrator_and_is_logged() -> None:
    client = _operator()
    run_id = start_run(PARKED, {"label": "x"}, trigger=TriggerKind.API).run_id

    response = client.post(f"{RUNS}{run_id}/act/cancel/")

    assert response.status_code == 302
    assert response["Location"] == f"{RUNS}{run_id}/change/"
    assert TaskHistory.objects.get(id=run_id).state == RunState.CANCELLED
    assert LogEntry.objects.get().change_message == f"cancelled run {run_id} (now cancelled)"


def test_retry_links_both_ways() -> None:
    client = _operator()
    original = _ended("test-fail", RunState.FAILED, error={"kind": "permanent", "message": "no"})

    client.post(f"{RUNS}{original}/act/retry/")

    retry = TaskHistory.objects.exclude(id=original).get()
    assert retry.trigger["retryOf"] == original
    assert f"/{retry.id}/change/" in client.get(f"{RUNS}{original}/change/").content.decode()
    retry_html = client.get(f"{RUNS}{retry.id}/change/").content.decode()
    assert f'retry of <a href="{RUNS}{original}/change/">' in retry_html


def test_a_pipeline_shows_its_stages_as_columns_and_resumes_or_starts_over() -> None:
    client = _operator()
    original = _failed_pipeline()

    html = client.get(f"{RUNS}{original}/change/").content.decode()
    # probe first; left and right one column right; final and after-right the next.
    columns = html.split('class="stage-column"')[1:]
    assert len(columns) == 3
    assert 'id="stage-probe"' in columns[0]
    assert 'id="stage-left"' in columns[1] and 'id="stage-right"' in columns[1]
    assert 'id="stage-final"' in columns[2]
    assert 'stage-box state-failed" id="stage-left"' in html
    assert "Resume" in html and "Retry from scratch" in html

    client.post(f"{RUNS}{original}/act/resume/")
    resumed = TaskHistory.objects.exclude(id=original).get()
    client.post(f"{RUNS}{original}/act/retry/")
    fresh = TaskHistory.objects.exclude(id__in=[original, resumed.id]).get()

    assert resumed.stages["probe"] == "completed" and resumed.stages["right"] == "completed"
    assert "completed" not in fresh.stages.values()
    logged = list(LogEntry.objects.order_by("id").values_list("change_message", flat=True))
    assert logged == [
        f"resumed run {original} as {resumed.id}",
        f"retried run {original} as {fresh.id}",
    ]


def test_bad_run_ids_and_actions_are_404() -> None:
    client = _operator()
    run_id = start_run(PARKED, {"label": "x"}, trigger=TriggerKind.API).run_id

    assert client.get(f"{RUNS}run_01ARZ3NDEKTSV4RRFFQ69G5FAV/change/").status_code == 404
    assert client.get(f"{RUNS}not-a-run/change/").status_code == 404
    assert client.post(f"{RUNS}{run_id}/act/explode/").status_code == 404
    assert client.post(f"{RUNS}run_01ARZ3NDEKTSV4RRFFQ69G5FAV/act/cancel/").status_code == 404
    assert client.get(f"{RUNS}{run_id}/act/cancel/").status_code == 405
    assert TaskHistory.objects.get(id=run_id).state == RunState.PENDING


def test_a_finished_run_cannot_be_cancelled_and_says_why() -> None:
    client = _operator()
    run_id = _ended(PARKED, RunState.COMPLETED)

    response = client.post(f"{RUNS}{run_id}/act/cancel/", follow=True)

    assert "nothing to cancel" in response.content.decode()
    assert TaskHistory.objects.get(id=run_id).state == RunState.COMPLETED
    assert not LogEntry.objects.exists()


def test_the_list_shows_live_progress_class_cost_and_error_kind() -> None:
    client = _client("viewer", Access.VIEW)
    running = start_run(PARKED, {"label": "x"}, trigger=TriggerKind.API).run_id
    TaskHistory.objects.filter(id=running).update(
        state=RunState.ACTIVE, progress={"done": 1, "total": 10}
    )
    # The live hash is ahead of the row: the list shows the hash's report.
    fresh = {"done": 7, "total": 10, "eta_s": 90, "item": "disc 2"}
    valkey.client().hset(keys.run_active(running), "progress", json.dumps(fresh))
    _ended(
        "test-fail",
        RunState.FAILED,
        error={"kind": "transient", "message": "x", "exhausted": True},
        cost_breakdown={"cpu_seconds": 1.5},
    )

    html = client.get(RUNS).content.decode()

    assert (
        '<progress value="7" max="10"></progress> <span>7 of 10 (disc 2), ETA 90 s</span>' in html
    )
    assert "transient (dead letter)" in html
    assert "cpu_seconds 1.5" in html
    assert '<td class="field-resource_class">maintenance</td>' in html


def test_the_class_and_date_filters_narrow_the_list() -> None:
    client = _client("viewer", Access.VIEW)
    other_run = start_run(PARKED, {"label": "x"}, trigger=TriggerKind.API).run_id
    cpu_run = start_run(PARKED, {"label": "x"}, trigger=TriggerKind.API).run_id
    TaskHistory.objects.filter(id=cpu_run).update(task_id="hash-folder")  # a cpu task
    old = start_run(PARKED, {"label": "x"}, trigger=TriggerKind.API).run_id
    TaskHistory.objects.filter(id=old).update(created_at=timezone.now() - timedelta(days=40))
    today = timezone.now().date()

    by_class = client.get(RUNS, {"class": "cpu"}).content.decode()
    recent = client.get(
        RUNS,
        {
            "created_at__gte": str(today - timedelta(days=1)),
            "created_at__lt": str(today + timedelta(days=1)),
        },
    ).content.decode()

    assert cpu_run in by_class and other_run not in by_class
    assert other_run in recent and cpu_run in recent and old not in recent


def test_counters_and_cost_kinds_named_like_dict_methods_render() -> None:
    # A task author may name a counter "items"; the template must not call dict.items on it.
    run_id = _ended(
        PARKED,
        RunState.COMPLETED,
        cost_breakdown={"items": 2.5},
        steps={PARKED: {"counters": {"items": 3, "keys": 1}, "cost": {"items": 2.5}}},
    )

    page = _client("viewer", Access.VIEW).get(f"{RUNS}{run_id}/change/")

    assert page.status_code == 200
    html = page.content.decode()
    assert "items 3, keys 1" in html
    assert "items 2.5" in html


def test_a_traced_runs_page_links_its_trace_where_lumastra_trace_url_says() -> None:
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    traced = {"kind": "api", "traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"}
    run_id = _ended(PARKED, RunState.COMPLETED, trigger=traced)
    untraced = _ended(PARKED, RunState.COMPLETED)
    client = _operator()
    assert f'<code id="run-trace">{trace_id}</code>' in _page(client, run_id)
    assert 'id="run-trace"' not in _page(client, untraced)

    config = settings.CONFIG
    settings.CONFIG = dataclasses.replace(config, trace_url="http://jaeger/trace/{trace_id}")
    try:
        link = f'<a id="run-trace" href="http://jaeger/trace/{trace_id}">{trace_id}</a>'
        assert link in _page(client, run_id)
    finally:
        settings.CONFIG = config


def _page(client: Client, run_id: str) -> str:
    return client.get(f"{RUNS}{run_id}/change/").content.decode()
