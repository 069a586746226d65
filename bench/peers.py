"""No-op throughput of Lumastra beside bare Celery and two peers, measured in one invocation.

    .venv/bin/python bench/peers.py [-n 2000] [--rounds 1] [--concurrency 2] [--json]

Four sides drain the same number N of no-op jobs on this machine, in one invocation (issue 22):

- bare: bare Celery, bench/bare_app.py, as bench/throughput.py runs it;
- lumastra: start_run and a `celery -A lumastra worker`, as bench/throughput.py runs it;
- procrastinate: Procrastinate 3 (bench/procrastinate_app.py, an async no-op task) with its
  psycopg 3 connector, C worker processes of concurrency 1 each, on its own database;
- celery+results: Celery with django-celery-results (bench/celery_results_app.py,
  `result_backend = "django-db"`, persistent connections), prefork -c C, on its own database
  and its own Redis DB.

Every side is measured the same way: enqueue all N first, one timed call each (start_run,
apply_async, defer); then let the workers at them and wait for all N to finish. Throughput is
(N - 1) / (last completion - first completion), from the jobs' own completion stamps:
`finished_at` (lumastra), the counter's stamps (bare, see bench/bare_app.py), the `succeeded`
events' `at` (procrastinate) and `date_done` (celery+results). Both Celery peers start their
worker on an idle queue and open the real one with `add_consumer`, as bench/throughput.py does.
Procrastinate's workers cannot add a queue, so the script holds the queue shut instead: it
takes `LOCK TABLE procrastinate_jobs IN EXCLUSIVE MODE` (reads pass, job fetches wait), starts
the workers, waits until every one has registered, and commits. All the workers then start on
the same backlog at once, as the Celery ones do. Each peer's table is analysed after the
enqueue, as the Lumastra side's is (Procrastinate's job pick is slow on the fresh
statistics of a bulk insert).

Rounds alternate the order of the sides. Each round prints every side's runs/s, every side's
ratio to bare Celery, and Lumastra's ratio to each peer; with --rounds > 1 the medians too.
`--json` ends the output with one line of medians.

Stores: the bench's own for bare and Lumastra (bench/throughput.py: `lumastra_bench`, Redis DBs
9-11); `lumastra_bench_procrastinate` and `lumastra_bench_celery_results`, dropped and created
again at the start of every invocation (the script refuses other names), and Redis DB 12 for
the celery+results broker, which must be empty or carry this script's marker key and is
flushed before that side. BENCH_PEER_PROCRASTINATE_DATABASE_URL,
BENCH_PEER_RESULTS_DATABASE_URL and BENCH_PEER_RESULTS_BROKER_URL move them.

Procrastinate runs under a virtualenv of its own, `.venv/peers`: it needs psycopg 3, and with
psycopg 3 importable Django would switch the whole project, Lumastra side included, from
psycopg2 to it. `make bench-peers` installs both peers (bench/requirements-peers.lock into the
project's virtualenv, bench/requirements-peers-procrastinate.lock into `.venv/peers`). The
script stops only the worker processes it started, also on failure and on SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
# Run as a script: import the project, not whatever sits beside this file.
sys.path[0] = str(ROOT)

from bench import throughput, workers  # noqa: E402
from bench.throughput import Side, load_average, percentile, wait_until  # noqa: E402

# The Procrastinate peer's virtualenv lies inside the one running this (`make bench-peers`), so
# a snapshot of the code run with the project's interpreter finds it too.
PEER_PYTHON = Path(sys.prefix) / "peers" / "bin" / "python"
_PEER_STORES = {
    "PEER_PROCRASTINATE_DATABASE_URL": (
        "postgres://postgres@127.0.0.1:5432/lumastra_bench_procrastinate"
    ),
    "PEER_RESULTS_DATABASE_URL": "postgres://postgres@127.0.0.1:5432/lumastra_bench_celery_results",
    "PEER_RESULTS_BROKER_URL": "redis://127.0.0.1:6379/12",
}
PEER_ENV = {
    name: os.environ.get(f"BENCH_{name}", default) for name, default in _PEER_STORES.items()
}
# The peers' databases are dropped each invocation: only names that say they are the bench's.
OWN_DATABASE_PREFIX = "lumastra_bench_"
# Set in the celery+results broker DB once it was found empty: later runs know it is theirs.
MARKER_KEY = "lumastra-bench:peers"
SIDES = ("lumastra", "bare", "procrastinate", "celery+results")
PEERS = ("procrastinate", "celery+results")
# Each side's figure in --json, and its unit.
RATES = {
    "lumastra": ("lumastra_runs_s", "runs/s"),
    "bare": ("bare_tasks_s", "tasks/s"),
    "procrastinate": ("procrastinate_jobs_s", "jobs/s"),
    "celery+results": ("celery_results_tasks_s", "tasks/s"),
}
CALLS = {
    "lumastra": "start_run",
    "bare": "apply_async",
    "procrastinate": "defer",
    "celery+results": "apply_async",
}


def _database(url: str) -> str:
    return urlsplit(url).path.lstrip("/")


@contextmanager
def postgres(url: str) -> Iterator[Any]:
    """An autocommit psycopg2 connection: the project's driver, so the bench process never
    needs psycopg 3."""
    import psycopg2

    with closing(psycopg2.connect(url)) as conn:
        conn.autocommit = True
        yield conn


def execute(conn: Any, query: str) -> None:
    with conn.cursor() as cursor:
        cursor.execute(query)


def scalar(conn: Any, query: str) -> Any:
    with conn.cursor() as cursor:
        cursor.execute(query)
        return cursor.fetchone()[0]


def recreate_database(url: str) -> None:
    from psycopg2 import sql

    database = _database(url)
    if not database.startswith(OWN_DATABASE_PREFIX):
        sys.exit(
            f"refusing to drop {database!r}: a peer's database must be named {OWN_DATABASE_PREFIX}*"
        )
    server = urlunsplit(urlsplit(url)._replace(path="/postgres"))
    with postgres(server) as conn, conn.cursor() as cursor:
        name = sql.Identifier(database)
        cursor.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(name))
        cursor.execute(sql.SQL("CREATE DATABASE {}").format(name))


def claim_broker_db() -> None:
    """The celery+results broker DB, flushed: refused if someone else's keys are in it."""
    import redis

    client = redis.Redis.from_url(PEER_ENV["PEER_RESULTS_BROKER_URL"])
    if client.dbsize() and not client.exists(MARKER_KEY):
        sample = ", ".join(key.decode() for key in client.scan_iter(count=10))[:200]
        sys.exit(
            f"{PEER_ENV['PEER_RESULTS_BROKER_URL']} is in use ({sample}…); set"
            " BENCH_PEER_RESULTS_BROKER_URL to an empty Redis DB"
        )
    client.flushdb()
    client.set(MARKER_KEY, "bench/peers.py flushes this DB before each celery+results side")


