"""The Cluster page: nodes with their last beat, the cluster's one leader seat, each pool's
waiting and running runs, and the link to Flower."""

from __future__ import annotations

import re

import pytest
from django.conf import settings
from django.test import Client

from orchestrator.cluster import roster
from orchestrator.cluster.leaders import CLUSTER
from orchestrator.models import TaskHistory
from orchestrator.routing import pool_of
from orchestrator.runs.start import start_run
from orchestrator.states import RunState
from orchestrator.stores import keys, valkey
from orchestrator.triggers import TriggerKind
from tasks import registry
from tests.support.catalog import empty_queues

pytestmark = pytest.mark.django_db(transaction=True)

# No worker consumes it in this suite (the shared worker serves test-noop): runs stay put.
PARKED = "test-record-order"

PAGE = "/admin/orchestrator/taskhistory/nodes/"


@pytest.fixture(autouse=True)
def _no_leftover_messages() -> None:
    empty_queues()


def _cell(html: str, row_id: str, cls: str) -> str:
    row = html.split(f'id="{row_id}"', 1)[1].split("</tr>", 1)[0]
    found = re.search(rf'class="{cls}">([^<]*)<', row)
    assert found, row
    return found.group(1)


def test_pools_show_waiting_and_running_runs(admin_client: Client) -> None:
    waiting = [start_run(PARKED, {"label": "x"}, trigger=TriggerKind.API).run_id for _ in range(3)]
    TaskHistory.objects.filter(id=waiting[0]).update(state=RunState.ACTIVE)

    html = admin_client.get(PAGE).content.decode()

    # Three messages wait in the parked task's pool; one of its runs is active.
    pool = pool_of(registry.get()[PARKED].resource_class, settings.CONFIG.per_task_queues)
    assert _cell(html, f"pool-{pool}", "waiting") == "3"
    assert _cell(html, f"pool-{pool}", "running") == "1"
    assert _cell(html, "pool-cpu", "running") == "0"
    assert 'id="flower-link"' in html and "http://127.0.0.1:5555" in html


def test_a_node_shows_how_long_ago_it_last_announced(admin_client: Client) -> None:
    node = roster.this_node("worker", ["task.t.test-noop"], pools=["io"])
    roster.announce(node)

    html = admin_client.get(PAGE).content.decode()

    row = html.split(node.instance_id, 1)[1].split("</tr>", 1)[0]
    assert re.search(r'class="last-beat">[01] s ago<', row), row


def test_the_page_shows_the_cluster_seat_and_no_other(admin_client: Client) -> None:
    node = roster.this_node("loops", [], pools=["io"])
    roster.announce(node)
    client = valkey.client()
    client.set(keys.orchestrator_lock(CLUSTER), f"{node.instance_id}:ab", px=30_000)
    # A class seat, as a loops process older than their removal still renews during a
    # rolling deploy: nothing shows it.
    client.set(keys.orchestrator_lock("io"), "old-host:9:OLDPROC1:cd", px=30_000)
    try:
        html = admin_client.get(PAGE).content.decode()
    finally:
        client.delete(keys.orchestrator_lock(CLUSTER), keys.orchestrator_lock("io"))

    assert html.count('id="seat-') == 1
    seat = html.split('id="seat-cluster"', 1)[1].split("</tr>", 1)[0]
    assert node.instance_id in seat and "not in the roster" not in seat
    assert "old-host:9:OLDPROC1" not in html
    node_row = html.split('id="nodes"', 1)[1].split(node.instance_id, 1)[1].split("</tr>")[0]
    assert node_row.split("<td>")[-1].startswith("cluster"), node_row
