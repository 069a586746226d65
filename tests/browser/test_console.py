"""The operator console in a real browser: sign in, start, cancel and retry runs from the list,
force-enable a circuit, heal a backlog stage; a viewer sees no way to act, and a POST without
the CSRF token changes nothing. With LUMASTRA_SCREENSHOTS=1 each test also saves a screenshot
of the pages it passes through (docs/screenshots/, shown in the README)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import User

from coverage.models import MediaItemStageState
from orchestrator.hooks import circuit
from orchestrator.models import CircuitState, TaskHistory
from orchestrator.runs.start import start_run
from orchestrator.scheduler.sync import sync as sync_schedules
from orchestrator.states import RunState
from orchestrator.triggers import TriggerKind
from tests.browser.seed import exhausted_run
from tests.support.browser import BACKLOG, NODES, START, TASKS, Console
from tests.support.catalog import movie
from tests.support.fixtures import wait_for
from tests.support.users import PASSWORD

pytestmark = pytest.mark.django_db(transaction=True)

STAGE = "test-probe"  # covered by test-cover (tests/support/task_defs.py)
CIRCUIT_TASK = "test-circuit"  # fails on request; a circuit no other shared task uses
ENDED: tuple[tuple[str, dict[str, str]], ...] = (
    ("test-noop", {}),
    ("test-fail", {"how": "permanent"}),
)


def _state(run_id: str) -> str:
    return TaskHistory.objects.values_list("state", flat=True).get(id=run_id)


def _until(run_id: str, state: RunState) -> None:
    wait_for(lambda: _state(run_id) == state.value)


def test_an_operator_signs_in_through_the_admin_login(
    open_console: Callable[[User | None], Console], operator_user: User
) -> None:
    tab = open_console(None)
    tab.page.goto(f"{tab.base_url}{START}")
    assert "/admin/login/" in tab.page.url  # not signed in: the console sends you to sign in

    tab.log_in(operator_user.username, PASSWORD)

    assert tab.page.locator("#user-tools").inner_text().upper().startswith("WELCOME")
    assert tab.page.locator("#console-nav").is_visible()


def test_a_run_started_from_the_form_completes_in_the_runs_list(console: Console) -> None:
    # The task's input asked field by field, the fields made from its input schema.
    form = console.start_form().choose("slow-progress").fill(steps="3", step_seconds="0.1")
    console.shoot("start-run")

    run_id = form.submit()

    assert console.said(f"as {run_id}")
    runs = console.runs(search=run_id)
    runs.wait_for_state(run_id, "completed")
    run = console.run(run_id)
    assert run.state() == "completed"
    assert "3 of 3" in run.text(run.PROGRESS)
    console.shoot("run-detail")
    started = TaskHistory.objects.get(id=run_id)
    assert started.trigger["kind"] == TriggerKind.ADMIN.value
    assert started.input == {"steps": 3, "step_seconds": 0.1}


def test_cancelling_a_running_run_from_the_list_ends_it_cancelled(console: Console) -> None:
    # A finished run of each kind beside it, for the screenshot of the list.
    done = [start_run(task, data, trigger=TriggerKind.MANUAL).run_id for task, data in ENDED]
    run_id = start_run(
        "slow-progress", {"steps": 100, "step_seconds": 0.2}, trigger=TriggerKind.MANUAL
    ).run_id
    _until(run_id, RunState.ACTIVE)
    wait_for(lambda: all(_state(other) in ("completed", "failed") for other in done))
    runs = console.runs()
    console.eventually(lambda: " of 100" in runs.row(run_id).inner_text())  # its progress
    console.shoot("runs")

    runs.act("cancel_runs", run_id)

    assert console.said(f"{run_id}: cancelling") or console.said(f"{run_id}: cancelled")
    runs.wait_for_state(run_id, "cancelled")
    assert LogEntry.objects.filter(change_message__startswith=f"cancelled run {run_id}").exists()


def test_retrying_a_failed_run_from_the_list_starts_a_new_run(console: Console) -> None:
    failed = start_run("test-fail", {"how": "permanent"}, trigger=TriggerKind.MANUAL).run_id
    _until(failed, RunState.FAILED)
    runs = console.runs(search="test-fail")

    runs.act("retry_runs", failed)

    retry = TaskHistory.objects.get(trigger__retryOf=failed)
    assert console.said(f"{failed}: retried as {retry.id}")
    console.runs(search="test-fail")
    assert console.eventually(lambda: retry.id in runs.run_ids())
    runs.wait_for_state(retry.id, "failed")  # test-fail fails again, as asked


def test_force_enabling_an_open_circuit_on_the_tasks_page(console: Console) -> None:
    # Five fatal failures in a row open the circuit (orchestrator/hooks/circuit.py).
    for _ in range(5):
        failing = start_run(CIRCUIT_TASK, {"how": "fatal"}, trigger=TriggerKind.MANUAL).run_id
        _until(failing, RunState.FAILED)
    wait_for(lambda: circuit.status(CIRCUIT_TASK).state == CircuitState.OPEN)
    tasks = console.tasks()
    assert tasks.circuit(CIRCUIT_TASK).startswith("open")

    tasks.force_enable(CIRCUIT_TASK)

    assert console.said(f"the circuit of {CIRCUIT_TASK} is closed and force-enabled")
    assert tasks.circuit(CIRCUIT_TASK).startswith("closed")
    assert "forced by operator" in tasks.circuit(CIRCUIT_TASK)
    assert circuit.status(CIRCUIT_TASK).forced_by == "operator"
    console.shoot("tasks")


def test_healing_a_skipped_item_on_the_backlog_page(console: Console) -> None:
    item = movie("healed in the browser")  # with a file: eligible again
    MediaItemStageState.objects.create(
        item=item, stage=STAGE, status="skipped_permanent", reason="ineligible"
    )
    backlog = console.backlog()
    assert backlog.count(STAGE, "skipped_permanent") == 1
    console.shoot("backlog")

    backlog.heal(STAGE)

    assert console.said(f"{STAGE}: 1 rows pending again")
    assert backlog.count(STAGE, "pending") == 1
    assert MediaItemStageState.objects.get(item=item, stage=STAGE).status == "pending"


def test_the_cluster_page_shows_the_pools_and_one_leader_seat(console: Console) -> None:
    console.goto(NODES)

    assert console.page.get_by_role("cell", name="io", exact=True).first.is_visible()
    assert console.page.locator("#leaders tbody tr").count() == 1
    assert console.page.locator("#seat-cluster").is_visible()
    console.shoot("cluster")


@pytest.mark.usefixtures("private_worker")
def test_a_viewer_sees_every_page_and_no_way_to_act(viewer_console: Console) -> None:
    # On the private worker, which kills it when the test ends.
    running = start_run("test-sleepy", {"seconds": 30}, trigger=TriggerKind.MANUAL).run_id
    failed = start_run("test-fail", {"how": "permanent"}, trigger=TriggerKind.MANUAL).run_id
    dead = exhausted_run()
    _until(failed, RunState.FAILED)
    _until(running, RunState.ACTIVE)
    sync_schedules()
    movie("seen, not healed")
    page = viewer_console.page

    viewer_console.runs()
    assert failed in page.content()
    assert page.get_by_text("Start a run").count() == 0
    assert page.locator("select[name=action]").count() == 0
    assert page.locator("input.action-select").count() == 0
    for run_id in (running, failed):  # would offer cancel and kill; retry
        run = viewer_console.run(run_id)
        assert run.buttons() == []
        assert page.locator(".run-actions").count() == 0
    assert viewer_console.tasks().force_enable_buttons().count() == 0
    assert page.locator(f"#task-{CIRCUIT_TASK}").is_visible()
    assert viewer_console.backlog().heal_buttons().count() == 0
    assert page.locator(f"#stage-{STAGE}").is_visible()
    dead_letters = viewer_console.dead_letters()
    assert dead_letters.row("exhausted-runs", dead).is_visible()
    assert dead_letters.buttons().count() == 0
    assert page.locator("input[name=selected]").count() == 0
    schedules = viewer_console.schedules()
    assert schedules.enabled("history-retention") == "on"
    assert schedules.switches().count() == 0
    refused = page.goto(f"{viewer_console.base_url}{START}")
    assert refused is not None and refused.status == 403


def test_a_post_without_the_csrf_token_is_refused_and_changes_nothing(console: Console) -> None:
    item = movie("forged")
    MediaItemStageState.objects.create(
        item=item, stage=STAGE, status="skipped_permanent", reason="ineligible"
    )
    # The signed-in tab's own cookies (session and csrftoken) go along; only the token in the
    # form is missing, as in a request another site's page makes the browser send.
    forged: dict[str, dict[str, str | float | bool]] = {
        f"{BACKLOG}{STAGE}/heal/": {},
        f"{TASKS}{CIRCUIT_TASK}/force-enable/": {},
        START: {"task": "test-noop", "input": "{}"},
    }

    for path, form in forged.items():
        response = console.page.request.post(f"{console.base_url}{path}", form=form)
        assert response.status == 403, (path, response.status)
        assert "CSRF" in response.text()

    assert MediaItemStageState.objects.get(item=item, stage=STAGE).status == "skipped_permanent"
    assert circuit.status(CIRCUIT_TASK).forced_by is None
    assert not TaskHistory.objects.exists()
    assert not LogEntry.objects.exists()
