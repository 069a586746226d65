"""The console's first page in a real browser: the minute chart's bars are the runs the test
ended, at the minutes they ended, and the chart follows more ends without a reload.

Runs end for real on the shared worker (test-noop completes, test-fail fails for good); two of
them are then moved to earlier minutes (their row's times, as if they had ended then), so the
chart has more than one bar to get right. What each bar should hold is read back from the
rows, so a minute that turns while the runs end changes nothing.
"""

from __future__ import annotations

from collections import Counter
from datetime import UTC, timedelta

import pytest
from django.db.models import F

from orchestrator.models import TaskHistory
from orchestrator.states import RunState
from tests.browser.seed import start, until
from tests.support.browser import ADMIN, Console

pytestmark = pytest.mark.django_db(transaction=True)

# Every bar of a chart: its data-at, and its completed and failed counts.
_BARS = """(chart) => Object.fromEntries(Array.from(
    document.querySelectorAll(`#${chart} g.bar`),
    (bar) => [bar.dataset.at, [Number(bar.dataset.completed), Number(bar.dataset.failed)]]))"""


def _end(completed: int, failed: int) -> list[str]:
    runs = [(start("test-noop"), RunState.COMPLETED) for _ in range(completed)]
    runs += [(start("test-fail", {"how": "permanent"}), RunState.FAILED) for _ in range(failed)]
    for run_id, state in runs:
        until(run_id, state)
    return [run_id for run_id, _ in runs]


def _expected(run_ids: list[str]) -> dict[str, list[int]]:
    """The runs' ends by minute, as the chart's bars should show them (bars with none left out)."""
    counts: Counter[tuple[str, str]] = Counter(
        (finished.astimezone(UTC).strftime("%Y-%m-%dT%H:%MZ"), state)
        for finished, state in TaskHistory.objects.filter(id__in=run_ids).values_list(
            "finished_at", "state"
        )
    )
    minutes = sorted({minute for minute, _ in counts})
    return {m: [counts[(m, "completed")], counts[(m, "failed")]] for m in minutes}


def _shown(console: Console, chart: str) -> dict[str, list[int]]:
    bars: dict[str, list[int]] = console.page.evaluate(_BARS, chart)
    return {at: n for at, n in bars.items() if n != [0, 0]}


def test_the_minute_chart_shows_the_runs_ended_and_moves_without_a_reload(
    console: Console,
) -> None:
    first = _end(completed=3, failed=2)
    # One completed run five minutes earlier, one failed run twelve.
    for run_id, back in ((first[0], 5), (first[-1], 12)):
        TaskHistory.objects.filter(id=run_id).update(
            started_at=F("started_at") - timedelta(minutes=back),
            finished_at=F("finished_at") - timedelta(minutes=back),
        )

    console.goto(f"{ADMIN}/")

    assert console.page.locator("h1").inner_text() == "Overview"
    assert _shown(console, "minutes-chart") == _expected(first)
    assert len(console.page.evaluate(_BARS, "minutes-chart")) == 60
    # The day chart counts the same ends (by the day they ended, whatever their row says now).
    days = _shown(console, "days-chart").values()
    assert [sum(n[0] for n in days), sum(n[1] for n in days)] == [3, 2]
    console.shoot("overview")
    # Set on this document only: a reload would lose it.
    console.page.evaluate("() => { window.overviewNotReloaded = true; }")

    more = _end(completed=2, failed=1)

    expected = _expected(first + more)
    assert console.eventually(lambda: _shown(console, "minutes-chart") == expected, reload=False)
    assert console.page.evaluate("() => window.overviewNotReloaded === true")
