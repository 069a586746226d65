"""No-op throughput of Lumastra against bare Celery, measured in one invocation.

    .venv/bin/python bench/throughput.py [-n 2000] [--concurrency 2|io] [--rounds 1] [--json]
                                         [--profile]

Each side gets a fresh `celery worker` subprocess (prefork, acks_late, prefetch 1, the same
concurrency, the same broker and transport options) that starts on an idle queue. The benchmark
first enqueues all N messages — N `start_run` calls on the Lumastra side (INSERT, Lua seed,
publish), N `apply_async` calls on the bare side — timing each call; then it opens the queue
with `add_consumer` and waits for all N to finish:

- Lumastra: until every run is terminal in Postgres; the span is from the first to the last
  `finished_at`.
- bare: until the INCR counter of `bench/bare_app.py` reaches N; the span is from the time
  the first task stamped to the time the N-th did.

Throughput is (N - 1) / span. The span starts at the first completion, not at `add_consumer`:
kombu's Redis consumer only adds the new queue to its next BRPOP, after the one in flight
times out (up to a second), which would otherwise count against each side.

Enqueueing before consuming keeps the two phases apart, so start_run latency is not inflated
by a busy worker on this 2-core machine, and both sides drain the same kind of backlog.

It uses its own stores and never touches the app's or the tests' data: the Postgres database
`lumastra_bench` (created and migrated here; task_history is truncated each round) and Redis
DBs 9, 10 and 11 (flushed); BENCH_DATABASE_URL, BENCH_VALKEY_URL, BENCH_VALKEY_CACHE_URL and
BENCH_CELERY_BROKER_URL move them. It stops only the worker processes it started. docs/benchmarks.md
records results and explains the CPU columns.

Each round also measures what admission adds to start_run (bench/admission.py: start_run p50
with every hook minus with none, for the same no-limit task). `--concurrency io` gives both
workers the io pool's real concurrency (its budget in the worker role's plan, folded classes
included) instead of a number. `--json` ends the output with one line of medians over the
rounds: ratio, lumastra_runs_s, bare_tasks_s, start_run_p50_ms, start_run_p99_ms,
admission_p50_ms.

With --profile it also times every step of start_run and of the runner (bench/steps.py),
cProfiles both paths in this process, and cProfiles each worker's main process.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# Run as a script: import the project, not whatever sits beside this file.
sys.path[0] = str(ROOT)

# The stores default to the bench's own; BENCH_<NAME> moves one (e.g. BENCH_CELERY_BROKER_URL)
# when those Redis DBs are in use by someone else on a shared machine. Never the app's own
# variables: an inherited DATABASE_URL must not point this at real data.
_STORES = {
    "DATABASE_URL": "postgres://postgres@127.0.0.1:5432/lumastra_bench",
    "VALKEY_URL": "redis://127.0.0.1:6379/9",
    "VALKEY_CACHE_URL": "redis://127.0.0.1:6379/10",
    "CELERY_BROKER_URL": "redis://127.0.0.1:6379/11",
}
BENCH_ENV = {
    **{name: os.environ.get(f"BENCH_{name}", default) for name, default in _STORES.items()},
    "LUMASTRA_TASK_MODULES": "bench.task_defs",
    "LUMASTRA_WORKER_MODE": "enabled",
    "DJANGO_SETTINGS_MODULE": "lumastra.settings",
    # The whole backlog waits at once, so the io class's default cap (2,000) would refuse
    # starts beyond it; the backpressure check itself still runs on every start.
    "LUMASTRA_QUEUE_DEPTH_CAP_IO": "1000000",
}
TASK_ID = "bench-noop"
# What start_run resolves for a manual trigger; the bare side publishes with the same value so
# both land in the same priority sub-queue.
PRIORITY = 2
TERMINAL = ("completed", "failed", "cancelled")
# Starts per alternating block of the admission figure (as bench/admission.py's default).
ADMISSION_BLOCK = 100
# Delivery settings both apps must share for the comparison to mean anything.
SHARED_SETTINGS = (
    "broker_url",
    "broker_transport_options",
    "task_acks_late",
    "task_reject_on_worker_lost",
    "worker_prefetch_multiplier",
    "task_ignore_result",
    "task_default_priority",
    "task_serializer",
)


@dataclass(frozen=True)
class Drain:
    opened_at: float  # wall clock, to compare with the completion stamps
    cpu: Any  # workers.CpuSample from the first observed completion to the last
    cpu_runs: int  # runs completed inside that window


@dataclass(frozen=True)
class Side:
    name: str
    runs: int
    enqueue_s: list[float]  # one per call
    first_at: float  # wall clock of the first completion
    last_at: float  # wall clock of the last completion
    drained: Drain
    load_before: str
    enqueue_cpu: Any  # workers.CpuSample over the enqueue phase

    @property
    def drain_s(self) -> float:
        return self.last_at - self.first_at

    @property
    def rate(self) -> float:
        return (self.runs - 1) / self.drain_s


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def wait_until(done: Callable[[], bool], timeout: float, what: str, interval: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def drain(
    worker: Any, open_queue: Callable[[], None], completed: Callable[[], int], runs: int
) -> Drain:
    """Open the queue and wait for `runs` completions, sampling CPU once work has begun.

    The CPU window starts at the first completion seen, so the consumer's reaction time
    (see the module docstring) does not dilute the machine's busy share.
    """
    from bench import workers

    opened_at = time.time()
    open_queue()
    timeout = 60 + runs / 20
    wait_until(lambda: completed() >= 1, timeout, "the first completion", interval=0.005)
    already = completed()
    cpu_before = workers.cpu_sample(worker)
    wait_until(lambda: completed() >= runs, timeout, f"{runs} completions")
    return Drain(opened_at, workers.cpu_sample(worker) - cpu_before, runs - already)


def prepare_stores(env: dict[str, str] = BENCH_ENV) -> None:
    """Bench database created and migrated, bench Redis DBs empty; a clear message if down."""
    import redis

    from lumastra import preflight

    problems = [preflight.check_postgres(env["DATABASE_URL"], create=True)]
    problems += [
        preflight.check_valkey(name, env[name])
        for name in ("VALKEY_URL", "VALKEY_CACHE_URL", "CELERY_BROKER_URL")
    ]
    found = [p for p in problems if p]
    if found:
        sys.exit("\n".join(found))
    migrate = subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput", "--verbosity", "0"],
        cwd=ROOT,
        env=os.environ.copy(),
    )
    if migrate.returncode:
        sys.exit("manage.py migrate failed on the bench database; its error is above")
    for name in ("VALKEY_URL", "VALKEY_CACHE_URL", "CELERY_BROKER_URL"):
        redis.Redis.from_url(env[name]).flushdb()


def setup() -> None:
    """What every bench script does first: its stores ready, Django set up on them."""
    # Without this, a SIGTERM would skip the `finally` that stops the workers started here.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    # Celery puts the working directory first on sys.path; from anywhere else, another
    # checkout's packages could shadow this one's.
    os.chdir(ROOT)
    # Forced, not defaulted: an inherited DATABASE_URL must never point this at real data.
    os.environ.update(BENCH_ENV)
    prepare_stores()
    import django

    django.setup()


def check_same_delivery(ours: Any, bare: Any) -> None:
    differ = [key for key in SHARED_SETTINGS if ours.conf[key] != bare.conf[key]]
    if differ:
        sys.exit(f"bench/bare_app.py differs from lumastra/settings.py in: {', '.join(differ)}")


def queued(queue: str) -> int:
    """Messages waiting in `queue`, over all of kombu's priority sub-queues."""
    import redis

    client = redis.Redis.from_url(BENCH_ENV["CELERY_BROKER_URL"])
    return sum(client.llen(key) for key in client.scan_iter(match=f"{queue}*"))