def run_helper(argv: list[str], what: str) -> dict[str, Any]:
    """Run a peer's helper command; its last line of output is JSON, if it prints any."""
    done = subprocess.run(argv, cwd=ROOT, env=os.environ.copy(), capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"{what} failed ({' '.join(argv)}):\n{done.stderr.strip()}")
    lines = done.stdout.strip().splitlines()
    return json.loads(lines[-1]) if lines else {}


def prepare_peers() -> None:
    """Both peers' databases new, their schemas applied, the broker DB claimed."""
    if not PEER_PYTHON.exists():
        sys.exit(
            f"{PEER_PYTHON} is missing: `make bench-peers` installs the peers"
            " (or see bench/requirements-peers-procrastinate.lock)"
        )
    try:
        import django_celery_results  # noqa: F401
    except ImportError:
        sys.exit("django-celery-results is missing: `make bench-peers` installs the peers")
    os.environ.update(PEER_ENV)
    for name in ("PEER_PROCRASTINATE_DATABASE_URL", "PEER_RESULTS_DATABASE_URL"):
        recreate_database(PEER_ENV[name])
    procrastinate = [str(PEER_PYTHON), "-m", "procrastinate", "--app=bench.procrastinate_app.app"]
    run_helper([*procrastinate, "schema", "--apply"], "applying Procrastinate's schema")
    run_helper([sys.executable, "-m", "bench.celery_results_app", "migrate"], "migrating")
    claim_broker_db()


