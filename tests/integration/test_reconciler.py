"""The reconciler, one tick at a time, on real Postgres and Redis (STYLE example 10).

Rows are seeded in each state with heartbeat ages around the thresholds (set in SQL relative
to the Postgres clock), live hashes present, absent or stale (relative to Redis's clock); one
tick runs; each row's outcome and the tick's counts are asserted. Pending runs use a private
queue, so no shared worker takes their messages.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta

import pytest
from django.conf import settings
from django.db import connection, connections
from django.utils import timezone

from orchestrator.cluster.leaders import CLUSTER
from orchestrator.cluster.locks import Fence, LockLost, LoopLock
from orchestrator.hooks import quotas
from orchestrator.models import TaskHistory, TaskQuotaUsage
from orchestrator.recovery import drain_replay, orphans
from orchestrator.recovery.reconciler import Reconciler
from orchestrator.runs import drain
from orchestrator.runs.start import new_run_id, start_run
from orchestrator.states import IllegalTransition, RunState, StageState
from orchestrator.stores import broker, durable, keys, live, valkey
from orchestrator.triggers import TriggerKind
from tests.support.messages import empty_queues

pytestmark = [pytest.mark.django_db(transaction=True)]

OWNER = "host-a:4242:DEADBEEF"
THRESHOLD = 300  # LUMASTRA_ORPHAN_THRESHOLD_S default
BOOT_THRESHOLD = 120  # LUMASTRA_ORPHAN_BOOT_THRESHOLD_S default
PRIVATE = "test-record-order"
PRIVATE_QUEUE = f"task.t.{PRIVATE}"
UNIQUE = "test-unique"  # identity-deduplicated, on a queue no worker here takes
UNACKED_TAG = "test-reconciler-unacked"


@pytest.fixture(autouse=True)
def _clean() -> Iterator[None]:
    _clean_shared_keys()
    yield
    # After too: a reconciler left holding the cluster seat would make the next module's
    # reconciler skip its ticks for the seat's whole lease.
    _clean_shared_keys()


def _clean_shared_keys() -> None:
    valkey.client().delete(
        keys.orchestrator_lock(CLUSTER),
        keys.drain_pending(),
        keys.drain_inflight(),
        keys.drain_backoff(),
        keys.drain_failures(),
    )
    _empty_queue()
    broker.client().hdel(keys.BROKER_UNACKED, UNACKED_TAG)


def _empty_queue() -> None:
    empty_queues(PRIVATE_QUEUE)


def _waiting_messages() -> list[str]:
    """Run ids of the messages waiting in the private queue, read straight from the lists."""
    found = []
    for step in keys.BROKER_PRIORITY_STEPS:
        for raw in broker.client().lrange(keys.broker_queue(PRIVATE_QUEUE, step), 0, -1):
            found.append(json.loads(raw)["headers"]["id"].rpartition("#")[2])
    return found


def _valkey_ms() -> int:
    seconds, micros = valkey.client().time()
    return int(seconds) * 1000 + int(micros) // 1000


def _age(run_id: str, **ages_s: int | None) -> None:
    """Set timestamp columns to `now() - age` by the Postgres clock (None: NULL)."""
    allowed = {"heartbeat_at", "started_at", "updated_at", "created_at", "not_before"}
    assert set(ages_s) <= allowed
    with connection.cursor() as cursor:
        for column, age in ages_s.items():
            if age is None:
                cursor.execute(f"UPDATE task_history SET {column} = NULL WHERE id = %s", [run_id])
            else:
                cursor.execute(
                    f"UPDATE task_history SET {column} = now() - %s * interval '1 second' "
                    "WHERE id = %s",
                    [age, run_id],
                )


@dataclass(frozen=True)
class Row:
    label: str
    state: str
    beat_age: int | None  # task_history.heartbeat_at, seconds ago (None: NULL)
    started_age: int | None
    live_hash: str  # gone | fresh | stale | no-beat-old | pending
    expected: str
    updated_age: int = 0


# Ages sit about 20 s either side of the 300 s threshold, so the seconds a test takes cannot
# move a row across it.
TABLE = [
    Row("active, stale, hash gone", "active", 400, 500, "gone", "failed"),
    Row("active, stale, hash heartbeat stale too", "active", 400, 500, "stale", "failed"),
    Row("active, stale, stray live heartbeat", "active", 400, 500, "fresh", "active"),
    Row("active, just past the threshold", "active", 320, 500, "gone", "failed"),
    Row("active, just under the threshold", "active", 280, 500, "gone", "active"),
    Row("active, beating", "active", 10, 500, "fresh", "active"),
    Row("active, no heartbeat yet, started long ago", "active", None, 400, "gone", "failed"),
    Row("active, no heartbeat yet, started lately", "active", None, 100, "gone", "active"),
    Row("active, hash never beat, old update", "active", 400, 500, "no-beat-old", "failed"),
    Row("cancelling, stale, hash gone", "cancelling", 400, 500, "gone", "cancelled"),
    Row("cancelling, stale, stray live heartbeat", "cancelling", 400, 500, "fresh", "cancelling"),
    Row("cancelled before pickup, long ago", "cancelling", None, None, "gone", "cancelled", 400),
    Row("cancelled before pickup, lately", "cancelling", None, None, "gone", "cancelling", 100),
    Row("completed long ago", "completed", 5000, 5000, "gone", "completed", 5000),
    Row("failed long ago", "failed", 5000, 5000, "gone", "failed", 5000),
    Row("pending, young", "pending", None, None, "pending", "pending", 10),
]


def _seed(row: Row, task_id: str = "test-noop", attempts: int = 3) -> str:
    """One row as `row` says. `attempts` defaults to test-noop's last (3 of 3), so an orphan
    ends: resuming orphans with attempts left has its own tests below."""
    run_id = new_run_id()
    started = row.started_age is not None
    TaskHistory.objects.create(
        id=run_id,
        task_id=task_id,
        state=row.state,
        trigger={"kind": "manual"},
        input={},
        priority=5,
        identity=run_id,
        owner_instance_id=OWNER if started else "",
        error={"kind": "permanent", "message": "before"} if row.state == "failed" else None,
        attempts=attempts if started else 0,
    )
    _age(
        run_id,
        heartbeat_at=row.beat_age,
        started_at=row.started_age,
        updated_at=row.updated_age,
    )
    if row.live_hash == "gone":
        return run_id
    live.seed(run_id, task_id, 5, ())
    if row.live_hash == "pending":
        return run_id
    live.claim(run_id, OWNER, live.NO_PAUSE)
    if row.state == "cancelling":
        live.transition(run_id, RunState.CANCELLING, owner=OWNER)
    now = _valkey_ms()
    active_key = keys.run_active(run_id)
    if row.live_hash == "fresh":
        valkey.client().hset(active_key, "heartbeat_at", now - 5_000)
    elif row.live_hash == "stale":
        valkey.client().hset(active_key, "heartbeat_at", now - 400_000)
    elif row.live_hash == "no-beat-old":
        valkey.client().hset(active_key, "updated_at", now - 400_000)
    return run_id


def _failed_count(task_id: str) -> int:
    quotas.rollup()  # the task has no daily cap: its counts reach the table by the rollup
    return sum(TaskQuotaUsage.objects.filter(task_id=task_id).values_list("failed", flat=True))


def test_one_tick_ends_exactly_the_orphans() -> None:
    seeded = {row.label: _seed(row) for row in TABLE}

    report = Reconciler().tick()

    outcomes = {row.label: TaskHistory.objects.get(id=seeded[row.label]).state for row in TABLE}
    assert outcomes == {row.label: row.expected for row in TABLE}
    for row in TABLE:
        ended = TaskHistory.objects.get(id=seeded[row.label])
        if row.expected == row.state:
            assert row.state in ("completed", "failed") or ended.error is None, row.label
            continue
        assert ended.error["kind"] == "orphaned", row.label
        assert ended.error["owner"] == (OWNER if row.started_age is not None else ""), row.label
        assert "stopped heartbeating" in ended.error["message"], row.label
        assert ended.finished_at is not None, row.label
        snapshot = live.read(ended.id)
        if row.live_hash == "gone":
            assert snapshot == {}, row.label
        else:
            assert snapshot["state"] == row.expected, row.label
    assert report.orphans.orphaned == 5
    assert report.orphans.cancelled == 2
    assert report.orphans.kept_alive == 2
    assert report.orphans.errors == report.pending.errors == 0
    assert report.pending.republished == 0
    # The hooks heard of each orphan once: the daily quota counts five failures.
    assert _failed_count("test-noop") == 5


def test_the_message_names_the_heartbeat_age_and_the_owner() -> None:
    run_id = _seed(Row("x", "active", 400, 500, "stale", "failed"))

    Reconciler().tick()

    message = TaskHistory.objects.get(id=run_id).error["message"]
    assert "last heartbeat 400s ago (threshold 300s)" in message
    assert OWNER in message
    assert "live hash heartbeat 400s old" in message
    assert TaskHistory.objects.get(id=run_id).error["heartbeat_age_s"] == 400


def test_a_stray_live_heartbeat_keeps_a_run_alive_tick_after_tick() -> None:
    run_id = _seed(Row("x", "active", 4000, 5000, "fresh", "active"))
    reconciler = Reconciler()

    for _ in range(3):
        assert reconciler.tick().orphans.kept_alive == 1

    assert TaskHistory.objects.get(id=run_id).state == "active"
    assert live.read(run_id)["state"] == "active"


def test_an_orphan_ended_by_the_tick_is_not_touched_again() -> None:
    run_id = _seed(Row("x", "active", 400, 500, "gone", "failed"))
    reconciler = Reconciler()
    reconciler.tick()
    # A late heartbeat of its old owner reaches the live hash: it must not bring it back.
    valkey.client().hset(keys.run_active(run_id), "heartbeat_at", _valkey_ms())

    report = reconciler.tick()

    assert report.stale == 0
    assert TaskHistory.objects.get(id=run_id).state == "failed"
    assert _failed_count("test-noop") == 1


def test_boot_recovery_uses_the_boot_threshold() -> None:
    between = _seed(Row("x", "active", 200, 500, "gone", "failed"))
    young = _seed(Row("y", "active", 60, 500, "gone", "active"))

    reconciler = Reconciler()

    regular = reconciler.tick()

    assert regular.stale == 0
    assert TaskHistory.objects.get(id=between).state == "active"

    boot = reconciler.tick(boot=True)

    assert boot.boot and boot.orphans.orphaned == 1
    assert TaskHistory.objects.get(id=between).state == "failed"
    assert "threshold 120s" in TaskHistory.objects.get(id=between).error["message"]
    assert TaskHistory.objects.get(id=young).state == "active"


def test_an_idle_tick_makes_four_indexed_queries() -> None:
    from django.test.utils import CaptureQueriesContext

    _seed(Row("beating", "active", 10, 500, "fresh", "active"))
    reconciler = Reconciler()

    with CaptureQueriesContext(connection) as queries:
        report = reconciler.tick()

    assert report.acted == 0 and not report.skipped
    # The stale/pending candidates, the runs ended since the last tick (the hash repair chore,
    # on the finished_at index), the pipelines stalled between stages (on the state index) and
    # the live children of ended parents (on the open batches' index); the pauses' mirror is
    # the windows loop's (`recovery.windows`).
    assert len(queries.captured_queries) == 4


def test_one_bad_row_does_not_stop_the_batch() -> None:
    bad = _seed(Row("bad", "active", 500, 600, "gone", "failed"))
    good = [_seed(Row(f"good{i}", "active", 400, 500, "gone", "failed")) for i in range(3)]
    # The bad row's live key is not a hash: it cannot be judged.
    valkey.client().set(keys.run_active(bad), "not a hash")

    report = Reconciler().tick()

    assert report.orphans.errors == 1
    assert report.orphans.orphaned == 3
    assert TaskHistory.objects.get(id=bad).state == "active"
    assert all(TaskHistory.objects.get(id=g).state == "failed" for g in good)
    valkey.client().delete(keys.run_active(bad))


def test_a_row_deleted_or_refreshed_after_the_query_is_left_alone() -> None:
    deleted = _seed(Row("deleted", "active", 400, 500, "gone", "failed"))
    refreshed = _seed(Row("refreshed", "active", 400, 500, "gone", "failed"))
    ended = _seed(Row("ended", "active", 400, 500, "gone", "failed"))
    lock = LoopLock("reconciler-test", timedelta(seconds=30))
    assert lock.hold()
    stale, _ = orphans.candidates(stale_after_s=THRESHOLD, pending_after_s=60, limit=100)
    assert {c.run_id for c in stale} == {deleted, refreshed, ended}

    TaskHistory.objects.filter(id=deleted).delete()
    _age(refreshed, heartbeat_at=1)  # its worker beat meanwhile
    TaskHistory.objects.filter(id=ended).update(state="completed")

    report = orphans.end_orphans(stale, THRESHOLD, fence=lock)

    assert report.raced == 3 and report.errors == 0 and report.orphaned == 0
    assert TaskHistory.objects.get(id=refreshed).state == "active"
    assert TaskHistory.objects.get(id=ended).state == "completed"
    lock.release()


def test_a_run_whose_terminal_write_waits_in_the_drain_is_not_an_orphan() -> None:
    run_id = _seed(Row("x", "active", 400, 500, "stale", "failed"))
    finished = {"result": {"ok": True}, "finished_at": timezone.now()}
    assert drain.push(run_id, RunState.COMPLETED, finished, OWNER)
    # Postgres failed the last replays: the drain is backing off, so the tick's flush waits.
    valkey.client().set(keys.drain_backoff(), 3, px=60_000)

    reconciler = Reconciler()
    report = reconciler.tick()

    assert report.drain.backing_off
    assert report.in_drain == 1 and report.orphans.orphaned == 0
    assert TaskHistory.objects.get(id=run_id).state == "active"
    # The drain runs under the same cluster lock: the holder replays it.
    assert drain_replay.replay(force=True, fence=reconciler.lock).applied == 1
    reconciler.release()
    assert TaskHistory.objects.get(id=run_id).state == "completed"
    assert live.read(run_id)["state"] == "completed"


# --- pending runs and the broker -------------------------------------------------------------


def _pending(label: str, age_s: int) -> str:
    run_id = start_run(PRIVATE, {"label": label}, trigger=TriggerKind.MANUAL).run_id
    _age(run_id, updated_at=age_s, created_at=age_s)
    return run_id


def test_a_pending_run_whose_message_is_gone_is_published_again() -> None:
    run_id = _pending("lost", 90)
    assert _waiting_messages() == [run_id]
    _empty_queue()

    report = Reconciler().tick()

    assert report.pending.republished == 1
    assert _waiting_messages() == [run_id]
    assert TaskHistory.objects.get(id=run_id).state == "pending"
    assert live.read(run_id)["state"] == "pending"


def test_a_pending_run_published_again_holds_its_lapsed_identity_again() -> None:
    # What an outage between a start's commit and its confirm leaves once the provisional TTL
    # has run out: the run pending in Postgres, its identity key and its message gone.
    run_id = start_run(UNIQUE, {"key": "lapsed"}, trigger=TriggerKind.MANUAL).run_id
    _age(run_id, updated_at=90, created_at=90)
    identity = keys.identity(UNIQUE, "lapsed")
    valkey.client().delete(identity)
    unique_queue = f"task.t.{UNIQUE}"
    empty_queues(unique_queue)

    report = Reconciler().tick()

    assert report.pending.republished == 1
    assert valkey.client().get(identity) == run_id
    held_s = valkey.client().pttl(identity) / 1000
    assert settings.CONFIG.identity_provisional_ttl_s < held_s <= settings.CONFIG.identity_ttl_s
    again = start_run(UNIQUE, {"key": "lapsed"}, trigger=TriggerKind.MANUAL)
    assert again.deduplicated and again.run_id == run_id


def test_a_pending_run_whose_message_waits_is_left_alone() -> None:
    run_id = _pending("queued", 90)

    report = Reconciler().tick()

    assert report.pending.waiting == 1
    assert report.pending.republished == 0
    assert _waiting_messages() == [run_id]


def test_a_message_held_by_a_worker_counts_as_present() -> None:
    run_id = _pending("taken", 90)
    # What kombu does when a worker takes a message with acks_late: off the list, into the
    # unacked hash under its delivery tag.
    list_name, raw = _find_message(run_id)
    assert broker.client().lrem(list_name, 1, raw) == 1
    entry = json.dumps([json.loads(raw), "", PRIVATE_QUEUE])
    broker.client().hset(keys.BROKER_UNACKED, UNACKED_TAG, entry)

    report = Reconciler().tick()

    assert report.pending.waiting == 1 and report.pending.republished == 0
    assert _waiting_messages() == []


def test_a_young_pending_run_is_not_checked() -> None:
    run_id = _pending("young", 30)
    _empty_queue()

    report = Reconciler().tick()

    assert report.pending_checked == 0
    assert _waiting_messages() == []
    assert TaskHistory.objects.get(id=run_id).state == "pending"


def test_a_lost_live_hash_is_seeded_again() -> None:
    waiting = _pending("hash lost, message waits", 90)
    lost = _pending("hash and message lost", 90)
    valkey.client().delete(keys.run_active(waiting), keys.run_active(lost))
    list_name, raw = _find_message(lost)
    broker.client().lrem(list_name, 1, raw)
    reconciler = Reconciler()

    report = reconciler.tick()

    assert report.pending.reseeded == 2
    # A worker may run a reseeded run with its Postgres claim not written yet: its message is
    # published once the seed has settled (a heartbeat interval and a store timeout), not in
    # the pass that found the hash lost, nor in the next one.
    assert report.pending.republished == 0
    assert live.read(waiting)["state"] == live.read(lost)["state"] == "pending"
    assert _waiting_messages() == [waiting]
    report = reconciler.tick()
    assert (report.pending.settling, report.pending.republished) == (1, 0)
    # ... a heartbeat interval and a store timeout later:
    assert (
        0
        < valkey.client().ttl(keys.run_reseeded(lost))
        <= (settings.CONFIG.heartbeat_interval_s + settings.CONFIG.store_timeout_s)
    )
    valkey.client().delete(keys.run_reseeded(lost))

    report = reconciler.tick()
    reconciler.release()

    assert report.pending.republished == 1
    assert sorted(_waiting_messages()) == sorted([waiting, lost])


def _find_message(run_id: str) -> tuple[str, str]:
    """(the broker list holding the run's message, the message as stored)."""
    for step in keys.BROKER_PRIORITY_STEPS:
        name = keys.broker_queue(PRIVATE_QUEUE, step)
        for raw in broker.client().lrange(name, 0, -1):
            if json.loads(raw)["headers"]["id"].endswith(f"#{run_id}"):
                return name, str(raw)
    raise AssertionError(f"no message for {run_id}")


def test_a_backlog_of_pending_runs_is_checked_a_page_per_tick() -> None:
    runs = [_pending(f"page{i}", 90 + i) for i in range(3)]
    _empty_queue()
    reconciler = Reconciler(batch=2)

    ticks = [reconciler.tick().pending for _ in range(3)]

    assert [(t.republished, t.waiting) for t in ticks] == [(2, 0), (1, 0), (0, 2)]
    assert sorted(_waiting_messages()) == sorted(runs)
    reconciler.release()


def test_a_pending_run_past_the_deadline_is_failed() -> None:
    expired = _pending("a day old", 86_400 + 100)
    recent = _pending("an hour old", 3_600)

    report = Reconciler().tick()

    assert report.pending.failed == 1
    row = TaskHistory.objects.get(id=expired)
    assert row.state == "failed"
    assert row.error["kind"] == "orphaned"
    assert "past the pending deadline of 86400s" in row.error["message"]
    assert live.read(expired)["state"] == "failed"
    assert TaskHistory.objects.get(id=recent).state == "pending"
    assert _failed_count(PRIVATE) == 1


def _claim_lost_by_postgres(run_id: str, beat_age_s: int) -> None:
    """OWNER claimed the run in both stores, and a crash of Postgres lost the claim's commit
    (it does not wait for its flush): the row is as before, Valkey names OWNER, whose last
    Valkey heartbeat is `beat_age_s` old. Its message is with OWNER's worker, acknowledged or
    about to be: not in the broker."""
    _empty_queue()
    live.claim(run_id, OWNER, live.NO_PAUSE)
    valkey.client().hset(keys.run_active(run_id), "heartbeat_at", _valkey_ms() - beat_age_s * 1000)


def test_a_claim_postgres_lost_whose_owner_beats_is_a_live_claim() -> None:
    """Nothing runs twice: no second message, and no failure at the deadline while its owner,
    which claims the run again at its next heartbeat or its end, beats in Valkey."""
    young = _pending("claim lost, owner beating", 90)
    old = _pending("claim lost a day ago, owner beating", 86_400 + 100)
    for run_id in (young, old):
        _claim_lost_by_postgres(run_id, beat_age_s=5)

    report = Reconciler().tick()

    assert report.pending.claimed == 2
    assert report.pending.republished == report.pending.failed == 0
    assert _waiting_messages() == []
    for run_id in (young, old):
        assert TaskHistory.objects.get(id=run_id).state == "pending"
        assert (live.read(run_id)["state"], live.read(run_id)["owner"]) == ("active", OWNER)


def test_a_claim_postgres_lost_whose_owner_went_silent_is_resumed_as_an_orphan() -> None:
    run_id = _pending("claim lost, owner gone", 90)
    _claim_lost_by_postgres(run_id, beat_age_s=THRESHOLD + 100)
    reconciler = Reconciler()

    report = reconciler.tick()

    # Its claim is written for it, as of its last heartbeat: the lost attempt counts.
    assert report.pending.silent_claims == 1 and report.pending.republished == 0
    row = TaskHistory.objects.get(id=run_id)
    assert (row.state, row.owner_instance_id, row.attempts) == ("active", OWNER, 1)

    report = reconciler.tick()
    reconciler.release()

    assert report.orphans.put_back == 1
    row = TaskHistory.objects.get(id=run_id)
    assert (row.state, row.attempts, row.error["kind"]) == ("pending", 1, "orphaned")
    assert live.read(run_id)["state"] == "pending"
    assert _waiting_messages() == [run_id]


# --- the lock: one reconciler per tick, and no write without it ------------------------------


def test_two_reconcilers_only_one_acts_per_tick() -> None:
    seeded = [_seed(Row(f"o{i}", "active", 400, 500, "gone", "failed")) for i in range(4)]
    reconcilers = [Reconciler(), Reconciler()]
    barrier = threading.Barrier(2)
    reports = []

    def tick(reconciler: Reconciler) -> None:
        barrier.wait()
        try:
            reports.append(reconciler.tick())
        finally:
            connections.close_all()

    threads = [threading.Thread(target=tick, args=(r,)) for r in reconcilers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert sorted(r.skipped for r in reports) == [False, True]
    acted = next(r for r in reports if not r.skipped)
    assert acted.orphans.orphaned == 4
    assert all(TaskHistory.objects.get(id=o).state == "failed" for o in seeded)
    assert _failed_count("test-noop") == 4


def test_the_holder_keeps_the_lock_until_it_releases_it() -> None:
    first, second = Reconciler(), Reconciler()

    assert not first.tick().skipped
    assert second.tick().skipped
    assert not first.tick().skipped
    first.release()
    assert not second.tick().skipped
    assert first.tick().skipped
    second.release()


def test_a_reconciler_that_lost_its_lock_writes_nothing() -> None:
    orphan = _seed(Row("o", "active", 400, 500, "gone", "failed"))
    reconciler = Reconciler()
    assert reconciler.lock.hold()
    stale, _ = orphans.candidates(stale_after_s=THRESHOLD, pending_after_s=60, limit=100)
    # Its lease ran out and another process took the lock.
    valkey.client().set(reconciler.lock.key, "another-process")

    with pytest.raises(LockLost):
        orphans.end_orphans(stale, THRESHOLD, fence=reconciler.lock)
    report = reconciler.tick()

    assert report.skipped
    assert TaskHistory.objects.get(id=orphan).state == "active"
    assert valkey.client().get(reconciler.lock.key) == "another-process"


def test_a_tick_that_loses_its_lock_midway_stops_writing() -> None:
    seeded = [_seed(Row(f"o{i}", "active", 400 + i, 500, "gone", "failed")) for i in range(3)]
    thief = LoopLock(CLUSTER, timedelta(seconds=30))

    @dataclass
    class StealAfterFirst:
        """A fence that lets one write batch through, then finds the lock taken."""

        inner: Fence
        calls: int = 0

        def check(self) -> None:
            self.calls += 1
            if self.calls == 2:
                valkey.client().set(thief.key, thief.token)
            self.inner.check()

    reconciler = Reconciler()
    assert reconciler.lock.hold()
    stale, _ = orphans.candidates(stale_after_s=THRESHOLD, pending_after_s=60, limit=100)

    with pytest.raises(LockLost):
        orphans.end_orphans(stale, THRESHOLD, fence=StealAfterFirst(reconciler.lock))

    states = sorted(TaskHistory.objects.get(id=o).state for o in seeded)
    assert states == ["active", "active", "failed"]
    thief.release()


@dataclass
class CountingChore:
    name: str = "probe"
    calls: int = 0

    def __call__(self, fence: Fence) -> int:
        fence.check()
        self.calls += 1
        return 2


@dataclass
class BrokenChore:
    name: str = "broken"

    def __call__(self, fence: Fence) -> int:
        raise RuntimeError("a chore failed")


def test_extra_chores_run_under_the_lock_each_alone() -> None:
    probe = CountingChore()
    reconciler = Reconciler(chores=[BrokenChore(), probe])

    report = reconciler.tick()

    assert probe.calls == 1
    assert report.chores == {"repair": 0, "pipelines": 0, "children": 0, "probe": 2}
    assert report.errors == 1
    reconciler.release()


# --- resuming orphans with attempts left (runs.put_back) ------------------------------------------

RESUME_TABLE = [
    Row("active, stale, hash gone", "active", 400, 500, "gone", "pending"),
    Row("active, stale, hash heartbeat stale too", "active", 400, 500, "stale", "pending"),
    Row("active, stale, stray live heartbeat", "active", 400, 500, "fresh", "active"),
    Row("active, beating", "active", 10, 500, "fresh", "active"),
    Row("cancelling, stale, hash gone", "cancelling", 400, 500, "gone", "cancelled"),
]


def test_one_tick_resumes_the_orphans_with_attempts_left() -> None:
    seeded = {row.label: _seed(row, PRIVATE, attempts=1) for row in RESUME_TABLE}

    report = Reconciler().tick()

    outcomes = {label: TaskHistory.objects.get(id=run_id).state for label, run_id in seeded.items()}
    assert outcomes == {row.label: row.expected for row in RESUME_TABLE}
    assert (report.orphans.put_back, report.orphans.orphaned, report.orphans.cancelled) == (2, 0, 1)
    resumed = [seeded[row.label] for row in RESUME_TABLE if row.expected == "pending"]
    for run_id in resumed:
        row = TaskHistory.objects.get(id=run_id)
        assert (row.owner_instance_id, row.attempts, row.finished_at) == ("", 1, None)
        assert row.error["kind"] == "orphaned" and row.error["owner"] == OWNER
        assert "stopped heartbeating" in row.error["message"]
        assert "attempt 1 of 3; retrying in" in row.error["message"]
        assert row.not_before > timezone.now()
    # Published again, each once; a hash Valkey still had follows to pending, a lost one is
    # seeded again by the pickup.
    assert sorted(_waiting_messages()) == sorted(resumed)
    assert live.read(seeded["active, stale, hash heartbeat stale too"])["state"] == "pending"
    assert live.read(seeded["active, stale, hash gone"]) == {}
    # Resumed runs did not end: the hooks counted no failure.
    assert _failed_count(PRIVATE) == 0


def test_an_orphan_of_a_task_that_opted_out_fails() -> None:
    run_id = _seed(Row("x", "active", 400, 500, "gone", "failed"), "test-no-resume", attempts=1)

    report = Reconciler().tick()

    assert report.orphans.orphaned == 1 and report.orphans.put_back == 0
    assert TaskHistory.objects.get(id=run_id).error["kind"] == "orphaned"


def test_a_resume_is_fenced_by_the_heartbeat_and_the_claim() -> None:
    beat = _seed(Row("beat", "active", 400, 500, "gone", "pending"), PRIVATE, attempts=1)
    claimed = _seed(Row("claimed", "active", 400, 500, "gone", "pending"), PRIVATE, attempts=1)
    lock = LoopLock("reconciler-test", timedelta(seconds=30))
    assert lock.hold()
    stale, _ = orphans.candidates(stale_after_s=THRESHOLD, pending_after_s=60, limit=100)
    assert {c.run_id for c in stale} == {beat, claimed}

    _age(beat, heartbeat_at=1)  # its worker beat meanwhile
    TaskHistory.objects.filter(id=claimed).update(owner_instance_id="host-b:1:NEWCLAIM")

    report = orphans.end_orphans(stale, THRESHOLD, fence=lock)

    assert (report.raced, report.put_back, report.errors) == (2, 0, 0)
    assert TaskHistory.objects.get(id=beat).state == "active"
    assert TaskHistory.objects.get(id=claimed).owner_instance_id == "host-b:1:NEWCLAIM"
    assert _waiting_messages() == []


PIPE = "test-fault-pipe"
PIPE_QUEUE = f"task.t.{PIPE}"
STAGE_CLAIMER = "host-b:77:STAGECLM"


def _pipeline_orphan(stage_attempts: int) -> str:
    """A pipeline run whose stage `a` was claimed by a process of another host that stopped
    heartbeating (its run's heartbeat 400 s old, no live hash)."""
    run_id = start_run(PIPE, {"ms": 1}, trigger=TriggerKind.MANUAL).run_id
    empty_queues(PIPE_QUEUE)
    valkey.client().delete(keys.run_active(run_id))
    TaskHistory.objects.filter(id=run_id).update(
        state="active",
        owner_instance_id=OWNER,
        attempts=1,
        stages={"a": "active", "b": "waiting", "c": "waiting", "d": "waiting"},
        steps={"a": {"owner": STAGE_CLAIMER, "attempts": stage_attempts, "status": "running"}},
    )
    _age(run_id, heartbeat_at=400, started_at=500)
    return run_id


def _stage_messages() -> list[str]:
    found = []
    for step in keys.BROKER_PRIORITY_STEPS:
        for raw in broker.client().lrange(keys.broker_queue(PIPE_QUEUE, step), 0, -1):
            found.append(json.loads(raw)["headers"]["id"])
    return found


def test_a_stage_whose_claimer_went_silent_is_tried_again_not_its_run_failed() -> None:
    run_id = _pipeline_orphan(stage_attempts=1)

    report = Reconciler().tick()

    row = TaskHistory.objects.get(id=run_id)
    assert (report.orphans.put_back, report.orphans.orphaned) == (1, 0)
    assert row.state == "active" and row.stages["a"] == "waiting"
    record = row.steps["a"]
    assert (record["status"], record["attempts"]) == ("waiting", 1)
    assert record["error"]["kind"] == "orphaned" and STAGE_CLAIMER in record["error"]["message"]
    assert len(_stage_messages()) == 1
    # The stage's move stamped the run's heartbeat: the next tick leaves it alone.
    assert Reconciler().tick().stale == 0
    # The silent claimer's late end is refused: the stage is the next attempt's now.
    with pytest.raises(IllegalTransition):
        durable.move_stage(run_id, "a", StageState.COMPLETED, claimer=STAGE_CLAIMER)


def test_a_stage_with_no_attempt_left_fails_its_run_as_an_orphan() -> None:
    run_id = _pipeline_orphan(stage_attempts=3)

    report = Reconciler().tick()

    row = TaskHistory.objects.get(id=run_id)
    assert (report.orphans.put_back, report.orphans.orphaned) == (0, 1)
    assert (row.state, row.error["kind"]) == ("failed", "orphaned")
    assert _stage_messages() == []
