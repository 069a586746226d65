"""The coverage loops the worker role runs beside the engine's (`orchestrator.loops` imports
this module by the path in settings.LUMASTRA_LOOP_FACTORIES): the stage-sweep and the outbox
dispatcher, both on the cluster leader's seat.

At start each covered stage's eligibility condition is planned by Postgres
(`stages.check_eligibility`): one that does not parse stops the loops process (exit 2) with
the task and stage named. Each tick first confirms the seat (`Leadership.check`): a process
that lost it starts no tick; a tick already under way finishes (at most one tick's writes).
"""

from __future__ import annotations

from collections.abc import Callable

from coverage.dispatcher import Dispatcher
from coverage.stages import check_eligibility, covered
from coverage.sweep import Sweep
from orchestrator.cluster.leaders import CLUSTER, Leadership
from orchestrator.loops import Loop


def loops(seat: Leadership) -> list[Loop]:
    from django.conf import settings

    check_eligibility(covered())
    config = settings.CONFIG
    sweep = Sweep()
    dispatcher = Dispatcher()
    return [
        Loop(
            "stage-sweep",
            config.coverage_sweep_interval_s,
            _fenced(seat, sweep.tick),
            first=_fenced(seat, lambda: sweep.tick(boot=True)),
            leader=CLUSTER,
        ),
        Loop(
            "outbox-dispatcher",
            config.coverage_dispatch_interval_s,
            _fenced(seat, dispatcher.tick),
            leader=CLUSTER,
        ),
    ]


def _fenced(seat: Leadership, body: Callable[[], object]) -> Callable[[], object]:
    def tick() -> object:
        seat.check()
        return body()

    return tick