def span(conn: Any, query: str) -> tuple[float, float]:
    with conn.cursor() as cursor:
        cursor.execute(query)
        first, last = cursor.fetchone()
    return float(first), float(last)


@contextmanager
def procrastinate_workers(processes: int, loglevel: str) -> Iterator[workers.Worker]:
    """`processes` Procrastinate workers of concurrency 1, children of one shell in a process
    group of their own: workers.cpu_sample counts them as that shell's children, and
    workers.stop reaches them all. The shell waits for them after a SIGTERM (`trap`), so
    stopping it waits for their graceful shutdown."""
    workers.LOG_DIR.mkdir(exist_ok=True)
    log_path = workers.LOG_DIR / "worker-procrastinate.log"
    worker = [
        str(PEER_PYTHON),
        "-m",
        "procrastinate",
        "--app=bench.procrastinate_app.app",
        # As quiet as the Celery workers: at its default (info) it logs two lines per job.
        f"--log-level={loglevel.lower()}",
        "worker",
        "--concurrency=1",
        "--queues=bench",
    ]
    script = "trap : TERM; " + '"$@" & ' * processes + "wait; wait"
    process = workers.spawn(["sh", "-c", script, "sh", *worker], log_path)
    try:
        yield workers.Worker(process, f"procrastinate-{process.pid}", "", log_path)
    finally:
        workers.stop(process)


def procrastinate_side(runs: int, args: argparse.Namespace) -> Side:
    url = PEER_ENV["PEER_PROCRASTINATE_DATABASE_URL"]
    # One connection polls for the whole side, as the Lumastra side's Django connection does:
    # a new connection per poll would cost this side a Postgres backend 20 times a second.
    with postgres(url) as conn, postgres(url) as gate:
        execute(
            conn,
            "TRUNCATE procrastinate_jobs, procrastinate_events, procrastinate_periodic_defers,"
            " procrastinate_workers RESTART IDENTITY CASCADE",
        )
        enqueued = run_helper(
            [str(PEER_PYTHON), "-m", "bench.procrastinate_app", "enqueue", str(runs)],
            "deferring Procrastinate jobs",
        )
        found = scalar(conn, "SELECT count(*) FROM procrastinate_jobs WHERE status = 'todo'")
        if found != runs:
            raise RuntimeError(f"{found} Procrastinate jobs to do, expected {runs}")
        execute(conn, "ANALYZE procrastinate_jobs")
        # Job fetches wait on this lock until the commit; registering, heartbeats and plain
        # reads do not.
        gate.autocommit = False
        execute(gate, "LOCK TABLE procrastinate_jobs IN EXCLUSIVE MODE")
        with procrastinate_workers(args.concurrency, args.loglevel) as worker:

            def registered() -> bool:
                if worker.process.poll() is not None:
                    raise RuntimeError(f"the Procrastinate workers exited; see {worker.log}")
                return (
                    scalar(conn, "SELECT count(*) FROM procrastinate_workers") >= args.concurrency
                )

            wait_until(registered, 60, f"{args.concurrency} Procrastinate workers ({worker.log})")
            load = load_average()
            drained = throughput.drain(
                worker,
                gate.commit,
                lambda: scalar(
                    conn,
                    "SELECT count(*) FROM procrastinate_jobs"
                    " WHERE status IN ('succeeded', 'failed')",
                ),
                runs,
            )
        first, last = span(
            conn,
            "SELECT extract(epoch FROM min(at)), extract(epoch FROM max(at))"
            " FROM procrastinate_events WHERE type IN ('succeeded', 'failed')",
        )
        failed = scalar(conn, "SELECT count(*) FROM procrastinate_jobs WHERE status <> 'succeeded'")
    if failed:
        print(f"  warning: {failed} Procrastinate jobs did not succeed; see {worker.log}")
    return Side("procrastinate", runs, enqueued["latencies"], first, last, drained, load, None)


