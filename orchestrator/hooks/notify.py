"""Tells whoever waits for a run that it ended: `PUBLISH <ns>:task:ended:<runId> <state>`, one more
command in the end-of-run pipeline (no round trip of its own).

`orchestrator.runs.wait` subscribes before it reads the run, so an end published between the
two is seen either way. Not guaranteed: a waiter that is not subscribed when the message goes
out (pub/sub keeps nothing) finds the end at its next read of the run instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from orchestrator.hooks.base import Outcome, Part, RunHook, checked
from orchestrator.states import TERMINAL_RUN_STATES
from orchestrator.stores import keys


@dataclass
class EndNotice(RunHook):
    name: str = field(default="notify")

    def plan_finished(self, outcome: Outcome) -> Part | None:
        if outcome.state not in TERMINAL_RUN_STATES:
            return None
        channel = keys.run_ended(outcome.run_id)
        return Part(checked, lambda pipe: pipe.publish(channel, outcome.state.value))