def expect_queued(queue: str, count: int) -> None:
    found = queued(queue)
    if found != count:
        raise RuntimeError(f"{found} messages in {queue}, expected {count}; publishing failed?")


def fresh_redis() -> None:
    """Each side starts from empty coordination and broker DBs, as after a deploy."""
    import redis

    for name in ("VALKEY_URL", "CELERY_BROKER_URL"):
        redis.Redis.from_url(BENCH_ENV[name]).flushdb()


def fresh_tables() -> None:
    """Each Lumastra side starts from empty engine tables: no runs, and no quota or circuit
    rows that earlier rounds kept updating (a hot row's dead versions would slow later ones).
    """
    from django.apps import apps
    from django.db import connection

    existing = set(connection.introspection.table_names())
    tables = [
        connection.ops.quote_name(model._meta.db_table)
        for app in ("orchestrator", "coverage")
        for model in apps.get_app_config(app).get_models()
        if model._meta.db_table in existing and model._meta.managed
    ]
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {', '.join(tables)} CASCADE")


def lumastra_side(
    runs: int,
    args: argparse.Namespace,
    profile_to: Path | None = None,
    task_id: str = TASK_ID,
    prepare: Callable[[], object] | None = None,
) -> Side:
    from celery import current_app
    from django.conf import settings
    from django.db import connection
    from django.db.models import Max, Min

    from bench import workers
    from orchestrator.models import TaskHistory
    from orchestrator.routing import queue_name
    from orchestrator.runs import start
    from orchestrator.triggers import TriggerKind
    from tasks import registry

    queue = queue_name(registry.get()[task_id], settings.CONFIG.per_task_queues)
    fresh_redis()
    fresh_tables()
    if prepare is not None:
        prepare()
    with workers.worker(
        current_app,
        "lumastra",
        "lumastra",
        concurrency=args.concurrency,
        loglevel=args.loglevel,
        profile_to=profile_to,
    ) as worker:
        latencies = []
        enqueue_before = workers.cpu_sample(worker)
        for _ in range(runs):
            began = time.perf_counter()
            handle = start.start_run(task_id, None, trigger=TriggerKind.MANUAL)
            latencies.append(time.perf_counter() - began)
        enqueue_cpu = workers.cpu_sample(worker) - enqueue_before
        if handle.priority != PRIORITY:
            raise RuntimeError(f"start_run resolved priority {handle.priority}, not {PRIORITY}")
        expect_queued(queue, runs)
        # Fresh statistics after a bulk insert, or the planner guesses badly.
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE task_history")
        terminal = TaskHistory.objects.filter(state__in=TERMINAL)
        load = load_average()
        drained = drain(
            worker,
            lambda: workers.open_queue(current_app, worker, queue),
            terminal.count,
            runs,
        )
    span = TaskHistory.objects.aggregate(first=Min("finished_at"), last=Max("finished_at"))
    first, last = span["first"].timestamp(), span["last"].timestamp()
    not_completed = TaskHistory.objects.exclude(state="completed").count()
    if not_completed:
        print(f"  warning: {not_completed} runs did not complete; see {worker.log}")
    return Side("lumastra", runs, latencies, first, last, drained, load, enqueue_cpu)


