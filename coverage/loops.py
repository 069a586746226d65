"""The coverage loops the worker role runs beside the engine's (`orchestrator.loops` imports
this module by the path in settings.LUMASTRA_LOOP_FACTORIES): the stage-sweep and the outbox
dispatcher, both on the cluster leader's seat.

At start each covered stage's eligibility condition is planned by Postgres
(`stages.check_eligibility`): one that does not parse stops the loops process (exit 2) with
the task and stage named. While Postgres cannot be reached the check is tried again, every
CHECK_RETRY_CAP at most, rather than taken for a bad condition (the fault battery's
Postgres outage started a loops process mid-cut, which then stopped). Each tick first
confirms the seat (`Leadership.check`): a process that lost it starts no tick; a tick already
under way finishes (at most one tick's writes).
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable
from datetime import timedelta

from django.db import InterfaceError, OperationalError, connection

from coverage.dispatcher import Dispatcher
from coverage.stages import check_eligibility, covered
from coverage.sweep import Sweep
from orchestrator.backoff import exponential
from orchestrator.cluster.leaders import Leadership
from orchestrator.loops import Loop

log = logging.getLogger(__name__)


# The pause between checks while Postgres is unreachable: doubling from the first, at most this.
CHECK_RETRY_FIRST = timedelta(seconds=0.5)
CHECK_RETRY_CAP = timedelta(seconds=10)


def loops(seat: Leadership) -> list[Loop]:
    from django.conf import settings

    _check_when_postgres_answers()
    config = settings.COVERAGE
    sweep = Sweep()
    dispatcher = Dispatcher()
    return [
        Loop(
            "stage-sweep",
            config.sweep_interval_s,
            _fenced(seat, sweep.tick),
            first=_fenced(seat, lambda: sweep.tick(boot=True)),
            leader=True,
        ),
        Loop(
            "outbox-dispatcher",
            config.dispatch_interval_s,
            _fenced(seat, dispatcher.tick),
            leader=True,
        ),
    ]


def _check_when_postgres_answers() -> None:
    for attempt in itertools.count():
        try:
            check_eligibility(covered())
            return
        except (OperationalError, InterfaceError) as exc:
            pause = exponential(CHECK_RETRY_FIRST, 2, attempt, CHECK_RETRY_CAP)
            log.warning(
                "loops: Postgres unreachable (%s); coverage conditions checked again in %.1fs",
                str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc),
                pause.total_seconds(),
            )
            connection.close()
            time.sleep(pause.total_seconds())


def _fenced(seat: Leadership, body: Callable[[], object]) -> Callable[[], object]:
    def tick() -> object:
        seat.check()
        return body()

    return tick
