"""A reconciler chore: the live children of a parent that ended failed or cancelled are
cancelled (`runs.children`).

A parent's cancel asks its live descendants at once (`runs.cancel.cancel_descendants`), and a
`fail_parent` failure asks its batch's; this chore finishes what those missed: a crash between
the parent's end and its children's cancels, a child that a stage spawned as the cancel came, a
pipeline parent failed by one of its own stages, a child whose cancel failed. A child of a
parent that completed is left to run: a plain handler's children outlive it by design.
Options: BATCH, the most children one tick cancels (the next tick takes more).
"""

from __future__ import annotations

import logging

from django.db import connection

from orchestrator.cluster.locks import Fence
from orchestrator.runs.cancel import NotCancellable, request_cancel
from orchestrator.stores import queries

log = logging.getLogger(__name__)

BATCH = 1000


class CancelChildrenLeft:
    """A reconciler chore (`recovery.reconciler.Chore`)."""

    name = "children"

    def __call__(self, fence: Fence) -> int:
        with connection.cursor() as cursor:
            cursor.execute(queries.CHILDREN_LEFT, {"limit": BATCH})
            rows = cursor.fetchall()
        cancelled = 0
        for child_id, parent_id, parent_state in rows:
            fence.check()
            try:
                request_cancel(child_id, actor=f"its parent {parent_id}, {parent_state}")
                cancelled += 1
            except NotCancellable:
                pass  # it ended meanwhile
        if cancelled:
            log.warning("cancelled %d live children of parents that ended", cancelled)
        return cancelled