def celery_results_side(runs: int, args: argparse.Namespace) -> Side:
    import redis
    from celery import Celery

    from bench import celery_results_settings as settings

    url = PEER_ENV["PEER_RESULTS_DATABASE_URL"]
    broker = PEER_ENV["PEER_RESULTS_BROKER_URL"]
    claim_broker_db()
    # Only to ping the worker and open its queue: the peer's app never loads in this process,
    # whose Django runs on Lumastra's settings.
    control = Celery("bench_results_control", set_as_current=False)
    # Read and write URLs, because Celery prefers CELERY_BROKER_URL from the environment (the
    # Lumastra side's broker) to a broker_url setting.
    control.conf.update(
        broker_read_url=broker,
        broker_write_url=broker,
        broker_transport_options=settings.CELERY_BROKER_TRANSPORT_OPTIONS,
    )
    keys = [key for key in throughput.SHARED_SETTINGS if key != "task_ignore_result"]
    with postgres(url) as conn:
        execute(
            conn,
            "TRUNCATE django_celery_results_taskresult, django_celery_results_groupresult,"
            " django_celery_results_chordcounter RESTART IDENTITY",
        )
        with workers.worker(
            control,
            "bench.celery_results_app",
            "celery-results",
            concurrency=args.concurrency,
            loglevel=args.loglevel,
        ) as worker:
            enqueued = run_helper(
                [
                    sys.executable,
                    "-m",
                    "bench.celery_results_app",
                    "enqueue",
                    str(runs),
                    str(throughput.PRIORITY),
                    ",".join(keys),
                ],
                "publishing celery+results tasks",
            )
            check_delivery("bench/celery_results_settings.py", enqueued["delivery"])
            client = redis.Redis.from_url(broker)
            waiting = sum(client.llen(k) for k in client.scan_iter(match=f"{settings.QUEUE}*"))
            if waiting != runs:
                raise RuntimeError(f"{waiting} messages in {settings.QUEUE}, expected {runs}")
            execute(conn, "ANALYZE django_celery_results_taskresult")
            load = load_average()
            drained = throughput.drain(
                worker,
                lambda: workers.open_queue(control, worker, settings.QUEUE),
                lambda: scalar(
                    conn,
                    "SELECT count(*) FROM django_celery_results_taskresult"
                    " WHERE status IN ('SUCCESS', 'FAILURE')",
                ),
                runs,
            )
        first, last = span(
            conn,
            "SELECT extract(epoch FROM min(date_done)), extract(epoch FROM max(date_done))"
            " FROM django_celery_results_taskresult",
        )
        failed = scalar(
            conn, "SELECT count(*) FROM django_celery_results_taskresult WHERE status <> 'SUCCESS'"
        )
    if failed:
        print(f"  warning: {failed} celery+results tasks did not succeed; see {worker.log}")
    return Side("celery+results", runs, enqueued["latencies"], first, last, drained, load, None)


def check_delivery(where: str, theirs: dict[str, Any]) -> None:
    """The peer's delivery settings are Lumastra's, as bare Celery's are (results aside)."""
    from lumastra.celery import app as lumastra_app

    # Through JSON, as the peer reported them: tuples become lists on both sides.
    ours = json.loads(json.dumps({key: lumastra_app.conf[key] for key in theirs}))
    differ = [key for key in theirs if key != "broker_url" and theirs[key] != ours[key]]
    if differ:
        sys.exit(f"{where} differs from lumastra/settings.py in: {', '.join(differ)}")


def report(side: Side) -> None:
    ms = [1000 * s for s in side.enqueue_s]
    cpu = side.drained.cpu
    per_run = 1000 / max(1, side.drained.cpu_runs)
    reaction = side.first_at - side.drained.opened_at
    print(
        f"  {side.name:<14}  {side.rate:6.0f} runs/s  (first to last completion"
        f" {side.drain_s:.2f} s; first {reaction:.2f} s after the queue opened)"
    )
    print(
        f"{'':18}{CALLS[side.name]} p50 {percentile(ms, 0.5):.3f} ms"
        f"  p99 {percentile(ms, 0.99):.3f} ms  mean {sum(ms) / len(ms):.3f} ms;"
        f" load when the drain began: {side.load_before}"
    )
    print(
        f"{'':18}cpu ms/run: workers {(cpu.main + cpu.children) * per_run:.3f},"
        f" redis* {cpu.redis * per_run:.3f}, postgres* {cpu.postgres * per_run:.3f};"
        f" other processes {cpu.others * per_run:.3f}; {throughput.busy(cpu)}"
    )


