"""The fault scenarios: each starts its workers and the loops, runs a load, breaks something for
real while the load runs, and returns the problems specific to it (the checker's common checks
run after every scenario).

Sizes are for `make test` on a 2-core machine; FAULTS_SCALE multiplies loads and fault counts
for a soak (docs/reliability.md).
"""

from __future__ import annotations

import itertools
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import connection

from orchestrator.models import TaskHistory
from orchestrator.runs.cancel import NotCancellable, request_cancel
from orchestrator.runs.publish import job_id, publish
from orchestrator.states import TERMINAL_RUN_STATES
from orchestrator.stores import broker, keys, valkey
from tasks import registry
from tests.faults.harness import QUEUES, Harness, _kill
from tests.faults.servers import PgProxy
from tests.support.fixtures import database_url

WORKER_APP = "lumastra-faults-worker"


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    run: Callable[[Harness], list[str]]
    aof: bool = False
    # Longest wait after the last fault for every run to end, before the rest counts as
    # stuck: the slowest recovery path the scenario can take (see docs/reliability.md).
    bound_s: float = 60.0


def _ended(run_ids: list[str]) -> bool:
    states = TaskHistory.objects.filter(id__in=run_ids).values_list("state", flat=True)
    return len(states) == len(run_ids) and all(s in TERMINAL_RUN_STATES for s in states)


# --- processes killed ---------------------------------------------------------------------


def sigkill(h: Harness) -> list[str]:
    """SIGKILL pool children again and again during a load, and twice a worker's main process
    (its children die with it); the role's supervisor would start a new worker: so do we."""
    h.worker()
    h.worker()
    h.loops()
    mains = {3, 7}
    with h.load(h.n(600), h.work(20, 200)):
        h.pause(2)
        for index in range(h.n(10)):
            if index % 10 in mains:
                victim = h.rng.choice(h.workers)
                _kill(victim.pid)
                h.fault("SIGKILL worker main process")
                h.retire(victim)
                h.worker()
            else:
                h.kill_random_child()
            h.pause(1.0)
    return []


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
    is stopped; SIGCONT it once the reconciler has ended both: their late writes are refused."""
    config = settings.CONFIG
    stopped = h.worker(concurrency=2)
    h.loops()
    # Short enough that, when the worker resumes, both handlers are past their sleep and try
    # their terminal write (unless their watch thread kills them first).
    long = [h.start("test-fault-work", {"ms": 5000}) for _ in range(2)]
    assert all(long)
    runs = [r for r in long if r]
    h.wait(lambda: sorted(h.active_runs_of(stopped)) == sorted(runs), 30, "both runs active")
    stopped.signal_all(signal.SIGSTOP)
    h.fault("SIGSTOP worker")
    stopped_at = time.monotonic()
    assert request_cancel(runs[0], actor="faults") == "cancelling"
    h.fault("cancel of a stopped worker's run")
    h.worker()
    with h.load(h.n(200), h.work(20, 200)):
        bound = config.orphan_threshold_s + 4 * config.reconcile_interval_s + 10
        h.wait(lambda: _ended(runs), bound, "the stopped worker's runs ended by the reconciler")
        h.notes["stopped worker's runs ended after (s)"] = round(time.monotonic() - stopped_at, 1)
    h.pause(1)
    stopped.signal_all(signal.SIGCONT)
    h.fault("SIGCONT worker")
    # Its handlers wake past their sleep and try to end their runs; its watch threads beat.
    h.pause(3 * config.heartbeat_interval_s + 3)
    problems = []
    rows = {r.id: r for r in TaskHistory.objects.filter(id__in=runs)}
    expected = {runs[0]: ("cancelled", "orphaned"), runs[1]: ("failed", "orphaned")}
    for run_id, (state, kind) in expected.items():
        row = rows[run_id]
        found = (row.state, (row.error or {}).get("kind"))
        if found != (state, kind):
            problems.append(f"stopped worker's run {run_id}: {found}, expected {(state, kind)}")
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
    return []


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
    return []


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
    return []


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
    return []


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
    stage is tried again when its message comes back; none runs twice under one claim, and
    every run ends with no stage left open. A run may still fail, as a plain run does under
    these kills: `worker_lost` when its stage was killed on every attempt, `orphaned` when the
    killed stage's message came back after the (here 6 s) orphan threshold."""
    h.worker()
    h.worker()
    h.loops()
    with h.load(h.n(60), _pipes(50, 300, h)):
        h.pause(1.5)
        for _ in range(h.n(8)):
            h.kill_random_child()
            h.pause(0.8)
    h.settle(60)
    retried = h.log_count(None, "worker_lost; retry in")
    h.notes["stages tried again after their worker died"] = retried
    ended = TaskHistory.objects.filter(id__in=h.started).exclude(state="completed")
    unexpected = [
        (run_id, state, error)
        for run_id, state, error in ended.values_list("id", "state", "error")
        if (error or {}).get("kind") not in ("worker_lost", "orphaned")
    ]
    problems = [f"{len(unexpected)} runs ended otherwise: {unexpected[:3]}"] if unexpected else []
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
    # A stage running across the restart is stopped by its own watch (its hash is gone) and
    # its run fails as an orphan; the common checks say nothing was lost, stuck or left open.
    return []


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario(
            "sigkill",
            "SIGKILL of pool children and worker main processes",
            sigkill,
        ),
        Scenario("sigterm", "SIGTERM (warm shutdown) mid-run", sigterm_expect),
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
            "backlog",
            "a backlog far above max_concurrent, postponed thousands of times",
            backlog,
            bound_s=120.0,
        ),
    )
}
