"""Pipeline runs on real workers: each stage its own message, the DAG advanced by the engine.

Two worker processes of one child each take the pipeline's queues, so two stages that are due
together can only overlap if they really run on different workers.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.conf import settings
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.utils import timezone

from orchestrator.api import report
from orchestrator.hooks import costs
from orchestrator.hooks.costs import CostQuotaExceeded
from orchestrator.models import TaskHistory, TaskQuotaUsage
from orchestrator.recovery.pending import held_by_workers
from orchestrator.recovery.reconciler import Reconciler
from orchestrator.routing import queue_name, stage_queue
from orchestrator.runs.cancel import request_cancel
from orchestrator.runs.rerun import dead_letters, rerun
from orchestrator.runs.start import start_run
from orchestrator.states import RunState
from orchestrator.stores import live, valkey
from orchestrator.triggers import TriggerKind
from tasks import registry
from tests.support.fixtures import wait_for, worker_process
from tests.support.task_defs import PIPE_CALLS_KEY

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

TASK = "test-pipe"
# The stages of a run of TASK that completed with `skip_right`.
RIGHT_SKIPPED = {
    "probe": "completed",
    "left": "completed",
    "final": "completed",
    "right": "skipped",
    "after-right": "skipped",
}


def _queues() -> list[str]:
    per_task = settings.CONFIG.per_task_queues
    queues: set[str] = set()
    for task in (TASK, "demo-pipeline", "test-cost-cap"):
        definition = registry.get()[task]
        queues.add(queue_name(definition, per_task))
        queues.update(stage_queue(definition, s, per_task) for s in definition.pipeline)
    return sorted(queues)


@pytest.fixture(scope="module")
def two_workers(django_db_setup: None) -> Iterator[list[subprocess.Popen[bytes]]]:
    with (
        worker_process(_queues(), concurrency=1, name="pipe-a") as a,
        worker_process(_queues(), concurrency=1, name="pipe-b") as b,
    ):
        yield [a, b]


def _ended(run_id: str) -> TaskHistory | None:
    row = TaskHistory.objects.get(id=run_id)
    return row if row.state in ("completed", "failed", "cancelled") else None


def _calls(run_id: str) -> dict[str, dict[str, Any]]:
    raw = valkey.client().lrange(PIPE_CALLS_KEY.format(run_id=run_id), 0, -1)
    return {call["stage"]: call for call in map(json.loads, raw)}


def _live_stages(run_id: str) -> dict[str, str]:
    snapshot: dict[str, str] = dict(live.read(run_id))  # type: ignore[arg-type]
    return {k.removeprefix("stage:"): v for k, v in snapshot.items() if k.startswith("stage:")}


def _viewer() -> Client:
    """A session of a staff user who may read runs (the API's `VIEW`)."""
    staff = User.objects.create_user(f"viewer-{uuid.uuid4().hex[:8]}", is_staff=True)
    staff.user_permissions.add(Permission.objects.get(codename="view_taskhistory"))
    client = Client()
    client.force_login(staff)
    return client


def _start(**params: Any) -> str:
    return start_run(TASK, params, trigger=TriggerKind.MANUAL).run_id


def test_stages_run_as_a_dag_and_parallel_branches_overlap(two_workers: object) -> None:
    run_id = _start(sleep_s=0.6)

    row = wait_for(lambda: _ended(run_id), timeout=30)

    assert row.state == "completed", row.error
    every = {"probe", "left", "right", "final", "after-right"}
    assert row.stages == dict.fromkeys(every, "completed")
    assert _live_stages(run_id) == row.stages
    calls = _calls(run_id)
    assert set(calls) == every
    # Each stage started only after what it depends on had ended.
    for stage, before in [("left", "probe"), ("right", "probe"), ("final", "left")]:
        assert calls[stage]["started"] >= calls[before]["ended"], (stage, before)
    # The two branches that were due together ran at the same time, in two processes.
    left, right = calls["left"], calls["right"]
    assert left["pid"] != right["pid"]
    assert left["started"] < right["ended"] and right["started"] < left["ended"]
    # Each stage read what the earlier ones returned; the run keeps every result.
    assert row.stage_results["final"] == {"stage": "final", "saw": ["left", "probe", "right"]}
    assert row.stage_results["left"]["saw"] == ["probe"]
    assert row.result == row.stage_results
    assert live.read(run_id)["state"] == "completed"


def test_when_false_skips_the_stage_and_what_depends_only_on_it(two_workers: object) -> None:
    run_id = _start(skip_right=True)

    row = wait_for(lambda: _ended(run_id), timeout=30)

    assert row.state == "completed", row.error
    assert row.stages == RIGHT_SKIPPED
    assert _live_stages(run_id) == row.stages
    assert set(_calls(run_id)) == {"probe", "left", "final"}  # skipped bodies never ran
    assert set(row.result) == {"probe", "left", "final"}


def test_a_failed_stage_fails_the_run_and_skips_what_had_not_started(two_workers: object) -> None:
    run_id = _start(fail_stage="left", skip_right=True)

    row = wait_for(lambda: _ended(run_id), timeout=30)

    assert row.state == "failed"
    assert row.error["kind"] == "permanent"
    assert row.error["stage"] == "left"
    assert "stage left: asked to fail in left" in row.error["message"]
    assert row.stages == {
        "probe": "completed",
        "left": "failed",
        "final": "skipped",
        "right": "skipped",
        "after-right": "skipped",
    }
    assert live.read(run_id)["state"] == "failed"
    assert "final" not in _calls(run_id)


def test_a_result_over_the_cap_fails_its_stage_with_a_clear_error(two_workers: object) -> None:
    run_id = _start(big_result=True)

    row = wait_for(lambda: _ended(run_id), timeout=30)

    assert row.state == "failed"
    assert row.error["stage"] == "probe"
    assert "LUMASTRA_STAGE_RESULT_MAX_BYTES" in row.error["message"]
    assert row.stages["probe"] == "failed"
    assert row.stage_results == {}
    assert set(row.stages.values()) == {"failed", "skipped"}


def test_discard_keeps_finished_stages_and_stops_the_rest(two_workers: object) -> None:
    run_id = _start(sleep_s=3.0)
    wait_for(lambda: TaskHistory.objects.get(id=run_id).stages["left"] == "active", timeout=20)

    # Cancelled at once when the running stages stopped before the call returned.
    assert request_cancel(run_id, actor="test") in (RunState.CANCELLING, RunState.CANCELLED)

    # The running stages hear the cancel signal at once (ctx.sleep wakes), not after 3 s.
    row = wait_for(lambda: _ended(run_id), timeout=10)
    assert row.state == "cancelled"
    assert row.stages["probe"] == "completed"
    assert row.stage_results["probe"]["stage"] == "probe"
    assert row.stages["left"] == "failed" and row.stages["right"] == "failed"
    assert row.stages["final"] == "skipped" and row.stages["after-right"] == "skipped"
    assert set(_calls(run_id)) == {"probe"}
    assert live.read(run_id)["state"] == "cancelled"


@pytest.fixture
def folder() -> Iterator[Path]:
    """Three files below the first media root, which the workers (started with this process's
    environment) read too."""
    path = settings.CONFIG.media_roots[0] / f"test-{uuid.uuid4().hex}"
    (path / "season-1").mkdir(parents=True)
    (path / "a.mkv").write_bytes(b"a" * 10)
    (path / "b.mkv").write_bytes(b"b" * 20)
    (path / "season-1" / "c.mkv").write_bytes(b"c" * 30)
    try:
        yield path
    finally:
        shutil.rmtree(path)


def test_the_demo_pipeline_does_its_work_across_two_pools(
    two_workers: object, folder: Path
) -> None:
    run_id = start_run("demo-pipeline", {"path": str(folder)}, trigger=TriggerKind.MANUAL).run_id

    row = wait_for(lambda: _ended(run_id), timeout=30)

    assert row.state == "completed", row.error
    assert row.stages == dict.fromkeys(["probe", "checksum", "index", "summary"], "completed")
    assert row.result["summary"] == {"files": 3, "bytes": 60, "checksummed": 3}
    expected = hashlib.sha256(b"c" * 30).hexdigest()
    assert row.result["checksum"]["sha256"]["season-1/c.mkv"] == expected
    index = json.loads(Path(row.result["index"]["index_file"]).read_text())
    assert index["files"] == {"a.mkv": 10, "b.mkv": 20, "season-1/c.mkv": 30}
    assert set(row.cost_breakdown) == {"cpu_seconds"}  # the checksum's CPU time
    assert row.steps["checksum"]["counters"] == {"bytes_hashed": 60}


def test_the_demo_pipeline_warns_about_an_empty_folder(two_workers: object, folder: Path) -> None:
    empty = folder / "empty"
    empty.mkdir()
    run_id = start_run("demo-pipeline", {"path": str(empty)}, trigger=TriggerKind.MANUAL).run_id

    row = wait_for(lambda: _ended(run_id), timeout=30)

    assert row.state == "completed"
    records = {step["stage"]: step for step in report.step_records(row)}
    assert records["probe"]["status"] == "warning"
    assert records["probe"]["warnings"] == [f"{empty} holds no files"]
    assert row.result["summary"] == {"files": 0, "bytes": 0, "checksummed": 0}


def test_the_demo_pipeline_skips_its_index_and_shows_a_failed_stage(
    two_workers: object, folder: Path
) -> None:
    skipped = start_run(
        "demo-pipeline", {"path": str(folder), "skip_index": True}, trigger=TriggerKind.MANUAL
    ).run_id
    # Another folder: runs of one folder are one identity, and a live one is not started twice.
    failed = start_run(
        "demo-pipeline",
        {"path": str(folder / "season-1"), "fail_stage": "checksum"},
        trigger=TriggerKind.API,
    ).run_id

    skipped_row = wait_for(lambda: _ended(skipped), timeout=30)
    failed_row = wait_for(lambda: _ended(failed), timeout=30)

    assert skipped_row.state == "completed"
    assert skipped_row.stages["index"] == "skipped"
    assert "index" not in skipped_row.result
    assert failed_row.state == "failed"
    assert failed_row.error["stage"] == "checksum"
    assert failed_row.stages["checksum"] == "failed"
    assert failed_row.stages["summary"] == "skipped"


def test_a_transient_error_retries_the_stage_alone(two_workers: object) -> None:
    run_id = _start(flaky_left=2, skip_right=True)

    row = wait_for(lambda: _ended(run_id), timeout=30)

    assert row.state == "completed", row.error
    assert row.attempts == 1  # the run was not retried, its stage was
    records = {step["stage"]: step for step in report.step_records(row)}
    assert records["left"]["attempts"] == 3
    assert records["probe"]["attempts"] == 1
    assert records["left"]["status"] == "ok"
    # Every attempt's spend counts: the failed ones too.
    assert records["left"]["cost"] == {"cpu_seconds": 0.75}
    assert records["left"]["counters"] == {"calls": 3}
    assert row.cost_breakdown == {"cpu_seconds": 1.25}  # probe, left x3, final
    assert records["right"]["status"] == "skipped"
    assert records["right"]["reason"] == "its `when` said no"


def test_a_stage_out_of_retries_makes_its_run_a_dead_letter(two_workers: object) -> None:
    # `left` allows 3 attempts; it fails transiently on every one of them.
    run_id = _start(flaky_left=5, skip_right=True)

    row = wait_for(lambda: _ended(run_id), timeout=30)

    assert row.state == "failed"
    assert row.error["kind"] == "transient" and row.error["stage"] == "left"
    assert "attempts exhausted: 3 of 3" in row.error["message"]
    assert row.error["exhausted"] is True
    assert run_id in set(dead_letters().values_list("id", flat=True))


def test_the_report_lists_every_step_in_yaml_frontmatter(two_workers: object) -> None:
    run_id = _start(warn_left=True, fail_stage="final", skip_right=True)
    wait_for(lambda: _ended(run_id), timeout=30)
    client = _viewer()

    response = client.get(f"/api/v1/runs/{run_id}/report.md")

    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/markdown")
    text = response.content.decode()
    _, frontmatter, body = text.split("---\n", 2)
    doc = yaml.safe_load(frontmatter)
    assert doc["run"]["id"] == run_id and doc["run"]["state"] == "failed"
    assert doc["run"]["cost"] == {"cpu_seconds": 0.75}  # probe, left, final
    by_stage = {step["stage"]: step for step in doc["steps"]}
    assert list(by_stage) == ["probe", "left", "right", "final", "after-right"]
    assert by_stage["left"]["status"] == "warning"
    assert by_stage["left"]["warnings"] == ["left saw something odd"]
    assert by_stage["final"]["status"] == "failed"
    assert by_stage["final"]["error"]["kind"] == "permanent"
    assert (
        by_stage["probe"]["resource_class"] == "io" and by_stage["right"]["resource_class"] == "cpu"
    )
    assert "| final | io | failed | 1 |" in body
    assert "## Error: permanent" in body and "left saw something odd" in body
    assert client.get("/api/v1/runs/run_00000000000000000000000000/report.md").status_code == 404
    assert Client().get(f"/api/v1/runs/{run_id}/report.md").status_code == 401


def test_cost_rolls_up_per_day_and_a_cost_quota_refuses_the_next_start(
    two_workers: object,
) -> None:
    run_id = start_run("test-cost-cap", {}, trigger=TriggerKind.MANUAL).run_id
    row = wait_for(lambda: _ended(run_id), timeout=30)

    assert row.state == "completed"
    assert row.cost_breakdown == {"tokens": 10}
    (step,) = report.step_records(row)
    assert step["status"] == "warning"
    assert step["cost"] == {"tokens": 10} and step["counters"] == {"requests": 2}
    today = timezone.now().date()
    assert costs.spent(["test-cost-cap"], today) == {"test-cost-cap": {"tokens": 10.0}}
    with pytest.raises(CostQuotaExceeded) as refused:
        start_run("test-cost-cap", {}, trigger=TriggerKind.MANUAL)
    assert "tokens 10 of 10" in str(refused.value)
    assert refused.value.retry_after is not None and refused.value.retry_after.total_seconds() > 0
    assert TaskHistory.objects.filter(task_id="test-cost-cap").count() == 1

    assert costs.rollup() == 1
    assert costs.rollup() == 0  # absolute values: a second rollup changes nothing
    usage = TaskQuotaUsage.objects.get(task_id="test-cost-cap", day=today)
    assert usage.cost == {"tokens": 10}
    client = _viewer()
    quota = client.get("/api/v1/tasks/test-cost-cap").json()["status"]["quota_today"]
    assert quota["cost"] == {"tokens": 10.0}
    assert quota["max_cost_per_day"] == {"tokens": 10.0}


def test_a_resumed_run_reruns_only_the_failed_stage_and_what_follows(two_workers: object) -> None:
    key = f"test:pipe:heal:{uuid.uuid4().hex}"
    original = _start(skip_right=True, final_needs_key=key)
    failed = wait_for(lambda: _ended(original), timeout=30)
    assert failed.state == "failed" and failed.stages["final"] == "failed"
    valkey.client().set(key, "1")  # what made `final` fail is fixed

    resumed = rerun(original, actor="test").run_id

    row = wait_for(lambda: _ended(resumed), timeout=30)
    assert row.state == "completed", row.error
    assert row.trigger["retryOf"] == original
    assert row.stages == RIGHT_SKIPPED
    # Only the failed stage ran again; the others' bodies were not called, their results kept.
    assert set(_calls(resumed)) == {"final"}
    assert row.stage_results["probe"] == failed.stage_results["probe"]
    assert row.result["final"]["saw"] == ["left", "probe"]
    records = {step["stage"]: step for step in report.step_records(row)}
    assert records["probe"]["attempts"] == 1 and row.steps["probe"]["reused_from"] == original
    assert row.cost_breakdown == {"cpu_seconds": 0.25}  # only `final` spent anything
    assert _live_stages(resumed) == row.stages


def test_a_resume_after_a_new_processing_version_reuses_nothing(two_workers: object) -> None:
    original = _start(skip_right=True, fail_stage="final")
    wait_for(lambda: _ended(original), timeout=30)
    TaskHistory.objects.filter(id=original).update(processing_version=0)

    resumed = rerun(original, actor="test").run_id

    row = wait_for(lambda: _ended(resumed), timeout=30)
    assert row.state == "failed"  # `final` still fails: the input asks it to
    assert {"probe", "left"} <= set(_calls(resumed))  # run again, not reused
    assert "reused_from" not in row.steps.get("probe", {})


def test_the_reconciler_moves_on_a_pipeline_stalled_between_stages(two_workers: object) -> None:
    """A crash between a stage's end and the next dispatch: probe completed, nothing queued.
    The orphan path leaves the run alone; the pipeline step dispatches what is due."""
    run_id = _start(skip_right=True, sleep_s=0.0, final_needs_key="never-set")
    wait_for(lambda: _ended(run_id), timeout=30)
    # Its stages' acknowledgements reach the broker with the workers' next reservation or
    # idle BRPOP (`stores.broker`): until then the reconciler counts them as held.
    wait_for(lambda: not any(m.startswith(run_id) for m in held_by_workers()), timeout=10)
    stalled = TaskHistory.objects.get(id=run_id)
    TaskHistory.objects.filter(id=run_id).update(
        state="active",
        finished_at=None,
        stages={**stalled.stages, "final": "waiting"},
        heartbeat_at=timezone.now() - timedelta(hours=1),
    )
    live.seed(run_id, TASK, stalled.priority, tuple(stalled.stages))

    reconciler = Reconciler()
    report_ = reconciler.tick()

    assert report_.chores["pipelines"] == 1
    assert report_.orphans.orphaned == 0
    row = wait_for(lambda: _ended(run_id), timeout=30)
    assert row.state == "failed" and row.error["stage"] == "final"  # it really ran again
    assert reconciler.tick().chores["pipelines"] == 0
    reconciler.release()
