"""The fault scenarios: each starts its workers and the loops, runs a load, breaks something for
real while the load runs, and returns the problems specific to it (the checker's common checks
run after every scenario).

Sizes are for `make test` on a 2-core machine; FAULTS_SCALE multiplies loads and fault counts
for a soak (docs/reliability.md).
"""

from __future__ import annotations

import itertools
import logging
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import redis
from django.conf import settings
from django.db import connection

from orchestrator.cluster.leaders import CLUSTER, instance_of
from orchestrator.models import RunBatch, TaskHistory
from orchestrator.runs import celery_tasks, leftovers
from orchestrator.runs.cancel import NotCancellable, request_cancel
from orchestrator.runs.publish import publish
from orchestrator.states import TERMINAL_RUN_STATES
from orchestrator.stores import broker, keys, valkey
from orchestrator.stores.broker import job_id
from tasks import registry
from tests.faults.checker import read_effects
from tests.faults.harness import QUEUES, Answer, Harness, Worker, _kill
from tests.faults.servers import PgProxy
from tests.support.fixtures import database_url
from tests.support.processes import alive, run_commands

WORKER_APP = "lumastra-faults-worker"
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    run: Callable[[Harness], list[str]]
    aof: bool = False
    # Runs on a Postgres server of its own, which it crashes (tests/faults/driver.py).
    own_postgres: bool = False
    # Hosts of its own network (`tests.faults.netns`), each running the real worker role; the
    # stores (its own Valkey and Postgres) sit behind the bridge (tests/faults/driver.py).
    hosts: tuple[str, ...] = ()
    # What the machine must have (tests/support/categories.py); hosts need "partitions".
    needs: tuple[str, ...] = ()
    # Longest wait after the last fault for every run to end, before the rest counts as
    # stuck: the slowest recovery path the scenario can take (see docs/reliability.md).
    bound_s: float = 60.0


def _ended(run_ids: list[str]) -> bool:
    states = TaskHistory.objects.filter(id__in=run_ids).values_list("state", flat=True)
    return len(states) == len(run_ids) and all(s in TERMINAL_RUN_STATES for s in states)


# --- processes killed ---------------------------------------------------------------------


def _kill_again_and_again(h: Harness, kills: int, mains: set[int], every_s: float) -> None:
    """SIGKILL pool children, and a worker's main process at the indexes in `mains` (its
    children die with it; the role's supervisor would start a new worker: so do we)."""
    for index in range(kills):
        if index % 10 in mains:
            victim = h.rng.choice(h.workers)
            _kill(victim.pid)
            h.fault("SIGKILL worker main process")
            h.retire(victim)
            h.worker()
        else:
            h.kill_random_child()
        h.pause(every_s)


def sigkill(h: Harness) -> list[str]:
    """SIGKILL pool children again and again during a load, and twice a worker's main process:
    every run killed mid-run is put back and completes as the same run (`runs.put_back`)."""
    h.worker()
    h.worker()
    h.loops()
    with h.load(h.n(600), h.work(20, 200)):
        h.pause(2)
        _kill_again_and_again(h, h.n(10), {3, 7}, 1.0)
    h.settle(SCENARIOS["sigkill"].bound_s)
    return _expect_all_completed(h, "after their workers were killed") + _resumed(h)


def resume(h: Harness) -> list[str]:
    """Runs of seconds that report progress (`test-fault-resume`, like the demo's
    slow-progress), with pool children SIGKILLed again and again and two whole workers
    SIGKILLed: every run completes, as the same run, none executed twice at the same time
    (the checker's entry lock)."""
    h.worker()
    h.worker()
    h.loops()

    def make(index: int) -> tuple[str, dict[str, Any]]:
        return "test-fault-resume", {"ms": h.rng.randint(800, 2500)}

    with h.load(h.n(80), make, per_s=20):
        h.pause(2)
        _kill_again_and_again(h, h.n(14), {3, 8}, 1.2)
    h.settle(SCENARIOS["resume"].bound_s)
    return _expect_all_completed(h, "after their workers were killed") + _resumed(h)


def _resumed(h: Harness) -> list[str]:
    """Notes how many runs took more than one attempt; a problem if none did (the kills
    then proved nothing)."""
    rows = TaskHistory.objects.filter(id__in=h.started)
    attempts = list(rows.values_list("attempts", flat=True))
    again = sum(1 for n in attempts if n > 1)
    h.notes["runs that took more than one attempt"] = again
    h.notes["most attempts of one run"] = max(attempts, default=0)
    h.notes["put back after a lost worker (worker logs)"] = h.log_count(None, "back to pending")
    return [] if again else ["no run was put back after its worker was killed"]


def sigterm(h: Harness) -> list[str]:
    """SIGTERM a worker while it runs handlers (warm shutdown: they finish), then replace it."""
    h.worker()
    h.worker()
    h.loops()
    with h.load(h.n(200), h.work(100, 400)):
        for _ in range(h.n(2)):
            h.pause(2.5)
            victim = h.workers[0]
            busy = len(h.active_runs_of(victim))
            h.notes["running at SIGTERM"] = h.notes.get("running at SIGTERM", 0) + busy
            victim.process.send_signal(signal.SIGTERM)
            h.fault("SIGTERM worker (warm shutdown)")
            victim.process.wait(timeout=60)
            h.retire(victim)
            h.worker()
    return []


# The grace a stopping worker role gives its running runs here: most of the load's runs are
# shorter and finish within it, a quarter (5-8 s) are longer and are handed back.
ROLLING_GRACE = {"LUMASTRA_SHUTDOWN_GRACE_S": "2"}


def rolling_restart(h: Harness) -> list[str]:
    """A rolling restart of every worker under load, twice over: each worker role (the role's
    supervisor around a Celery worker, as `deploy/start-worker.sh` runs it) gets SIGTERM once
    its replacement is up. It stops taking messages, its running runs get the grace (2 s
    here), the rest are handed back (pending, published again) and its processes end. Every
    run completes; no process of a stopped role is left."""
    h.role(env=ROLLING_GRACE)
    h.role(env=ROLLING_GRACE)
    h.loops()
    exits: list[float] = []
    survivors: list[int] = []

    def make(index: int) -> tuple[str, dict[str, Any]]:
        span = (5000, 8000) if h.rng.random() < 0.25 else (300, 1500)
        return "test-fault-resume", {"ms": h.rng.randint(*span)}

    with h.load(h.n(100), make, per_s=10):
        for _ in range(h.n(2)):
            for old in list(h.workers):
                h.pause(1.5)
                h.role(env=ROLLING_GRACE)  # the replacement first, as a rolling deploy does
                h.notes["running at SIGTERM"] = h.notes.get("running at SIGTERM", 0) + len(
                    h.active_runs_of(old)
                )
                tree = [old.pid, *old.children()]
                began = time.monotonic()
                old.process.send_signal(signal.SIGTERM)
                h.fault("SIGTERM worker role (rolling restart)")
                old.process.wait(timeout=60)
                exits.append(round(time.monotonic() - began, 1))
                h.retire(old)
                survivors += [pid for pid in tree if _running(pid)]
    h.settle(SCENARIOS["rolling-restart"].bound_s)
    h.notes["SIGTERM to exit (s)"] = exits
    h.notes["runs handed back"] = h.log_count(None, "handed back after the")
    problems = _expect_all_completed(h, "across the rolling restarts")
    if survivors:
        problems.append(f"processes of stopped worker roles still running: {survivors}")
    if not h.notes["runs handed back"]:
        problems.append("no run was handed back (the grace let every run finish)")
    return problems


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _expect_all_completed(h: Harness, what: str) -> list[str]:
    others = TaskHistory.objects.filter(id__in=h.started).exclude(state="completed")
    found = list(others.values_list("id", "state", "error"))
    return [f"{len(found)} runs did not complete {what}: {found[:3]}"] if found else []


