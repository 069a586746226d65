"""The Schedules page: beat's rows (synced from the definitions, or an operator's own) and the
rows of each dynamic schedule, with last fire, next fire and a switch that goes through
`orchestrator.scheduler.switch` and the admin log. View-only users see no switch and are
refused a forged POST."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import User
from django.contrib.contenttypes.models import ContentType
from django.test import Client
from django.utils import timezone
from django_celery_beat.models import CrontabSchedule, PeriodicTask

from coverage.models import EpgSource
from orchestrator.api.access import Access
from orchestrator.clock import FrozenClock
from orchestrator.models import SchedulerState, TaskHistory
from orchestrator.scheduler import overview
from orchestrator.scheduler.dynamic import Scheduler
from orchestrator.scheduler.names import DISPATCH_TASK, SCHEDULER_QUEUE
from orchestrator.scheduler.sync import sync
from tests.support.runs import clear_scheduler_locks
from tests.support.users import PASSWORD, account, operator

pytestmark = pytest.mark.django_db(transaction=True)

PAGE = "/admin/orchestrator/taskhistory/schedules/"
STATIC = "history-retention"  # every 1d, synced from tasks/definitions/maintenance.py
DYNAMIC = "epg-refresh"  # one row per enabled EPG source


@pytest.fixture(autouse=True)
def _schedules() -> None:
    clear_scheduler_locks()
    sync()
    for slug, minutes in (("tv1", 30), ("tv2", 60)):
        EpgSource.objects.create(
            slug=slug, name=slug, url=f"https://{slug}.invalid/feed", interval_minutes=minutes
        )


def _client(user: User) -> Client:
    client = Client()
    assert client.login(username=user.username, password=PASSWORD)
    return client


def _logged(user: User) -> list[tuple[str, str | None]]:
    return [
        (entry.change_message, entry.content_type.model if entry.content_type else None)
        for entry in LogEntry.objects.filter(user_id=user.pk).order_by("id")
    ]


def _dynamic_rows(clock: FrozenClock) -> dict[str, overview.DynamicRow]:
    (epg,) = [d for d in overview.dynamic_schedules(clock) if d.task_id == DYNAMIC]
    return {row.row_key: row for row in epg.rows}


def test_the_page_lists_both_kinds_with_their_last_fire_and_no_switch_for_viewers() -> None:
    report = Scheduler(clock=FrozenClock(timezone.now())).tick()
    assert sorted(report.fired) == [f"{DYNAMIC}:tv1", f"{DYNAMIC}:tv2"]
    fired = SchedulerState.objects.get(key=f"{DYNAMIC}:tv1").last_run_id
    viewer = account("viewer", Access.VIEW)
    client = _client(viewer)

    response = client.get(PAGE)

    assert response.status_code == 200
    page = response.content.decode()
    assert f'id="static-{STATIC}"' in page
    assert "definition: cadence, task, args, queue; operator: enabled" in page
    assert f'id="dynamic-{DYNAMIC}-tv1"' in page and f'id="dynamic-{DYNAMIC}-tv2"' in page
    assert fired in page
    assert 'name="enabled"' not in page
    refused = client.post(PAGE, {"kind": "static", "name": STATIC, "enabled": "0"})
    assert refused.status_code == 403
    assert PeriodicTask.objects.get(name=STATIC).enabled
    assert _logged(viewer) == []


def test_next_fire_is_the_scheduler_s_for_static_rows_and_the_next_slot_for_dynamic_ones() -> None:
    t0 = datetime(2031, 5, 1, 3, 0, tzinfo=UTC)
    PeriodicTask.objects.filter(name=STATIC).update(last_run_at=t0)
    nightly = CrontabSchedule.objects.create(minute="0", hour="3", timezone="UTC")
    PeriodicTask.objects.create(
        name="nightly-cleanup", task="celery.backend_cleanup", crontab=nightly, last_run_at=t0
    )
    clock = FrozenClock(t0 + timedelta(hours=7))

    static = {s.name: s for s in overview.static_schedules(clock)}

    # Daily slots start at midnight UTC (an interval is aligned to the epoch), whenever beat
    # last sent the row: the tick fires the slot when it begins.
    assert static[STATIC].managed
    assert static[STATIC].next_fire_at == datetime(2031, 5, 2, tzinfo=UTC)
    assert len(static[STATIC].next_fires) == overview.NEXT_FIRES
    own = static["nightly-cleanup"]
    assert not own.managed and own.owners == "operator: every field (not synced)"
    assert own.next_fire_at == datetime(2031, 5, 2, 3, 0, tzinfo=UTC)

    slot = datetime(2031, 5, 1, 10, 0, tzinfo=UTC)
    clock = FrozenClock(slot + timedelta(minutes=5))
    assert _dynamic_rows(clock)["tv1"].next_fire_at == clock.now()  # not fired this slot: due
    Scheduler(clock=clock).tick()
    EpgSource.objects.filter(slug="tv2").update(enabled=False)  # the loader stops listing it

    rows = _dynamic_rows(clock)

    assert rows["tv1"].next_fire_at == slot + timedelta(minutes=30)
    assert rows["tv1"].last.at == clock.now() and rows["tv1"].last.run_id
    assert not rows["tv2"].listed and rows["tv2"].next_fire_at is None
    assert rows["tv2"].last.run_id  # its history is kept


def test_an_operator_switches_a_static_schedule_off_and_the_sync_keeps_it_off() -> None:
    user = operator("scheduler-op")
    client = _client(user)

    client.post(PAGE, {"kind": "static", "name": STATIC, "enabled": "0"})

    row = PeriodicTask.objects.get(name=STATIC)
    assert not row.enabled
    sync()
    assert not PeriodicTask.objects.get(name=STATIC).enabled
    page = client.get(PAGE).content.decode()
    assert f'name="name" value="{STATIC}"' in page and 'value="Enable"' in page
    (listed,) = [s for s in overview.static_schedules() if s.name == STATIC]
    assert listed.next_fire_at is None

    client.post(PAGE, {"kind": "static", "name": STATIC, "enabled": "1"})
    client.post(PAGE, {"kind": "static", "name": STATIC, "enabled": "1"})  # already on

    assert PeriodicTask.objects.get(name=STATIC).enabled
    assert _logged(user) == [
        (f"switched static schedule {STATIC} off", "periodictask"),
        (f"switched static schedule {STATIC} on", "periodictask"),
    ]
    entry = LogEntry.objects.filter(user_id=user.pk).first()
    assert entry is not None and entry.object_id == str(row.pk)
    assert entry.content_type == ContentType.objects.get_for_model(PeriodicTask)


def test_an_operator_switches_a_dynamic_row_off_the_tick_skips_it_until_switched_on() -> None:
    user = operator("scheduler-op")
    client = _client(user)
    clock = FrozenClock(timezone.now())

    client.post(PAGE, {"kind": "dynamic", "task": DYNAMIC, "row": "tv1", "enabled": "0"})
    skipped = Scheduler(clock=clock).tick()

    assert SchedulerState.objects.get(key=f"{DYNAMIC}:tv1").disabled
    assert skipped.fired == [f"{DYNAMIC}:tv2"] and skipped.switched_off == [f"{DYNAMIC}:tv1"]
    assert not TaskHistory.objects.filter(task_id=DYNAMIC, input__source="tv1").exists()
    assert not _dynamic_rows(clock)["tv1"].enabled

    client.post(PAGE, {"kind": "dynamic", "task": DYNAMIC, "row": "tv1", "enabled": "1"})
    fired = Scheduler(clock=clock).tick()

    assert fired.fired == [f"{DYNAMIC}:tv1"]
    assert TaskHistory.objects.filter(task_id=DYNAMIC, input__source="tv1").count() == 1
    assert _logged(user) == [
        (f"switched dynamic schedule {DYNAMIC} row tv1 off", "schedulerstate"),
        (f"switched dynamic schedule {DYNAMIC} row tv1 on", "schedulerstate"),
    ]


def test_a_synced_row_whose_task_is_gone_is_not_switched_on() -> None:
    PeriodicTask.objects.create(
        name="gone-task",
        task=DISPATCH_TASK,
        args=json.dumps(["gone-task"]),
        queue=SCHEDULER_QUEUE,
        crontab=CrontabSchedule.objects.create(minute="0", hour="4", timezone="UTC"),
        enabled=False,
    )
    user = operator("scheduler-op")
    client = _client(user)

    response = client.post(
        PAGE, {"kind": "static", "name": "gone-task", "enabled": "1"}, follow=True
    )

    assert "no longer declares a static schedule" in response.content.decode()
    assert not PeriodicTask.objects.get(name="gone-task").enabled
    assert _logged(user) == []


def test_a_forged_post_without_csrf_is_refused() -> None:
    client = Client(enforce_csrf_checks=True)
    assert client.login(username=operator("forger").username, password=PASSWORD)

    response = client.post(PAGE, {"kind": "static", "name": STATIC, "enabled": "0"})

    assert response.status_code == 403
    assert PeriodicTask.objects.get(name=STATIC).enabled


def test_an_operator_gives_a_schedule_a_cadence_on_the_page_and_resets_it() -> None:
    user = operator("cadence-op")
    client = _client(user)
    override = {"action": "override", "kind": "static", "name": STATIC}

    bad = client.post(PAGE, {**override, "cron": "30 2 * * * *"}, follow=True)
    assert "keeps its cadence: cron: bad cron" in bad.content.decode()
    client.post(PAGE, {**override, "cron": "30 2 * * *", "tz": "Europe/Berlin"})
    client.post(
        PAGE,
        {"action": "override", "kind": "dynamic", "task": DYNAMIC, "row": "tv1", "every_s": "900"},
    )

    page = client.get(PAGE).content.decode()
    static_row = page[page.index(f'id="static-{STATIC}"') :]
    static_row = static_row[: static_row.index("</tr>")]
    assert "cron &#x27;30 2 * * *&#x27; (Europe/Berlin)" in static_row
    assert "operator's cadence</strong>, set by cadence-op" in static_row
    assert 'value="Reset to the definition"' in static_row
    dynamic_row = page[page.index(f'id="dynamic-{DYNAMIC}-tv1"') :]
    assert "operator's cadence: every 0:15:00</strong>" in dynamic_row[: dynamic_row.index("</tr>")]

    client.post(PAGE, {"action": "reset", "kind": "static", "name": STATIC})

    assert PeriodicTask.objects.get(name=STATIC).crontab is None
    assert _logged(user) == [
        (f"static schedule {STATIC} given the operator's cadence", "periodictask"),
        (f"{DYNAMIC} row tv1 given the operator's cadence", None),
        (f"static schedule {STATIC} reset to its definition", "periodictask"),
    ]
