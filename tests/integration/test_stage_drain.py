"""A pipeline stage's end that Postgres refused, carried by the drain, on real Postgres and Redis.

Postgres refuses for real: the end-to-end test terminates the Postgres sessions of a real
worker (pg_terminate_backend) while its stage runs, so the end's `move_stage` fails as it does
when Postgres is unreachable; another terminates the replayer's own session. The other tests
seed a run whose stage a process claimed (`durable.claim_stage`) and push the entry its writer
would have pushed. Nothing of ours is patched.
"""

from __future__ import annotations

import json
import socket
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import psycopg2
import pytest
from django.conf import settings
from django.db import connection

from orchestrator.cluster.leaders import CLUSTER
from orchestrator.models import TaskHistory
from orchestrator.recovery import drain_replay
from orchestrator.recovery.reconciler import Reconciler
from orchestrator.routing import queue_name, stage_queue
from orchestrator.runs import drain, stage_attempts
from orchestrator.runs.cancel import request_cancel
from orchestrator.runs.publish import stage_message_id
from orchestrator.runs.start import start_run
from orchestrator.states import RunState, StageState
from orchestrator.stores import broker, durable, keys, live, valkey
from orchestrator.triggers import TriggerKind
from tasks import registry
from tests.support.fixtures import database_url, wait_for, worker_process
from tests.support.runs import clean_drain, seed_active
from tests.support.task_defs import PIPE_CALLS_KEY

pytestmark = [pytest.mark.django_db(transaction=True)]

OWNER = "host-b:777:CAFEBABE"  # the run's claim
CLAIMER = "host-b:778:STAGECLM"  # the process that claimed stage `a`
PIPE = "test-fault-pipe"  # a → b (cpu) and a → c, c → d; no worker of this module takes it
THRESHOLD = 300  # LUMASTRA_ORPHAN_THRESHOLD_S default
FINISHED_AT = datetime(2026, 11, 30, 12, 0, 0, 123000, tzinfo=UTC)


@pytest.fixture(autouse=True)
def _clean() -> None:
    clean_drain(CLUSTER)
    _empty_queues(PIPE)


def _queues(task_id: str) -> list[str]:
    definition = registry.get()[task_id]
    per_task = settings.CONFIG.per_task_queues
    found = {queue_name(definition, per_task)}
    found.update(stage_queue(definition, s, per_task) for s in definition.pipeline)
    return sorted(found)


def _empty_queues(task_id: str) -> None:
    broker.client().delete(
        *(
            keys.broker_queue(q, step)
            for q in _queues(task_id)
            for step in keys.BROKER_PRIORITY_STEPS
        )
    )


def _published(run_id: str) -> list[str]:
    """The stages of `run_id` whose message waits in a queue of PIPE."""
    found = []
    for queue in _queues(PIPE):
        for step in keys.BROKER_PRIORITY_STEPS:
            for raw in broker.client().lrange(keys.broker_queue(queue, step), 0, -1):
                message_id = json.loads(raw)["headers"]["id"]
                found += [
                    name
                    for name in ("a", "b", "c", "d")
                    if message_id.endswith(stage_message_id(run_id, name))
                ]
    return sorted(found)


def _running_stage(claimer: str = CLAIMER) -> str:
    """A run of PIPE claimed by OWNER whose stage `a` `claimer` claimed, in both stores: what
    a stage's writer finds at its end. Its own message is taken out of its queue."""
    run_id = start_run(PIPE, {"ms": 1}, trigger=TriggerKind.MANUAL).run_id
    _empty_queues(PIPE)
    assert durable.claim(run_id, OWNER) is not None
    live.claim(run_id, OWNER, live.NO_PAUSE)
    assert durable.claim_stage(run_id, "a", "io", claimer) is not None
    live.transition_stage(run_id, "a", StageState.ACTIVE)
    return run_id