def sigterm_expect(h: Harness) -> list[str]:
    problems = sigterm(h)
    h.settle(60)
    return problems + _expect_all_completed(h, "under warm shutdown")


def sigstop(h: Harness) -> list[str]:
    """SIGSTOP a worker running two runs past the orphan threshold; cancel one of them while it
    is stopped; SIGCONT it once both ended: the cancelled one by the reconciler, the other put
    back by the reconciler and completed by another worker (`runs.put_back`). The stopped
    worker's late writes are refused."""
    config = settings.CONFIG
    stopped = h.worker(concurrency=2)
    h.loops()
    # Short enough that, when the worker resumes, both handlers are past their sleep and try
    # their terminal write (unless their watch thread kills them first).
    long = [h.start("test-fault-work", {"ms": 5000}) for _ in range(2)]
    assert all(long)
    runs = [r for r in long if r]
    h.wait(lambda: sorted(h.active_runs_of(stopped)) == sorted(runs), 30, "both runs active")
    h.frozen_pids.update([stopped.pid, *stopped.children()])
    stopped.signal_all(signal.SIGSTOP)
    h.fault("SIGSTOP worker")
    stopped_at = time.monotonic()
    assert request_cancel(runs[0], actor="faults") == "cancelling"
    h.fault("cancel of a stopped worker's run")
    h.worker()
    with h.load(h.n(200), h.work(20, 200)):
        # The resumed run's backoff (test-fault-work: up to 2 s) and its 5 s of work too.
        bound = config.orphan_threshold_s + 4 * config.reconcile_interval_s + 10 + 7
        h.wait(lambda: _ended(runs), bound, "the stopped worker's runs ended")
        h.notes["stopped worker's runs ended after (s)"] = round(time.monotonic() - stopped_at, 1)
    h.pause(1)
    stopped.signal_all(signal.SIGCONT)
    h.fault("SIGCONT worker")
    # Its handlers wake past their sleep and try to end their runs; its watch threads beat.
    h.pause(3 * config.heartbeat_interval_s + 3)
    problems = []
    rows = {r.id: r for r in TaskHistory.objects.filter(id__in=runs)}
    expected = {runs[0]: ("cancelled", "orphaned", 1), runs[1]: ("completed", None, 2)}
    for run_id, (state, kind, attempts) in expected.items():
        row = rows[run_id]
        found = (row.state, (row.error or {}).get("kind"), row.attempts)
        if found != (state, kind, attempts):
            problems.append(
                f"stopped worker's run {run_id}: {found}, expected {(state, kind, attempts)}"
            )
    h.notes["late terminal writes refused"] = h.log_count(stopped, "not recorded")
    h.notes["handlers stopped by their own watch"] = h.log_count(stopped, "no longer ours")
    return problems


# --- Valkey -------------------------------------------------------------------------------


def valkey_restart(h: Harness) -> list[str]:
    """Crash the battery's Valkey (SIGKILL) and start it again mid-load, twice; with AOF
    (appendfsync always) it comes back with its data, without AOF it comes back empty (live
    hashes, locks and the broker's queues gone). With AOF, SCRIPT FLUSH three times too."""
    h.worker()
    h.worker()
    h.loops()
    downtime = []
    with h.load(h.n(240), h.work(50, 300, long_share=0.1), per_s=12):
        for round_ in range(h.n(2)):
            h.pause(3)
            if h.valkey.aof:
                for _ in range(3 if round_ == 0 else 0):
                    h.valkey.script_flush()
                    h.fault("SCRIPT FLUSH")
                    h.pause(0.7)
            downtime.append(round(h.valkey.restart(), 2))
            h.fault("Valkey restart " + ("with AOF" if h.valkey.aof else "without AOF"))
    h.notes["Valkey down (s)"] = downtime
    name = "valkey-restart-aof" if h.valkey.aof else "valkey-restart"
    h.settle(SCENARIOS[name].bound_s)
    return _expect_all_completed(h, "across the Valkey restarts")


# --- Postgres -----------------------------------------------------------------------------


def _worker_url(base: str) -> str:
    return f"{base}?application_name={WORKER_APP}"


def pg_terminate(h: Harness) -> list[str]:
    """pg_terminate_backend on every worker connection, several times during a load."""
    env = {"DATABASE_URL": _worker_url(database_url())}
    h.worker(env=env)
    h.worker(env=env)
    h.loops()
    terminated = 0
    with h.load(h.n(600), h.work(20, 200)):
        for _ in range(h.n(6)):
            h.pause(1.5)
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE application_name = %s",
                    [WORKER_APP],
                )
                terminated += int(cursor.fetchone()[0])
            h.fault("pg_terminate_backend of the workers' connections")
    h.notes["backends terminated"] = terminated
    h.settle(SCENARIOS["pg-terminate"].bound_s)
    return _expect_all_completed(h, "across terminated connections")


def pg_outage(h: Harness) -> list[str]:
    """Postgres unreachable for the workers and the loops for a few seconds mid-load: every
    connection through the proxy is reset and new ones are refused, then it is back."""
    db = settings.DATABASES["default"]
    proxy = PgProxy(str(db["HOST"]), int(db["PORT"]))
    proxy.start()
    try:
        url = f"postgres://{db['USER']}@127.0.0.1:{proxy.port}/{db['NAME']}"
        env = {"DATABASE_URL": _worker_url(url)}
        h.worker(env=env)
        h.worker(env=env)
        h.loops(env={"DATABASE_URL": url})
        outage_s = 5.0
        with h.load(h.n(200), h.work(100, 400), per_s=12):
            for _ in range(h.n(1)):
                h.pause(4)
                proxy.cut()
                h.fault("Postgres unreachable")
                h.pause(outage_s)
                proxy.restore()
                h.fault("Postgres back")
        h.notes["outage (s)"] = outage_s
        h.settle(120)
        h.notes["terminal writes queued in the drain"] = h.log_count(None, "queued in the drain")
    finally:
        h.retire_all()
        proxy.close()
    return _expect_all_completed(h, "across the Postgres outage")


PG_DOWN_S = 5.0


def pg_crash(h: Harness) -> list[str]:
    """Postgres itself crashes in the middle of a drain (`pg_ctl stop -m immediate` on the
    scenario's own server: no checkpoint, WAL not yet flushed is lost) and starts again 5 s
    later. The claim's commit does not wait for its flush (`stores/sql/claim_run.sql`), so
    the claims of the last moments before the crash can come back `pending` while Valkey says
    their owner runs them; the INSERTs and terminal writes are synchronous. Every run must
    still complete, each handler entered at most once per claim."""
    postgres = h.postgres
    assert postgres is not None, "pg-crash runs on the scenario's own Postgres"
    h.worker(concurrency=4)
    h.worker(concurrency=4)
    h.loops()
    count = h.n(320)
    # A third of the runs go on long enough for their claim to be written (a shorter run's
    # claim is folded into its end): those claims are what the crash may lose.
    with h.load(count, h.work(5, 500, long_share=0.33)):
        pass  # every run is recorded before the crash: none is refused by it
    h.wait(
        lambda: _completed(h) >= count // 4 and len(h.active_runs()) >= 4,
        60,
        "the drain under way with runs active",
    )
    h.notes["completed before the crash"] = _completed(h)
    h.notes["active (Valkey) just before the crash"] = len(h.active_runs())
    # The promise's window: a claim committed moments ago whose WAL is not written out yet.
    waited, unwritten = _await_unwritten_claim()
    postgres.crash()
    h.fault("Postgres crash (pg_ctl stop -m immediate)")
    crashed = time.monotonic()
    # What Valkey says is claimed while Postgres is down, read at both ends of the outage: a
    # claim kept throughout is a run that was running at the crash (a claim tried during the
    # outage is given back when its Postgres half fails).
    claims = h.live_claims(h.started)
    h.pause(max(0.0, crashed + PG_DOWN_S - time.monotonic()))
    later = h.live_claims(h.started)
    claims = {run: owner for run, owner in claims.items() if later.get(run) == owner}
    h.notes["claimed in Valkey throughout the outage"] = len(claims)
    postgres.start()
    h.fault("Postgres started again")
    h.notes["Postgres down (s)"] = round(time.monotonic() - crashed, 1)
    h.notes["waited for a claim not yet written out (s)"] = waited
    h.notes["claims not yet written out at the crash (seen by the poll)"] = unwritten
    # Read at once, before anything claims them again.
    connection.close()
    lost = _lost_claims(claims)
    h.notes["claims lost in the crash (pending again, Valkey says claimed)"] = len(lost)
    h.settle(SCENARIOS["pg-crash"].bound_s)
    h.notes["terminal writes queued in the drain"] = h.log_count(None, "queued in the drain")
    h.notes["drained writes dropped"] = h.log_count(None, "dropped: the run is")
    h.notes["published again by the pending check"] = h.log_count(
        None, "its message is not in the broker"
    )
    attempts = dict(TaskHistory.objects.filter(id__in=h.started).values_list("id", "attempts"))
    h.notes["runs that took more than one attempt"] = sum(1 for n in attempts.values() if n > 1)
    h.notes["most attempts of one run"] = max(attempts.values(), default=0)
    ended = dict(TaskHistory.objects.filter(id__in=lost).values_list("id", "state"))
    entries = Counter(e.run for e in read_effects(h.effects_path) if e.run in lost)
    h.notes["runs whose claim was lost: state, attempts, executions"] = {
        run: [ended.get(run), attempts.get(run), entries[run]] for run in lost
    }
    problems = _expect_all_completed(h, "across the Postgres crash")
    if len(h.started) < count:
        problems.append(f"{count - len(h.started)} runs were not started: {dict(h.refused)}")
    return problems


