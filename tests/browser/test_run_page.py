"""A run's page and the runs list in a real browser, while runs run: the page follows a run's
progress, log and state in place (no reload until the run ends); the list refreshes its rows'
cells; Cancel and Kill now end a running run; Retry and Resume start new runs linked from the
page; a pipeline's stages show their states."""

from __future__ import annotations

import json
import time
import uuid

import pytest
from django.conf import settings

from orchestrator.models import TaskHistory
from orchestrator.states import RunState
from orchestrator.stores import valkey
from tests.browser.seed import retry_of, start, state_of, until
from tests.support.browser import Console, RunsList
from tests.support.fixtures import wait_for
from tests.support.processes import alive
from tests.support.task_defs import PIPE_CALLS_KEY, SLEEPY_PIDS_KEY

pytestmark = pytest.mark.django_db(transaction=True)

STEPS = 8
SKIPPED_RIGHT = {
    "probe": "completed",
    "left": "completed",
    "right": "skipped",
    "final": "completed",
    "after-right": "skipped",
}


def test_a_running_runs_page_follows_its_progress_and_log_in_place(console: Console) -> None:
    run_id = start("slow-progress", {"steps": STEPS, "step_seconds": 0.4})
    run = console.run(run_id)
    assert run.followed()  # it was live when the page loaded
    shown = console.watch(state=run.STATE, progress=run.PROGRESS, log=run.LOG)

    # The page reloads itself once the run has ended (and only then): from then on it is a
    # new document, which says so.
    console.eventually(lambda: not run.followed(), timeout=30, reload=False)

    # What the first document showed, each time it changed, until it was reloaded.
    states = shown.seen("state")
    assert states[0] in ("pending", "active")
    assert states[-1] == "completed"  # reached before the reload, in place
    progress = [p for p in shown.seen("progress") if p and f" of {STEPS}" in p]
    assert len(set(progress)) >= 2, progress
    logs = [log.count("\n") for log in shown.seen("log") if log]
    assert len(set(logs)) >= 2 and logs == sorted(logs), logs
    # The reloaded page: the run as it ended, its whole log.
    assert run.state() == "completed"
    assert f"{STEPS} of {STEPS}" in run.text(run.PROGRESS)
    console.eventually(lambda: run.log_status() == "The run ended (completed).", reload=False)
    assert f"step {STEPS} of {STEPS}" in run.text(run.LOG)


def test_the_runs_list_refreshes_a_running_runs_cells_in_place(console: Console) -> None:
    run_id = start("slow-progress", {"steps": 10, "step_seconds": 0.3})
    until(run_id, RunState.ACTIVE)
    runs = console.runs()
    shown = console.watch(
        state=RunsList.cell_css(run_id, "state_badge"),
        progress=RunsList.cell_css(run_id, "progress_bar"),
    )
    later = start("test-noop")  # started after the list loaded: not a row, a notice

    runs.console.eventually(lambda: runs.state(run_id) == "completed", timeout=30, reload=False)

    states = shown.seen("state")
    assert states[0] in ("pending", "active") and states[-1] == "completed"
    assert (shown.seen("progress")[-1] or "").startswith("10 of 10 (step 10)")
    assert len(set(shown.seen("progress"))) >= 2
    assert later not in runs.run_ids()
    assert console.page.locator("#newer-runs").inner_text() == "1 newer run: show"


def test_cancel_on_a_runs_page_ends_it_cancelled(console: Console) -> None:
    run_id = start("slow-progress", {"steps": 100, "step_seconds": 0.2})
    until(run_id, RunState.ACTIVE)
    run = console.run(run_id)
    assert run.buttons() == ["Cancel", "Kill now"]

    run.act("Cancel")

    assert console.said(f"cancelled run {run_id}")
    console.eventually(lambda: run.state() == "cancelled", reload=False)
    console.eventually(lambda: run.buttons() == ["Retry"], reload=False)  # after the reload
    assert state_of(run_id) == "cancelled"


@pytest.mark.usefixtures("private_worker")
def test_kill_now_ends_a_run_whose_handler_ignores_cancel(console: Console) -> None:
    # A plain time.sleep: the cancel flag is never looked at.
    run_id = start("test-sleepy", {"seconds": 60, "cooperative": False})
    pid = int(wait_for(lambda: valkey.client().hget(SLEEPY_PIDS_KEY, run_id)))
    run = console.run(run_id)
    run.act("Cancel")
    assert console.said(f"cancelled run {run_id} (now cancelling)")
    assert run.state() == "cancelling"  # the handler sleeps on
    assert run.buttons() == ["Kill now"]
    began = time.monotonic()

    run.act("Kill now")

    assert console.said(f"killed run {run_id}")
    console.eventually(lambda: run.state() == "cancelled", reload=False)
    took = time.monotonic() - began
    assert took < settings.CONFIG.cancel_escalate_s / 4, took  # not the escalation's doing
    wait_for(lambda: not alive(pid), timeout=5)  # the handler's process is gone


def test_retry_on_a_failed_runs_page_links_the_new_run(console: Console) -> None:
    failed = start("test-fail", {"how": "permanent"})
    until(failed, RunState.FAILED)
    run = console.run(failed)

    run.act("Retry")

    retry = retry_of(failed)
    assert console.said(f"retried run {failed} as {retry}")
    new = run.open(retry)
    assert console.page.locator(f".run-links a:text-is('{failed}')").is_visible()  # retry of
    console.eventually(lambda: new.state() == "failed", reload=False)  # fails again, as asked
    assert TaskHistory.objects.get(id=retry).input == {"how": "permanent"}


@pytest.mark.usefixtures("private_worker")
def test_a_pipelines_stages_and_resuming_it_after_a_failed_stage(console: Console) -> None:
    needed = f"test:browser:final-ok:{uuid.uuid4().hex}"
    # `final` fails without the key; `right` (and what follows it) is skipped by its `when`.
    original = start("test-pipe", {"final_needs_key": needed, "skip_right": True})
    until(original, RunState.FAILED)
    run = console.run(original)
    assert run.stages() == {**SKIPPED_RIGHT, "final": "failed"}
    assert f"{needed} is missing" in run.text("#stage-final")
    assert run.buttons() == ["Resume", "Retry from scratch"]
    console.shoot("run-stages")
    valkey.client().set(needed, 1)  # what `final` missed is there now

    run.act("Resume")

    resumed = retry_of(original)
    assert console.said(f"resumed run {original} as {resumed}")
    new = run.open(resumed)
    console.eventually(lambda: new.state() == "completed", reload=False)
    assert new.stages() == SKIPPED_RIGHT
    # Only the failed stage ran again; the others are the original's, reused.
    calls = valkey.client().lrange(PIPE_CALLS_KEY.format(run_id=resumed), 0, -1)
    assert [json.loads(c)["stage"] for c in calls] == ["final"]
    steps = TaskHistory.objects.get(id=resumed).steps
    assert {name for name, step in steps.items() if step.get("reused_from") == original} == {
        "probe",
        "left",
    }
