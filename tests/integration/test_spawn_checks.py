"""`ctx.spawn` refuses what it cannot write with the step's end, before anything is admitted or
written, and `ctx.children` keeps each child's result under the stage result cap (issue 40).
No worker: the context is the engine's own, as a handler gets it."""

from __future__ import annotations

import pytest
from django.conf import settings

from orchestrator.models import RunBatch, TaskHistory
from orchestrator.runs.context import RunContext
from orchestrator.runs.rerun import NotRetryable, rerun
from tasks.errors import PermanentError

pytestmark = [pytest.mark.django_db(transaction=True)]

PARENT = "run_01SPAWNPARENT0000000000000"


def _context(**options: object) -> RunContext:
    return RunContext(PARENT, None, task_id="test-fan-out", stage="scan", **options)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("task_id", "inputs", "options", "says"),
    [
        ("test-child", [{"n": 0}] * 10_001, {}, "10001 children in one step; at most 10000"),
        ("no-such-task", [{}], {}, "no-such-task"),
        ("test-child", [{"n": 0}, {"n": "x"}], {}, "child 1 of test-child: field n"),
        ("test-child", [{"n": 0}], {"on_failure": "ignore"}, "on_failure 'ignore'"),
        ("test-debounced", [{"key": "k", "n": 1}], {}, "coalesces its starts"),
        ("test-follow-up", [{"key": "k", "n": 1}], {}, "coalesces its starts"),
    ],
    ids=["too-many", "unknown-task", "bad-input", "bad-on-failure", "debounced", "follow-up"],
)
def test_a_spawn_that_cannot_be_written_fails_the_step(
    task_id: str, inputs: list[dict[str, object]], options: dict[str, str], says: str
) -> None:
    context = _context()
    with pytest.raises(PermanentError, match=says):
        context.spawn(task_id, inputs, **options)  # type: ignore[arg-type]
    assert context.spawned == []
    assert not TaskHistory.objects.filter(parent_run_id=PARENT).exists()


def test_a_when_cannot_spawn() -> None:
    with pytest.raises(PermanentError, match="only a handler or a stage"):
        _context(spawns=False).spawn("test-child", [{"n": 0}])


def test_children_come_in_order_with_results_over_the_cap_left_out() -> None:
    cap = settings.CONFIG.stage_result_max_bytes
    RunBatch.objects.create(
        id="batch_01SPAWNCHECKS000000000000", parent_run_id=PARENT, parent_stage="scan",
        total=2, open=0,
    )  # fmt: skip
    for index, result in enumerate(({"n": 0}, {"blob": "x" * cap})):
        TaskHistory.objects.create(
            id=f"run_01SPAWNCHILD{index:015d}", task_id="test-child", priority=5,
            identity=str(index), state="completed", input={"n": index}, result=result,
            parent_run_id=PARENT, batch_id="batch_01SPAWNCHECKS000000000000",
        )  # fmt: skip

    small, large = _context().children("scan")

    assert (small.input, small.result, small.result_omitted) == ({"n": 0}, {"n": 0}, False)
    assert (large.input, large.result, large.result_omitted) == ({"n": 1}, None, True)
    assert _context().children("other-stage") == []


def test_a_resume_is_refused_while_the_original_has_live_children() -> None:
    TaskHistory.objects.create(
        id=PARENT, task_id="test-fan-out", priority=5, identity="p", state="failed",
        input={"count": 1}, stages={"scan": "completed", "collections": "skipped"},
    )  # fmt: skip
    TaskHistory.objects.create(
        id="run_01SPAWNLIVECHILD0000000000", task_id="test-child", priority=5, identity="c",
        state="pending", input={"n": 0}, parent_run_id=PARENT,
    )  # fmt: skip

    with pytest.raises(NotRetryable, match="still has 1 live children"):
        rerun(PARENT, actor="tester", reuse=True)
    assert TaskHistory.objects.filter(trigger__retryOf=PARENT).count() == 0
