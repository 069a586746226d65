"""A handler cut off from both stores stops itself on its own clock (issue 26).

The first partition test saw a cut-off handler run 26 s past its lease: the self-stop lived on
the watch thread, which was itself stuck in a heartbeat on a dead connection. The
lease now has a thread of its own that takes no lock and calls no store. Here the watch thread
is stuck for good, as on a connection nothing answers, and the process must still die at half
the orphan threshold."""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import signal
import threading
import time
from typing import Any

from django.conf import settings

from orchestrator.runs import watch
from orchestrator.runs.context import RunContext
from tasks import registry
from tasks.definition import NoInput

ORPHAN_THRESHOLD_S = 2  # the lease: half of it


def _run_with_a_hung_watch() -> None:
    settings.CONFIG = dataclasses.replace(settings.CONFIG, orphan_threshold_s=ORPHAN_THRESHOLD_S)

    def hung(self: Any, pubsub: Any, channel: Any) -> None:
        threading.Event().wait()  # a store call that never returns, holding the watch's lock

    watch.Watcher._tick = hung  # type: ignore[method-assign]
    definition = registry.get()["test-noop"]
    context = RunContext("run_lease", NoInput(), task_id=definition.id)
    with watch.watching(definition, "run_lease", "owner-cut-off", context):
        time.sleep(30)  # the handler, still running
    os._exit(0)  # never reached when the lease holds


def test_a_handler_whose_watch_hangs_on_a_store_still_stops_at_its_lease() -> None:
    child = multiprocessing.get_context("fork").Process(target=_run_with_a_hung_watch)
    began = time.monotonic()
    child.start()
    try:
        child.join(15)
        took = time.monotonic() - began
    finally:
        child.kill()

    assert child.exitcode == -signal.SIGKILL
    assert ORPHAN_THRESHOLD_S / 2 <= took < ORPHAN_THRESHOLD_S / 2 + 3
