"""Dead letters and Schedules in a real browser: requeue a run that exhausted its retries and
see its row say so; switch a static schedule off and on again."""

from __future__ import annotations

import pytest
from django.contrib.admin.models import LogEntry
from django_celery_beat.models import PeriodicTask

from orchestrator.scheduler.sync import sync
from tests.browser.seed import exhausted_run, retry_of
from tests.support.browser import Console

pytestmark = pytest.mark.django_db(transaction=True)

EXHAUSTED = "exhausted-runs"  # the Dead letters section of runs out of retries
STATIC = "history-retention"  # a static schedule synced from tasks/definitions/maintenance.py


@pytest.mark.usefixtures("private_worker")
def test_requeueing_a_dead_letter_starts_a_new_run_and_the_row_says_so(console: Console) -> None:
    dead = exhausted_run()
    page = console.dead_letters()
    assert "flaky" in page.row(EXHAUSTED, dead).inner_text()

    page.act(EXHAUSTED, dead, "Requeue as new run")

    requeued = retry_of(dead)
    assert console.said(f"{dead}: requeued as {requeued}")
    assert f"requeued as {requeued}" in page.row(EXHAUSTED, dead).inner_text()
    assert LogEntry.objects.filter(
        change_message=f"requeued dead letter {dead} as run {requeued}"
    ).exists()
    console.shoot("dead-letters")


def test_switching_a_static_schedule_off_and_on_again(console: Console) -> None:
    sync()  # beat's rows from the definitions, as `manage.py sync_schedules` writes them
    page = console.schedules()
    assert page.enabled(STATIC) == "on"

    page.switch(STATIC)

    assert console.said(f"the static schedule {STATIC} is off")
    assert page.enabled(STATIC) == "off"
    assert not PeriodicTask.objects.get(name=STATIC).enabled

    page.switch(STATIC)

    assert console.said(f"the static schedule {STATIC} is on")
    assert page.enabled(STATIC) == "on"
    assert PeriodicTask.objects.get(name=STATIC).enabled
    console.shoot("schedules")