# One poll for a claim whose commit is still in Postgres's WAL buffers. A claim (written by the
# run's watch once the run has gone on for a second, `runs.watch.CLAIM_AFTER_S`, and stamping
# `updated_at`, while its `started_at` is the earlier moment Valkey took it) whose
# transaction began after the previous poll read the WAL write position, while that position has
# not moved since, has its commit record past it: not written out (let alone flushed), so a
# crash of Postgres now loses it, while the next synchronous commit, or the WAL writer within
# wal_writer_delay, would save it. (WAL written but not yet fsynced survives a crash of
# Postgres: the kernel still holds it.) The position is read before the clock, and these
# reads write no WAL themselves.
_UNWRITTEN_CLAIM = """
SELECT pg_current_wal_lsn(), clock_timestamp(),
       ARRAY(SELECT id FROM task_history WHERE state = 'active' AND updated_at > %s)
"""


def _await_unwritten_claim(within_s: float = 10.0) -> tuple[float, list[str]]:
    """Poll Postgres until it holds claims not written out yet (at most `within_s`, then the
    crash comes anyway); returns the seconds waited and those claims' runs."""
    began = time.monotonic()
    written, polled = None, None
    with connection.cursor() as cursor:
        while time.monotonic() - began < within_s:
            cursor.execute(_UNWRITTEN_CLAIM, [polled or "infinity"])
            lsn, at, fresh = cursor.fetchone()
            if fresh and lsn == written:
                return round(time.monotonic() - began, 3), list(fresh)
            written, polled = lsn, at
    return round(time.monotonic() - began, 3), []


def _completed(h: Harness) -> int:
    return TaskHistory.objects.filter(id__in=h.started, state="completed").count()


def _lost_claims(claims: dict[str, str]) -> list[str]:
    """The runs Valkey says were claimed and Postgres, after its crash recovery, says are
    pending: their claim's commit was lost with the WAL that was not flushed."""
    rows = TaskHistory.objects.filter(id__in=list(claims), state="pending")
    return sorted(rows.values_list("id", flat=True))


# --- messages -----------------------------------------------------------------------------


def _publish_copies(run_id: str, copies: int) -> int:
    row = TaskHistory.objects.filter(id=run_id).values_list("task_id", "identity", "priority")
    found = row.first()
    if found is None:
        return 0
    task_id, identity, priority = found
    definition = registry.get()[task_id]
    for _ in range(copies):
        publish(definition, run_id, job_id(task_id, identity, run_id), priority)
    return copies


def duplicates(h: Harness) -> list[str]:
    """Publish the same run's message again and again: while it waits, while it runs, and
    after it ended."""
    h.worker()
    h.worker()
    h.loops()
    copies = 0
    with h.load(h.n(300), h.work(50, 250), per_s=40) as load:
        seen = 0
        while load.is_alive() or seen < len(h.started):
            fresh = h.started[seen:]
            seen += len(fresh)
            for run_id in fresh:
                copies += _publish_copies(run_id, 3)
                h.fault("duplicate messages published")
            time.sleep(0.1)
    h.settle(60)
    for run_id in h.rng.sample(h.started, min(50, len(h.started))):
        copies += _publish_copies(run_id, 3)
        h.fault("duplicate messages published")
    h.wait(lambda: _broker_idle(), 60, "every duplicate consumed")
    h.notes["duplicate messages"] = copies
    return _expect_all_completed(h, "beside their duplicate messages")


def _broker_idle() -> bool:
    return broker.depth(list(QUEUES)) == 0 and broker.client().hlen(keys.BROKER_UNACKED) == 0


# --- poison -------------------------------------------------------------------------------


def poison(h: Harness) -> list[str]:
    """Poison payloads (os._exit, a huge allocation, an exception) while a healthy load flows:
    the poisoned task's circuit opens; the healthy runs all complete."""
    h.worker()
    h.worker()
    h.loops()
    problems = []
    with h.load(h.n(300), h.work(20, 100), per_s=20):
        opened_after = _poison_until_open("test-fault-poison", ["exit", "alloc", "raise"], h)
        h.notes["mixed poison: starts before its circuit opened"] = opened_after
        if opened_after is None:
            problems.append("test-fault-poison: the circuit never opened")
        crash_after = _poison_until_open("test-fault-crash", ["exit"], h, attempts=8)
        h.notes["os._exit only: starts before its circuit opened"] = crash_after
        if crash_after is None:
            problems.append("test-fault-crash: os._exit alone never opened the circuit")
    healthy = TaskHistory.objects.filter(id__in=h.started, task_id="test-fault-work")
    h.settle(60)
    bad = list(healthy.exclude(state="completed").values_list("id", "state", "error"))
    if bad:
        problems.append(f"{len(bad)} healthy runs did not complete: {bad[:3]}")
    return problems


def _poison_until_open(
    task_id: str, kinds: list[str], h: Harness, attempts: int = 15
) -> int | None:
    """Start poison runs one after another; the number started when a start is refused by
    the circuit (None if none was)."""
    before = h.refused["circuit_open"]
    for index, how in enumerate(itertools.islice(itertools.cycle(kinds), attempts)):
        run_id = h.start(task_id, {"how": how})
        if run_id is None:
            if h.refused["circuit_open"] > before:
                return index
            continue
        h.fault(f"poison {how}")
        h.wait(lambda r=run_id: _ended([r]), 40, f"poison run {run_id} ended")
    return None


# --- cancels ------------------------------------------------------------------------------


def cancels(h: Harness) -> list[str]:
    """Cancel runs at random moments during a load: waiting, running cooperatively, running
    deaf (escalated to a kill), already ended."""
    h.worker()
    h.worker()
    h.loops()
    outcomes: dict[str, int] = {}
    with h.load(h.n(160), h.work(100, 1500, deaf_share=0.2), per_s=8) as load:
        while load.is_alive():
            time.sleep(h.rng.uniform(0.05, 0.4))
            # Mostly running runs (cooperative or deaf), else one just started (waiting).
            running = h.active_runs()
            pool = running if running and h.rng.random() < 0.6 else h.started[-10:]
            if not pool:
                continue
            run_id = h.rng.choice(pool)
            try:
                answer = str(request_cancel(run_id, actor="faults"))
            except NotCancellable:
                answer = "already ended"
            outcomes[answer] = outcomes.get(answer, 0) + 1
            h.fault(f"cancel ({answer})")
    h.notes["cancel answers"] = outcomes
    return []


