"""The console's first page, the overview (orchestrator/admin/overview.py): each panel's numbers
against rows the test makes, on real Postgres, Valkey and broker; who sees it, and each panel
served alone as the page fetches it again.

Rows are written directly with the times a test needs (an end three minutes ago, a wait of
40 seconds): what is checked is the reading, not how runs get there (the browser test ends
real runs). Reads take a FrozenClock anchored at the real time, so a minute never turns
between the rows and the read.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from django.conf import settings
from django.test import Client

from orchestrator.admin import activity, waiting
from orchestrator.api.access import Access
from orchestrator.clock import FrozenClock
from orchestrator.cluster import roster
from orchestrator.models import PauseScope, TaskHistory, TaskQuotaUsage
from orchestrator.recovery import pauses
from orchestrator.routing import queue_name
from orchestrator.runs.start import new_run_id, start_run
from orchestrator.states import RunState
from orchestrator.stores import keys, valkey
from orchestrator.triggers import TriggerKind
from tasks import registry
from tests.support import catalog
from tests.support.messages import empty_queues
from tests.support.users import account

pytestmark = pytest.mark.django_db(transaction=True)

# The only task of the "embedding" class; no worker of the suite consumes its queue.
PARKED = "test-bp-fail"


@pytest.fixture
def now() -> datetime:
    # Mid-minute, so "a minute ago" and "now" are never the same minute by a rounding.
    real = datetime.now(UTC).replace(second=30, microsecond=0)
    return real if real <= datetime.now(UTC) else real - timedelta(minutes=1)


@pytest.fixture(autouse=True)
def _no_leftover_messages() -> Iterator[None]:
    queue = queue_name(registry.get()[PARKED], settings.CONFIG.per_task_queues)
    empty_queues(queue)
    yield
    empty_queues(queue)


def _run(
    task_id: str,
    state: RunState,
    *,
    created: datetime,
    started: datetime | None = None,
    finished: datetime | None = None,
    not_before: datetime | None = None,
) -> str:
    run_id = new_run_id()
    TaskHistory.objects.create(
        id=run_id, task_id=task_id, trigger={"kind": "manual"}, input={}, priority=5,
        identity=run_id, state=state,
    )  # fmt: skip
    # created_at is set on insert (auto_now_add): the test's moment is written after it.
    TaskHistory.objects.filter(id=run_id).update(
        created_at=created, started_at=started, finished_at=finished, not_before=not_before
    )
    return run_id


def _ended(task_id: str, state: RunState, at: datetime) -> str:
    return _run(task_id, state, created=at - timedelta(seconds=2), started=at, finished=at)


def test_the_minute_chart_counts_each_minutes_ends(now: datetime) -> None:
    minute = now.replace(second=0)
    for back, completed, failed in ((0, 2, 1), (3, 1, 0), (59, 0, 2)):
        for _ in range(completed):
            _ended("test-noop", RunState.COMPLETED, minute - timedelta(minutes=back, seconds=-5))
        for _ in range(failed):
            _ended("test-fail", RunState.FAILED, minute - timedelta(minutes=back, seconds=-5))
    # Not counted: cancelled, still running, and an end before the hour.
    _ended("test-noop", RunState.CANCELLED, minute)
    _run("test-noop", RunState.ACTIVE, created=minute, started=minute)
    _ended("test-noop", RunState.COMPLETED, minute - timedelta(minutes=60))

    bars = activity.per_minute(clock=FrozenClock(now))

    assert len(bars) == 60
    assert bars[-1].at == minute and bars[0].at == minute - timedelta(minutes=59)
    found = {(minute - bar.at) // timedelta(minutes=1): (bar.completed, bar.failed) for bar in bars}
    assert {back: n for back, n in found.items() if n != (0, 0)} == {
        0: (2, 1),
        3: (1, 0),
        59: (0, 2),
    }


def test_the_day_chart_reads_the_daily_counts_and_todays_not_rolled_up(now: datetime) -> None:
    today = now.date()
    TaskQuotaUsage.objects.create(
        task_id="test-noop", day=today - timedelta(days=20), completed=7, failed=1
    )
    TaskQuotaUsage.objects.create(task_id="test-fail", day=today - timedelta(days=20), failed=4)
    TaskQuotaUsage.objects.create(task_id="test-noop", day=today - timedelta(days=30), failed=9)
    # Today: the row the last rollup wrote and, newer, the counts still in Valkey (the larger
    # of the two counts, as the rollup will write it).
    TaskQuotaUsage.objects.create(task_id="test-noop", day=today, completed=3, failed=1)
    valkey.client().hset(
        keys.quota_counts("test-noop", today.isoformat()), mapping={"completed": 5, "failed": 1}
    )
    valkey.client().hset(keys.quota_counts("test-fail", today.isoformat()), "failed", 2)

    bars = activity.per_day(list(registry.get().values()), clock=FrozenClock(now))

    assert len(bars) == 30 and bars[-1].at.date() == today
    found = {b.at.date(): (b.completed, b.failed) for b in bars if b.completed + b.failed}
    assert found == {today - timedelta(days=20): (7, 5), today: (5, 3)}


def test_top_failing_tasks_are_the_last_days_most_failed(now: datetime) -> None:
    for _ in range(3):
        _ended("test-fail", RunState.FAILED, now - timedelta(hours=2))
    _ended("test-noop", RunState.FAILED, now - timedelta(hours=1))
    _ended("test-noop", RunState.COMPLETED, now - timedelta(hours=1))
    # Outside the day.
    for _ in range(5):
        _ended("test-circuit", RunState.FAILED, now - timedelta(days=2))

    failing = activity.top_failing(sorted(registry.get()), clock=FrozenClock(now))

    assert [(f.task_id, f.ended.failed, f.ended.completed) for f in failing] == [
        ("test-fail", 3, 0),
        ("test-noop", 1, 1),
    ]


def test_a_class_shows_its_depth_oldest_wait_and_the_hours_wait_p95(now: datetime) -> None:
    catalog.empty_queues()  # what earlier tests left in any class's queues: depths counted here
    # Runs of the class that started in the last hour, after 10, 20, ... 100 seconds.
    for n in range(1, 11):
        created = now - timedelta(minutes=30)
        started = created + timedelta(seconds=10 * n)
        _run(PARKED, RunState.COMPLETED, created=created, started=started, finished=started)
    # Waited from its not_before (a retry's backoff), not from its creation: 4 s.
    due = now - timedelta(minutes=20)
    _run(PARKED, RunState.ACTIVE, created=due - timedelta(hours=2), not_before=due,
         started=due + timedelta(seconds=4))  # fmt: skip
    # Started before the hour: not in it.
    old = now - timedelta(hours=2)
    _run(PARKED, RunState.COMPLETED, created=old, started=old + timedelta(seconds=900),
         finished=now - timedelta(minutes=1))  # fmt: skip
    # Two messages waiting; the older row has waited since its creation.
    for _ in range(2):
        start_run(PARKED, {}, trigger=TriggerKind.API)
    TaskHistory.objects.filter(task_id=PARKED, state=RunState.PENDING).update(
        created_at=datetime.now(UTC) - timedelta(seconds=300)
    )

    queues = {q.name: q for q in waiting.read(clock=FrozenClock(now)).queues}

    embedding = queues["embedding"]
    assert embedding.depth == 2
    assert embedding.cap > 0 and embedding.filled == pytest.approx(2 / embedding.cap)
    assert 300 <= embedding.oldest_s < 330
    waits = sorted([4.0, *(10.0 * n for n in range(1, 11))])
    assert embedding.started == 11
    assert embedding.p95_s == pytest.approx(_percentile(waits, 0.95))
    assert queues["io"].depth == 0 and queues["io"].p95_s is None


def _percentile(values: list[float], share: float) -> float:
    """Interpolated, as Postgres's percentile_cont."""
    at = share * (len(values) - 1)
    low = int(at)
    high = min(low + 1, len(values) - 1)
    return values[low] + (values[high] - values[low]) * (at - low)


