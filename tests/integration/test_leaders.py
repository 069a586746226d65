"""Leaders across real loops processes (`python -m orchestrator.loops` as subprocesses).

Leases are compressed through the environment (TTL 3 s, renewed every second, jitter up to
300 ms), so a failover takes seconds, not the default 15. Processes are killed for real:
SIGKILL for a crash, SIGSTOP/SIGCONT for a leader paused past its lease.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from functools import partial
from pathlib import Path

import pytest
from django.test import Client

from orchestrator.cluster import leaders, roster
from orchestrator.cluster.leaders import CLUSTER, Elector
from orchestrator.cluster.locks import LockLost
from orchestrator.models import TaskHistory
from orchestrator.stores import keys, valkey
from tests.support.fixtures import ROOT, database_url, wait_for
from tests.support.runs import seed_orphan

pytestmark = [pytest.mark.django_db(transaction=True)]

TTL_S = 3
RENEW_S = 1
JITTER_S = 0.3
# Scheduling slack on top of TTL + jitter: the candidate's wake-up, one MGET poll by the test.
SLACK_S = 1.0
KILLS = 5

COMPRESSED = {
    "LUMASTRA_LEADER_TTL_S": str(TTL_S),
    "LUMASTRA_LEADER_RENEW_S": str(RENEW_S),
    "LUMASTRA_LEADER_JITTER_S": str(JITTER_S),
    "LUMASTRA_RECONCILE_INTERVAL_S": "1",
    "LUMASTRA_DRAIN_INTERVAL_S": "1",
}


@dataclass
class LoopsProcess:
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def owns(self, instance: str | None) -> bool:
        return instance is not None and f":{self.pid}:" in instance


@dataclass
class Cluster:
    tmp: Path
    processes: list[LoopsProcess] = field(default_factory=list)

    def start(self, **env: str) -> LoopsProcess:
        log = self.tmp / f"loops-{len(self.processes)}.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "orchestrator.loops"],
                cwd=ROOT,
                env={
                    **os.environ,
                    "DATABASE_URL": database_url(),
                    "LUMASTRA_WORKER_MODE": "enabled",
                    **COMPRESSED,
                    **env,
                },
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        started = LoopsProcess(process, log)
        self.processes.append(started)
        wait_for(lambda: "leader: racing for" in started.output(), timeout=60)
        return started

    def live(self) -> list[LoopsProcess]:
        return [p for p in self.processes if p.process.poll() is None]

    def leader(self) -> LoopsProcess | None:
        return _held_by(self.live())

    def stop_all(self) -> None:
        for p in self.processes:
            if p.process.poll() is None:
                p.process.send_signal(signal.SIGCONT)
                p.process.terminate()
        for p in self.processes:
            try:
                p.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.process.kill()
                p.process.wait()


@pytest.fixture(autouse=True)
def _clean() -> None:
    valkey.client().delete(keys.orchestrator_lock(CLUSTER))


@contextmanager
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    running = Cluster(tmp_path)
    try:
        yield running
    finally:
        running.stop_all()


def _held_by(processes: list[LoopsProcess]) -> LoopsProcess | None:
    """The cluster's leader, if it is one of `processes`."""
    holder = leaders.leader()
    return next((p for p in processes if p.owns(holder)), None)


def _locks_held_by(processes: list[LoopsProcess]) -> set[str]:
    """Every `lock:orch:*` key whose token is one of `processes`'."""
    client = valkey.client()
    return {
        key
        for key in client.scan_iter(match=keys.orchestrator_lock("*"))
        if any(p.owns(client.get(key)) for p in processes)
    }


def _just_renewed(process: LoopsProcess) -> bool:
    """`process` leads the cluster and renewed its lease within the last 200 ms."""
    pipe = valkey.client().pipeline(transaction=True)
    pipe.get(keys.orchestrator_lock(CLUSTER))
    pipe.pttl(keys.orchestrator_lock(CLUSTER))
    holder, ttl_ms = pipe.execute()
    return process.owns(holder) and ttl_ms > (TTL_S - 0.2) * 1000


def _views(process: LoopsProcess) -> set[str]:
    """The locks a process believes it leads, from its own log (last word per lock wins)."""
    leading: set[str] = set()
    for line in process.output().splitlines():
        if "leader: now leading lock:orch:" in line:
            leading.add(line.split("lock:orch:", 1)[1].split()[0])
        elif "leader: lost lock:orch:" in line or "leader: released lock:orch:" in line:
            leading.discard(line.split("lock:orch:", 1)[1].split()[0])
    return leading


def test_a_leader_whose_renewal_is_refused_stops_at_once_and_backs_off() -> None:
    elector = Elector(ttl=timedelta(seconds=TTL_S), renew_every=timedelta(seconds=1))
    seat = elector.fence()
    elector.step()
    assert elector.leads() and seat.hold()

    # Its lease ran out while it was away and another process took the seat.
    valkey.client().set(keys.orchestrator_lock(CLUSTER), "another-host:1:X:ab", px=TTL_S * 1000)

    with pytest.raises(LockLost):
        seat.check()  # the fence before a write batch: an atomic compare in Lua
    assert not elector.leads()
    elector.step()  # backing off: no attempt yet, and it never renews the other's lease
    assert not elector.leads()
    assert valkey.client().get(keys.orchestrator_lock(CLUSTER)) == "another-host:1:X:ab"
    assert leaders.leader() == "another-host:1:X"
    assert not seat.release()


