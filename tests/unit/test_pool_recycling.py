"""Pool children are replaced by memory, not by count, unless an operator asks (issue 22).

A child Celery replaces by count (`worker_max_tasks_per_child`) exits with the next message
already handed to it by the worker's main process, and that message waits for the pool's
maintenance tick (Celery's asynpool runs `maintain_pool` every 5 s) before another child gets
it. That was the benchmark's "slow rounds": 2,000 runs on two children of 1,000 runs each, one
stall of 2.4 to 4.4 s at the end of about half the rounds (docs/benchmarks.md)."""

from __future__ import annotations

import os
import subprocess
import sys

from django.conf import settings

from lumastra.celery import app
from tests.support.fixtures import ROOT


def test_the_worker_replaces_no_child_by_count_by_default() -> None:
    assert "LUMASTRA_WORKER_MAX_TASKS_PER_CHILD" not in os.environ
    assert app.conf.worker_max_tasks_per_child is None
    assert app.conf.worker_max_memory_per_child == settings.CONFIG.worker_max_memory_per_child_kb


def test_an_operator_may_still_ask_for_a_count() -> None:
    shown = subprocess.run(
        [
            sys.executable,
            "-c",
            "from lumastra.celery import app; print(app.conf.worker_max_tasks_per_child)",
        ],
        cwd=ROOT,
        env={**os.environ, "LUMASTRA_WORKER_MAX_TASKS_PER_CHILD": "500"},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert shown.stdout.strip() == "500"