def test_held_runs_and_pauses_in_force() -> None:
    for _ in range(2):
        start_run(PARKED, {}, trigger=TriggerKind.API)
    pauses.pause(PauseScope.TASK, PARKED, by="tests", reason="overview", refuse_starts=True)

    found = waiting.read()

    assert [(h.by, h.over, h.runs) for h in found.held] == [("pause", PARKED, 2)]
    assert found.pauses == [f"task {PARKED} (refusing starts)"]
    assert found.dead_letters == {"drain_poison": 0, "exhausted_run": 0, "webhook_delivery": 0}


def test_the_first_page_is_the_overview_with_every_panel(client: Client, now: datetime) -> None:
    _ended("test-noop", RunState.COMPLETED, now)
    node = roster.this_node("worker", ["task.t.test-noop"], pools=["io"])
    roster.announce(node)
    client.force_login(account("viewer", Access.VIEW))

    html = client.get("/admin/").content.decode()

    assert "<h1>Overview</h1>" in html
    for panel in ("minutes", "days", "waiting", "failing", "workers"):
        assert f'data-panel-url="/admin/overview/{panel}/"' in html
    # The chart's bars carry their numbers; the current minute holds the run.
    current = now.strftime("%Y-%m-%dT%H:%MZ")
    assert f'data-at="{current}" data-completed="1" data-failed="0"' in html
    # Its title for a pointer or a screen reader, and the numbers as a table.
    assert f"<title>{now:%H:%M}: 1 completed, 0 failed</title>" in html
    assert f"<td>{now:%Y-%m-%d %H:%M}</td><td>1</td><td>0</td>" in html
    assert html.count('<g class="bar"') == 60 + 30
    assert node.host in html.split('id="overview-workers"', 1)[1]
    # Django's index stays below: the apps and models.
    assert 'id="overview"' in html and "app-orchestrator" in html
    assert "<script>" not in html  # the CSP allows no inline script: console.js polls


def test_each_panel_is_served_alone_for_the_page_to_fetch(client: Client, now: datetime) -> None:
    _ended("test-fail", RunState.FAILED, now)
    client.force_login(account("viewer", Access.VIEW))

    minutes = client.get("/admin/overview/minutes/")
    failing = client.get("/admin/overview/failing/")

    assert minutes.status_code == 200
    body = minutes.content.decode()
    assert body.lstrip().startswith("<h2>") and "<html" not in body
    assert re.search(r'data-completed="0" data-failed="1"', body)
    assert 'id="failing-test-fail"' in failing.content.decode()
    assert client.get("/admin/overview/nothing/").status_code == 404


def test_staff_without_view_get_djangos_index_and_no_panel(client: Client) -> None:
    client.force_login(account("staff"))

    index = client.get("/admin/")

    assert index.status_code == 200
    assert 'id="overview"' not in index.content.decode()
    assert client.get("/admin/overview/minutes/").status_code == 403
    client.logout()
    assert client.get("/admin/overview/minutes/").status_code == 302  # to the login