def _step(status: str, error: dict[str, Any] | None = None) -> dict[str, Any]:
    """The step record's end as `runs.steps.attempt_ended` writes it."""
    step: dict[str, Any] = {
        "status": status,
        "finished_at": FINISHED_AT.isoformat(),
        "cost": {"cpu_seconds": 0.25},
        "counters": {},
        "warnings": [],
    }
    if error is not None:
        step["error"] = {"kind": error["kind"], "message": error["message"]}
    return step


def _completed_args(claimer: str = CLAIMER) -> dict[str, Any]:
    return {
        "stage": "a",
        "result": {"stage": "a", "n": 12345678901234567},
        "step": _step("ok"),
        "cost": {"cpu_seconds": 0.25},
        "claimer": claimer,
    }


def _push(run_id: str, target: StageState, args: dict[str, Any], **then: Any) -> None:
    assert drain.push(run_id, target, args, OWNER, call=drain.MOVE_STAGE, then=then)


def _live_stage(run_id: str, stage: str) -> str:
    return str(live.read(run_id)[f"stage:{stage}"])


def _terminate(pids: list[int]) -> None:
    """Postgres drops these sessions, as it does when it restarts or the link dies."""
    other = psycopg2.connect(database_url())
    try:
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", [pids])
        other.commit()
    finally:
        other.close()


def _workers_backends() -> list[int]:
    """The Postgres sessions of the test database other than this test's own."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND backend_type = 'client backend' AND pid <> pg_backend_pid()"
        )
        return [pid for (pid,) in cursor.fetchall()]


# --- the replay: the writer's own call, then what the writer would have done ----------------


def test_a_completed_stage_is_moved_then_the_pipeline_advances() -> None:
    run_id = _running_stage()
    _push(run_id, StageState.COMPLETED, _completed_args())

    (entry,) = [json.loads(raw) for raw in valkey.client().lrange(keys.drain_pending(), 0, -1)]
    assert (entry["call"], entry["target"], entry["owner"]) == ("move_stage", "completed", OWNER)
    assert entry["args"]["claimer"] == CLAIMER
    assert drain.waiting_run_ids() == {run_id}
    assert drain.waiting_stages(run_id) == {"a"}

    report = drain_replay.replay()

    assert report.applied == 1
    row = TaskHistory.objects.get(id=run_id)
    assert (row.state, row.stages["a"]) == ("active", "completed")
    assert row.stage_results["a"] == {"stage": "a", "n": 12345678901234567}
    assert (row.steps["a"]["status"], row.steps["a"]["owner"]) == ("ok", CLAIMER)
    assert row.cost_breakdown == {"cpu_seconds": 0.25}
    assert _live_stage(run_id, "a") == "completed"
    # The advance: what depends on `a` alone is published, `d` (after `c`) is not.
    assert _published(run_id) == ["b", "c"]
    assert drain.depth() == (0, 0)


def test_a_failed_stage_is_moved_then_its_run_fails_with_the_stages_error() -> None:
    run_id = _running_stage()
    error = {"kind": "permanent", "message": "stage a: asked to fail", "stage": "a"}
    args = {"stage": "a", "step": _step("failed", error), "claimer": CLAIMER}
    _push(run_id, StageState.FAILED, args, error=error)

    assert drain_replay.replay().applied == 1

    row = TaskHistory.objects.get(id=run_id)
    assert (row.state, row.error) == ("failed", error)
    assert row.stages == {"a": "failed", "b": "skipped", "c": "skipped", "d": "skipped"}
    assert live.read(run_id)["state"] == "failed"
    assert _published(run_id) == []


def test_a_retry_is_moved_back_to_waiting_then_published_again() -> None:
    run_id = _running_stage()
    error = {"kind": "transient", "message": "flaky (attempt 1 of 3; retrying in 0.2s)"}
    args = {"stage": "a", "step": _step("waiting", error), "claimer": CLAIMER}
    _push(run_id, StageState.WAITING, args, delay_s=0.2, kind="transient")

    assert drain_replay.replay().applied == 1

    row = TaskHistory.objects.get(id=run_id)
    assert (row.state, row.stages["a"], row.steps["a"]["attempts"]) == ("active", "waiting", 1)
    assert _live_stage(run_id, "a") == "waiting"
    assert _published(run_id) == ["a"]


# --- idempotent as an end's replay is ---------------------------------------------------------


def test_a_move_postgres_already_has_is_not_made_twice_but_still_followed() -> None:
    # The UPDATE committed but its reply was lost: the writer pushed a move Postgres has.
    run_id = _running_stage()
    args = _completed_args()
    durable.move_stage(run_id, target=StageState.COMPLETED, **args)
    _push(run_id, StageState.COMPLETED, args)

    report = drain_replay.replay()

    assert report.already == 1 and report.applied == 0
    row = TaskHistory.objects.get(id=run_id)
    assert row.stages["a"] == "completed"
    assert row.cost_breakdown == {"cpu_seconds": 0.25}  # the cost is counted once
    # What the writer skipped is still done.
    assert _live_stage(run_id, "a") == "completed"
    assert _published(run_id) == ["b", "c"]
    assert drain.depth() == (0, 0)


def test_a_stage_claimed_anew_is_not_ended_by_its_old_claims_end() -> None:
    """Fenced by the stage claim that wrote it: its claimer was judged lost, the stage put
    back and claimed by another process; the old claim's deferred end must not end it."""
    run_id = _running_stage()
    _push(run_id, StageState.COMPLETED, _completed_args())
    durable.move_stage(run_id, "a", StageState.WAITING, claimer=CLAIMER)
    assert durable.claim_stage(run_id, "a", "io", "host-c:1:NEWCLAIM") is not None

    report = drain_replay.replay()

    assert report.superseded == 1 and report.already == 0
    row = TaskHistory.objects.get(id=run_id)
    assert (row.stages["a"], row.steps["a"]["owner"]) == ("active", "host-c:1:NEWCLAIM")
    assert row.stage_results == {}
    assert _published(run_id) == []