def bare_side(runs: int, args: argparse.Namespace, profile_to: Path | None = None) -> Side:
    import redis

    from bench import bare_app, workers

    fresh_redis()
    counter = redis.Redis.from_url(BENCH_ENV["VALKEY_URL"])
    with workers.worker(
        bare_app.app,
        "bench.bare_app",
        "bare",
        concurrency=args.concurrency,
        loglevel=args.loglevel,
        profile_to=profile_to,
    ) as worker:
        latencies = []
        enqueue_before = workers.cpu_sample(worker)
        for _ in range(runs):
            began = time.perf_counter()
            bare_app.noop.apply_async(args=[runs], queue=bare_app.QUEUE, priority=PRIORITY)
            latencies.append(time.perf_counter() - began)
        enqueue_cpu = workers.cpu_sample(worker) - enqueue_before
        expect_queued(bare_app.QUEUE, runs)
        load = load_average()
        drained = drain(
            worker,
            lambda: workers.open_queue(bare_app.app, worker, bare_app.QUEUE),
            lambda: int(counter.get(bare_app.DONE_KEY) or 0),
            runs,
        )
    first = float(counter.get(bare_app.FIRST_AT_KEY) or "nan")
    last = float(counter.get(bare_app.FINISHED_AT_KEY) or "nan")
    return Side("bare", runs, latencies, first, last, drained, load, enqueue_cpu)


def report(side: Side) -> None:
    call = "start_run" if side.name == "lumastra" else "apply_async"
    ms = [1000 * s for s in side.enqueue_s]
    cpu = side.drained.cpu
    per_run = 1000 / max(1, side.drained.cpu_runs)
    reaction = side.first_at - side.drained.opened_at
    print(
        f"  {side.name:<8}  {side.rate:7.0f} runs/s  (first to last completion"
        f" {side.drain_s:.2f} s; first {reaction:.2f} s after the queue opened)"
    )
    print(
        f"            {call} p50 {percentile(ms, 0.5):.3f} ms  p99 {percentile(ms, 0.99):.3f} ms"
        f"  max {max(ms):.1f} ms  mean {sum(ms) / len(ms):.3f} ms"
    )
    print(f"            {busy(side.enqueue_cpu)} while enqueueing")
    print(f"            load average when the drain began: {side.load_before}")
    print(
        f"            cpu ms/run: worker main {cpu.main * per_run:.3f}, pool children"
        f" {cpu.children * per_run:.3f}, redis* {cpu.redis * per_run:.3f},"
        f" postgres* {cpu.postgres * per_run:.3f}; other processes {cpu.others * per_run:.3f}"
    )
    print(f"            {busy(cpu)} during the drain")


