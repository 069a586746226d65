"""Schedules (issue 5): beat rows synced from definitions, bucket locks, boot catch-up, and the
dynamic scheduler tick — against real Postgres, Redis and, where said, real processes."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from celery import current_app
from django.core.management import CommandError, call_command
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext
from django_celery_beat.models import PeriodicTask

from coverage.models import EpgSource
from orchestrator.clock import FrozenClock
from orchestrator.models import SchedulerState, TaskHistory
from orchestrator.scheduler.catchup import catch_up
from orchestrator.scheduler.dispatch import fire_static
from orchestrator.scheduler.dynamic import Scheduler
from orchestrator.scheduler.fire import FireRequest, Outcome, fire
from orchestrator.scheduler.names import DISPATCH_TASK, SCHEDULER_QUEUE
from orchestrator.scheduler.sync import ScheduleConfigError, sync
from orchestrator.slots import IntervalSlots
from orchestrator.stores import counters, keys, valkey
from tasks import ScheduleRow, dynamic, every, registry
from tasks.definition import TaskDefinition
from tests.support.fixtures import ROOT, database_url, wait_for, worker_process
from tests.support.runs import clear_scheduler_locks

pytestmark = [pytest.mark.django_db(transaction=True)]

TASK = "test-noop"  # registered, takes no input, io class (a deep queue cap)


@pytest.fixture(autouse=True)
def _no_bucket_locks() -> None:
    clear_scheduler_locks()


def _with_schedule(schedule: Any, task_id: str = TASK) -> TaskDefinition:
    return dataclasses.replace(registry.get()[task_id], schedule=schedule)


def _static(task_id: str, schedule: Any) -> TaskDefinition:
    from tasks import define_task

    return define_task(
        id=task_id, resource_class="io", execute=lambda ctx, params: None, schedule=schedule
    )


def _runs(task_id: str = TASK) -> list[TaskHistory]:
    return list(TaskHistory.objects.filter(task_id=task_id, trigger__kind="schedule"))


# --- static schedules: the sync --------------------------------------------------------------


def test_sync_creates_one_dispatch_row_per_static_schedule_and_is_idempotent() -> None:
    defs = [_static("sched-a", "15m"), _static("sched-b", "0 3 * * *"), _static("sched-c", None)]

    first = sync(defs, environ={})
    second = sync(defs, environ={})

    assert sorted(first.created) == ["sched-a", "sched-b"]
    assert second.created == second.updated == second.disabled == []
    assert sorted(second.unchanged) == ["sched-a", "sched-b"]
    a = PeriodicTask.objects.get(name="sched-a")
    assert (a.task, json.loads(a.args), a.queue, a.enabled) == (
        DISPATCH_TASK,
        ["sched-a"],
        SCHEDULER_QUEUE,
        True,
    )
    assert (a.interval.every, a.interval.period, a.crontab) == (15, "minutes", None)
    b = PeriodicTask.objects.get(name="sched-b")
    assert b.interval is None
    assert (b.crontab.minute, b.crontab.hour, str(b.crontab.timezone)) == ("0", "3", "UTC")
    assert not PeriodicTask.objects.filter(name="sched-c").exists()


def test_sync_updates_a_changed_schedule_and_disables_a_removed_one() -> None:
    sync([_static("sched-a", "15m"), _static("sched-b", "1h")], environ={})

    report = sync([_static("sched-a", "*/5 * * * *")], environ={})

    assert report.updated == ["sched-a"] and report.disabled == ["sched-b"]
    a = PeriodicTask.objects.get(name="sched-a")
    assert a.interval is None and a.crontab.minute == "*/5"
    b = PeriodicTask.objects.get(name="sched-b")  # kept, not deleted
    assert not b.enabled
    assert SchedulerState.objects.get(key="sched-b").sync_disabled

    back = sync([_static("sched-a", "*/5 * * * *"), _static("sched-b", "1h")], environ={})

    assert back.enabled_again == ["sched-b"]
    assert PeriodicTask.objects.get(name="sched-b").enabled


def test_operator_edits_the_definition_owns_the_cadence_the_operator_owns_enabled() -> None:
    sync([_static("sched-a", "15m"), _static("sched-b", "1h")], environ={})
    from django_celery_beat.models import IntervalSchedule

    a = PeriodicTask.objects.get(name="sched-a")
    a.interval = IntervalSchedule.objects.create(every=2, period="hours")  # operator's edit
    a.save()
    b = PeriodicTask.objects.get(name="sched-b")
    b.enabled = False  # operator pauses it
    b.save()
    own = PeriodicTask.objects.create(
        name="operator-own", task="celery.backend_cleanup", interval=a.interval
    )

    report = sync([_static("sched-a", "15m"), _static("sched-b", "1h")], environ={})

    assert report.updated == ["sched-a"]
    a.refresh_from_db()
    assert (a.interval.every, a.interval.period) == (15, "minutes")  # the definition wins
    assert not PeriodicTask.objects.get(name="sched-b").enabled  # the operator's pause holds
    own.refresh_from_db()
    assert own.enabled  # not a synced row: untouched

    # Paused by the operator, then the definition goes and comes back: still paused.
    sync([_static("sched-a", "15m")], environ={})
    sync([_static("sched-a", "15m"), _static("sched-b", "1h")], environ={})
    assert not PeriodicTask.objects.get(name="sched-b").enabled


def test_an_env_override_replaces_the_declared_interval() -> None:
    definition = _static("sched-env", every("1h", env_override="SCHED_TEST_EVERY"))

    sync([definition], environ={"SCHED_TEST_EVERY": "90s"})
    row = PeriodicTask.objects.get(name="sched-env")
    assert (row.interval.every, row.interval.period) == (90, "seconds")

    sync([definition], environ={})
    row.refresh_from_db()
    assert (row.interval.every, row.interval.period) == (1, "hours")


def test_a_bad_env_override_is_rejected_naming_the_variable_and_writes_nothing() -> None:
    good = _static("sched-good", "15m")
    bad = _static("sched-env", every("1h", env_override="SCHED_TEST_EVERY"))

    with pytest.raises(ScheduleConfigError) as caught:
        sync([good, bad], environ={"SCHED_TEST_EVERY": "soon"})

    assert str(caught.value).startswith(
        "SCHED_TEST_EVERY='soon' (the schedule of task 'sched-env')"
    )
    assert not PeriodicTask.objects.exists()


def test_the_command_syncs_the_registry_and_leaves_dynamic_tasks_to_the_loop() -> None:
    call_command("sync_schedules")
    call_command("sync_schedules")

    rows = {row.name: row for row in PeriodicTask.objects.filter(task=DISPATCH_TASK)}
    assert set(rows) == {"history-retention"}  # epg-refresh is dynamic: no beat row
    assert (
        rows["history-retention"].interval.every,
        rows["history-retention"].interval.period,
    ) == (
        1,
        "days",
    )


def test_the_command_fails_clearly_on_a_bad_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LUMASTRA_HISTORY_RETENTION_EVERY", "daily")

    with pytest.raises(CommandError, match="LUMASTRA_HISTORY_RETENTION_EVERY='daily'"):
        call_command("sync_schedules")


# --- bucket locks -------------------------------------------------------------------------


def test_two_dispatchers_racing_over_200_buckets_never_double_fire() -> None:
    buckets = 200
    base = 1_700_000_000 - 1_700_000_000 % 60
    slots = [base + 60 * i for i in range(buckets)]
    barrier = threading.Barrier(2)
    outcomes: list[Counter[Outcome]] = [Counter(), Counter()]
    errors: list[BaseException] = []

    def dispatcher(index: int) -> None:
        try:
            for slot in slots:
                barrier.wait(timeout=30)  # both fire each bucket at the same moment
                now = datetime.fromtimestamp(slot, UTC)
                outcomes[index][fire(FireRequest(TASK, slot), now).outcome] += 1
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()
        finally:
            connections.close_all()

    threads = [threading.Thread(target=dispatcher, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)

    assert not errors, errors
    per_bucket = Counter(run.trigger["bucket"] for run in _runs())
    double_fires = sum(1 for count in per_bucket.values() if count > 1)
    print(f"double fires observed: {double_fires} over {buckets} buckets")
    assert double_fires == 0
    assert sorted(per_bucket) == sorted(str(s) for s in slots)  # and none skipped
    total = outcomes[0] + outcomes[1]
    assert total[Outcome.FIRED] == buckets
    assert total[Outcome.LOCKED] + total[Outcome.ALREADY] == buckets


def test_a_bucket_fired_once_stays_fired_after_its_lock_expired() -> None:
    slot = 1_700_003_600
    now = datetime.fromtimestamp(slot + 5, UTC)
    assert fire(FireRequest(TASK, slot), now).outcome is Outcome.FIRED
    valkey.client().delete(keys.scheduler_lock(TASK, str(slot)))  # as if 30 s passed

    late = fire(FireRequest(TASK, slot), now + timedelta(seconds=40))

    assert late.outcome is Outcome.ALREADY
    assert len(_runs()) == 1
    state = SchedulerState.objects.get(key=TASK)
    assert state.last_bucket == slot and state.last_run_id == _runs()[0].id


def test_a_slot_whose_previous_run_is_still_live_is_skipped() -> None:
    # test-sleepy keeps the default overlap ("skip"); no worker takes its runs here.
    task, key, row = "test-sleepy", "test-sleepy:r", "r"
    slot = 1_700_007_200

    def fired(at: int) -> Any:
        now = datetime.fromtimestamp(at + 1, UTC)
        return fire(FireRequest(task, at, row_key=row, input={"seconds": 1}), now)

    first = fired(slot)
    skips = counters.read_all((counters.SCHEDULE_SKIPS,))[counters.SCHEDULE_SKIPS]
    second = fired(slot + 60)
    third = fired(slot + 120)

    assert first.outcome is Outcome.FIRED
    assert (second.outcome, second.run_id) == (Outcome.SKIPPED, first.run_id)
    assert (third.outcome, third.run_id) == (Outcome.SKIPPED, first.run_id)
    state = SchedulerState.objects.get(key=key)
    assert state.last_bucket == slot + 120 and state.last_run_id == first.run_id
    assert f"run {first.run_id}" in state.last_error and "still pending" in state.last_error
    after = counters.read_all((counters.SCHEDULE_SKIPS,))[counters.SCHEDULE_SKIPS]
    assert after.get((task,), 0) - skips.get((task,), 0) == 2
    assert TaskHistory.objects.filter(task_id=task).count() == 1

    # Its run ended: the next slot starts one again.
    TaskHistory.objects.filter(id=first.run_id).update(state="completed")
    fourth = fired(slot + 180)
    assert fourth.outcome is Outcome.FIRED and fourth.run_id != first.run_id
    state.refresh_from_db()
    assert (state.last_run_id, state.last_error) == (fourth.run_id, "")


def test_a_task_that_allows_overlap_starts_every_slot() -> None:
    slot = 1_700_010_800
    runs = [
        fire(FireRequest(TASK, slot + 60 * i), datetime.fromtimestamp(slot + 60 * i, UTC))
        for i in range(3)
    ]

    assert [r.outcome for r in runs] == [Outcome.FIRED] * 3
    assert len({r.run_id for r in runs}) == 3


def test_beat_dispatch_through_a_real_worker_starts_a_scheduled_run() -> None:
    sync([_with_schedule(every("1h"))], environ={})

    with worker_process([SCHEDULER_QUEUE], concurrency=1, name="scheduler"):
        current_app.send_task(DISPATCH_TASK, args=[TASK], queue=SCHEDULER_QUEUE)
        runs = wait_for(_runs, timeout=30)

    assert len(runs) == 1
    slot = IntervalSlots(timedelta(hours=1)).slot(runs[0].created_at)
    assert runs[0].trigger == {
        "kind": "schedule",
        "bucket": str(slot),
        "slot": datetime.fromtimestamp(slot, UTC).isoformat(),
    }
    assert runs[0].priority == 5  # the schedule trigger's priority
    assert SchedulerState.objects.get(key=TASK).last_run_id == runs[0].id


# --- boot catch-up ------------------------------------------------------------------------


def _missed_an_interval(interval: timedelta) -> None:
    sync([_with_schedule(every(f"{int(interval.total_seconds())}s"))], environ={})
    long_ago = datetime.now(UTC) - 3 * interval
    SchedulerState.objects.create(
        key=TASK,
        task_id=TASK,
        last_fired_at=long_ago,
        last_bucket=IntervalSlots(interval).slot(long_ago),
    )


def test_catch_up_fires_exactly_once_with_three_replicas_booting_together(tmp_path: Path) -> None:
    _missed_an_interval(timedelta(hours=1))
    # A barrier, not a wall-clock start: with the fault battery beside the suite, booting
    # Django once took a replica past a start 20 s ahead.
    env = {**os.environ, "DATABASE_URL": database_url()}
    replicas = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.support.catch_up_once", str(tmp_path), "3"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    reports = []
    for replica in replicas:
        out, err = replica.communicate(timeout=180)
        assert replica.returncode == 0, err
        reports.append(json.loads(out.strip().splitlines()[-1]))

    assert sorted(len(r["fired"]) for r in reports) == [0, 0, 1]
    # A loser found the slot locked or claimed ("elsewhere"), or, scheduled after the winner
    # had committed, found nothing due: which one is up to the machine's scheduler.
    assert all(r["elsewhere"] in ([], [TASK]) for r in reports if not r["fired"])
    runs = _runs()
    assert len(runs) == 1 and runs[0].trigger["catchUp"] is True
    # Beat's own overdue fire at boot lands in the same slot and starts nothing.
    assert fire_static(TASK).outcome in (Outcome.ALREADY, Outcome.LOCKED)
    assert catch_up().fired == []  # nothing missed any more
    assert len(_runs()) == 1


def test_no_catch_up_within_one_interval_or_for_a_paused_schedule() -> None:
    sync([_with_schedule(every("1h"))], environ={})
    recent = datetime.now(UTC) - timedelta(minutes=50)
    SchedulerState.objects.create(key=TASK, task_id=TASK, last_fired_at=recent, last_bucket=1)

    assert catch_up().fired == []

    SchedulerState.objects.filter(key=TASK).update(last_fired_at=recent - timedelta(hours=2))
    PeriodicTask.objects.filter(name=TASK).update(enabled=False)
    assert catch_up().fired == []
    assert _runs() == []


# --- dynamic schedules --------------------------------------------------------------------


def _dynamic(rows: list[Any], task_id: str = TASK) -> TaskDefinition:
    return _with_schedule(dynamic(lambda: list(rows)), task_id)


def test_dynamic_rows_fire_on_their_own_cadence_with_a_test_clock() -> None:
    t0 = datetime(2031, 1, 1, tzinfo=UTC)  # a five-minute boundary
    clock = FrozenClock(t0)
    definition = _dynamic([("fast", {}, "1m"), ScheduleRow("slow", {}, timedelta(minutes=5))])
    scheduler = Scheduler(definitions=[definition], clock=clock)

    idle_queries = []
    for _ in range(60):  # ten minutes of 10 s ticks
        before = len(_runs())
        with CaptureQueriesContext(connection) as queries:
            report = scheduler.tick()
        if len(_runs()) == before:
            idle_queries.append(len(queries.captured_queries))
        assert report.errors == 0
        clock.advance(timedelta(seconds=10))

    per_row = Counter(run.trigger["row"] for run in _runs())
    assert per_row == {"fast": 10, "slow": 2}
    # Once a tick (`scheduler.dynamic`): the static schedules' rows and the operators' cadences
    # of dynamic rows; the test loader makes none; the dynamic rows' state is not re-read.
    assert set(idle_queries) == {2}
    assert SchedulerState.objects.get(key=f"{TASK}:fast").last_bucket == int(
        (t0 + timedelta(minutes=9)).timestamp()
    )


def test_a_row_fired_by_another_replica_is_not_fired_again() -> None:
    clock = FrozenClock(datetime(2031, 2, 1, tzinfo=UTC))
    definition = _dynamic([("only", {}, "1m")])
    one = Scheduler(definitions=[definition], clock=clock)
    two = Scheduler(definitions=[definition], clock=clock)

    assert one.tick().fired == [f"{TASK}:only"]
    valkey.client().delete(*valkey.client().keys(keys.scheduler_lock(TASK, "*")))
    assert two.tick().fired == []
    assert len(_runs()) == 1


def test_a_poisoned_row_does_not_stop_the_others(caplog: pytest.LogCaptureFixture) -> None:
    clock = FrozenClock(datetime(2031, 3, 1, tzinfo=UTC))

    def broken_loader() -> list[Any]:
        raise RuntimeError("catalog unavailable")

    definitions = [
        _with_schedule(dynamic(broken_loader), "test-fail"),
        _dynamic(
            [
                ("good-1", {}, "1m"),
                ("bad-input", {"unexpected": 1}, "1m"),  # the task takes no input
                ("bad-interval", {}, "soon"),
                "not-a-row",
                ("good-2", {}, "2m"),
            ]
        ),
    ]

    report = Scheduler(definitions=definitions, clock=clock).tick()

    assert sorted(report.fired) == [f"{TASK}:good-1", f"{TASK}:good-2"]
    assert report.refused == [f"{TASK}:bad-input"]
    assert report.errors == 3  # the loader, the bad interval, the non-row
    assert "input invalid" in SchedulerState.objects.get(key=f"{TASK}:bad-input").last_error
    assert "bad-interval" in caplog.text and "test-fail" in caplog.text
    assert sorted(r.trigger["row"] for r in _runs()) == ["good-1", "good-2"]


def test_an_overlapping_tick_is_skipped() -> None:
    entered, release = threading.Event(), threading.Event()

    def slow_loader() -> list[Any]:
        entered.set()
        release.wait(10)
        return []

    scheduler = Scheduler(definitions=[_with_schedule(dynamic(slow_loader))])
    first = threading.Thread(target=scheduler.tick)
    first.start()
    assert entered.wait(10)

    overlapping = scheduler.tick()

    release.set()
    first.join(10)
    assert overlapping.skipped
    assert not scheduler.tick().skipped  # the next one runs


def test_a_scheduler_state_row_deleted_between_ticks_is_not_an_error() -> None:
    clock = FrozenClock(datetime(2031, 4, 1, tzinfo=UTC))
    scheduler = Scheduler(definitions=[_dynamic([("row", {}, "1m")])], clock=clock)
    assert scheduler.tick().fired
    SchedulerState.objects.all().delete()

    clock.advance(timedelta(minutes=1))
    report = scheduler.tick()

    assert report.errors == 0 and report.fired == [f"{TASK}:row"]


def test_the_demo_refreshes_each_enabled_epg_source() -> None:
    for slug, interval, enabled, url in [
        ("bbc", 30, True, "https://epg.example/bbc.xml"),
        ("arte", 120, True, "https://epg.example/arte.xml"),
        ("off", 30, False, "https://epg.example/off.xml"),
        ("broken", 30, True, "ftp://epg.example/broken.xml"),  # the input model refuses it
    ]:
        EpgSource.objects.create(
            slug=slug, name=slug, url=url, interval_minutes=interval, enabled=enabled
        )

    report = Scheduler(clock=FrozenClock(datetime(2031, 5, 1, tzinfo=UTC))).tick()

    assert sorted(report.fired) == ["epg-refresh:arte", "epg-refresh:bbc"]
    assert report.refused == ["epg-refresh:broken"]
    runs = _runs("epg-refresh")
    assert sorted(r.input["source"] for r in runs) == ["arte", "bbc"]


# --- a tick that outlasts its interval, on a real worker (issue 23) ----------------------------


def _fire_every_2s_for(task_id: str, seconds: float) -> list[Outcome]:
    """Fire the task's static 2 s schedule at each of its slots for `seconds`, as beat would."""
    sync([_with_schedule(every("2s"), task_id)], environ={})
    outcomes = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        outcomes.append(fire_static(task_id).outcome)
        time.sleep(2)
    return outcomes


