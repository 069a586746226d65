"""The console's operator pages over the API: dead letters (listed by kind and task, in pages,
requeued one or many with an outcome per id), the drain's poison list (replay, discard),
schedules (next fire, last outcome, switch) and the cluster's nodes and leader seat."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client
from django_celery_beat.models import IntervalSchedule, PeriodicTask

from orchestrator.api import tokens
from orchestrator.cluster import roster
from orchestrator.cluster.leaders import CLUSTER
from orchestrator.models import DeliveryStatus, SchedulerState, TaskHistory, WebhookDelivery
from orchestrator.recovery import drain_poison
from orchestrator.runs import drain
from orchestrator.runs.start import start_run
from orchestrator.scheduler.names import DISPATCH_TASK
from orchestrator.states import RunState
from orchestrator.stores import keys, valkey
from orchestrator.triggers import TriggerKind
from orchestrator.webhooks.delivery import create_endpoint
from tests.support.runs import clean_drain
from tests.support.users import operator

pytestmark = pytest.mark.django_db(transaction=True)

PARKED = "test-record-order"  # nothing consumes its queue here
OTHER = "test-flaky"  # nor this one's


@pytest.fixture(autouse=True)
def _clean() -> None:
    clean_drain(CLUSTER)
    stale = list(valkey.client().scan_iter(match=keys.cluster_node("*"), count=500))
    if stale:
        valkey.client().delete(*stale)


@pytest.fixture
def client() -> Client:
    return Client(headers={"Authorization": f"Bearer {tokens.issue(operator())[1]}"})


def _get(client: Client, path: str) -> Any:
    response = client.get(f"/api/v1{path}")
    assert response.status_code == 200, response.content
    return response.json()


def _post(client: Client, path: str, body: Any) -> Any:
    return client.post(f"/api/v1{path}", json.dumps(body), content_type="application/json")


def _exhausted(task: str = PARKED) -> str:
    """A run as a worker leaves one that failed its last attempt."""
    data: dict[str, Any] = {"label": "dead"} if task == PARKED else {"label": "d", "fail_times": 9}
    run_id = start_run(task, data, trigger=TriggerKind.MANUAL).run_id
    error = {"kind": "transient", "message": "still down", "exhausted": True}
    TaskHistory.objects.filter(id=run_id).update(state=RunState.FAILED, error=error, attempts=3)
    return run_id


def _poisoned(run_id: str) -> str:
    entry = drain.Entry(run_id, RunState.COMPLETED, {"result": {}}, "host:1:X")
    drain_poison.add(entry.to_json(), entry, "Postgres refused it")
    return drain_poison.poisoned(1)[0].record_id


def _dead_delivery(run_id: str) -> WebhookDelivery:
    endpoint, _ = create_endpoint("https://hooks.invalid/x", states=[], tasks=[])
    return WebhookDelivery.objects.create(
        endpoint=endpoint,
        event_id=f"ev-{run_id}",
        event_type="run.failed",
        run_id=run_id,
        envelope={},
        status=DeliveryStatus.DEAD,
        attempts=5,
        last_error="connection refused",
    )


def test_dead_letters_are_listed_by_kind_and_task_in_pages(client: Client) -> None:
    runs = [_exhausted() for _ in range(3)]
    other = _exhausted(OTHER)
    record = _poisoned(runs[0])
    hook = _dead_delivery(other)

    everything = _get(client, "/dead-letters")["items"]
    assert [(i["kind"], i["id"]) for i in everything] == [
        *(("exhausted_run", r) for r in [other, *reversed(runs)]),
        ("drain_poison", record),
        ("webhook_delivery", str(hook.pk)),
    ]
    assert everything[-1]["task"] == OTHER and everything[-1]["error"] == "connection refused"
    assert everything[-2]["task"] == PARKED and everything[-2]["requeueable"]

    of_task = _get(client, f"/dead-letters?task={OTHER}")["items"]
    assert [(i["kind"], i["id"]) for i in of_task] == [
        ("exhausted_run", other),
        ("webhook_delivery", str(hook.pk)),
    ]
    poison = _get(client, "/dead-letters?kind=drain_poison")["items"]
    assert [i["run_id"] for i in poison] == [runs[0]]

    # Two at a time across the kinds: every item once, in the same order, then no cursor.
    seen: list[str] = []
    cursor = ""
    while True:
        found = _get(client, f"/dead-letters?limit=2{cursor}")
        seen += [i["id"] for i in found["items"]]
        if found["next_cursor"] is None:
            break
        cursor = f"&cursor={found['next_cursor']}"
    assert seen == [i["id"] for i in everything]


def test_a_bad_filter_cursor_or_body_is_a_422_naming_it(client: Client) -> None:
    for run_id in (_exhausted(), _exhausted()):
        _poisoned(run_id)
    poison_cursor = _get(client, "/dead-letters?kind=drain_poison&limit=1")["next_cursor"]
    runs = TaskHistory.objects.count()

    for query, field in (
        ("kind=outbox", "kind"),
        ("limit=0", "limit"),
        ("cursor=bm90IGEgY3Vyc29y", "cursor"),
        (f"kind=exhausted_run&cursor={poison_cursor}", "cursor"),
    ):
        refused = client.get(f"/api/v1/dead-letters?{query}")
        assert refused.status_code == 422, query
        assert [e["loc"][-1] for e in refused.json()["errors"]] == [field], query
    for body, field in (
        ({"kind": "exhausted_run", "ids": []}, "ids"),
        ({"ids": ["run_x"]}, "kind"),
        ({"kind": "exhausted_run", "ids": ["run_x"], "all": True}, "all"),
    ):
        refused = _post(client, "/dead-letters/requeue", body)
        assert refused.status_code == 422, body
        assert field in [e["loc"][-1] for e in refused.json()["errors"]], body
    assert TaskHistory.objects.count() == runs
    assert len(drain_poison.poisoned()) == 2


def test_requeue_gives_an_outcome_per_id_and_requeues_only_dead_letters(client: Client) -> None:
    dead, live = _exhausted(), start_run(PARKED, {"label": "l"}, trigger=TriggerKind.MANUAL)
    runs = TaskHistory.objects.count()

    answer = _post(
        client,
        "/dead-letters/requeue",
        {"kind": "exhausted_run", "ids": [dead, live.run_id, "run_nope", dead]},
    )

    assert answer.status_code == 200, answer.content
    results = answer.json()["results"]
    assert [(r["id"], r["outcome"]) for r in results] == [
        (dead, "requeued"),
        (live.run_id, "not_found"),
        ("run_nope", "not_found"),
    ]
    new = TaskHistory.objects.get(id=results[0]["run_id"])
    assert new.trigger["retryOf"] == dead and new.priority == 1
    assert TaskHistory.objects.count() == runs + 1
    listed = _get(client, "/dead-letters?kind=exhausted_run")["items"]
    assert listed[0]["requeued_as"] == [new.id]


def test_a_dead_delivery_is_sent_again(client: Client) -> None:
    hook = _dead_delivery(_exhausted())

    answer = _post(
        client,
        "/dead-letters/requeue",
        {"kind": "webhook_delivery", "ids": [str(hook.pk), "9" * 30]},
    )

    assert [r["outcome"] for r in answer.json()["results"]] == ["requeued", "not_found"]
    hook.refresh_from_db()
    assert hook.status == DeliveryStatus.PENDING and hook.attempts == 0


def test_the_poison_list_is_read_replayed_and_discarded(client: Client) -> None:
    replayed_run, discarded_run = _exhausted(), _exhausted()
    replayed, discarded = _poisoned(replayed_run), _poisoned(discarded_run)
    valkey.client().lpush(keys.drain_poison(), json.dumps({"raw": "{not json", "error": "x"}))

    listed = _get(client, "/drain/poison")
    assert {e["id"] for e in listed} >= {replayed, discarded}
    by_id = {e["id"]: e for e in listed}
    assert by_id[replayed]["run_id"] == replayed_run and by_id[replayed]["write"] == "completed"
    assert by_id[replayed]["run_state"] == "failed" and by_id[replayed]["replayable"]
    unreadable = next(e for e in listed if not e["replayable"])

    replay = _post(client, "/drain/poison/replay", {"ids": [replayed, unreadable["id"]]})
    discard = _post(client, "/drain/poison/discard", {"ids": [discarded, replayed]})

    assert [r["outcome"] for r in replay.json()["results"]] == ["replayed", "refused"]
    assert [r["outcome"] for r in discard.json()["results"]] == ["discarded", "not_found"]
    pending = valkey.client().lrange(keys.drain_pending(), 0, -1)
    assert [json.loads(p)["run_id"] for p in pending] == [replayed_run]
    assert [e["id"] for e in _get(client, "/drain/poison")] == [unreadable["id"]]


def test_schedules_are_listed_and_switched(client: Client) -> None:
    daily = IntervalSchedule.objects.create(every=1, period=IntervalSchedule.DAYS)
    PeriodicTask.objects.create(name="api-own", task="an.own.task", interval=daily)
    PeriodicTask.objects.create(name="gone-task", task=DISPATCH_TASK, interval=daily, enabled=False)

    listed = {s["name"]: s for s in _get(client, "/schedules")["static"]}
    assert listed["api-own"]["enabled"] and listed["api-own"]["next_fire_at"] is not None
    assert listed["api-own"]["last_fire"] == {"at": None, "run_id": None, "error": None}
    assert not listed["api-own"]["managed"] and listed["gone-task"]["managed"]

    off = _post(client, "/schedules/static/switch", {"name": "api-own", "enabled": False})
    again = _post(client, "/schedules/static/switch", {"name": "api-own", "enabled": False})
    assert off.json() == {"enabled": False, "changed": True}
    assert again.json() == {"enabled": False, "changed": False}
    assert not PeriodicTask.objects.get(name="api-own").enabled
    assert (
        _post(client, "/schedules/static/switch", {"name": "nope", "enabled": True}).status_code
        == 404
    )
    gone = _post(client, "/schedules/static/switch", {"name": "gone-task", "enabled": True})
    assert gone.status_code == 409 and "stays off" in gone.json()["detail"]
    assert not PeriodicTask.objects.get(name="gone-task").enabled

    row = {"task": "epg-refresh", "row": "tv9", "enabled": False}
    assert _post(client, "/schedules/dynamic/switch", row).json()["changed"]
    assert SchedulerState.objects.get(key="epg-refresh:tv9").disabled
    unknown = _post(client, "/schedules/dynamic/switch", {**row, "task": PARKED})
    assert unknown.status_code == 404


def test_nodes_and_the_leader_seat_are_read(client: Client) -> None:
    assert _get(client, "/cluster/leaders") == [
        {
            "seat": CLUSTER,
            "key": keys.orchestrator_lock(CLUSTER),
            "holder": None,
            "holder_live": False,
        }
    ]
    node = roster.this_node("loops", ["q1"], pools=["io"])
    roster.announce(node)
    valkey.client().set(keys.orchestrator_lock(CLUSTER), f"{node.instance_id}:tok", ex=15)

    # A worker another test started may announce itself meanwhile: this node, once.
    (shown,) = [n for n in _get(client, "/cluster/nodes") if n["instance_id"] == node.instance_id]
    assert shown["instance_id"] == node.instance_id and shown["role"] == "loops"
    assert shown["pools"] == ["io"] and shown["queues"] == ["q1"]
    assert shown["leads"] and 0 <= shown["last_beat_s"] < 5
    (seat,) = _get(client, "/cluster/leaders")
    assert seat["holder"] == node.instance_id and seat["holder_live"]
