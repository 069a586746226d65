"""Where a no-op run's time goes, for `throughput.py --profile`.

Three views, each on fresh runs so none skews another:

1. Steps: wall ms per run of every round trip and orchestrator call of start_run and of the
   runner (bench/steps.py). The runner is called in this process, directly on runs start_run
   left pending, so it measures the runner without Celery's machinery around it.
2. cProfile of the same two paths, in CPU time (the steps already give wall time), top
   functions by own and cumulative time: what the Python costs, apart from the waiting.
3. cProfile of each worker's main process during a drain (bench/profile_worker.py): the part
   Celery spends receiving, dispatching to the pool and acking, per message.

Not measured here: the pool children's Celery tracer around the runner, and the servers' CPU
(throughput.py reports those as CPU ms per run).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.steps import StepTimer
from bench.workers import LOG_DIR, ROOT

TASK_ID = "bench-noop"


def _start_runs(count: int) -> list[str]:
    from orchestrator.runs import start
    from orchestrator.triggers import TriggerKind

    return [start.start_run(TASK_ID, None, trigger=TriggerKind.MANUAL).run_id for _ in range(count)]


def _run_all(run_ids: list[str]) -> None:
    from orchestrator.runs import runner
    from tasks import registry

    version = registry.get()[TASK_ID].processing_version
    for run_id in run_ids:
        runner.run_message(TASK_ID, run_id, version)


def _target(_run_id: str, target: Any, *args: Any, **kwargs: Any) -> str:
    return str(getattr(target, "value", target))


def _hook_steps(timer: StepTimer, methods: tuple[str, ...]) -> None:
    """Every lifecycle hook's methods, one row each (quotas, circuit, dedup, ...)."""
    from orchestrator.hooks import dispatch

    for hook in dispatch.installed():
        for method in methods:
            # Only methods a hook overrides: the base class's are documented no-ops.
            if method in vars(type(hook)):
                timer.wrap(hook, method, f"hook {hook.name}.{method}")


def _start_run_steps(timer: StepTimer) -> None:
    from orchestrator.runs import start
    from orchestrator.stores import live

    timer.wrap(start, "start_run", "start_run (total)")
    timer.wrap(start, "validate_input", "validate_input (pydantic)")
    # start_run calls these by the names it imported: wrapped there.
    timer.wrap(start, "admit", "admission (script, hooks, queue cap)")
    timer.wrap(live, "admit", "Lua admit_run (alone)")
    _hook_steps(timer, ("plan_admit", "abandoned"))
    timer.wrap(start, "_publish", "publish on commit (seed + send)")
    timer.wrap(live, "seed", "Lua seed_run")
    timer.wrap(start, "publish", "publish (one LPUSH)")


def _runner_steps(timer: StepTimer) -> None:
    from orchestrator.runs import execute, runner, terminal
    from orchestrator.stores import durable, live

    timer.wrap(runner, "run_message", "run_message (total)")
    timer.wrap(runner, "check_connections", "connection check")
    _hook_steps(timer, ("plan_before_claim", "release", "plan_finished"))
    timer.wrap(live, "claim", "Lua claim_run (alone)")
    timer.wrap(durable, "end", lambda *a, **k: f"Postgres end -> {_target(*a, **k)}")
    timer.wrap(terminal, "settle", "settle (Valkey follows)")
    timer.wrap(live, "end", lambda *a, **k: f"Lua end_run -> {_target(*a, **k)}")
    timer.wrap_context(execute, "watching", "the handler under its watch")


def _short(key: tuple[str, int, str]) -> str:
    path, line, name = key
    for marker in ("site-packages/", f"{ROOT}/"):
        if marker in path:
            path = path.split(marker, 1)[1]
    return f"{path}:{line}({name})" if line else name


def _top(profile: cProfile.Profile | str, runs: int, limit: int = 18) -> None:
    stats: dict[Any, Any] = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    total = sum(
        own for key, (_cc, _n, own, _cum, _callers) in stats.items() if "bench/" not in key[0]
    )
    print(f"    profiled total {1000 * total / runs:.3f} ms/run")
    for column, title in ((2, "own time"), (3, "cumulative time")):
        print(f"    top by {title} (ms/run, calls/run)")
        ranked = sorted(stats.items(), key=lambda item: item[1][column], reverse=True)
        shown = 0
        for key, (_cc, calls, own, cumulative, _callers) in ranked:
            if "bench/" in key[0]:
                continue  # the benchmark's own loops and step wrappers
            print(
                f"      {1000 * own / runs:7.3f} own {1000 * cumulative / runs:7.3f} cum"
                f" {calls / runs:6.2f}  {_short(key)}"
            )
            shown += 1
            if shown == limit:
                break


def _purge_broker_queue() -> None:
    # The runs above were run in-process; their messages must not reach a later drain.
    import redis
    from django.conf import settings

    from orchestrator.routing import queue_name
    from tasks import registry

    queue = queue_name(registry.get()[TASK_ID], settings.CONFIG.per_task_queues)
    client = redis.Redis.from_url(settings.CONFIG.celery_broker_url)
    for key in client.scan_iter(match=f"{queue}*"):
        client.delete(key)


def in_process(runs: int) -> None:
    print(f"\nprofile: start_run and the runner in this process, {runs} runs each pass")
    with StepTimer() as timer:
        _start_run_steps(timer)
        run_ids = _start_runs(runs)
    print("  start_run steps (wall)")
    print("\n".join(timer.table("start_run (total)", runs)))
    with StepTimer() as timer:
        _runner_steps(timer)
        _run_all(run_ids)
    print("  runner steps (wall, without Celery's tracer)")
    print("\n".join(timer.table("run_message (total)", runs)))

    profile = cProfile.Profile(time.process_time)
    profile.enable()
    run_ids = _start_runs(runs)
    profile.disable()
    print("  start_run under cProfile (CPU time)")
    _top(profile, runs)
    profile = cProfile.Profile(time.process_time)
    profile.enable()
    _run_all(run_ids)
    profile.disable()
    print("  runner under cProfile (CPU time)")
    _top(profile, runs)
    _purge_broker_queue()


def worker_main_processes(
    args: argparse.Namespace,
    lumastra_side: Callable[..., Any],
    bare_side: Callable[..., Any],
) -> None:
    print(f"\nprofile: each worker's main process during a drain of {args.runs}")
    for side in (lumastra_side, bare_side):
        out = Path(LOG_DIR) / f"worker-main-{side.__name__}.prof"
        result = side(args.runs, args, profile_to=out)
        print(f"  {result.name}: {result.rate:.0f} runs/s under the profiler (CPU time); {out}")
        _top(str(out), args.runs, limit=15)