def figures(sides: dict[str, Side]) -> dict[str, float]:
    """One round's figures, as --json reports them."""
    rate = {name: side.rate for name, side in sides.items()}
    found = {RATES[name][0]: rate[name] for name in SIDES}
    for name in SIDES:
        if name != "bare":
            found[f"{key(name)}_bare"] = rate[name] / rate["bare"]
    for peer in PEERS:
        found[f"lumastra_{key(peer)}"] = rate["lumastra"] / rate[peer]
    for name in SIDES:
        ms = [1000 * s for s in sides[name].enqueue_s]
        found[f"{key(name)}_enqueue_p50_ms"] = percentile(ms, 0.5)
    return found


def key(name: str) -> str:
    return name.replace("+", "_")


def table(values: dict[str, float], title: str) -> None:
    print(f"  {title}:")
    for name in SIDES:
        figure, unit = RATES[name]
        ratio = "" if name == "bare" else f"   {name}/bare {values[f'{key(name)}_bare']:.2f}"
        print(f"    {name:<14} {values[figure]:6.0f} {unit:<7}{ratio}")
    for peer in PEERS:
        print(f"    lumastra/{peer} = {values[f'lumastra_{key(peer)}']:.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("-n", "--runs", type=int, default=2000, help="jobs per side")
    parser.add_argument(
        "--concurrency",
        type=int,
        default=os.cpu_count() or 2,
        help="prefork processes of each Celery worker; Procrastinate worker processes",
    )
    parser.add_argument("--rounds", type=int, default=1, help="alternate sides this many times")
    parser.add_argument("--loglevel", default="WARNING", help="every worker's log level")
    parser.add_argument("--json", action="store_true", help="end with one JSON line of medians")
    args = parser.parse_args(argv)

    throughput.setup()
    from lumastra.celery import app as lumastra_app

    # Before bench.bare_app and bench.celery_results_settings are imported here, and inherited
    # by their workers.
    os.environ["BENCH_DELIVERY_SETTINGS"] = json.dumps(
        {key: lumastra_app.conf[key] for key in throughput.SHARED_SETTINGS if key != "broker_url"}
    )
    from bench import bare_app

    throughput.check_same_delivery(lumastra_app, bare_app.app)
    prepare_peers()
    print(
        f"N={args.runs} per side, {args.concurrency} worker processes per side (Celery: prefork,"
        f" prefetch 1, acks_late, priority {throughput.PRIORITY}; Procrastinate: {args.concurrency}"
        f" workers of concurrency 1), {os.cpu_count()} cores"
    )
    print("enqueue all N first, then drain; * = machine-wide (other users included)")
    run: dict[str, Callable[[int, argparse.Namespace], Side]] = {
        "lumastra": throughput.lumastra_side,
        "bare": throughput.bare_side,
        "procrastinate": procrastinate_side,
        "celery+results": celery_results_side,
    }
    rounds: list[dict[str, float]] = []
    for round_no in range(args.rounds):
        print(f"round {round_no + 1}  (load {load_average()})")
        # Alternating the order spreads any drift of the machine's load over the sides.
        order = SIDES if round_no % 2 == 0 else SIDES[::-1]
        sides = {name: run[name](args.runs, args) for name in order}
        for name in SIDES:
            report(sides[name])
        rounds.append(figures(sides))
        table(rounds[-1], f"round {round_no + 1}")
    medians = {name: statistics.median(r[name] for r in rounds) for name in rounds[0]}
    if args.rounds > 1:
        table(medians, f"median of {args.rounds} rounds")
    if args.json:
        print(json.dumps({name: round(value, 3) for name, value in medians.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
