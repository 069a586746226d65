"""Run one fault scenario end to end: `python -m tests.faults.driver SCENARIO [--scale N]`.

Why a process of its own: the battery needs its own Valkey (it crashes and restarts it), and
the engine reads its Valkey and broker URLs once, when Django's settings load
(`settings.CONFIG`, the cached clients in `orchestrator.stores.valkey` and
`orchestrator.stores.broker`, the Celery app's broker URL). So the driver starts a
`redis-server` on a free port first, puts its URLs (VALKEY_URL, VALKEY_CACHE_URL,
CELERY_BROKER_URL) and the compressed thresholds (THRESHOLDS) into its environment, and only
then sets Django up; every worker and the loops process it starts inherit the same
environment. Nothing is reconfigured after the fact, and
the shared Redis on 6379 is never touched.

It uses the database DATABASE_URL names (already migrated: the pytest battery passes its test
database), starts the scenario's workers and loops, lets the reconciler settle, runs the
checker (`tests/faults/checker.py`) and prints the figures; `--report` writes them as JSON
and they are appended to .pytest_cache/faults-figures.jsonl. Exit status 0 when every check
held.

A scenario that crashes Postgres itself (OWN_POSTGRES) gets a Postgres server of its own
instead, the same way: the driver starts it (`initdb`, `pg_ctl`, `servers.PostgresServer`),
creates and migrates a database on it (`manage.py migrate`) and points DATABASE_URL at it
before Django is set up, so the workers, the loops, the load and the checker all use it;
the shared Postgres is never stopped. It is removed when the scenario ends, also on failure.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import django

from tests.support.fixtures import stall_fail_everywhere

ROOT = Path(__file__).resolve().parents[2]
LOG_DIR = ROOT / ".pytest_cache"

# Compressed so a scenario takes seconds; each keeps the relation the defaults have (orphan
# threshold several heartbeats; visibility timeout above the fault tasks' 20 s hard timeout).
THRESHOLDS = {
    "LUMASTRA_HEARTBEAT_INTERVAL_S": "1",
    **stall_fail_everywhere(20),
    "LUMASTRA_CANCEL_ESCALATE_S": "3",
    "LUMASTRA_ORPHAN_THRESHOLD_S": "6",
    "LUMASTRA_ORPHAN_BOOT_THRESHOLD_S": "6",
    "LUMASTRA_PENDING_CHECK_AFTER_S": "5",
    "LUMASTRA_PIPELINE_RECOVER_AFTER_S": "3",
    "LUMASTRA_RECONCILE_INTERVAL_S": "1",
    "LUMASTRA_DRAIN_INTERVAL_S": "1",
    "LUMASTRA_BROKER_VISIBILITY_TIMEOUT_S": "25",
}

# The scenarios that crash Postgres, on a server of their own (`scenarios.Scenario.own_postgres`).
OWN_POSTGRES = frozenset({"pg-crash"})
OWN_DATABASE = "lumastra_faults"
# The partition scenarios and their hosts (`scenarios.Scenario.hosts`): network namespaces
# (`tests.faults.netns`), each running a real role (the worker role; `webhost` the web role),
# and both stores of their own behind the bridge, so a cut drops exactly one host's packets.
OWN_NETWORK: dict[str, tuple[str, ...]] = {
    **{
        name: ("hosta", "hostb")
        for name in ("partition-full", "partition-valkey", "partition-postgres", "partition-lossy")
    },
    "partition-web": ("webhost", "hosta"),
}
# What every process of a partition scenario runs with: two pools per host (io 3, cpu 1), and
# store calls that fail well inside the compressed lease (half the orphan threshold, 3 s).
NETWORK_ENV = {
    "LUMASTRA_TASK_MODULES": "tests.faults.cluster_tasks",
    "LUMASTRA_CONCURRENCY_IO": "3",
    "LUMASTRA_CONCURRENCY_CPU": "1",
    "LUMASTRA_STORE_TIMEOUT_S": "2",
    "LUMASTRA_SECRET_KEY": "faults-partition-scenarios",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.faults.driver")
    parser.add_argument("scenario")
    parser.add_argument(
        "--scale",
        type=float,
        default=float(os.environ.get("FAULTS_SCALE", "1")),
        help="multiply loads and fault counts (default FAULTS_SCALE or 1)",
    )
    parser.add_argument("--report", type=Path, help="write the figures as JSON here")
    args = parser.parse_args(argv)

    from tests.faults.netns import STORES_ADDRESS, Network
    from tests.faults.servers import PostgresServer, ValkeyServer

    LOG_DIR.mkdir(exist_ok=True)
    aof = args.scenario.endswith("-aof")
    hosts = OWN_NETWORK.get(args.scenario, ())
    network = Network() if hosts else None
    stores_host = STORES_ADDRESS if hosts else "127.0.0.1"
    server = ValkeyServer(
        aof=aof, log_path=LOG_DIR / f"faults-{args.scenario}-valkey.log", host=stores_host
    )
    postgres: PostgresServer | None = None
    effects = LOG_DIR / f"faults-{args.scenario}-{os.getpid()}-effects.jsonl"
    try:
        if network is not None:
            network.up()
            for name in hosts:
                network.add_host(name)
            os.environ.update(NETWORK_ENV)
        server.start()
        os.environ.update(
            {
                "VALKEY_URL": server.url(0),
                "VALKEY_CACHE_URL": server.url(1),
                "CELERY_BROKER_URL": server.url(2),
                "LUMASTRA_FAULTS_EFFECTS_FILE": str(effects),
                **THRESHOLDS,
            }
        )
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "lumastra.settings")
        if args.scenario in OWN_POSTGRES or network is not None:
            postgres = PostgresServer(
                log_path=LOG_DIR / f"faults-{args.scenario}-postgres.log", host=stores_host
            )
            _own_database(postgres)
        django.setup()
        return _run(args.scenario, args.scale, server, postgres, effects, args.report, network)
    finally:
        server.stop()
        if postgres is not None:
            postgres.stop()
        if network is not None:
            network.down()
        effects.unlink(missing_ok=True)
        shutil.rmtree(f"{effects}.locks", ignore_errors=True)


def _own_database(postgres: object) -> None:
    """A migrated database on the scenario's own Postgres, named by DATABASE_URL from now on
    (in this process, and in every process it starts)."""
    from tests.faults.servers import PostgresServer

    assert isinstance(postgres, PostgresServer)
    began = time.monotonic()
    postgres.init()
    postgres.start()
    postgres.create_database(OWN_DATABASE)
    os.environ["DATABASE_URL"] = postgres.url(OWN_DATABASE)
    log = LOG_DIR / f"{postgres.log_path.stem}-migrate.log"
    with open(log, "wb") as out:
        migrated = subprocess.run(
            [sys.executable, "manage.py", "migrate", "--noinput"],
            cwd=ROOT,
            env=os.environ,
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=300,
        )
    if migrated.returncode != 0:
        raise RuntimeError(f"manage.py migrate failed on the own Postgres; see {log}")
    print(
        f"own Postgres on port {postgres.port}, migrated in {time.monotonic() - began:.1f} s",
        flush=True,
    )


def _run(
    name: str,
    scale: float,
    server: object,
    postgres: object,
    effects: Path,
    report_path: Path | None,
    network: object = None,
) -> int:
    from django.db import connection

    from tests.faults import checker
    from tests.faults.harness import Harness
    from tests.faults.netns import Network
    from tests.faults.scenarios import SCENARIOS
    from tests.faults.servers import PostgresServer, ValkeyServer

    assert isinstance(server, ValkeyServer)
    assert postgres is None or isinstance(postgres, PostgresServer)
    scenario = SCENARIOS[name]
    assert scenario.aof == server.aof
    assert scenario.own_postgres == (name in OWN_POSTGRES)
    assert scenario.hosts == OWN_NETWORK.get(name, ())
    assert network is None or isinstance(network, Network)
    report = checker.Report(name)
    began = time.monotonic()
    harness = Harness(name, server, effects, scale=scale, postgres=postgres, network=network)
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        harness.since = cursor.fetchone()[0]
    try:
        report.problems.extend(scenario.run(harness))
        report.recovery_s = harness.settle(scenario.bound_s)
    finally:
        harness.close()
    report.late_writes_refused = harness.late_writes_refused()
    report.leader_failover_s = harness.leader_failover_s
    report.faults = dict(harness.faults)
    report.refused_starts = sum(harness.refused.values())
    report.notes = {**harness.notes, "refusals": dict(harness.refused)}
    if report.recovery_s is not None:
        report.recovery_s = round(report.recovery_s, 1)
    checker.check(
        report,
        started=harness.started,
        since=harness.since,
        effects=checker.read_effects(effects),
        frozen_pids=harness.frozen_pids,
    )
    report.duration_s = round(time.monotonic() - began, 1)
    print(report.summary(), flush=True)
    for problem in report.problems:
        print(f"PROBLEM {problem}", flush=True)
    if report_path is not None:
        report_path.write_text(report.to_json())
    with open(LOG_DIR / "faults-figures.jsonl", "a") as figures:
        figures.write(report.to_json() + "\n")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