def test_two_loops_processes_elect_exactly_one_leader(tmp_path: Path) -> None:
    with cluster(tmp_path) as running:
        a, b = running.start(), running.start()
        ruling = wait_for(lambda: _held_by([a, b]), timeout=30)
        # Let several renewals and candidate attempts pass: the seat must stay put.
        time.sleep(3 * RENEW_S + JITTER_S)

        assert _held_by([a, b]) is ruling
        follower = b if ruling is a else a
        # The cluster seat is the only one either process races for, takes or holds.
        for process in (a, b):
            assert "leader: racing for lock:orch:cluster (lease" in process.output()
        assert _views(ruling) == {CLUSTER}
        assert _views(follower) == set()
        assert _locks_held_by([a, b]) == {keys.orchestrator_lock(CLUSTER)}
        # The once-per-cluster loops ran on the cluster leader only.
        assert "boot recovery:" in ruling.output()
        assert "boot recovery" not in follower.output()


def test_a_killed_leader_is_replaced_within_ttl_plus_jitter(tmp_path: Path) -> None:
    bound = TTL_S + JITTER_S + SLACK_S
    failovers: list[float] = []
    with cluster(tmp_path) as running:
        running.start()
        running.start()
        for _ in range(KILLS):
            wait_for(lambda: _held_by(running.live()), timeout=30)
            ruling = running.leader()
            assert ruling is not None
            survivors = [p for p in running.live() if p is not ruling]
            # Kill it right after a renewal: the worst case, a whole TTL to wait out.
            wait_for(partial(_just_renewed, ruling), timeout=10, interval=0.005)
            os.kill(ruling.pid, signal.SIGKILL)
            killed_at = time.monotonic()
            ruling.process.wait()
            wait_for(partial(_held_by, survivors), timeout=bound + 5, interval=0.01)
            failovers.append(time.monotonic() - killed_at)
            running.start()  # keep two candidates for the next round

    print(
        f"\nleader failover over {KILLS} SIGKILLs (TTL {TTL_S}s, renew {RENEW_S}s, "
        f"jitter <= {JITTER_S}s): median {statistics.median(failovers):.2f}s, "
        f"max {max(failovers):.2f}s, all {[round(f, 2) for f in failovers]}"
    )
    assert max(failovers) <= bound, failovers


def test_a_leader_paused_past_its_ttl_writes_nothing_when_it_wakes(tmp_path: Path) -> None:
    with cluster(tmp_path) as running:
        # `paused` would fail an orphan older than 60 s; `other` would not fail it for a day.
        paused = running.start(LUMASTRA_ORPHAN_THRESHOLD_S="60")
        wait_for(lambda: running.leader() is paused, timeout=30)
        other = running.start(
            LUMASTRA_ORPHAN_THRESHOLD_S="86400", LUMASTRA_ORPHAN_BOOT_THRESHOLD_S="86400"
        )

        os.kill(paused.pid, signal.SIGSTOP)
        stopped_at = time.monotonic()
        wait_for(lambda: running.leader() is other, timeout=TTL_S + JITTER_S + 5)
        assert time.monotonic() - stopped_at >= TTL_S - RENEW_S
        # Past its lease: the write it would make as leader is waiting when it wakes.
        orphan = seed_orphan(400)
        os.kill(paused.pid, signal.SIGCONT)

        wait_for(lambda: "leader: lost lock:orch:cluster" in paused.output(), timeout=10)
        time.sleep(4)  # several of its reconciler intervals (1 s)
        assert TaskHistory.objects.get(id=orphan).state == "active"
        assert running.leader() is other
        assert "orphans failed" not in paused.output().split("leader: lost lock:orch:cluster")[1]

        # The control: the same process fails that orphan once it leads again.
        os.kill(other.pid, signal.SIGKILL)
        other.process.wait()
        wait_for(lambda: running.leader() is paused, timeout=TTL_S + JITTER_S + 10)
        wait_for(lambda: TaskHistory.objects.get(id=orphan).state == "failed", timeout=10)


def test_the_nodes_page_lists_live_nodes_and_the_leader(
    tmp_path: Path, admin_client: Client
) -> None:
    with cluster(tmp_path) as running:
        a, b = running.start(), running.start()
        ruling = wait_for(lambda: _held_by([a, b]), timeout=30)
        announced = wait_for(
            lambda: (
                [n for n in roster.roster() if n.pid in (a.pid, b.pid) and n.role == "loops"]
                if len([n for n in roster.roster() if n.pid in (a.pid, b.pid)]) == 2
                else None
            )
        )

        page = admin_client.get("/admin/orchestrator/taskhistory/nodes/")
        changelist = admin_client.get("/admin/orchestrator/taskhistory/").content.decode()

    assert page.status_code == 200
    html = page.content.decode()
    for entry in announced:
        assert entry.instance_id in html
        assert entry.version and entry.version != "unknown"
        assert entry.pools  # the loops process announces its host's pools
    # One seat, the cluster's, held by the leader; the leader's node row says it leads.
    assert html.count('id="seat-') == 1
    instance = next(n.instance_id for n in announced if n.pid == ruling.pid)
    assert instance in html.split('id="seat-cluster"', 1)[1].split("</tr>", 1)[0]
    nodes = html.split('id="nodes"', 1)[1]
    for entry in announced:
        leads = nodes.split(entry.instance_id, 1)[1].split("</tr>", 1)[0].split("<td>")[-1]
        assert leads.startswith("cluster" if entry.pid == ruling.pid else "-"), leads
    assert "/admin/orchestrator/taskhistory/nodes/" in changelist


def test_the_nodes_page_is_for_staff_only(client: Client) -> None:
    page = client.get("/admin/orchestrator/taskhistory/nodes/")

    assert page.status_code == 302
    assert "/admin/login/" in page["Location"]
