"""`covers_stages`: what define_task and the registry accept and refuse."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from coverage.models import ItemKind
from tasks import CoverageBatch, CoverageItem, CoveredStage, TaskContext, define_task, skipped
from tasks.coverage import ITEM_KINDS
from tasks.definition import NoInput, TaskDefinition
from tasks.errors import ManifestError
from tasks.registry import Registry, RegistryError


def _noop(ctx: TaskContext, params: Any) -> None:
    return None


def _covering(*stages: Any, task_id: str = "cover-task", **options: Any) -> TaskDefinition:
    options.setdefault("input_model", CoverageItem)
    return define_task(
        id=task_id, resource_class="io", execute=_noop, covers_stages=stages, **options
    )


def _problem(*stages: Any, **options: Any) -> str:
    with pytest.raises(ManifestError) as caught:
        _covering(*stages, **options)
    assert caught.value.field == "covers_stages"
    return caught.value.problem


def test_the_sdk_knows_the_catalogs_item_kinds() -> None:
    assert set(ITEM_KINDS) == {kind.value for kind in ItemKind}


def test_a_covered_stage_is_kept_as_declared() -> None:
    stage = CoveredStage(
        id="checksum",
        applies_to=("movie", "episode"),
        eligible_sql="mi.year > 2000",
        invalidated_by=("file.linked",),
        recover_when_additional_reasons=("no_file",),
    )
    assert _covering(stage).covers_stages == (stage,)


@pytest.mark.parametrize(
    ("stage", "says"),
    [
        (CoveredStage(id="Bad Id", applies_to=("movie",)), "stage id"),
        (CoveredStage(id="s", applies_to=()), "non-empty sequence"),
        (CoveredStage(id="s", applies_to="movie"), "non-empty sequence"),  # type: ignore[arg-type]
        (CoveredStage(id="s", applies_to=("film",)), "unknown item kind(s) ['film']"),
        (CoveredStage(id="s", applies_to=("movie",), eligible_sql="  "), "non-empty SQL"),
        (
            CoveredStage(
                id="s", applies_to=("movie",), eligible_sql="true", eligible=lambda item: True
            ),
            "not both",
        ),
        (
            CoveredStage(id="s", applies_to=("movie",), invalidated_by=("file.renamed",)),
            "unknown event kind",
        ),
        ("thumbnails", "entries must be CoveredStage"),
    ],
)
def test_a_malformed_stage_is_refused_with_its_problem(stage: Any, says: str) -> None:
    assert says in _problem(stage)


def test_the_input_model_must_take_the_runs_item() -> None:
    problem = _problem(CoveredStage(id="s", applies_to=("movie",)), input_model=NoInput)
    assert "CoverageItem" in problem
    batch = CoveredStage(id="s", applies_to=("movie",), per_item=False)
    assert _covering(batch, input_model=CoverageBatch).covers_stages == (batch,)


def test_a_stage_is_covered_by_one_task_only() -> None:
    stage = CoveredStage(id="shared", applies_to=("movie",))
    assert "more than once" in _problem(stage, stage)
    with pytest.raises(RegistryError, match="covered by task 'first' too"):
        Registry([_covering(stage, task_id="first"), _covering(stage, task_id="second")])


def test_skipped_says_why_and_when_to_ask_again() -> None:
    assert skipped("no audio") == {"skipped": {"reason": "no audio"}}
    later = skipped("locked", retry_after=timedelta(minutes=5))
    assert later == {"skipped": {"reason": "locked", "retry_after_s": 300}}


def test_lists_are_kept_as_tuples_so_a_stage_stays_hashable() -> None:
    stage = CoveredStage(
        id="lists",
        applies_to=["movie"],  # type: ignore[arg-type]
        invalidated_by=["file.linked"],  # type: ignore[arg-type]
        recover_when_additional_reasons=["gone"],  # type: ignore[arg-type]
    )
    kept = _covering(stage).covers_stages[0]
    assert (kept.applies_to, kept.invalidated_by) == (("movie",), ("file.linked",))
    assert kept.recover_when_additional_reasons == ("gone",)
    assert hash(kept)