def test_a_stage_end_of_a_run_that_ended_otherwise_is_dropped() -> None:
    run_id = _running_stage()
    _push(run_id, StageState.COMPLETED, _completed_args())
    orphaned = {"kind": "orphaned", "message": "its worker stopped heartbeating"}
    durable.end(run_id, RunState.FAILED, error=orphaned, finished_at=FINISHED_AT)

    assert drain_replay.replay().superseded == 1

    row = TaskHistory.objects.get(id=run_id)
    assert (row.state, row.error) == ("failed", orphaned)
    assert row.stages["a"] == "failed"


def test_a_stage_end_replayed_after_a_cancel_lets_the_run_end_cancelled() -> None:
    """A cancel came while the end waited: the move is still made, as the writer's would be,
    and the run ends cancelled once no stage of it runs (here: when the next stage's message,
    published by the advance, finds its claim refused)."""
    run_id = _running_stage()
    _push(run_id, StageState.COMPLETED, _completed_args())
    assert request_cancel(run_id, actor="test") == RunState.CANCELLING

    assert drain_replay.replay().applied == 1

    row = TaskHistory.objects.get(id=run_id)
    assert (row.state, row.stages["a"]) == ("cancelling", "completed")
    assert _published(run_id) == ["b", "c"]
    definition = registry.get()[PIPE]
    stage_attempts.run_stage_message(PIPE, "b", run_id, definition.processing_version)

    row = TaskHistory.objects.get(id=run_id)
    assert (row.state, row.stages["a"]) == ("cancelled", "completed")
    assert live.read(run_id)["state"] == "cancelled"


def test_a_stage_end_postgres_keeps_refusing_is_retried_then_applied() -> None:
    run_id = _running_stage()
    _push(run_id, StageState.COMPLETED, _completed_args())
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (pid,) = cursor.fetchone()
    _terminate([pid])

    first = drain_replay.replay()

    assert first.retried == 1 and first.applied == 0
    assert drain.waiting_stages(run_id) == {"a"}
    assert TaskHistory.objects.get(id=run_id).stages["a"] == "active"
    assert drain_replay.replay(force=True).applied == 1
    assert TaskHistory.objects.get(id=run_id).stages["a"] == "completed"