# --- media: real ffmpeg ---------------------------------------------------------------------


def media(h: Harness) -> list[str]:
    """Real ffmpeg encodes (`test-fault-encode`: trickplay's sprite command on a test pattern
    at its native rate, 1.5-3 s each) while pool processes are SIGKILLed mid-encode and runs are
    cancelled mid-encode: every run completes, or ends cancelled when a cancel was asked, and
    no process a run's command started is left running (the commands' pids from the runs'
    logs, and any process carrying a run's marks)."""
    h.worker()
    h.worker()
    h.loops()
    asked: set[str] = set()

    def make(index: int) -> tuple[str, dict[str, Any]]:
        return "test-fault-encode", {"seconds": round(h.rng.uniform(1.5, 3.0), 1)}

    with h.load(h.n(40), make, per_s=4):
        h.pause(2)
        for index in range(h.n(12)):
            running = [r for r in h.active_runs() if r not in asked]
            if index % 3 == 2 and running:
                run_id = h.rng.choice(running)
                with suppress(NotCancellable):
                    request_cancel(run_id, actor="faults")
                    asked.add(run_id)
                    h.fault("cancel mid-encode")
            else:
                h.kill_random_child()
            h.pause(1.0)
    h.settle(SCENARIOS["media"].bound_s)

    states = dict(TaskHistory.objects.filter(id__in=h.started).values_list("id", "state"))
    wrong = {
        run_id: state
        for run_id, state in states.items()
        if state != "completed" and not (state == "cancelled" and run_id in asked)
    }
    commands = {pid: run_id for run_id in h.started for pid in run_commands(run_id)}
    time.sleep(1.0)  # a command's group is killed as its run ends: let the kernel reap it
    left = sorted(pid for pid in commands if alive(pid))
    marked = sorted(p.pid for p in leftovers.marked() if p.run_id in states)
    h.notes["cancels asked mid-encode"] = len(asked)
    h.notes["runs cancelled"] = sum(1 for state in states.values() if state == "cancelled")
    h.notes["ffmpeg commands started"] = len(commands)
    h.notes["commands left running"] = len(left) + len(marked)
    problems = [f"{len(wrong)} runs ended wrongly: {sorted(wrong.items())[:3]}"] if wrong else []
    if left or marked:
        problems.append(f"commands left running: logged pids {left}, marked pids {marked}")
    return problems + _resumed(h)


# --- backlog --------------------------------------------------------------------------------

# A backlog that has waited for hours: each run starts with this many postponements behind it
# (a run postponed ~82 times used to crash every pickup on an overflowing delay).
AGED_POSTPONEMENTS = 5_000


def backlog(h: Harness) -> list[str]:
    """A backlog far above a task's max_concurrent (2), every run already postponed thousands
    of times: every pickup must postpone cleanly, and every run complete."""
    task_id = "test-fault-limited"
    with h.load(h.n(150), lambda _: (task_id, {"ms": h.rng.randint(20, 80)})):
        pass
    client = valkey.client()
    seconds, micros = client.time()
    seen_ms = seconds * 1000 + micros // 1000
    client.hset(
        keys.concurrency_postponed(task_id),
        mapping={run: f"{AGED_POSTPONEMENTS}:{seen_ms}" for run in h.started},
    )
    h.worker()
    h.worker()
    h.loops()
    h.settle(120)
    problems = _expect_all_completed(h, "from a backlog above max_concurrent")
    # The reconciler re-publishes a run whose pickup crashed, so completion alone would hide
    # crashes: every pickup must end in a run or a postponement.
    crashes = h.log_count(None, "raised unexpected")
    h.notes["postponements"] = h.log_count(None, "postponed")
    return problems + ([f"{crashes} pickups crashed"] if crashes else [])


# --- pipelines ----------------------------------------------------------------------------


def _pipes(ms_low: int, ms_high: int, h: Harness) -> Callable[[int], Any]:
    def make(index: int) -> tuple[str, dict[str, Any]]:
        return "test-fault-pipe", {"ms": h.rng.randint(ms_low, ms_high)}

    return make


def pipeline_sigkill(h: Harness) -> list[str]:
    """SIGKILL pool children while four-stage pipeline runs move across two workers. A killed
    stage is tried again, when its message comes back or when the reconciler finds its run's
    heartbeat stale; none runs twice under one claim or at the same time, every run completes
    and ends with no stage left open."""
    h.worker()
    h.worker()
    h.loops()
    with h.load(h.n(60), _pipes(50, 300, h)):
        h.pause(1.5)
        for _ in range(h.n(8)):
            h.kill_random_child()
            h.pause(0.8)
    h.settle(60)
    retried = h.log_count(None, "worker_lost; retry in") + h.log_count(None, "orphaned; retry in")
    h.notes["stages tried again after their worker died"] = retried
    problems = _expect_all_completed(h, "after their stages' workers were killed")
    if not retried:
        problems.append("no killed stage was tried again")
    return problems


def pipeline_valkey_restart(h: Harness) -> list[str]:
    """Valkey crashes and comes back empty while pipeline runs are between stages: their live
    hashes and queued stage messages are gone; Postgres still has every stage, and the
    reconciler dispatches the due stages again."""
    h.worker()
    h.worker()
    h.loops()
    with h.load(h.n(60), _pipes(50, 200, h), per_s=10):
        h.pause(2.5)
        h.valkey.restart()
        h.fault("Valkey restart without AOF")
    # A stage running across the restart is stopped by its own watch (its run's hash, with the
    # stages' states, is gone); its run is resumed as an orphan's, the lost attempt counted.
    h.settle(SCENARIOS["pipeline-valkey-restart"].bound_s)
    return _expect_all_completed(h, "across the Valkey restart between stages")


# --- children (issue 40) -------------------------------------------------------------------

# The children scenario's tasks (tests/faults/cluster_tasks.py), which the test registry
# (LUMASTRA_TASK_MODULES) does not name.
CHILDREN_MODULE = "tests.faults.cluster_tasks"
FAN_TASK = "test-fault-fan"
# Each parent's children, and each child's work.
CHILDREN_PER_PARENT = (40, 60)
CHILD_MS = (20, 150)
# The loops' connections, terminated with the workers' (the leader's `batches` loop releases).
LOOPS_APP = "lumastra-faults-loops"
TERMINAL = tuple(s.value for s in TERMINAL_RUN_STATES)


def _children_registry() -> dict[str, str]:
    """The registry with the children scenario's tasks, installed again in the driver (its
    starts); returns the environment that names them to the scenario's workers and loops."""
    modules = settings.CONFIG.task_modules
    if CHILDREN_MODULE not in modules:
        modules = (*modules, CHILDREN_MODULE)
    if FAN_TASK not in registry.get():
        registry.install(registry.load(registry.BUILT_IN_MODULES + modules))
        celery_tasks.register_all(registry.get())
    return {"LUMASTRA_TASK_MODULES": ",".join(modules)}


@dataclass(frozen=True)
class _Flight:
    """The children of the scenario's parents, as Postgres has them now."""

    batches: int  # parents whose scan wrote its batch
    least_open: int  # the fewest children a batch still waits for
    written: int
    ended: int

    @property
    def live(self) -> int:
        return self.written - self.ended


def _flight(parents: list[str]) -> _Flight:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*), coalesce(min(open), 0), coalesce(sum(total), 0), "
            "coalesce(sum(total - open), 0) FROM run_batches WHERE parent_run_id = ANY(%s)",
            [parents],
        )
        batches, least_open, written, ended = cursor.fetchone()
    return _Flight(int(batches), int(least_open), int(written), int(ended))


