"""The worker role: one `celery worker` per pool, supervised as one unit.

`python -m lumastra.workers` plans the pools from the task registry and the resource budgets
(`orchestrator.routing.plan_pools`) and starts one prefork Celery worker per pool, with the
pool's budget as its concurrency and `<pool>@<host>` as its node name, plus one process for
the orchestrator loops (`python -m orchestrator.loops`: reconciler, boot recovery, drain
replay). Arguments it does not know are passed on to every worker (e.g. `--loglevel=DEBUG`),
not to the loops. `--print-plan` prints the pools and the loops, and exits.

SIGTERM and SIGINT stop the role gracefully (a deploy, Ctrl+C):
1. every worker gets SIGTERM, Celery's warm shutdown: it takes no new message, and its
   reserved ones go back to their queues; the loops process stops too (releasing its seat);
2. the runs still running get LUMASTRA_SHUTDOWN_GRACE_S to finish;
3. then the pool processes still running are killed and their runs handed back, pending for
   another worker (`orchestrator.runs.handback`), instead of failing or waiting for the
   reconciler, one log line per run (the workers do not report those kills as crashes:
   `orchestrator.runs.stopping`); a second signal skips the rest of the grace;
4. a worker still alive STOP_TIMEOUT_S later is killed, and so is every process this one
   started, and theirs: nothing it started outlives it.
It exits 0 when stopped this way. When a worker or the loops process exits on its own, the
others are stopped the same way and this process exits non-zero.

A signal to the whole process group (honcho's, `make run`; systemd's control-group stop)
reaches every process directly as well: each worker and the loops process take a second
SIGTERM as the first, and the pool processes, which Celery leaves to SIGTERM's default, end at
once, their runs found lost as for any dead pool process (`orchestrator.runs.put_back`).

It does not restart a dead worker: a role with a pool missing would look healthy while that
pool's queues fill up, so the whole role ends and its supervisor (honcho, compose, systemd)
restarts it. Its other children (`settings.LUMASTRA_WORKER_CHILDREN`: the file watcher,
`coverage.watcher`) are restarted instead, after RESTART_BACKOFF_S (1 s, then longer for each
death in a row, up to 30 s; a child that ran STEADY_S starts from 1 s again): each death is
printed and is an operator's notification (`watcher_down`), and the role's health check fails
while the child is missing from the roster. They learn the role's pid from
LUMASTRA_WORKER_ROLE_PID (the watcher's seats are the role's, so a restarted watcher takes
them back at once).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType

import django
from django.conf import settings

from lumastra.config import WorkerMode
from orchestrator.routing import Pool, plan_pools
from orchestrator.runs import leftovers, stopping
from orchestrator.scheduler.names import SCHEDULER_QUEUE
from tasks import registry
from tasks.resources import budgets

POLL_INTERVAL_S = 0.5
# After the grace and the hand back, a worker has this long to finish its shutdown before it
# is killed (with its pool processes).
STOP_TIMEOUT_S = 15.0
LOOPS = "loops"
RESTART_BACKOFF_S = (1.0, 2.0, 4.0, 8.0, 15.0, 30.0)
STEADY_S = 60.0
ROLE_PID = "LUMASTRA_WORKER_ROLE_PID"


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

    def __init__(
        self,
        commands: dict[str, list[str]],
        *,
        grace_s: float,
        restarted: dict[str, list[str]] | None = None,
        on_death: Callable[[str, int, float], None] | None = None,
    ) -> None:
        self._commands = commands
        self._restarted = restarted or {}
        self._on_death = on_death
        self._grace_s = grace_s
        self._children: dict[str, subprocess.Popen[bytes]] = {}
        self._started_at: dict[str, float] = {}
        self._deaths: dict[str, int] = {}
        self._restart_at: dict[str, float] = {}
        self._stopping = False
        self._signals = 0
        # Where the hand back marks the pool processes it kills (`orchestrator.runs.stopping`).
        self._marks = marks_directory()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signals += 1
        if not self._stopping:
            self._stopping = True
            self._signal_all(signal.SIGTERM)

    def _signal_all(self, signum: int) -> None:
        for child in self._children.values():
            if child.poll() is None:
                child.send_signal(signum)

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        try:
            return self._run()
        finally:
            shutil.rmtree(self._marks, ignore_errors=True)

    def _start(self, name: str, argv: list[str]) -> None:
        env = {**os.environ, stopping.MARKS: str(self._marks), ROLE_PID: str(os.getpid())}
        self._children[name] = subprocess.Popen(argv, env=env)  # noqa: S603 (our own argv)
        self._started_at[name] = time.monotonic()
        print(f"started {name} (pid {self._children[name].pid})", flush=True)

    def _tend(self) -> None:
        """Restart the restarted children that died, each after its backoff."""
        now = time.monotonic()
        for name, argv in self._restarted.items():
            code = self._children[name].poll()
            if code is None:
                continue
            if name in self._restart_at:
                # A stop that came meanwhile starts nothing more (its SIGTERM went out already).
                if now >= self._restart_at[name] and not self._stopping:
                    del self._restart_at[name]
                    self._start(name, argv)
                continue
            steady = now - self._started_at[name] >= STEADY_S
            deaths = 0 if steady else self._deaths.get(name, -1) + 1
            self._deaths[name] = deaths
            delay = RESTART_BACKOFF_S[min(deaths, len(RESTART_BACKOFF_S) - 1)]
            self._restart_at[name] = now + delay
            print(
                f"{name} died with {code}; restarting it in {delay:g}s", file=sys.stderr, flush=True
            )
            if self._on_death is not None:
                self._on_death(name, code, delay)

    def _run(self) -> int:
        for name, argv in {**self._commands, **self._restarted}.items():
            if self._stopping:
                break
            self._start(name, argv)
        status = 0
        while not self._stopping:
            self._tend()
            dead = {
                n: c.returncode
                for n, c in self._children.items()
                if c.poll() is not None and n not in self._restarted
            }
            if dead:
                for name, code in dead.items():
                    print(f"{name} exited unexpectedly with {code}", file=sys.stderr)
                status = 1
                self._stopping = True
                self._signal_all(signal.SIGTERM)
                break
            time.sleep(POLL_INTERVAL_S)
        self._shut_down()
        return status

    def _alive(self) -> dict[str, subprocess.Popen[bytes]]:
        return {name: child for name, child in self._children.items() if child.poll() is None}

    def _shut_down(self) -> None:
        """Every child has had SIGTERM: the grace, the hand back, then no survivors."""
        deadline = time.monotonic() + self._grace_s
        while self._alive() and time.monotonic() < deadline and self._signals < 2:
            time.sleep(POLL_INTERVAL_S / 5)
        workers = {
            n: c for n, c in self._alive().items() if n != LOOPS and n not in self._restarted
        }
        if workers:
            self._hand_back(workers)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while self._alive() and time.monotonic() < deadline:
            time.sleep(POLL_INTERVAL_S / 5)
        for name, child in self._alive().items():
            print(f"{name} did not stop in time; killing it", file=sys.stderr, flush=True)
            kill_tree(child.pid)
            child.wait()
        # A pool process whose worker died first is reparented to this process (a child
        # subreaper, see `main`), not ended: nothing this role started may outlive it.
        _kill_tree_and_reap(os.getpid())

    def _hand_back(self, workers: dict[str, subprocess.Popen[bytes]]) -> None:
        # Imported here: it needs Django's apps, which `main` sets up first.
        from orchestrator.runs.handback import hand_back

        pids = [pid for child in workers.values() for pid in descendants(child.pid)]
        print(
            f"grace of {self._grace_s:.0f}s over: handing back the runs of {sorted(workers)}",
            file=sys.stderr,
            flush=True,
        )
        try:
            # It logs each run it hands back, and the totals.
            hand_back(pids, grace_s=self._grace_s, marks=self._marks)
        except Exception as exc:
            # The reconciler resumes what was not handed back (its heartbeats stop).
            print(f"hand back failed: {exc!r}", file=sys.stderr, flush=True)


def marks_directory() -> Path:
    """A new directory for the hand back's marks, named by this process; those of roles that
    no longer run (SIGKILLed before they could remove theirs) go."""
    prefix = "lumastra-handback-"
    for old in Path(tempfile.gettempdir()).glob(f"{prefix}*-*"):
        owner = old.name.removeprefix(prefix).split("-", 1)[0]
        if owner.isdigit() and not _running(int(owner)):
            shutil.rmtree(old, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-"))


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's
    return True


def descendants(pid: int) -> list[int]:
    """Every live process below `pid`, read from /proc (Linux)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            parents.setdefault(int(fields[1]), []).append(int(entry))
    found: list[int] = []
    todo = [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_tree(pid: int) -> None:
    """SIGKILL `pid`'s descendants, then `pid` (if it still runs)."""
    for target in [*descendants(pid), pid]:
        try:
            os.kill(target, signal.SIGKILL)
        except ProcessLookupError:
            continue


def _kill_tree_and_reap(pid: int) -> None:
    """SIGKILL every process below `pid` (this process) and reap those that were ours."""
    for target in descendants(pid):
        try:
            os.kill(target, signal.SIGKILL)
            print(f"process {target} outlived its worker; killed", file=sys.stderr, flush=True)
        except ProcessLookupError:
            continue
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            reaped, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return  # no child left
        if reaped == 0:
            time.sleep(0.05)


def become_subreaper() -> None:
    """Orphans of this process's descendants are reparented to it, not to init (Linux), so
    `_kill_tree_and_reap` finds a pool process whose worker died before it."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


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
        f"stage-sweep every {settings.COVERAGE.sweep_interval_s}s, "
        f"outbox dispatcher every {settings.COVERAGE.dispatch_interval_s}s",
        flush=True,
    )
    for name, module in settings.LUMASTRA_WORKER_CHILDREN.items():
        print(f"{name}: python -m {module}, restarted when it dies", flush=True)
    if args.print_plan:
        return 0
    if cfg.worker_mode is not WorkerMode.ENABLED:
        print(
            "LUMASTRA_WORKER_MODE is not 'enabled': this process may not consume queues",
            file=sys.stderr,
        )
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
    commands[LOOPS] = loops_argv()
    # Commands a run of this host's last start left behind (the host was SIGKILLed whole).
    left = leftovers.sweep()
    if left:
        print(f"killed {len(left)} processes earlier runs left behind", file=sys.stderr)
    restarted = {
        name: [sys.executable, "-m", module]
        for name, module in settings.LUMASTRA_WORKER_CHILDREN.items()
    }
    become_subreaper()
    return Supervisor(
        commands, grace_s=cfg.shutdown_grace_s, restarted=restarted, on_death=notify_death
    ).run()


def notify_death(name: str, code: int, delay_s: float) -> None:
    """A restarted child's death, for the operator (the role carries on without Postgres)."""
    from django.db import connection

    from orchestrator.models import NotificationKind
    from orchestrator.notifications import events

    host = socket.gethostname()
    try:
        events.notify(
            NotificationKind.WATCHER_DOWN,
            subject=f"{name}@{host}",
            title=f"The {name} of {host} died",
            body=f"It exited with {code}; the worker role starts it again in {delay_s:g} s.",
            link="/admin/orchestrator/taskhistory/nodes/",
        )
    except Exception as exc:
        print(f"{name}'s death was not recorded as a notification: {exc!r}", file=sys.stderr)
    finally:
        # A connection Postgres dropped meanwhile would fail the next death's write too.
        connection.close()


if __name__ == "__main__":
    sys.exit(main())