# --- recovery leaves a stage whose end waits in the drain ------------------------------------


def _silent(run_id: str) -> None:
    """The run's heartbeat 400 s old, its live hash gone: an orphan by both stores, were it
    not for the stage end waiting in the drain."""
    valkey.client().delete(keys.run_active(run_id))
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE task_history SET heartbeat_at = now() - interval '400 seconds', "
            "started_at = now() - interval '500 seconds' WHERE id = %s",
            [run_id],
        )


def test_the_reconciler_does_not_try_again_a_stage_whose_end_waits_in_the_drain() -> None:
    run_id = _running_stage()
    _push(run_id, StageState.COMPLETED, _completed_args())
    _silent(run_id)
    # Postgres failed the last replays: the drain is backing off, so the tick's flush waits.
    valkey.client().set(keys.drain_backoff(), 3, px=60_000)

    reconciler = Reconciler()
    report = reconciler.tick()

    assert report.drain.backing_off
    assert report.in_drain == 1
    assert (report.orphans.put_back, report.orphans.orphaned) == (0, 0)
    assert TaskHistory.objects.get(id=run_id).stages["a"] == "active"
    # The stage recovery itself leaves it too, whoever calls it.
    definition = registry.get()[PIPE]
    assert stage_attempts.put_back_lost_stages(definition, run_id, "test", THRESHOLD) == 0
    assert TaskHistory.objects.get(id=run_id).stages["a"] == "active"
    assert _published(run_id) == []
    # The drain runs under the same cluster lock: the holder replays it.
    assert drain_replay.replay(force=True, fence=reconciler.lock).applied == 1
    reconciler.release()
    assert TaskHistory.objects.get(id=run_id).stages["a"] == "completed"
    assert _published(run_id) == ["b", "c"]