def _overlapping(runs: list[TaskHistory]) -> list[tuple[str, str]]:
    """Pairs of runs that executed at the same time, from their recorded start and end."""
    executed = sorted((r for r in runs if r.started_at), key=lambda r: r.started_at)
    return [
        (a.id, b.id)
        for a, b in itertools.pairwise(executed)
        if a.finished_at is None or b.started_at < a.finished_at
    ]


def test_a_tick_longer_than_its_interval_never_stacks() -> None:
    task = "test-slow-tick"  # 7 s of work every 2 s, the default overlap ("skip")
    skips = counters.read_all((counters.SCHEDULE_SKIPS,))[counters.SCHEDULE_SKIPS].get((task,), 0)

    with worker_process([f"task.t.{task}"], concurrency=2, name="slow-tick"):
        outcomes = _fire_every_2s_for(task, 16)
        wait_for(lambda: not TaskHistory.objects.filter(task_id=task).exclude(
            state="completed").exists(), timeout=30)  # fmt: skip

    runs = _runs(task)
    assert Counter(outcomes)[Outcome.SKIPPED] >= 4 and 2 <= len(runs) <= 3, outcomes
    assert _overlapping(runs) == []
    after = counters.read_all((counters.SCHEDULE_SKIPS,))[counters.SCHEDULE_SKIPS]
    assert after[(task,)] - skips == Counter(outcomes)[Outcome.SKIPPED]
    # The slot's record says why it started nothing, naming the live run.
    last_error = SchedulerState.objects.get(key=task).last_error
    assert last_error.startswith("skipped: run ") is (outcomes[-1] is Outcome.SKIPPED)


def test_a_tick_that_queues_starts_every_slot_and_runs_one_at_a_time() -> None:
    task = "test-slow-tick-queued"  # overlap="queue", at most one running

    with worker_process([f"task.t.{task}"], concurrency=2, name="slow-tick-queued"):
        outcomes = _fire_every_2s_for(task, 8)
        wait_for(lambda: TaskHistory.objects.filter(task_id=task, state="active").exists(), 10)
        runs = _runs(task)

        assert outcomes == [Outcome.FIRED] * len(outcomes) and len(runs) == len(outcomes) >= 4
        # One executes; the rest wait their turn, started and queued, not lost or skipped.
        assert TaskHistory.objects.filter(task_id=task, state="active").count() == 1
        assert TaskHistory.objects.filter(task_id=task, state="pending").count() >= 2

    assert _overlapping(_runs(task)) == []
