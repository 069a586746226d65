"""Identity dedup and idempotency keys: one live run per identity, across processes."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path

import psycopg2
import pytest
from django.conf import LazySettings
from django.db import transaction

from orchestrator.clock import SYSTEM
from orchestrator.hooks.dedup import ExclusiveRunning
from orchestrator.hooks.quotas import QuotaExceeded
from orchestrator.models import TaskHistory
from orchestrator.runs.start import start_run
from orchestrator.stores import keys, valkey
from orchestrator.triggers import TriggerKind
from tests.faults.servers import ValkeyServer
from tests.support.fixtures import ROOT, database_url, wait_for, worker_process

pytestmark = [pytest.mark.django_db(transaction=True)]

PROCESSES = 4
PER_PROCESS = 50


def _race(task: str, raw_input: str, key: str | None = None) -> list[tuple[str, bool]]:
    """PROCESSES processes, PER_PROCESS starts each, all beginning at the same moment."""
    start_at = str(time.time() + 3)
    env = {**os.environ, "DATABASE_URL": database_url()}
    args = [
        sys.executable,
        "-m",
        "tests.support.start_many",
        task,
        raw_input,
        str(PER_PROCESS),
        start_at,
    ] + ([key] if key else [])
    procs = [
        subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
        for _ in range(PROCESSES)
    ]
    results: list[tuple[str, bool]] = []
    for proc in procs:
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0
        results.extend(tuple(json.loads(line)) for line in out.splitlines())  # type: ignore[misc]
    assert len(results) == PROCESSES * PER_PROCESS
    return results


def test_concurrent_starts_of_one_identity_make_exactly_one_run() -> None:
    results = _race("test-unique", '{"key": "same"}')

    run_ids = {run_id for run_id, _ in results}
    assert len(run_ids) == 1
    assert sum(1 for _, dedup in results if not dedup) == 1
    assert list(TaskHistory.objects.values_list("id", flat=True)) == list(run_ids)


def test_concurrent_starts_with_one_idempotency_key_make_exactly_one_run() -> None:
    # A private queue: the run stays live for the whole race, so every later start matches.
    results = _race("test-record-order", '{"label": "keyed"}', key="one-key")

    assert len({run_id for run_id, _ in results}) == 1
    assert TaskHistory.objects.count() == 1


def test_concurrent_distinct_identities_make_a_run_each() -> None:
    results = _race("test-unique", '{"key": "k-{i}-' + "x" + '"}')

    # Each process starts k-0..k-49: PER_PROCESS identities, each raced by every process.
    assert len({run_id for run_id, _ in results}) == PER_PROCESS
    assert TaskHistory.objects.count() == PER_PROCESS


def test_distinct_inputs_without_identity_are_never_deduplicated() -> None:
    handles = [start_run("test-noop", {}, trigger=TriggerKind.MANUAL) for _ in range(5)]

    assert len({h.run_id for h in handles}) == 5
    assert not any(h.deduplicated for h in handles)


def test_a_deduplicated_start_is_not_counted_in_the_day() -> None:
    start_run("test-unique", {"key": "counted"}, trigger=TriggerKind.MANUAL)
    again = start_run("test-unique", {"key": "counted"}, trigger=TriggerKind.MANUAL)

    assert again.deduplicated
    day = valkey.client().hgetall(keys.quota_counts("test-unique", SYSTEM.now().date().isoformat()))
    assert day == {"started": "1"}  # the admission script counted both; the second went back


def test_a_finished_run_frees_its_identity() -> None:
    first = start_run("test-unique", {"key": "again"}, trigger=TriggerKind.MANUAL)
    second = start_run("test-unique", {"key": "again"}, trigger=TriggerKind.MANUAL)
    assert second.deduplicated and second.run_id == first.run_id

    with worker_process(["task.t.test-unique"], concurrency=1, name="dedup"):
        wait_for(lambda: TaskHistory.objects.get(id=first.run_id).state == "completed")
        wait_for(lambda: not valkey.client().exists(keys.identity("test-unique", "again")))

    fresh = start_run("test-unique", {"key": "again"}, trigger=TriggerKind.MANUAL)
    assert not fresh.deduplicated and fresh.run_id != first.run_id


def test_exclusive_tasks_share_an_identity_space() -> None:
    start_run("test-excl-a", {"key": "lib-1"}, trigger=TriggerKind.MANUAL)

    with pytest.raises(ExclusiveRunning, match=r"'test-excl-b' is exclusive with 'test-excl-a'"):
        start_run("test-excl-b", {"key": "lib-1"}, trigger=TriggerKind.MANUAL)
    other = start_run("test-excl-b", {"key": "lib-2"}, trigger=TriggerKind.MANUAL)

    assert not other.deduplicated
    assert TaskHistory.objects.filter(task_id="test-excl-b").count() == 1


@pytest.mark.parametrize("blank", ["", "  "])
def test_an_empty_or_blank_idempotency_key_is_no_key(blank: str) -> None:
    first = start_run("test-noop", {}, trigger=TriggerKind.API, idempotency_key=blank)
    second = start_run("test-noop", {}, trigger=TriggerKind.API, idempotency_key=blank)

    assert not first.deduplicated and not second.deduplicated
    assert first.run_id != second.run_id
    # Not stored as a key either: the live-key unique index never sees "".
    assert [r.trigger for r in TaskHistory.objects.all()] == [{"kind": "api"}] * 2


def _short_provisional_ttl(settings: LazySettings, seconds: int) -> None:
    settings.CONFIG = dataclasses.replace(settings.CONFIG, identity_provisional_ttl_s=seconds)


def test_a_crash_between_claim_and_insert_blocks_only_for_the_provisional_ttl(
    settings: LazySettings,
) -> None:
    _short_provisional_ttl(settings, 1)
    # A replica claimed the identity and died before its insert.
    key = keys.identity("test-unique", "crashed")
    valkey.script("identity_claim", [key], ["run_01DEADDEADDEADDEADDEADDEAD", 1000, ""])

    during = start_run("test-unique", {"key": "crashed"}, trigger=TriggerKind.MANUAL)
    assert during.deduplicated and during.run_id == "run_01DEADDEADDEADDEADDEADDEAD"

    wait_for(lambda: not valkey.client().exists(key), timeout=3)
    after = start_run("test-unique", {"key": "crashed"}, trigger=TriggerKind.MANUAL)
    assert not after.deduplicated
    assert TaskHistory.objects.filter(id=after.run_id).exists()
    assert valkey.client().pttl(key) > 1000  # confirmed on commit, no longer provisional


def test_a_callers_rollback_frees_the_identity_after_the_provisional_ttl(
    settings: LazySettings,
) -> None:
    _short_provisional_ttl(settings, 1)
    with pytest.raises(RuntimeError), transaction.atomic():
        start_run("test-unique", {"key": "rolled"}, trigger=TriggerKind.MANUAL)
        raise RuntimeError("caller aborts")

    key = keys.identity("test-unique", "rolled")
    assert 0 < valkey.client().pttl(key) <= 1000
    wait_for(lambda: not valkey.client().exists(key), timeout=3)
    assert not start_run("test-unique", {"key": "rolled"}, trigger=TriggerKind.MANUAL).deduplicated


def test_a_start_refused_after_the_claim_releases_the_identity_at_once() -> None:
    start_run("test-unique-quota", {"key": "a"}, trigger=TriggerKind.MANUAL)

    with pytest.raises(QuotaExceeded):
        start_run("test-unique-quota", {"key": "b"}, trigger=TriggerKind.MANUAL)

    assert valkey.client().exists(keys.identity("test-unique-quota", "a"))
    assert not valkey.client().exists(keys.identity("test-unique-quota", "b"))


def test_a_start_whose_valkey_goes_away_before_its_commit_still_returns_its_run(
    tmp_path: Path,
) -> None:
    # Valkey answers the admission (the identity's provisional claim), then stops answering
    # while the INSERT waits for a lock; the commit's follow-ups (the identity's confirmation,
    # the seed and publish) then fail. The run is committed, so the caller must get it back,
    # not an error it would retry (found by the partition-web scenario's engineer, issue 26).
    server = ValkeyServer(aof=False, log_path=tmp_path / "valkey.log")
    server.start()
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "VALKEY_URL": server.url(0),
        "CELERY_BROKER_URL": server.url(2),
        "LUMASTRA_STORE_TIMEOUT_S": "1",
    }
    starter = subprocess.Popen(
        [sys.executable, "-m", "tests.support.start_one", "test-unique", "through-an-outage"],
        cwd=ROOT,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert starter.stdin is not None and starter.stdout is not None
    try:
        assert starter.stdout.readline().strip() == "ready"
        with closing(psycopg2.connect(database_url())) as locker:
            with locker.cursor() as cursor:
                cursor.execute("LOCK TABLE task_history IN EXCLUSIVE MODE")
            starter.stdin.write("go\n")
            starter.stdin.flush()
            wait_for(_an_insert_waits_on_a_lock, timeout=20)
            assert server.process is not None
            server.process.send_signal(signal.SIGSTOP)
            locker.commit()
        answer = json.loads(starter.stdout.readline())
        assert starter.wait(timeout=30) == 0
    finally:
        if server.process is not None:
            server.process.send_signal(signal.SIGCONT)
        starter.kill()
        server.stop()

    assert "error" not in answer
    row = TaskHistory.objects.get(id=answer["run_id"])
    # Recorded, not published: the reconciler's pending check publishes it.
    assert (row.task_id, row.state) == ("test-unique", "pending")


def _an_insert_waits_on_a_lock() -> bool:
    # A connection of its own: inside a transaction pg_stat_activity is read once and kept.
    with closing(psycopg2.connect(database_url())) as watcher, watcher.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND datname = current_database() AND query LIKE %s",
            ["%INSERT INTO task_history%"],
        )
        return bool(cursor.fetchone()[0])
