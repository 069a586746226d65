"""The Cluster page: nodes with their last beat, each pool's waiting and running runs, and
the link to Flower."""

from __future__ import annotations

import re

import pytest
from django.conf import settings
from django.test import Client

from orchestrator.cluster import roster
from orchestrator.models import TaskHistory
from orchestrator.routing import pool_of
from orchestrator.runs.start import start_run
from orchestrator.states import RunState
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