def test_a_dead_claimer_here_whose_stage_end_waits_is_not_tried_again() -> None:
    """Its claimer, a process of this host, ended the stage and died (a pool child killed
    at a worker's shutdown, `runs.handback`) while the end waited for Postgres."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    claimer = f"{socket.gethostname()}:{gone.pid}:GONE0000"
    run_id = _running_stage(claimer)
    _push(run_id, StageState.COMPLETED, _completed_args(claimer))
    definition = registry.get()[PIPE]

    stage_attempts.put_back_dead_stage(definition, run_id, "a")

    row = TaskHistory.objects.get(id=run_id)
    assert (row.stages["a"], row.steps["a"]["attempts"]) == ("active", 1)
    assert _published(run_id) == []
    assert drain_replay.replay().applied == 1
    assert TaskHistory.objects.get(id=run_id).stages["a"] == "completed"


def test_a_lost_stage_beside_one_whose_end_waits_is_tried_again() -> None:
    run_id = _running_stage()
    _push(run_id, StageState.COMPLETED, _completed_args())
    # `b` too is running, claimed by a process of another host that went silent.
    assert durable.claim_stage(run_id, "b", "cpu", "host-c:2:LOSTCLM") is not None
    _silent(run_id)
    definition = registry.get()[PIPE]

    assert stage_attempts.put_back_lost_stages(definition, run_id, "test", THRESHOLD) == 1

    row = TaskHistory.objects.get(id=run_id)
    assert (row.stages["a"], row.stages["b"]) == ("active", "waiting")
    assert _published(run_id) == ["b"]


# --- entries of a shape the drain does not write ---------------------------------------------


def test_an_end_without_then_is_read_and_a_row_columns_entry_is_poisoned() -> None:
    """`then` is optional (an end has nothing to follow); an entry holding the row's columns
    (`fields`, a shape no release wrote: Lumastra has none yet) is not guessed at."""
    named, columns = seed_active(OWNER), seed_active(OWNER)
    end = {
        "run_id": named,
        "call": "end",
        "target": "completed",
        "args": {"result": {"ok": True}, "finished_at": FINISHED_AT.isoformat()},
        "owner": OWNER,
        "attempts": 0,
    }
    fields = {
        "run_id": columns,
        "target": "completed",
        "fields": {"result": {"ok": True}, "error": None, "finished_at": FINISHED_AT.isoformat()},
        "owner": OWNER,
        "attempts": 0,
    }
    valkey.client().lpush(keys.drain_pending(), json.dumps(end), json.dumps(fields))

    assert drain.waiting_run_ids() == {named}
    report = drain_replay.replay()
    assert (report.applied, report.poisoned) == (1, 1)

    row = TaskHistory.objects.get(id=named)
    assert (row.state, row.result, row.finished_at) == ("completed", {"ok": True}, FINISHED_AT)
    assert live.read(named)["state"] == "completed"
    assert TaskHistory.objects.get(id=columns).state == "active"


def test_push_refuses_what_the_stage_move_does_not_take() -> None:
    with pytest.raises(ValueError, match="finished_at"):
        drain.push(
            "run_x",
            StageState.COMPLETED,
            {"stage": "a", "finished_at": 1},
            OWNER,
            call=drain.MOVE_STAGE,
        )
    with pytest.raises(ValueError, match="move_stage"):
        drain.push("run_x", StageState.COMPLETED, {"result": 1}, OWNER, call=drain.MOVE_STAGE)
    with pytest.raises(ValueError, match="RunState"):
        drain.push("run_x", StageState.SKIPPED, {}, OWNER)  # `end` writes run states
    assert drain.depth() == (0, 0)


# --- end to end: a stage whose end Postgres refused, on a real worker ---------------------------

TASK = "test-pipe"
EVERY_STAGE = {"probe", "left", "right", "final", "after-right"}


@pytest.fixture(scope="module")
def worker(django_db_setup: None) -> Iterator[subprocess.Popen[bytes]]:
    with worker_process(_queues(TASK), concurrency=2, name="stage-drain") as process:
        yield process


@pytest.mark.worker
def test_a_stage_end_postgres_refused_is_replayed_and_the_run_completes(worker: object) -> None:
    run_id = start_run(TASK, {"sleep_s": 1.5}, trigger=TriggerKind.MANUAL).run_id
    wait_for(lambda: TaskHistory.objects.get(id=run_id).stages["probe"] == "active", timeout=20)

    # Mid-stage: the worker's sessions are dropped, so the stage's end finds Postgres gone.
    _terminate(_workers_backends())
    raw = wait_for(lambda: valkey.client().lrange(keys.drain_pending(), 0, -1), timeout=20)

    (entry,) = [json.loads(r) for r in raw]
    assert (entry["call"], entry["target"], entry["args"]["stage"]) == (
        "move_stage",
        "completed",
        "probe",
    )
    row = TaskHistory.objects.get(id=run_id)
    assert row.stages["probe"] == "active"
    assert entry["args"]["claimer"] == row.steps["probe"]["owner"]
    # Postgres first: nothing of the end reached Valkey while Postgres did not have it.
    assert _live_stage(run_id, "probe") == "active"

    assert drain_replay.replay().applied == 1

    row = wait_for(
        lambda: TaskHistory.objects.filter(id=run_id, state__in=["completed", "failed"]).first(),
        timeout=30,
    )
    assert row.state == "completed", row.error
    assert row.stages == dict.fromkeys(EVERY_STAGE, "completed")
    calls = [
        json.loads(r)["stage"]
        for r in valkey.client().lrange(PIPE_CALLS_KEY.format(run_id=run_id), 0, -1)
    ]
    assert sorted(calls) == sorted(EVERY_STAGE)  # each stage executed once
    assert all(row.steps[name]["attempts"] == 1 for name in EVERY_STAGE)
    assert live.read(run_id)["state"] == "completed"
    assert drain.depth() == (0, 0)
