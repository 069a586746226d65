"""Hash repair: brings a live hash back in line with a run Postgres has already ended.

The terminal write is Postgres first, then Valkey, then the `finished` hooks. A writer that
dies (or loses Valkey) between the first two leaves the hash saying `active` until its TTL,
and the hooks never run: the identity stays claimed, the concurrency slot held until its
lease ends, the circuit and quota uncounted. Each reconciler tick this step looks at the runs
that ended since the last tick (minus GRACE, so a writer still settling is not overtaken),
finds those whose live hash is still live and settles them (`runs.terminal.settle`: one Lua
transition moves the hash to the Postgres state, so only one repairer wins, and the winner runs the
hooks).

Not guaranteed: a writer whose Valkey write failed after retries but whose hooks ran anyway (Valkey
unreachable for seconds) gets its hooks run a second time here; hooks are idempotent except
the daily quota's completed/failed counters, which can count that run twice. A process
starts looking LUMASTRA_RUN_ACTIVE_TTL_S back, the longest a left-behind hash can live.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.utils import timezone

from orchestrator.cluster.locks import Fence
from orchestrator.models import TaskHistory
from orchestrator.runs.terminal import settle
from orchestrator.states import LIVE_RUN_STATES, TERMINAL_RUN_STATES, RunState
from orchestrator.stores import keys, valkey
from tasks import registry
from tasks.errors import ErrorKind

log = logging.getLogger(__name__)

# A writer is normally between its Postgres and Valkey writes for milliseconds; its settle
# retries for about three seconds.
GRACE = timedelta(seconds=10)
BATCH = 2_000
LIVE_STATES = frozenset(s.value for s in LIVE_RUN_STATES)


@dataclass
class RepairHashes:
    name: str = "repair"
    _since: datetime | None = field(default=None, repr=False)

    def __call__(self, fence: Fence) -> int:
        now = timezone.now()
        since = self._since or now - timedelta(seconds=settings.CONFIG.run_active_ttl_s)
        until = now - GRACE
        ended = list(
            TaskHistory.objects.filter(
                state__in=[s.value for s in TERMINAL_RUN_STATES],
                finished_at__gt=since,
                finished_at__lte=until,
            )
            .order_by("finished_at")
            .values_list("id", "task_id", "state", "owner_instance_id", "error", "finished_at")[
                :BATCH
            ]
        )
        # A full batch resumes after its last row; otherwise everything up to `until` is seen.
        self._since = ended[-1][5] if len(ended) == BATCH else until
        if not ended:
            return 0
        pipe = valkey.client().pipeline(transaction=False)
        for run_id, *_ in ended:
            pipe.hget(keys.run_active(run_id), "state")
        states = valkey.execute(pipe)
        repaired = 0
        for (run_id, task_id, state, owner, error, _), live_state in zip(
            ended, states, strict=True
        ):
            if live_state not in LIVE_STATES or task_id not in registry.get():
                continue
            fence.check()
            if self._repair(run_id, task_id, RunState(state), owner, error):
                repaired += 1
        return repaired

    @staticmethod
    def _repair(
        run_id: str, task_id: str, state: RunState, owner: str, error: dict[str, str] | None
    ) -> bool:
        kind = ErrorKind(error["kind"]) if error else None
        # Only the process whose transition moves the hash runs the hooks: one repairer wins.
        repaired = settle(
            run_id, task_id, state, owner=owner, fenced=False, error_kind=kind, only_if_moved=True
        )
        if repaired:
            log.warning("run %s: live hash was left behind its %s end; repaired", run_id, state)
        return repaired
