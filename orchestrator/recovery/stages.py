"""Pipeline recovery: a pipeline run between stages that nobody moves any more is moved on.

A pipeline run is `active` for its whole life, but between two stages nothing runs for it and
nothing heartbeats: its last stage ended (or was claimed) and the next stage's message waits
in a queue. The orphan path leaves such runs alone (`recovery.orphans`: an active run with
stages and none of them running is not an orphan). This reconciler step looks at them once
their last stage move is older than LUMASTRA_PIPELINE_RECOVER_AFTER_S:

- every stage ended (a crash between the last stage's end and the run's end): the run ends
  `completed` with the stages' results;
- a child spawned with `on_failure="fail_parent"` did not complete and the release that fails
  the parent was lost (`runs.children`): it fails now;
- a stage that is due (all its dependencies completed or skipped, and, when it awaits
  children, every child of theirs ended) and still waiting, whose
  message is neither in its queue nor held by a worker (a crash between a stage's end and
  the dispatch of the next, a message the broker lost): published again, its `when` asked
  again first, unless a pause holds it (`recovery.pauses`: its resume publishes it).

A parent whose children are still running waits on purpose and is not looked at (its batch
is open). A second message of a stage does no harm: its claim is one guarded UPDATE, and the later
delivery finds the stage no longer waiting and is dropped. Options: the threshold above and
the batch (`BATCH` runs per tick, the longest-stalled first).

Not guaranteed: a due stage whose message a worker holds longer than the pending check's
"stranded" bound is published again (its retry then comes early); a stage that is running
when its worker dies is the orphan path's (its heartbeat stops) or, when its message comes
back, the stage runner's (`runs.pipeline`).
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.db import connection

from orchestrator.cluster.locks import Fence
from orchestrator.recovery.pauses import Holds
from orchestrator.recovery.pending import held_by_workers, in_broker_lists, stranded_after_s
from orchestrator.routing import stage_queue
from orchestrator.runs import children, pipeline
from orchestrator.stores import queries
from orchestrator.stores.durable import Stages, json_value
from tasks import registry

log = logging.getLogger(__name__)

BATCH = 100


class AdvanceStalledPipelines:
    """A reconciler chore (`recovery.reconciler.Chore`)."""

    name = "pipelines"

    def __call__(self, fence: Fence) -> int:
        params = {"after_s": settings.CONFIG.pipeline_recover_after_s, "limit": BATCH}
        with connection.cursor() as cursor:
            cursor.execute(queries.STALLED_PIPELINES, params)
            rows = cursor.fetchall()
        if not rows:
            return 0
        tasks = registry.get()
        definitions = {row[1]: tasks[row[1]] for row in rows if row[1] in tasks}
        per_task = settings.CONFIG.per_task_queues
        queues = {
            stage_queue(definition, stage, per_task)
            for definition in definitions.values()
            for stage in definition.pipeline
        }
        # Lists first, then the unacked hash: a message taken meanwhile is found in the second.
        present = in_broker_lists(queues) | held_by_workers(taken_within_s=stranded_after_s())
        # A stage a pause holds waits on purpose: its resume publishes it (`recovery.pauses`).
        present |= Holds.load(0).held_stages(rows)
        moved = 0
        for run_id, task_id, input_, owner, identity, priority, states, results in rows:
            definition = definitions.get(task_id)
            if definition is None:
                log.warning("run %s: task %r is not registered; pipeline left", run_id, task_id)
                continue
            fence.check()
            stages = Stages(json_value(states), json_value(results))
            try:
                if children.fail_if_a_child_failed(definition, run_id, owner):
                    moved += 1
                    continue
                moved += pipeline.advance_stalled(
                    definition,
                    run_id,
                    json_value(input_),
                    owner,
                    identity,
                    priority,
                    stages,
                    present,
                )
            except Exception:
                log.exception("run %s: stalled pipeline not advanced; next tick retries", run_id)
        return moved
