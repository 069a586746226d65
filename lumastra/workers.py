"""The worker role: one `celery worker` per pool, supervised as one unit.

`python -m lumastra.workers` plans the pools from the task registry and the resource budgets
(`orchestrator.routing.plan_pools`) and starts one prefork Celery worker per pool, with the
pool's budget as its concurrency and `<pool>@<host>` as its node name, plus one process for
the orchestrator loops (`python -m orchestrator.loops`: reconciler, boot recovery, drain
replay). Arguments it does not know are passed on to every worker (e.g. `--loglevel=DEBUG`),
not to the loops. `--print-plan` prints the pools and the loops, and exits.

SIGTERM and SIGINT are forwarded to every worker as SIGTERM, Celery's warm shutdown: running
tasks may finish, and with `acks_late` the messages of those that do not go back to the queue.
When a worker or the loops process exits on its own, the others are stopped and this process
exits non-zero.

It does not restart a dead worker: a role with a pool missing would look healthy while that
pool's queues fill up, so the whole role ends and its supervisor (honcho, compose, systemd)
restarts it.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from types import FrameType

import django
from django.conf import settings

from lumastra.config import WorkerMode
from orchestrator.routing import Pool, plan_pools
from orchestrator.scheduler.names import SCHEDULER_QUEUE
from tasks import registry
from tasks.resources import budgets

POLL_INTERVAL_S = 0.5
# A warm shutdown waits for running tasks; a worker still busy after this is killed, and
# acks_late returns its unfinished messages to the queue.
STOP_TIMEOUT_S = 60.0


def plan() -> list[Pool]:
    """The pools this host runs (needs the registry, so Django must be set up)."""
    cfg = settings.CONFIG
    return plan_pools(
        registry.get().values(),
        budgets(cfg.concurrency_overrides, cfg.queue_depth_cap_overrides),
        cfg.per_task_queues,
    )


def worker_argv(
    node_name: str, concurrency: int, queues: Sequence[str], extra: Sequence[str]
) -> list[str]:
    """One prefork Celery worker: `node_name` like `io@%h`, consuming `queues`."""
    return [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "lumastra",
        "worker",
        "--pool=prefork",
        "-c",
        str(concurrency),
        "-Q",
        ",".join(queues),
        "-n",
        node_name,
        *extra,
    ]


def loops_argv() -> list[str]:
    """The orchestrator loops process: one per worker host (it elects its own leaders)."""
    return [sys.executable, "-m", "orchestrator.loops"]


class Supervisor:
    """Runs the workers; `run` returns the exit status of the role."""

    def __init__(self, commands: dict[str, list[str]]) -> None:
        self._commands = commands
        self._children: dict[str, subprocess.Popen[bytes]] = {}
        self._stopping = False

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._stopping = True
        self._signal_all(signal.SIGTERM)

    def _signal_all(self, signum: int) -> None:
        for child in self._children.values():
            if child.poll() is None:
                child.send_signal(signum)

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        for name, argv in self._commands.items():
            if self._stopping:
                break
            self._children[name] = subprocess.Popen(argv)  # noqa: S603 (our own argv)
            print(f"started {name} (pid {self._children[name].pid})", flush=True)
        status = 0
        while not self._stopping:
            dead = {n: c.returncode for n, c in self._children.items() if c.poll() is not None}
            if dead:
                for name, code in dead.items():
                    print(f"{name} exited unexpectedly with {code}", file=sys.stderr)
                status = 1
                self._stopping = True
                self._signal_all(signal.SIGTERM)
                break
            time.sleep(POLL_INTERVAL_S)
        self._wait_all()
        return status

    def _wait_all(self) -> None:
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for name, child in self._children.items():
            try:
                child.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                print(
                    f"{name} did not stop in {STOP_TIMEOUT_S:.0f}s; killing it",
                    file=sys.stderr,
                )
                child.kill()
                child.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lumastra.workers", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--print-plan", action="store_true", help="print the pools and exit")
    args, extra = parser.parse_known_args(argv)

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "lumastra.settings")
    django.setup()
    pools = plan()
    for pool in pools:
        queues = ",".join(pool.queues)
        print(
            f"pool {pool.name}: concurrency {pool.concurrency}, queues {queues},{SCHEDULER_QUEUE}",
            flush=True,
        )
    cfg = settings.CONFIG
    print(
        f"loops: reconciler every {cfg.reconcile_interval_s}s "
        f"(boot recovery at start), drain replay every {cfg.drain_interval_s}s, "
        f"scheduler every {cfg.scheduler_tick_s}s (boot catch-up at start), "
        f"stage-sweep every {cfg.coverage_sweep_interval_s}s, "
        f"outbox dispatcher every {cfg.coverage_dispatch_interval_s}s",
        flush=True,
    )
    if args.print_plan:
        return 0
    if cfg.worker_mode is not WorkerMode.ENABLED:
        print("WORKER_MODE is not 'enabled': this process may not consume queues", file=sys.stderr)
        return 2
    if not pools:
        print("no task is registered: there is nothing to consume", file=sys.stderr)
        return 2
    # Every pool also consumes the scheduler's queue: a beat fire is a few milliseconds of
    # work, and whichever pool has a free process takes it.
    commands = {
        p.name: worker_argv(f"{p.name}@%h", p.concurrency, (*p.queues, SCHEDULER_QUEUE), extra)
        for p in pools
    }
    commands["loops"] = loops_argv()
    return Supervisor(commands).run()


if __name__ == "__main__":
    sys.exit(main())
