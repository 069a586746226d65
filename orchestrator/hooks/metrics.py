"""Counts every run's end for /metrics: runs by task and state, and the run's duration in its
task's histogram (`metrics_end.lua`, one more command in the end-of-run pipeline, after the
move that left `started_at` and `finished_at` on the terminal hash).

Not guaranteed: an end settled twice (see `runs.settle`) is counted twice; a run whose hash
was lost before its end counts without a duration.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from redis.client import Pipeline

from orchestrator.hooks.base import Outcome, Part, RunHook
from orchestrator.states import TERMINAL_RUN_STATES
from orchestrator.stores import counters, keys, scripts


@dataclass
class RunMetrics(RunHook):
    name: str = field(default="metrics")

    def plan_finished(self, outcome: Outcome) -> Part | None:
        if outcome.state not in TERMINAL_RUN_STATES:
            return None
        script_keys = [
            keys.run_terminal(outcome.run_id),
            keys.metrics(counters.RUNS),
            keys.metrics(counters.DURATION),
        ]
        args = [outcome.definition.id, outcome.state.value, *counters.DURATION_BUCKETS]

        def send(pipe: Pipeline) -> None:
            scripts.queue(pipe, "metrics_end", script_keys, args)

        def receive(replies: list[Any]) -> None:
            (reply,) = replies
            scripts.replied("metrics_end", script_keys, args, reply)

        return Part(receive, send)
