"""Debounce and throttle declarations (issue 39): a bad one is a registry error naming the
field, before anything runs."""

from __future__ import annotations

from typing import Any

import pytest

from tasks import Debounce, Stage, Throttle, define_task
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