def _terminate(apps: list[str]) -> int:
    """pg_terminate_backend on every connection of the named applications; how many."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE application_name = ANY(%s)",
            [apps],
        )
        return int(cursor.fetchone()[0])


def children(h: Harness) -> list[str]:
    """Fan-out pipelines (`test-fault-fan`: `scan` spawns 40-60 children of 20-150 ms each,
    `on_failure="continue"`; `gather` awaits them) whose children are in flight when Valkey
    crashes and comes back empty (the children's live hashes and queued messages gone), and
    Postgres then terminates the workers' and the loops' connections again and again, once
    the children run again (published anew by the pending check). The
    counts that make `gather` due are Postgres's (`run_batches`, counted by a trigger on each
    child's end), so: every parent and every child completes, each child enters a terminal
    state once, and each parent's `gather` runs once, after its last child ended, seeing all
    of its children completed (its result, kept in `task_history.stage_results`)."""
    tasks_env = _children_registry()
    workers = {**tasks_env, "DATABASE_URL": _worker_url(database_url())}
    h.worker(env=workers)
    h.worker(env=workers)
    h.loops(env={**tasks_env, "DATABASE_URL": f"{database_url()}?application_name={LOOPS_APP}"})
    tag = f"{time.time_ns():x}"  # no parent (nor child) meets the identity of an earlier one

    def make(index: int) -> tuple[str, dict[str, Any]]:
        count = h.rng.randint(*CHILDREN_PER_PARENT)
        low, high = CHILD_MS
        return FAN_TASK, {
            "label": f"fan-{tag}-{index}",
            "count": count,
            "low_ms": low,
            "high_ms": high,
        }

    with h.load(h.n(6), make):
        pass
    parents = list(h.started)

    # Every scan has written its children, and some of them have ended while every parent
    # still waits for some: the faults come with children of every parent in flight.
    def in_flight() -> _Flight | None:
        found = _flight(parents)
        spawned = found.batches == len(parents)
        return (
            found if spawned and found.least_open and found.ended >= found.written // 20 else None
        )

    flight = h.wait(in_flight, 60, "every parent's children written, some ended")
    h.notes["children written / ended / least a parent waited for, at the Valkey restart"] = [
        flight.written,
        flight.ended,
        flight.least_open,
    ]
    h.notes["Valkey down (s)"] = round(h.valkey.restart(), 2)
    h.fault("Valkey restart without AOF (children in flight)")
    restarted = time.monotonic()
    # The children's messages went with Valkey: they wait for the pending check to publish
    # them again. The connections are terminated once children run again, while they run:
    # once more have ended than the ones running at the restart (four pool processes) could.
    h.pause(1.0)
    after = _flight(parents).ended
    h.wait(
        lambda: _flight(parents).ended >= after + 8, 60, "children running again after the restart"
    )
    h.notes["children running again after the restart (s)"] = round(time.monotonic() - restarted, 1)
    terminated, live_at = 0, []
    for _ in range(h.n(4)):
        live_at.append(_flight(parents).live)
        terminated += _terminate([WORKER_APP, LOOPS_APP])
        h.fault("pg_terminate_backend of the workers' and the loops' connections")
        h.pause(1.0)
    h.notes["children live at each pg_terminate_backend"] = live_at
    h.notes["backends terminated"] = terminated
    h.settle(SCENARIOS["children"].bound_s)
    h.notes["published again by the pending check"] = h.log_count(
        None, "its message is not in the broker"
    )
    h.notes["parents not moved on by their batch's release"] = h.log_count(
        None, "not moved on after its batch"
    )
    h.notes["parents moved on by the stalled-pipeline recovery"] = h.log_count(
        None, "stalled between stages"
    )

    problems = _expect_all_completed(h, "with their children across the faults")
    problems += _children_ended_once(h, parents)
    problems += _gathered_once(h, parents)
    if not flight.live:
        problems.append("no child was in flight at the Valkey restart")
    if not any(live_at):
        problems.append("no child was in flight at any pg_terminate_backend")
    return problems


def _children_ended_once(h: Harness, parents: list[str]) -> list[str]:
    """Each parent has the children its input asked for, in one batch, each completed after
    exactly one terminal transition (task_history_audit)."""
    rows = TaskHistory.objects.filter(id__in=parents).values_list("id", "input")
    asked = {run_id: int(input_["count"]) for run_id, input_ in rows}
    kids = TaskHistory.objects.filter(parent_run_id__in=parents)
    found = list(kids.values_list("id", "parent_run_id", "state", "attempts"))
    by_parent = Counter(parent for _, parent, _, _ in found)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT run_id, count(*) FILTER (WHERE to_state = ANY(%s)), "
            "array_agg(to_state ORDER BY id) FROM task_history_audit "
            "WHERE run_id = ANY(%s) GROUP BY run_id",
            [list(TERMINAL), [run_id for run_id, _, _, _ in found]],
        )
        trails = {run_id: (int(ends), trail) for run_id, ends, trail in cursor.fetchall()}
    batches = {
        b.parent_run_id: b
        for b in RunBatch.objects.filter(parent_run_id__in=parents, parent_stage="scan")
    }
    h.notes["parents / children"] = [len(parents), len(found)]
    h.notes["children that took more than one attempt"] = sum(1 for *_, n in found if n > 1)
    h.notes["batches released by the leader"] = sum(
        1 for b in batches.values() if b.released_at is not None
    )
    problems = []
    wrong_count = {p: [by_parent[p], n] for p, n in asked.items() if by_parent[p] != n}
    if wrong_count:
        problems.append(
            f"{len(wrong_count)} parents without the children they spawned "
            f"(found, asked): {sorted(wrong_count.items())[:3]}"
        )
    not_done = [(r, p, s) for r, p, s, _ in found if s != "completed"]
    if not_done:
        problems.append(f"{len(not_done)} children did not complete: {not_done[:3]}")
    not_once = {r: trails.get(r) for r, _, _, _ in found if trails.get(r, (0, []))[0] != 1}
    if not_once:
        problems.append(
            f"{len(not_once)} children did not end exactly once (ends, trail): "
            f"{sorted(not_once.items())[:3]}"
        )
    for parent, n in asked.items():
        batch = batches.get(parent)
        seen = None if batch is None else (batch.total, batch.open, batch.counts)
        if seen != (n, 0, {"completed": n}):
            problems.append(
                f"parent {parent}: its batch (total, open, counts) is {seen}, not "
                f"{(n, 0, {'completed': n})}"
            )
    return problems


def _gathered_once(h: Harness, parents: list[str]) -> list[str]:
    """Each parent's `gather` ran once (one entry, one claim), after its last child's terminal
    transition, and returned every child completed."""
    rows = TaskHistory.objects.filter(id__in=parents).values_list(
        "id", "input", "stage_results", "steps"
    )
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT h.parent_run_id, max(a.at) FROM task_history_audit a "
            "JOIN task_history h ON h.id = a.run_id "
            "WHERE h.parent_run_id = ANY(%s) AND a.to_state = ANY(%s) GROUP BY h.parent_run_id",
            [parents, list(TERMINAL)],
        )
        last_end = {parent: at.timestamp() for parent, at in cursor.fetchall()}
    entries: dict[str, list[float]] = {}
    for entry in read_effects(h.effects_path):
        if entry.stage == "gather":
            entries.setdefault(entry.run, []).append(entry.at)
    problems = []
    margins = []
    for run_id, input_, results, steps in rows:
        n = int(input_["count"])
        seen = (results or {}).get("gather")
        if seen != {"children": n, "completed": n}:
            problems.append(f"parent {run_id}: gather saw {seen}, not all {n} children completed")
        attempts = ((steps or {}).get("gather") or {}).get("attempts")
        at = sorted(entries.get(run_id, []))
        if len(at) != 1 or attempts != 1:
            problems.append(
                f"parent {run_id}: gather entered {len(at)} times under {attempts} claims, not once"
            )
        ended = last_end.get(run_id)
        if at and ended is not None:
            margins.append(at[0] - ended)
            if at[0] < ended:
                problems.append(
                    f"parent {run_id}: gather entered {ended - at[0]:.3f} s before its last "
                    "child ended"
                )
    if margins:
        h.notes["gather entered after the last child's end (s, least / most)"] = [
            round(min(margins), 3),
            round(max(margins), 3),
        ]
    return problems


# --- partitions between hosts (issue 26) ---------------------------------------------------

# Longer than the orphan threshold (6 s here): host A's runs are resumed elsewhere meanwhile.
FULL_CUT_S = 15.0


def _slow_and_pipes(h: Harness) -> Callable[[int], Any]:
    """Three runs in four of the slow-progress task (0.5-2.5 s of progress reports), one
    four-stage pipeline (0.2-0.6 s a stage)."""

    def make(index: int) -> tuple[str, dict[str, Any]]:
        if index % 4 == 3:
            return "test-fault-pipe", {"ms": h.rng.randint(200, 600)}
        return "test-fault-resume", {"ms": h.rng.randint(500, 2500)}

    return make


def partition_full(h: Harness) -> list[str]:
    """Host A is cut from both stores (its packets to and from Valkey and Postgres dropped,
    as on a dead link) for longer than the orphan threshold, its handlers running. Its runs
    must be resumed on host B; A's handlers must stop themselves at their lease, before B
    resumes them, so nothing runs twice at once; A's late writes after the heal are refused
    by the fences; A takes runs again once healed; every run completes."""
    assert h.network is not None and h.postgres is not None
    a = h.network.hosts["hosta"]
    role_a = _leading_host_a(h)
    count = h.n(200)
    with h.load(count, _slow_and_pipes(h)):
        h.wait(lambda: len(h.active_runs_of(role_a)) >= 2, 60, "host A running runs")
    on_a = h.active_runs_of(role_a)
    with _watch_seat() as samples:
        cut_at, healed = h.cut_for(
            a, (h.valkey.port, h.postgres.port), FULL_CUT_S, "host A cut from Valkey and Postgres"
        )
    # Recorded, not asserted: the cut is as long as the seat's lease, so whether host B takes
    # it before host A is back and renews is a race the design leaves open.
    h.leader_failover_s = _failover_s(samples, a.name, cut_at)
    h.notes["runs on host A at the cut"] = len(on_a)
    h.settle(SCENARIOS["partition-full"].bound_s)
    log_a = role_a.name
    stopped = h.log_count(role_a, "no heartbeat confirmed")
    h.notes["host A handlers stopped at their lease"] = stopped
    h.notes["host A late writes refused (no longer ours / not recorded)"] = h.log_count(
        role_a, "no longer ours"
    ) + h.log_count(role_a, "not recorded")
    h.notes["resumed after host A went silent (reconciler)"] = h.log_count(None, "orphaned")
    after = [e for e in read_effects(h.effects_path) if e.at > healed]
    h.notes["entries on host A after the heal"] = sum(e.owner.startswith("hosta:") for e in after)
    problems = _expect_all_completed(h, f"across host A's {FULL_CUT_S:.0f} s cut ({log_a})")
    if not stopped:
        problems.append("no handler of host A stopped itself while cut off")
    return problems


# Five orphan thresholds (6 s here): long enough that a run judged by one store alone would
# have been resumed elsewhere several times over.
ONE_STORE_CUT_S = 30.0


def _partition_one_store(h: Harness, store: str) -> tuple[Worker, list[str]]:
    """Host A cut from one store (`valkey` or `postgres`) for ONE_STORE_CUT_S under a load of
    200 runs, the other store still reachable; host B beside it. Returns A's role and the
    common problems: a run not completed."""
    assert h.network is not None and h.postgres is not None
    a = h.network.hosts["hosta"]
    role_a = _leading_host_a(h)
    port = h.valkey.port if store == "valkey" else h.postgres.port
    with h.load(h.n(200), _slow_and_pipes(h)):
        h.wait(lambda: len(h.active_runs_of(role_a)) >= 2, 60, "host A running runs")
    h.notes["runs claimed by host A at the cut"] = len(h.active_runs_of(role_a))
    with _watch_seat() as samples:
        cut_at, _ = h.cut_for(a, (port,), ONE_STORE_CUT_S, f"host A cut from {store}")
    h.leader_failover_s = _failover_s(samples, a.name, cut_at)
    h.settle(SCENARIOS[f"partition-{store}"].bound_s)
    h.notes["host A handlers stopped at their lease"] = h.log_count(
        role_a, "no heartbeat confirmed"
    )
    seat = keys.orchestrator_lock(CLUSTER)
    h.notes["cluster seat lost by host A"] = h.log_count(role_a, f"leader: lost {seat}")
    h.notes["cluster seat taken by host B"] = h.log_count(None, f"leader: now leading {seat}") - (
        h.log_count(role_a, f"leader: now leading {seat}")
    )
    h.notes["terminal writes queued in the drain"] = h.log_count(None, "queued in the drain")
    h.notes["resumed as orphans"] = h.log_count(None, "orphaned; retry in")
    problems = _expect_all_completed(h, f"across host A's {ONE_STORE_CUT_S:.0f} s cut from {store}")
    return role_a, problems


def partition_valkey(h: Harness) -> list[str]:
    """Host A cut from Valkey only (its broker too: the scenario's one server holds both) for
    30 s, Postgres still reachable: its heartbeats reach Postgres, so its runs are not orphans
    (the reconciler needs both stores silent) and finish there, their Valkey side repaired
    after the heal; the cluster seat, if it held it, moves to host B. Every run completes, none
    twice at once."""
    role_a, problems = _partition_one_store(h, "valkey")
    if h.log_count(role_a, "no heartbeat confirmed"):
        problems.append("a handler of host A stopped itself though Postgres still heard it")
    # Host A's last renewal can be up to a renewal interval before the cut; host B takes the
    # seat once the lease has run out, after its jitter.
    config = settings.CONFIG
    within_s = config.leader_ttl_s + config.leader_jitter_s + SEAT_SLACK_S
    if h.leader_failover_s is None:
        problems.append("the cluster seat never left host A while it was cut from Valkey")
    elif h.leader_failover_s > within_s:
        problems.append(f"the cluster seat moved {h.leader_failover_s} s after the cut")
    return problems


def partition_postgres(h: Harness) -> list[str]:
    """Host A cut from Postgres only for 30 s, Valkey still reachable: its heartbeats reach
    Valkey, so its runs are not orphans and finish; their terminal writes, and the ends of
    pipeline stages that ended during the cut, wait in the drain and are replayed once
    Postgres is back, and the pipelines advance from there. No run is failed for it, and no
    stage is entered twice by one pool child (the checker's "at most once per claim")."""
    role_a, problems = _partition_one_store(h, "postgres")
    h.notes["stage ends queued in the drain"] = h.log_count(None, "waits in the drain")
    if h.leader_failover_s is not None:
        problems.append(
            f"the cluster seat left host A, which Valkey still heard, "
            f"{h.leader_failover_s} s into its cut from Postgres"
        )
    if h.log_count(role_a, "no heartbeat confirmed"):
        problems.append("a handler of host A stopped itself though Valkey still heard it")
    return problems


# The web replica's cut: long enough for each client thread to be refused several times over
# (a start fails within the store timeout, 2 s here) and for more than one pending check (5 s
# here) to pass meanwhile; starts go on 8 s before it and 10 s after.
WEB_CUT_S = 12.0
WEB_BEFORE_S, WEB_AFTER_S = 8.0, 10.0
WEB_STARTS_PER_S = 4.0
# Beside the API's starts, runs the driver starts itself (not through the cut replica), so that
# 200 runs are in flight on host A as in the other partition scenarios.
WEB_BESIDE_RUNS = 200
# A start asked this long after the heal finds the web role's Valkey connections made anew.
WEB_RECOVERED_AFTER_S = 5.0


def partition_web(h: Harness) -> list[str]:
    """A web replica (the real web role, `deploy/start-web.sh`, on host `webhost`) cut from
    Valkey (and the broker on it) for 12 s, Postgres still reachable, while clients start runs
    through its API (`POST /api/v1/runs`, 4 a second from 8 threads, from 8 s before the cut
    to 10 s after the heal), beside 200 runs the driver starts over the same time; host A runs
    the worker role.

    Every start is answered: 202 with a run whose row exists (the checker's "lost"), or an
    error status with the API's error body (`detail`) and no row written for it (the
    scenario's own database holds exactly the runs answered 202). Every run answered 202
    completes, any the replica recorded but could not seed or publish included (the
    reconciler's pending check publishes them; the notes count them). At least one start
    is refused during the cut (else it proved nothing), and every start asked 5 s or more
    after the heal is answered 202: the replica recovers on its own.

    What the replica does meanwhile: a request with a bearer token reads the failed sign-in
    count in Valkey before anything else (`orchestrator.api.throttle`), so a start asked
    during the cut is answered 503 (`unavailable`) within the store timeout, before
    `start_run` is called; only a start already past its admission when the cut begins can
    be recorded and left unpublished."""
    assert h.network is not None
    web_host = h.network.hosts["webhost"]
    web, url = h.host_web(web_host)
    h.host_role(h.network.hosts["hosta"])
    token = h.api_token()
    span_s = WEB_BEFORE_S + WEB_CUT_S + WEB_AFTER_S
    count = h.n(round(span_s * WEB_STARTS_PER_S))
    beside = h.n(WEB_BESIDE_RUNS)
    with (
        h.load(beside, _slow_and_pipes(h), per_s=beside / span_s),
        h.http_load(url, token, count, _slow_and_pipes(h), WEB_STARTS_PER_S) as answers,
    ):
        h.pause(WEB_BEFORE_S)
        cut_at, healed_at = h.cut_for(
            web_host, (h.valkey.port,), WEB_CUT_S, "web host cut from Valkey"
        )
    h.settle(SCENARIOS["partition-web"].bound_s)

    def phase(answer: Answer) -> str:
        if answer.asked_at < cut_at:
            return "before the cut"
        return "during the cut" if answer.asked_at < healed_at else "after the heal"

    by_phase: dict[str, Counter[str]] = {}
    for answer in answers:
        by_phase.setdefault(phase(answer), Counter())[str(answer.status or "no answer")] += 1
    h.notes["answers by phase (status: count)"] = {k: dict(v) for k, v in by_phase.items()}
    accepted = sum(1 for a in answers if a.run_id is not None)
    h.notes["starts answered 202 / refused"] = [accepted, len(answers) - accepted]
    h.notes["runs the driver started beside them"] = len(h.started) - accepted
    h.notes["slowest answer (s)"] = round(max((a.took_s for a in answers), default=0), 1)
    # A start asked in the cut's last moments is answered once its packets get through.
    h.notes["answered 202 though asked during the cut (s into the cut, s to answer)"] = [
        [round(a.asked_at - cut_at, 1), round(a.took_s, 1)]
        for a in answers
        if a.run_id is not None and phase(a) == "during the cut"
    ]
    refused = [a for a in answers if a.run_id is None]
    if refused:
        h.notes["a refusal (status, body)"] = [refused[0].status, refused[0].body[:200]]
    h.notes["recorded by the web role but not published (its log)"] = h.log_count(
        web, "recorded but not published"
    )
    h.notes["published again by the pending check"] = h.log_count(
        None, "its message is not in the broker"
    )

    problems = _expect_all_completed(h, "of those answered 202 or started beside them")
    if silent := [a for a in answers if a.status is None]:
        problems.append(f"{len(silent)} starts got no answer: {silent[0].error}")
    if unclear := [a for a in refused if a.status is not None and not a.detail()]:
        problems.append(
            f"{len(unclear)} refusals without the API's error body: {unclear[0].status} "
            f"{unclear[0].body[:200]!r}"
        )
    # The scenario's own database: every row in it was written by a start answered 202 or
    # by the driver's own.
    written = set(TaskHistory.objects.values_list("id", flat=True))
    if unanswered := sorted(written - set(h.started)):
        problems.append(
            f"{len(unanswered)} rows written for starts not answered 202: {unanswered[:3]}"
        )
    if not sum(1 for a in refused if phase(a) == "during the cut"):
        problems.append("no start was refused during the cut")
    late = [a for a in refused if a.asked_at >= healed_at + WEB_RECOVERED_AFTER_S]
    if late:
        problems.append(
            f"{len(late)} starts refused {WEB_RECOVERED_AFTER_S:.0f} s or more after the heal: "
            f"{late[0].status} {late[0].body[:200]!r}"
        )
    return problems


# The lossy link: a share of host A's packets to and from Valkey dropped, both ways, for a
# minute, after 10 s of the same load on a clean link to compare its throughput with.
LOSS_PERCENT = 30
LOSS_S = 60.0
LOSSY_BEFORE_S = 10.0
LOSSY_STARTS_PER_S = 3.5
# The slow-progress runs' longest: completions before it are the load still ramping up.
RAMP_S = 2.5
# Sampling slack when comparing a holder change with the lease the last sample showed.
SEAT_SLACK_S = 0.5


@dataclass(frozen=True)
class _SeatSample:
    at: float  # time.time() once read
    holder: str  # the instance id holding the seat, "" when nobody does
    lease_s: float  # what was left of the holder's lease


@contextmanager
def _watch_seat(every_s: float = 0.2) -> Iterator[list[_SeatSample]]:
    """Read the cluster seat (its holder and its lease's remaining time, in one MULTI) every
    `every_s` from the driver, which no cut reaches, while the block runs."""
    samples: list[_SeatSample] = []
    stop = threading.Event()
    key = keys.orchestrator_lock(CLUSTER)

    def body() -> None:
        while not stop.wait(every_s):
            pipe = valkey.client().pipeline(transaction=True)
            pipe.get(key)
            pipe.pttl(key)
            try:
                token, ttl_ms = valkey.execute(pipe)
            except redis.RedisError:
                # The driver's own path to Valkey is never cut: a failure here is the
                # server's, and the gap in the samples shows it.
                log.exception("reading %s failed", key)
                continue
            samples.append(_SeatSample(time.time(), instance_of(token or ""), ttl_ms / 1000))

    thread = threading.Thread(target=body, name="seat-watch", daemon=True)
    thread.start()
    try:
        yield samples
    finally:
        stop.set()
        thread.join()


def _handovers(samples: list[_SeatSample]) -> list[tuple[_SeatSample, _SeatSample]]:
    """Each change of holder: the last sample of the one before, the first of the next."""
    found = []
    last: _SeatSample | None = None
    for sample in samples:
        if not sample.holder:
            continue
        if last is not None and sample.holder != last.holder:
            found.append((last, sample))
        last = sample
    return found


def _per_s(times: list[float], since: float, until: float) -> float:
    return round(sum(1 for t in times if since <= t < until) / (until - since), 2)


def partition_lossy(h: Harness) -> list[str]:
    """Host A's link to Valkey (and the broker on it) drops 30 % of its packets, both ways, for
    60 s, while host A leads the cluster seat (`lock:orch:cluster`) and a steady load (245
    runs at 3.5 a second: slow-progress runs and four-stage pipelines, from 10 s before the
    loss) runs on host A and host B. Every run completes (and the checker's: none lost, stuck,
    illegal, over-executed or twice at once). The cluster seat, read every 0.2 s from the
    driver, changes holder only once the previous holder's lease has run out (no change
    earlier than the lease its last sample showed, with 0.5 s of slack), so at most once a
    lease. Notes the runs completed per second and host A's handler entries per second before
    and during the loss, the seat's handovers and host A's failed renewals."""
    assert h.network is not None
    a = h.network.hosts["hosta"]
    # Its renewals are what cross the bad link.
    role_a = _leading_host_a(h)
    count = h.n(round((LOSSY_BEFORE_S + LOSS_S) * LOSSY_STARTS_PER_S))
    with _watch_seat() as samples:
        with h.load(count, _slow_and_pipes(h), per_s=LOSSY_STARTS_PER_S):
            loaded_at = time.time()
            h.pause(LOSSY_BEFORE_S)
            lossy_at, healed_at = h.cut_for(
                a,
                (h.valkey.port,),
                LOSS_S,
                f"host A's link to Valkey dropping {LOSS_PERCENT} % of packets",
                loss_percent=LOSS_PERCENT,
            )
        h.settle(SCENARIOS["partition-lossy"].bound_s)

    finished = TaskHistory.objects.filter(id__in=h.started, state="completed")
    ends = [t.timestamp() for t in finished.values_list("finished_at", flat=True) if t]
    on_a = [e.at for e in read_effects(h.effects_path) if e.owner.startswith(f"{a.name}:")]
    before = (loaded_at + RAMP_S, lossy_at)
    h.notes["runs completed per second before / during the loss"] = [
        _per_s(ends, *before),
        _per_s(ends, lossy_at, healed_at),
    ]
    h.notes["host A's handler entries per second before / during the loss"] = [
        _per_s(on_a, *before),
        _per_s(on_a, lossy_at, healed_at),
    ]
    handovers = _handovers(samples)
    lease_s = settings.CONFIG.leader_ttl_s
    watched_s = samples[-1].at - samples[0].at if samples else 0.0
    h.notes["cluster seat handovers (s after the loss began: from, to)"] = [
        [round(new.at - lossy_at, 1), old.holder, new.holder] for old, new in handovers
    ]
    h.notes["cluster seat watched (s), handovers its lease allows in that time"] = [
        round(watched_s),
        int(watched_s // lease_s) + 1,
    ]
    seat = keys.orchestrator_lock(CLUSTER)
    lost = _logged_at(h.log_lines(role_a, f"leader: lost {seat}"))
    led = _logged_at(h.log_lines(None, f"leader: now leading {seat}"))
    h.notes["host A: cluster seat lost on a failed renewal / taken again"] = [
        len(lost),
        h.log_count(role_a, f"leader: now leading {seat}") - 1,
    ]
    # A failed renewal stops the holder's loops at once; nobody else may take the seat
    # before its lease ends, so the cluster's once-per-cluster loops wait meanwhile.
    h.notes["cluster loops led by nobody after each lost renewal (s; null: to the end)"] = [
        next((round(t - at, 1) for t in led if t > at), None) for at in lost
    ]
    h.notes["host A handlers stopped at their lease"] = h.log_count(
        role_a, "no heartbeat confirmed"
    )
    h.notes["resumed as orphans"] = h.log_count(None, "orphaned; retry in")
    problems = _expect_all_completed(h, f"across {LOSS_S:.0f} s of a lossy link to Valkey")
    for old, new in handovers:
        if new.at < old.at + old.lease_s - SEAT_SLACK_S:
            problems.append(
                f"the cluster seat went from {old.holder} to {new.holder} "
                f"{old.at + old.lease_s - new.at:.1f} s before the lease ran out"
            )
    if not samples:
        problems.append("the cluster seat was never read")
    return problems


def _logged_at(lines: list[str]) -> list[float]:
    """When each log line was written (the logging format's leading timestamp), sorted."""
    return sorted(
        datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp() for line in lines
    )


def _leading_host_a(h: Harness) -> Worker:
    """Host A's role, started first and leading the cluster seat (`lock:orch:cluster`), then
    host B's beside it; returns host A's."""
    assert h.network is not None
    a = h.network.hosts["hosta"]
    role_a = h.host_role(a)
    h.wait(lambda: _cluster_holder().startswith(f"{a.name}:"), 30, "host A leading the cluster")
    h.host_role(h.network.hosts["hostb"])
    return role_a


def _failover_s(samples: list[_SeatSample], host: str, cut_at: float) -> float | None:
    """Seconds from the cut of `host` to the first sample of the seat held by another host;
    None if it never was while watched."""
    for sample in samples:
        if sample.at >= cut_at and sample.holder and not sample.holder.startswith(f"{host}:"):
            return round(sample.at - cut_at, 1)
    return None


def _cluster_holder() -> str:
    return instance_of(str(valkey.client().get(keys.orchestrator_lock(CLUSTER)) or ""))


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario(
            "sigkill",
            "SIGKILL of pool children and worker main processes",
            sigkill,
        ),
        Scenario(
            "resume",
            "runs of seconds resumed after SIGKILL of pool children and whole workers",
            resume,
        ),
        Scenario("sigterm", "SIGTERM (warm shutdown) mid-run", sigterm_expect),
        Scenario(
            "rolling-restart",
            "a rolling restart of every worker role under load (grace, then hand back)",
            rolling_restart,
        ),
        Scenario("sigstop", "SIGSTOP past the orphan threshold, then SIGCONT", sigstop),
        Scenario("valkey-restart", "Valkey crash and restart without AOF", valkey_restart),
        Scenario(
            "valkey-restart-aof",
            "Valkey crash and restart with AOF, and SCRIPT FLUSH",
            valkey_restart,
            aof=True,
        ),
        Scenario("pg-terminate", "pg_terminate_backend of the workers' connections", pg_terminate),
        Scenario("pg-outage", "Postgres unreachable for a few seconds", pg_outage),
        Scenario(
            "pg-crash",
            "Postgres itself crashed (pg_ctl stop -m immediate) mid-drain, started 5 s later",
            pg_crash,
            own_postgres=True,
        ),
        Scenario("duplicates", "the same message delivered many times", duplicates),
        Scenario("poison", "poison payloads and the circuit breaker", poison),
        Scenario("cancels", "cancels at random moments", cancels),
        Scenario("pipeline-sigkill", "SIGKILL of pool children mid-stage", pipeline_sigkill),
        Scenario(
            "pipeline-valkey-restart",
            "Valkey crash without AOF between pipeline stages",
            pipeline_valkey_restart,
        ),
        Scenario(
            "children",
            "children in flight while Valkey restarts empty and Postgres terminates connections",
            children,
        ),
        Scenario(
            "partition-full",
            "host A cut from Valkey and Postgres past the orphan threshold, handlers running",
            partition_full,
            hosts=("hosta", "hostb"),
            bound_s=90.0,
        ),
        Scenario(
            "partition-valkey",
            "host A cut from Valkey (and its broker) for 30 s, Postgres reachable",
            partition_valkey,
            hosts=("hosta", "hostb"),
            bound_s=90.0,
        ),
        Scenario(
            "partition-postgres",
            "host A cut from Postgres for 30 s, Valkey reachable",
            partition_postgres,
            hosts=("hosta", "hostb"),
            bound_s=90.0,
        ),
        Scenario(
            "partition-web",
            "a web replica cut from Valkey for 12 s while clients start runs through its API",
            partition_web,
            hosts=("webhost", "hosta"),
            bound_s=60.0,
        ),
        Scenario(
            "partition-lossy",
            "host A's link to Valkey dropping 30 % of its packets for 60 s, host A leading",
            partition_lossy,
            hosts=("hosta", "hostb"),
            bound_s=90.0,
        ),
        Scenario(
            "media",
            "real ffmpeg encodes with pool children SIGKILLed and runs cancelled mid-encode",
            media,
            needs=("media",),
        ),
        Scenario(
            "backlog",
            "a backlog far above max_concurrent, postponed thousands of times",
            backlog,
            bound_s=120.0,
        ),
    )
}