def pool_concurrency(value: str) -> int:
    """A number as given, or the concurrency the worker role plans for the pool so named."""
    if value.isdigit():
        return int(value)
    from lumastra import workers

    pools = {pool.name: pool.concurrency for pool in workers.plan()}
    if value not in pools:
        sys.exit(f"--concurrency {value!r}: not a number nor a planned pool ({', '.join(pools)})")
    return pools[value]


def summary(ours: Side, bare: Side, admission_runs: int) -> dict[str, float]:
    """One round's figures, as --json reports them; admission is measured here, after both
    sides, on the emptied stores."""
    from bench import admission

    ms = [1000 * s for s in ours.enqueue_s]
    return {
        "ratio": ours.rate / bare.rate,
        "lumastra_runs_s": ours.rate,
        "bare_tasks_s": bare.rate,
        "start_run_p50_ms": percentile(ms, 0.5),
        "start_run_p99_ms": percentile(ms, 0.99),
        "admission_p50_ms": admission.added_p50(
            admission.measure(admission_runs, min(ADMISSION_BLOCK, admission_runs))
        ),
    }


def busy(cpu: Any) -> str:
    capacity = cpu.wall * (os.cpu_count() or 1)
    return (
        f"machine busy {100 * cpu.machine / capacity:.0f}% of {os.cpu_count()} cores,"
        f" {100 * cpu.others / capacity:.0f}% by other processes"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("-n", "--runs", type=int, default=2000, help="runs per side")
    parser.add_argument(
        "--concurrency",
        default=str(os.cpu_count() or 2),
        help="pool processes per worker: a number, or a pool's name (io) for its real budget",
    )
    parser.add_argument("--rounds", type=int, default=1, help="alternate sides this many times")
    parser.add_argument("--loglevel", default="WARNING", help="both workers' log level")
    parser.add_argument(
        "--admission-runs", type=int, default=1000, help="starts per variant, each round"
    )
    parser.add_argument("--json", action="store_true", help="end with one JSON line of medians")
    parser.add_argument("--profile", action="store_true", help="also profile both paths")
    parser.add_argument("--profile-runs", type=int, default=500, help="runs per profile pass")
    args = parser.parse_args(argv)

    setup()
    from lumastra.celery import app as lumastra_app

    # Before bench.bare_app is imported here, and inherited by its worker subprocess.
    os.environ["BENCH_DELIVERY_SETTINGS"] = json.dumps(
        {key: lumastra_app.conf[key] for key in SHARED_SETTINGS if key != "broker_url"}
    )
    from bench import bare_app

    check_same_delivery(lumastra_app, bare_app.app)
    concurrency = args.concurrency
    args.concurrency = pool_concurrency(concurrency)
    if str(args.concurrency) != concurrency:
        concurrency = f"{args.concurrency} (the {concurrency} pool's budget)"
    print(
        f"N={args.runs} per side, concurrency={concurrency}, pool=prefork, prefetch=1,"
        f" acks_late, priority {PRIORITY}, broker {BENCH_ENV['CELERY_BROKER_URL']},"
        f" worker loglevel {args.loglevel}, {os.cpu_count()} cores"
    )
    print("enqueue all N first, then open the queue; * = machine-wide (other users included)")
    rounds: list[dict[str, float]] = []
    for round_no in range(args.rounds):
        print(f"round {round_no + 1}  (load {load_average()})")
        # Alternating the order spreads any drift of the machine's load over both sides.
        order = [lumastra_side, bare_side] if round_no % 2 == 0 else [bare_side, lumastra_side]
        sides = {side.name: side for side in (run(args.runs, args) for run in order)}
        for name in ("lumastra", "bare"):
            report(sides[name])
        rounds.append(summary(sides["lumastra"], sides["bare"], args.admission_runs))
        print(f"  admission adds {rounds[-1]['admission_p50_ms']:.3f} ms to start_run at p50")
        print(f"  ratio lumastra/bare = {rounds[-1]['ratio']:.2f}")
    medians = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
    if args.rounds > 1:
        print(f"median ratio over {args.rounds} rounds = {medians['ratio']:.2f}")

    if args.profile:
        from bench import profiling

        profiling.in_process(args.profile_runs)
        profiling.worker_main_processes(args, lumastra_side, bare_side)
    if args.json:
        print(json.dumps({key: round(value, 3) for key, value in medians.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
