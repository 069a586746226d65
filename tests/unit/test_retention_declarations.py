"""A task's own retention (`Retention`, issue 42): checked when the task is declared, so a bad
one fails startup naming the task, the field and what is wrong."""

from __future__ import annotations

from typing import Any

import pytest

import tasks
from tasks import Retention, define_task
from tasks.errors import ManifestError


def _task(retention: Any) -> tasks.TaskDefinition:
    return define_task(
        id="pruned", resource_class="io", execute=lambda ctx, p: None, retention=retention
    )


@pytest.mark.parametrize(
    ("retention", "problem"),
    [
        (Retention(completed_s=-1), "completed_s must be a whole number >= 0"),
        (Retention(failed_s=-86400), "failed_s must be a whole number >= 0"),
        (Retention(completed_s=60, keep_last=-1), "keep_last must be a whole number >= 0"),
        (Retention(completed_s=1.5), "completed_s must be a whole number"),  # type: ignore[arg-type]
        (Retention(failed_s=True), "failed_s must be a whole number"),  # type: ignore[arg-type]
        (Retention(), "sets nothing the global retention does not"),
        (Retention(keep_last=0), "sets nothing the global retention does not"),
        ({"completed_s": 60}, "must be Retention"),
    ],
)
def test_a_bad_retention_names_the_task_and_the_problem(retention: Any, problem: str) -> None:
    with pytest.raises(ManifestError) as raised:
        _task(retention)

    assert "pruned" in str(raised.value)
    assert "retention" in str(raised.value)
    assert problem in str(raised.value)


@pytest.mark.parametrize(
    "retention",
    [
        Retention(completed_s=0),  # deleted at the first pass after its end
        Retention(failed_s=90 * 86400),
        Retention(keep_last=1),
        Retention(completed_s=3600, failed_s=86400, keep_last=100),
    ],
)
def test_a_good_retention_is_kept_on_the_definition(retention: Retention) -> None:
    assert _task(retention).retention == retention


def test_no_retention_is_the_global_one_and_retention_is_part_of_the_sdk() -> None:
    assert define_task(id="plain", resource_class="io", execute=lambda c, p: None).retention is None
    assert tasks.Retention is Retention and "Retention" in tasks.__all__
    with pytest.raises(AttributeError):
        Retention(completed_s=1).completed_s = 2  # type: ignore[misc]
