"""Debounce, throttle and follow-up declarations (issue 39): a bad one is a registry error
naming the field, before anything runs."""

from __future__ import annotations

from typing import Any

import pytest

from tasks import Debounce, Stage, Throttle, WhileActive, define_task
from tasks.errors import ManifestError


def _task(**options: Any) -> object:
    return define_task(id="bursty", resource_class="io", execute=lambda ctx, p: None, **options)


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"debounce": Debounce(period_s=0, max_wait_s=10), "identity_for": str}, "debounce"),
        ({"debounce": Debounce(period_s=10, max_wait_s=5)}, "debounce"),
        ({"debounce": Debounce(period_s=1.5, max_wait_s=5)}, "debounce"),  # type: ignore[arg-type]
        ({"throttle": Throttle(period_s=0)}, "throttle"),
        ({"debounce": Debounce(1, 2), "throttle": Throttle(1)}, "debounce"),
        ({"while_active": "follow_up"}, "while_active"),  # one follow-up per identity: needs one
        ({"while_active": "later", "identity_for": str}, "while_active"),
        (
            {"while_active": "follow_up", "identity_for": str, "throttle": Throttle(1)},
            "while_active",
        ),
    ],
)
def test_a_bad_declaration_names_its_field(options: dict[str, Any], field: str) -> None:
    with pytest.raises(ManifestError, match=field):
        _task(**options)


def test_a_pipeline_does_not_coalesce_and_a_good_declaration_is_kept() -> None:
    with pytest.raises(ManifestError, match="debounce"):
        define_task(
            id="piped",
            resource_class="io",
            pipeline=[Stage(name="only", execute=lambda ctx, p: None)],
            debounce=Debounce(1, 2),
        )
    with pytest.raises(ManifestError, match="identity_for"):
        _task(debounce=Debounce(period_s=60, max_wait_s=600))
    kept = _task(debounce=Debounce(period_s=60, max_wait_s=600), identity_for=lambda p: "x")
    assert kept.debounce == Debounce(60, 600)


def test_a_follow_up_task_is_kept_with_its_choice() -> None:
    kept = _task(while_active="follow_up", identity_for=lambda p: "x")
    assert kept.while_active is WhileActive.FOLLOW_UP  # type: ignore[attr-defined]
    assert _task().while_active is WhileActive.JOIN  # type: ignore[attr-defined]
